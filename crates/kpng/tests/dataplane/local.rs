//! Probes from a process on the node: a pod, or the node itself, as its sockets are seen
//! there. The process is this test binary again ([`serve_when_asked`], behind the
//! `local_probes` test), started in the namespace and, for `to-ebpf`, in the test's cgroup
//! (a thread cannot change cgroup), so that its sockets are the ones the programs translate.
//! It reads one probe per line on standard input and answers one line each.

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use kpng_testkit::netns::Netns;
use kpng_testkit::probe::{self, Outcome};

use crate::harness::Dataplane;

const ASKED: &str = "KPNG_TEST_LOCAL_PROBES";
const TIMEOUT: Duration = Duration::from_millis(1500);

/// A probing process on the node; killed on drop.
pub struct Local {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Dataplane {
    /// A probing process in `ns` (a pod on the node, or the node itself).
    pub fn local(self, ns: &Netns) -> Local {
        let join = match self {
            Dataplane::Nft | Dataplane::Iptables | Dataplane::Aggregated(_) => String::new(),
            Dataplane::Ebpf(attachment) => {
                format!("echo $$ > '{}/cgroup.procs' && ", attachment.cgroup().display())
            }
        };
        let script = format!("{join}exec ip netns exec '{}' \"$0\" \"$@\"", ns.name());
        let mut child = Command::new("sh")
            .args(["-c", &script])
            .arg(std::env::current_exe().expect("the test binary"))
            .args(["local_probes", "--exact", "--nocapture", "--test-threads=1", "--quiet"])
            .env(ASKED, "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting the probing process");
        let input = child.stdin.take().expect("piped");
        let output = BufReader::new(child.stdout.take().expect("piped"));
        Local { child, input, output }
    }
}

impl Local {
    fn ask(&mut self, probe: &str) -> String {
        writeln!(self.input, "{probe}").expect("writing to the probing process");
        let mut line = String::new();
        loop {
            line.clear();
            let n = self.output.read_line(&mut line).expect("reading the probing process");
            assert!(n > 0, "the probing process ended before answering {probe}");
            if let Some(answer) = line.trim_end().strip_prefix("PROBE ") {
                return answer.to_string();
            }
        }
    }

    /// A TCP connection: the outcome and the peer address the socket reports
    /// (`getpeername()`).
    pub fn tcp(&mut self, target: &str) -> (Outcome, String) {
        split(&self.ask(&format!("tcp {target}")))
    }

    /// A TCP probe that must reach an endpoint: its name, the client address it saw, and
    /// `getpeername()`. A timeout is retried twice (a first SYN may wait out a busy moment).
    pub fn reach(&mut self, target: &str) -> (String, IpAddr, String) {
        let mut last = None;
        for _ in 0..3 {
            match self.tcp(target) {
                (Outcome::Answer { name, peer }, getpeername) => return (name, peer, getpeername),
                (Outcome::Timeout, _) => last = Some(Outcome::Timeout),
                (other, _) => {
                    panic!("{target} from a local process: expected an answer, got {other}")
                }
            }
        }
        panic!("{target} from a local process: expected an answer, got {last:?}")
    }

    /// The endpoints that answered `n` TCP probes.
    pub fn names(&mut self, target: &str, n: usize) -> BTreeSet<String> {
        (0..n).map(|_| self.reach(target).0).collect()
    }

    /// A TCP connection that stays open for [`Local::again`]. A timeout is retried twice,
    /// as in [`Local::reach`]: on a loaded machine a first SYN may wait out a busy moment.
    pub fn hold(&mut self, target: &str) -> (Outcome, String) {
        let mut answer = split(&self.ask(&format!("hold {target}")));
        for _ in 0..2 {
            if answer.0 != Outcome::Timeout {
                break;
            }
            answer = split(&self.ask(&format!("hold {target}")));
        }
        answer
    }

    /// One more exchange on the held connection.
    pub fn again(&mut self) -> (Outcome, String) {
        split(&self.ask("again"))
    }

    /// A connected UDP exchange.
    pub fn udp(&mut self, target: &str) -> Outcome {
        self.ask(&format!("udp {target}")).parse().unwrap_or_else(Outcome::Error)
    }

    /// An unconnected UDP exchange (`sendto()`): the outcome and the address the reply came
    /// from.
    pub fn sendto(&mut self, target: &str) -> (Outcome, String) {
        split(&self.ask(&format!("sendto {target}")))
    }

    /// A UDP exchange on the connected socket this process keeps for `target`, as a client
    /// that connects once sends datagram after datagram. A socket that fails is closed, and
    /// the next exchange connects a new one.
    pub fn connected(&mut self, target: &str) -> Outcome {
        self.ask(&format!("connected {target}")).parse().unwrap_or_else(Outcome::Error)
    }

