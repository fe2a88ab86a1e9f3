//! Real sockets through real BPF programs: kpng attaches `to-ebpf` to a cgroup of the
//! test's own (and programs `to-nft` in the node namespace), and a "pod" process in that
//! cgroup and in a pod namespace on the node connects to services.
//!
//! The pod process is this test binary again, started by `sh` after it moved itself into
//! the cgroup (a thread cannot change cgroup), in the pod's namespace: it reads probes on
//! standard input and answers one line each (see [`pod_agent`]).

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kpng_testkit::netns::Netns;
use kpng_testkit::privileged::require;
use kpng_testkit::probe::{self, Outcome};
use kpng_testkit::topology::Cluster;

const AGENT_ENV: &str = "KPNG_TEST_POD_AGENT";
const TOOLS: &[&str] = &["ip", "nft", "conntrack", "bpftool", "nsenter"];

const NODE_A: &str = r#"
apiVersion: v1
kind: Node
metadata: {name: node-a}
spec:
  podCIDRs: [10.244.0.0/24, "fd00:244::/64"]
status:
  addresses:
  - {type: InternalIP, address: 192.168.10.1}
  - {type: InternalIP, address: "fd00:10::1"}
"#;

/// The body of the pod process: one probe per input line, one `AGENT <answer>` line each.
/// - `tcp ADDR`: connect, read the greeting: `<outcome>|<getpeername()>`
/// - `udp ADDR`: connected UDP exchange: `<outcome>`
/// - `sendto ADDR`: unconnected UDP: `<outcome>|<address the reply came from>`
/// - `hold ADDR`: as `tcp`, and the connection stays open
/// - `again`: one more exchange on the last held connection: `<outcome>|<getpeername()>`
///
/// Outside a pod process (no `KPNG_TEST_POD_AGENT`), it does nothing.
#[test]
fn pod_agent() {
    if std::env::var(AGENT_ENV).is_err() {
        return;
    }
    let stdin = std::io::stdin();
    let mut held: Option<TcpStream> = None;
    for line in stdin.lock().lines().map_while(Result::ok) {
        if line == "again" {
            println!("AGENT {}", exchange_again(held.as_mut()));
            continue;
        }
        let (kind, target) = line.split_once(' ').unwrap_or((line.as_str(), ""));
        let target: SocketAddr = match target.parse() {
            Ok(t) => t,
            Err(e) => {
                println!("AGENT error: {e}");
                continue;
            }
        };
        let answer = match kind {
            "tcp" => tcp_with_peer(target).0,
            "hold" => {
                let (answer, stream) = tcp_with_peer(target);
                held = stream;
                answer
            }
            "udp" => probe::udp(target, 0, Duration::from_millis(1500)).to_string(),
            "sendto" => unconnected_udp(target),
            other => format!("error: unknown probe {other}"),
        };
        println!("AGENT {answer}");
    }
}

fn tcp_with_peer(target: SocketAddr) -> (String, Option<TcpStream>) {
    let timeout = Duration::from_millis(1500);
    let mut stream = match TcpStream::connect_timeout(&target, timeout) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return ("refused|".into(), None);
        }
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return ("timeout|".into(), None),
        Err(e) => return (format!("error: {e}|"), None),
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let answer = read_answer(&mut stream);
    (answer, Some(stream))
}

/// The server's next line and what getpeername() says.
fn read_answer(stream: &mut TcpStream) -> String {
    let peer = stream.peer_addr().map(|p| p.to_string()).unwrap_or_default();
    let mut buf = [0u8; 256];
    let text = match stream.read(&mut buf) {
        Ok(0) => "error: closed".to_string(),
        Ok(n) => String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_string(),
        Err(e) => format!("error: {e}"),
    };
    format!("{text}|{peer}")
}

fn exchange_again(stream: Option<&mut TcpStream>) -> String {
    let Some(stream) = stream else { return "error: no held connection|".into() };
    if let Err(e) = stream.write_all(b"again\n") {
        return format!("error: {e}|");
    }
    read_answer(stream)
}

fn unconnected_udp(target: SocketAddr) -> String {
    let bind: SocketAddr =
        if target.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let socket = match UdpSocket::bind(bind) {
        Ok(s) => s,
        Err(e) => return format!("error: {e}|"),
    };
    let _ = socket.set_read_timeout(Some(Duration::from_millis(1500)));
    if let Err(e) = socket.send_to(b"hello", target) {
        return match e.kind() {
            std::io::ErrorKind::ConnectionRefused => "refused|".into(),
            _ => format!("error: {e}|"),
        };
    }
    let mut buf = [0u8; 256];
    match socket.recv_from(&mut buf) {
        Ok((n, from)) => {
            let text = String::from_utf8_lossy(&buf[..n]);
            format!("{}|{from}", text.lines().next().unwrap_or_default())
        }
        Err(_) => "timeout|".into(),
    }
}

/// `require`, and the BPF object in this build (without clang the tests skip, except
/// under `CI=true`).
fn ready(test: &str) -> bool {
    if !require(test, TOOLS) {
        return false;
    }
    if kpng_ebpf::support::available() {
        return true;
    }
    let message = format!("{test} needs to-ebpf: {}", kpng_ebpf::support::UNAVAILABLE.trim());
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{message} (CI=true: privileged tests must run)");
    }
    eprintln!("SKIPPED: {message}");
    false
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A cgroup v2 of the test's own and a pin directory, removed on drop (programs detached,
/// maps unpinned, processes in the cgroup killed) even when the test fails.
struct Attachment {
    cgroup: PathBuf,
    pins: PathBuf,
}

impl Attachment {
    fn new(test: &str) -> Attachment {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let root = kpng_ebpf::support::cgroup2_root().expect("a cgroup2 mount");
        let name = format!("kpng-test-{}-{n}-{test}", std::process::id());
        let cgroup = root.join(&name);
        std::fs::create_dir(&cgroup).expect("creating the test cgroup");
        Attachment { cgroup, pins: PathBuf::from("/sys/fs/bpf").join(name) }
    }

    /// `to-ebpf` options for this attachment.
    fn args(&self) -> Vec<String> {
        vec![
            "to-ebpf".into(),
            "--cgroup-path".into(),
            self.cgroup.display().to_string(),
            "--bpf-pin-path".into(),
            self.pins.display().to_string(),
        ]
    }