    /// An unconnected UDP exchange on the socket this process keeps for `target` (one
    /// flow, as a resolver's socket sends query after query).
    pub fn flow(&mut self, target: &str) -> Outcome {
        split(&self.ask(&format!("flow {target}"))).0
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `<outcome>|<address>` apart.
fn split(answer: &str) -> (Outcome, String) {
    let (outcome, address) = answer.split_once('|').unwrap_or((answer, ""));
    (outcome.parse().unwrap_or_else(Outcome::Error), address.to_string())
}

/// The probing process's body: one probe per input line, one `PROBE <answer>` line each.
/// - `tcp ADDR`: connect, read the greeting: `<outcome>|<getpeername()>`
/// - `hold ADDR`: as `tcp`, and the connection stays open
/// - `again`: one more exchange on the held connection: `<outcome>|<getpeername()>`
/// - `udp ADDR`: connected UDP exchange: `<outcome>`
/// - `sendto ADDR`: unconnected UDP: `<outcome>|<address the reply came from>`
/// - `flow ADDR`: as `sendto`, on one socket kept per address
/// - `connected ADDR`: as `udp`, on one connected socket kept per address until it fails
///
/// Does nothing unless [`Dataplane::local`] started this process.
pub fn serve_when_asked() {
    if std::env::var(ASKED).is_err() {
        return;
    }
    let mut held: Option<TcpStream> = None;
    let mut flows: std::collections::HashMap<SocketAddr, UdpSocket> = Default::default();
    let mut connected: std::collections::HashMap<SocketAddr, UdpSocket> = Default::default();
    for line in std::io::stdin().lock().lines().map_while(Result::ok) {
        let answer = match line.split_once(' ') {
            None if line == "again" => exchange_again(held.as_mut()),
            None => format!("error: unknown probe {line}"),
            Some((kind, target)) => match target.parse::<SocketAddr>() {
                Err(e) => format!("error: {e}"),
                Ok(target) => match kind {
                    "tcp" => connect(target).0,
                    "hold" => {
                        let (answer, stream) = connect(target);
                        held = stream;
                        answer
                    }
                    "udp" => probe::udp(target, 0, TIMEOUT).to_string(),
                    "sendto" => unconnected_udp(target, None),
                    "flow" => {
                        let socket = flows.entry(target).or_insert_with(|| {
                            let bind: SocketAddr = match target.is_ipv4() {
                                true => ([0, 0, 0, 0], 0).into(),
                                false => ([0u16; 8], 0).into(),
                            };
                            UdpSocket::bind(bind).expect("binding a UDP socket")
                        });
                        unconnected_udp(target, Some(socket))
                    }
                    "connected" => {
                        let answer = connected_udp(target, &mut connected);
                        if answer.starts_with("error: ") {
                            connected.remove(&target);
                        }
                        answer
                    }
                    other => format!("error: unknown probe {other}"),
                },
            },
        };
        println!("PROBE {answer}");
    }
}

fn connect(target: SocketAddr) -> (String, Option<TcpStream>) {
    let mut stream = match TcpStream::connect_timeout(&target, TIMEOUT) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
            return ("refused|".into(), None);
        }
        Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return ("timeout|".into(), None),
        Err(e) => return (format!("error: {e}|"), None),
    };
    let _ = stream.set_read_timeout(Some(TIMEOUT));
    let answer = read_answer(&mut stream);
    (answer, Some(stream))
}

/// The server's next line and what `getpeername()` says.
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

/// One datagram to `target` and its answer, on the connected socket kept for it (connected
/// first when there is none).
fn connected_udp(
    target: SocketAddr,
    sockets: &mut std::collections::HashMap<SocketAddr, UdpSocket>,
) -> String {
    let socket = match sockets.entry(target) {
        std::collections::hash_map::Entry::Occupied(kept) => kept.into_mut(),
        std::collections::hash_map::Entry::Vacant(slot) => {
            let bind: SocketAddr =
                if target.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
            let socket = match UdpSocket::bind(bind).and_then(|s| s.connect(target).map(|()| s)) {
                Ok(socket) => socket,
                Err(e) => return format!("error: {e}"),
            };
            let _ = socket.set_read_timeout(Some(TIMEOUT));
            slot.insert(socket)
        }
    };
    if let Err(e) = socket.send(b"hello") {
        return format!("error: {e}");
    }
    let mut buf = [0u8; 256];
    match socket.recv(&mut buf) {
        Ok(n) => String::from_utf8_lossy(&buf[..n]).lines().next().unwrap_or_default().to_string(),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            "timeout".into()
        }
        Err(e) => format!("error: {e}"),
    }
}

/// One datagram to `target` and its answer, on `socket` or a new one.
fn unconnected_udp(target: SocketAddr, socket: Option<&UdpSocket>) -> String {
    let bind: SocketAddr =
        if target.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { ([0u16; 8], 0).into() };
    let fresh;
    let socket = match socket {
        Some(socket) => socket,
        None => match UdpSocket::bind(bind) {
            Ok(s) => {
                fresh = s;
                &fresh
            }
            Err(e) => return format!("error: {e}|"),
        },
    };
    let _ = socket.set_read_timeout(Some(TIMEOUT));
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