    /// The programs `bpftool` sees on the cgroup.
    fn attached(&self) -> String {
        let out = Command::new("bpftool")
            .args(["cgroup", "show"])
            .arg(&self.cgroup)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned());
        out.unwrap_or_default()
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let _ = kpng_ebpf::pins::cleanup(&self.pins);
        if let Ok(procs) = std::fs::read_to_string(self.cgroup.join("cgroup.procs")) {
            for pid in procs.split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).output();
            }
        }
        for _ in 0..50 {
            if std::fs::remove_dir(&self.cgroup).is_ok() || !self.cgroup.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// A pod process (this binary's [`pod_agent`]) in `ns` and in the attachment's cgroup.
struct Pod {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Pod {
    fn start(ns: &Netns, cgroup: &Path) -> Pod {
        let exe = std::env::current_exe().unwrap();
        let script = format!(
            "echo $$ > '{}/cgroup.procs' && exec ip netns exec '{}' \"$0\" \"$@\"",
            cgroup.display(),
            ns.name()
        );
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .arg(&exe)
            .args(["pod_agent", "--exact", "--nocapture", "--test-threads=1", "--quiet"])
            .env(AGENT_ENV, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the pod process");
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        Pod { child, input, output }
    }

    fn ask(&mut self, probe: &str) -> String {
        writeln!(self.input, "{probe}").expect("writing to the pod process");
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.output.read_line(&mut line).expect("reading the pod process");
            assert!(n > 0, "the pod process ended before answering {probe}");
            if let Some(answer) = line.trim_end().strip_prefix("AGENT ") {
                return answer.to_string();
            }
        }
    }

    /// A TCP probe: the outcome and what getpeername() said.
    fn tcp(&mut self, target: &str) -> (Outcome, String) {
        split(&self.ask(&format!("tcp {target}")))
    }

    /// A TCP probe that must reach an endpoint (a first SYN may wait out a busy moment).
    fn reach(&mut self, target: &str) -> (String, IpAddr, String) {
        let mut last = None;
        for _ in 0..3 {
            match self.tcp(target) {
                (Outcome::Answer { name, peer }, getpeername) => return (name, peer, getpeername),
                other => last = Some(other),
            }
        }
        panic!("{target} from the pod: expected an answer, got {last:?}")
    }

    /// A TCP probe whose connection stays open for [`Pod::again`].
    fn hold(&mut self, target: &str) -> (Outcome, String) {
        split(&self.ask(&format!("hold {target}")))
    }

    /// One more exchange on the held connection.
    fn again(&mut self) -> (Outcome, String) {
        split(&self.ask("again"))
    }

    fn udp(&mut self, target: &str) -> Outcome {
        self.ask(&format!("udp {target}")).parse().unwrap_or_else(Outcome::Error)
    }

    /// Unconnected UDP: the outcome and the address the reply came from.
    fn sendto(&mut self, target: &str) -> (Outcome, String) {
        split(&self.ask(&format!("sendto {target}")))
    }
}

/// `<outcome>|<address>` apart.
fn split(answer: &str) -> (Outcome, String) {
    let (outcome, addr) = answer.split_once('|').unwrap_or((answer, ""));
    (outcome.parse().unwrap_or_else(Outcome::Error), addr.to_string())
}

impl Drop for Pod {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs kpng once in the node namespace: `to-local to-ebpf ... to-nft` over `manifests`.
/// Returns its log.
fn program(cluster: &Cluster, attachment: &Attachment, manifests: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, format!("{NODE_A}{manifests}")).unwrap();
    let mut args: Vec<String> =
        ["file", "--input", path.to_str().unwrap(), "to-local", "--node", "node-a"]
            .map(String::from)
            .to_vec();
    args.extend(attachment.args());
    args.extend(["to-nft", "--once"].map(String::from));
    let out = in_node(cluster, &args).output().expect("running kpng");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "kpng failed: {log}");
    log
}

/// kpng in the node's network namespace. `nsenter` changes only the network namespace:
/// `ip netns exec` would also remount /sys, hiding the cgroup2 mount and bpffs.
fn in_node(cluster: &Cluster, args: &[String]) -> Command {
    let mut command = Command::new("nsenter");
    command
        .arg(format!("--net=/var/run/netns/{}", cluster.node.name()))
        .arg(env!("CARGO_BIN_EXE_kpng"))
        .args(args);
    command
}

/// A Service manifest.
fn service(name: &str, extra: &str, ports: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec:\n{extra}  ports:\n{ports}"
    )
}

/// An EndpointSlice manifest with ready `(ip, node)` endpoints.
fn slice(
    name: &str,
    service: &str,
    family: &str,
    ports: &str,
    endpoints: &[(&str, &str)],
) -> String {
    let mut text = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: test\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {family}\nports:\n{ports}endpoints:\n"
    );
    for (ip, node) in endpoints {
        text.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  nodeName: {node}\n  conditions: {{ready: true}}\n"
        ));
    }
    text
}

const PORTS: &str = "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n  - {name: dns, protocol: UDP, port: 53, targetPort: 8080}\n";
const SLICE_PORTS: &str =
    "- {name: http, protocol: TCP, port: 8080}\n- {name: dns, protocol: UDP, port: 8080}\n";

/// Conntrack entries in the node namespace matching `filter` (conntrack -L arguments).
fn conntrack(cluster: &Cluster, filter: &[&str]) -> Vec<String> {
    let mut args = vec!["-L"];
    args.extend_from_slice(filter);
    let out = cluster.node.output("conntrack", &args);
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

fn names(pod: &mut Pod, target: &str, n: usize) -> BTreeSet<String> {
    (0..n).map(|_| pod.reach(target).0).collect()
}

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|n| n.to_string()).collect()
}

/// Waits until `done` holds; fails naming `what` after 30 s.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < Duration::from_secs(30), "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[path = "ebpf_dataplane/scenarios.rs"]
mod scenarios;
