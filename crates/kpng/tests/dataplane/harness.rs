//! What every dataplane shares in the real-packet tests: the manifests, how kpng is run in
//! the node namespace, and the probes' helpers.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::process::Command;

use kpng_testkit::privileged::require;
use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

pub use crate::aggregation::Aggregation;
pub use crate::attachment::Attachment;
use crate::attachment::ebpf_programs_built;

/// A dataplane the scenarios run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dataplane {
    /// `to-nft`.
    Nft,
    /// `to-ebpf` on a cgroup of the test's own, then `to-nft` for what stays on the packet
    /// path (the deployment the README gives). Local probes ([`Dataplane::local`]) run in
    /// that cgroup, so their sockets are the ones the programs translate.
    Ebpf(Attachment),
    /// `to-iptables`.
    Iptables,
    /// `to-nft --aggregator`: kpng's tables published to a `kpng aggregate` of the
    /// scenario's own, which programs the node.
    Aggregated(Aggregation),
}

impl Dataplane {
    /// `to-ebpf` with an attachment of its own.
    pub fn ebpf() -> Dataplane {
        Dataplane::Ebpf(Attachment::next())
    }

    /// `to-nft --aggregator` with an aggregator of its own.
    pub fn aggregated() -> Dataplane {
        Dataplane::Aggregated(Aggregation::next())
    }

    /// The backend under test, as on kpng's command line.
    pub fn name(self) -> &'static str {
        match self {
            Dataplane::Nft => "to-nft",
            Dataplane::Aggregated(_) => "to-nft --aggregator",
            Dataplane::Ebpf(_) => "to-ebpf",
            Dataplane::Iptables => "to-iptables",
        }
    }

    /// The backends on kpng's command line, with their options.
    pub fn backends(self) -> Vec<String> {
        match self {
            Dataplane::Nft => vec!["to-nft".into()],
            Dataplane::Aggregated(aggregation) => {
                vec!["to-nft".into(), "--aggregator".into(), aggregation.address()]
            }
            Dataplane::Iptables => vec!["to-iptables".into()],
            Dataplane::Ebpf(attachment) => vec![
                "to-ebpf".into(),
                "--cgroup-path".into(),
                attachment.cgroup().display().to_string(),
                "--bpf-pin-path".into(),
                attachment.pins().display().to_string(),
                "to-nft".into(),
            ],
        }
    }

    /// Whether sockets of local processes are translated at `connect()`/`sendmsg()`: their
    /// packets carry the endpoint's address from the first one on, so nothing is NATed or
    /// masqueraded and the endpoint sees the socket's own address.
    pub fn translates_sockets(self) -> bool {
        matches!(self, Dataplane::Ebpf(_))
    }

    /// Whether `peer`, the source an endpoint saw for a connection from a local pod at
    /// `own`, is what this dataplane shows for a connection it masquerades: not `own` on the
    /// packet path; `own` itself for a socket translated at connect(), where nothing is
    /// NATed and nothing needs undoing on the way back.
    pub fn shows_masqueraded(self, peer: IpAddr, own: IpAddr) -> bool {
        (peer == own) == self.translates_sockets()
    }

    /// Whether kpng's start-up, whose log is `stderr`, left the kernel as it was (kpng
    /// found its tables, or programs and maps, holding the state). Through an aggregator,
    /// kpng publishes its tables whole and the aggregator's batch has nothing to commit.
    pub fn started_without_changes(self, stderr: &str) -> bool {
        match self {
            Dataplane::Aggregated(aggregation) => {
                let log = aggregation.log();
                let last = log.lines().rfind(|l| l.contains(" batch "));
                last.is_some_and(|l| l.contains("transactions=0") && l.contains("commands=0"))
            }
            Dataplane::Ebpf(_) => {
                stderr.contains("already holds this state") && !stderr.contains("eBPF maps written")
            }
            Dataplane::Nft | Dataplane::Iptables => stderr.contains("already holds this state"),
        }
    }

    /// The commands its scenarios need.
    fn tools(self) -> &'static [&'static str] {
        match self {
            Dataplane::Nft | Dataplane::Aggregated(_) => &["nft", "ip", "curl", "conntrack"],
            Dataplane::Ebpf(_) => &["nft", "ip", "curl", "conntrack", "bpftool", "nsenter"],
            Dataplane::Iptables => &[
                "iptables",
                "iptables-save",
                "iptables-legacy-save",
                "iptables-nft-save",
                "ip",
                "curl",
                "conntrack",
            ],
        }
    }

    /// kpng with `args` in the node's network namespace. For eBPF through `nsenter`, which
    /// changes only the network namespace: `ip netns exec` would also remount /sys, hiding
    /// the cgroup2 mount and bpffs.
    pub fn kpng(self, cluster: &Cluster, args: &[String]) -> Command {
        if let Dataplane::Aggregated(aggregation) = self {
            aggregation.ensure(cluster);
        }
        match self {
            Dataplane::Nft | Dataplane::Iptables | Dataplane::Aggregated(_) => {
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                cluster.node.command(env!("CARGO_BIN_EXE_kpng"), &args)
            }
            Dataplane::Ebpf(_) => {
                let mut command = Command::new("nsenter");
                command
                    .arg(format!("--net=/var/run/netns/{}", cluster.node.name()))
                    .arg(env!("CARGO_BIN_EXE_kpng"))
                    .args(args);
                command
            }
        }
    }

    /// kpng's arguments over the manifests at `path`: the file source, `to-local` on
    /// node-a, the backends, then `extra`.
    pub fn args(self, path: &std::path::Path, watch: bool, extra: &[&str]) -> Vec<String> {
        let mut args: Vec<String> =
            vec!["file".into(), "--input".into(), path.display().to_string()];
        if watch {
            args.push("--watch".into());
        }
        args.extend(["to-local", "--node", "node-a"].map(String::from));
        args.extend(self.backends());
        args.extend(extra.iter().map(|a| a.to_string()));
        args
    }
}

/// Runs scenario `f` on dataplane `dp`, when the machine can (root, tools, and for eBPF a
/// build with its programs; under CI=true it must). The eBPF attachment is removed after
/// the scenario, even when it fails.
pub fn run(name: &str, dp: Dataplane, f: fn(Dataplane)) {
    let test = format!("{name} ({})", dp.name());
    if !require(&test, dp.tools()) {
        return;
    }
    let _aggregated = match dp {
        Dataplane::Aggregated(aggregation) => Some(aggregation.guard()),
        _ => None,
    };
    let _attached = match dp {
        Dataplane::Nft | Dataplane::Iptables | Dataplane::Aggregated(_) => None,
        Dataplane::Ebpf(attachment) => match ebpf_programs_built(&test) {
            true => Some(attachment.create()),
            false => return,
        },
    };
    f(dp);
}

/// A Service manifest.
pub fn service(name: &str, extra: &str, ports: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec:\n{extra}  ports:\n{ports}"
    )
}

/// An EndpointSlice manifest with `(ip, node, ready, serving, terminating)` endpoints.
pub fn slice(
    name: &str,
    service: &str,
    family: &str,
    ports: &str,
    endpoints: &[(&str, &str, bool, bool, bool)],
) -> String {
    let mut text = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: test\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {family}\nports:\n{ports}endpoints:\n"
    );
    for (ip, node, ready, serving, terminating) in endpoints {
        text.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  nodeName: {node}\n  conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}\n"
        ));
    }
    text
}

/// Runs kpng once in the node namespace over `manifests`; its log.
pub fn program(cluster: &Cluster, dp: Dataplane, manifests: &str, extra: &[&str]) -> String {
    program_node(cluster, dp, NODE_A, manifests, extra)
}

/// [`program`] with `node` (a Node manifest) in place of [`NODE_A`].
pub fn program_node(
    cluster: &Cluster,
    dp: Dataplane,
    node: &str,
    manifests: &str,
    extra: &[&str],
) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, format!("{node}{manifests}")).unwrap();
    let mut extra = extra.to_vec();
    extra.insert(0, "--once");
    let out = dp.kpng(cluster, &dp.args(&path, false, &extra)).output().expect("running kpng");
    let log = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "kpng failed: {log}");
    log
}

/// A TCP probe from `from` that must reach an endpoint: its name and the client address it
/// saw. A timeout is retried twice: on two busy cores a first SYN can wait out the probe's
/// window in neighbour resolution.
pub fn reach(from: &kpng_testkit::netns::Netns, target: &str) -> (String, IpAddr) {
    let mut outcome = Cluster::tcp(from, target);
    for _ in 0..2 {
        if outcome != Outcome::Timeout {
            break;
        }
        outcome = Cluster::tcp(from, target);
    }
    answer(&outcome)
}

/// One more exchange of the UDP flow from `source_port` of `from` to `target`. A timeout is
/// retried twice, as in [`reach`]; the retries belong to the same flow. So is an
/// "Address already in use" from the socket calls, seen once under a full parallel run
/// (an answer from another endpoint still fails the caller's check).
pub fn udp_flow(from: &kpng_testkit::netns::Netns, target: &str, source_port: u16) -> Outcome {
    let transient = |outcome: &Outcome| match outcome {
        Outcome::Timeout => true,
        Outcome::Error(error) => error.contains("os error 98"),
        _ => false,
    };
    let mut outcome = Cluster::udp(from, target, source_port);
    for _ in 0..2 {
        if !transient(&outcome) {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        outcome = Cluster::udp(from, target, source_port);
    }
    outcome
}

pub fn answer(outcome: &Outcome) -> (String, IpAddr) {
    match outcome {
        Outcome::Answer { name, peer } => (name.clone(), *peer),
        other => panic!("expected an answer, got {other}"),
    }
}

/// The endpoints that answered `n` TCP probes.
pub fn tcp_names(from: &kpng_testkit::netns::Netns, target: &str, n: usize) -> BTreeSet<String> {
    (0..n).map(|_| reach(from, target).0).collect()
}

/// Service `web` on `cluster_ip`, port 80 to 8080, with `endpoints` in one IPv4 slice.
pub fn web(cluster_ip: &str, endpoints: &[Ep<'_>]) -> String {
    [
        service("web", &format!("  clusterIP: {cluster_ip}\n"), PORT_HTTP),
        slice("web-1", "web", "IPv4", SLICE_HTTP, endpoints),
    ]
    .concat()
}

pub fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

/// Waits until `done` holds; fails naming `what` after 30 s.
pub fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let start = std::time::Instant::now();
    while !done() {
        assert!(
            start.elapsed() < std::time::Duration::from_secs(30),
            "timed out waiting until {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// How many endpoints the node's rules hold for a ClusterIP destination
/// (`10.96.0.60 . tcp . 80`).
pub fn slots(cluster: &Cluster, dp: Dataplane, dest: &str) -> usize {
    backends(cluster, dp, dest).len()
}

/// The endpoints (`ip . port`, sorted) the node's rules hold for a ClusterIP destination
/// (`10.96.0.60 . tcp . 80`): elements of `to-nft`'s Cluster backends maps (one per bucket
/// of endpoint counts), or the DNAT targets of `to-iptables`' endpoint chains.
pub fn backends(cluster: &Cluster, dp: Dataplane, dest: &str) -> Vec<String> {
    let mut found = match dp {
        Dataplane::Iptables => iptables_backends(cluster, dest),
        _ => {
            let out = cluster.node.output("nft", &["list", "table", "ip", "kpng"]);
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            // Each map's text runs from its header to its closing brace.
            text.split("\tmap ")
                .filter(|map| map.starts_with("cluster_backends_"))
                .map(|map| map.split("\n\t}").next().unwrap_or_default())
                .flat_map(|map| map.split([',', '{', '}']))
                .filter(|element| element.trim().starts_with(&format!("{dest} . ")))
                .filter_map(|element| element.split(" : ").nth(1).map(|v| v.trim().to_string()))
                .collect()
        }
    };
    found.sort();
    found
}

/// The rules of the node's IPv4 nat chains, by chain.
pub fn iptables_nat(cluster: &Cluster) -> std::collections::BTreeMap<String, Vec<String>> {
    let out = cluster.node.output("iptables-save", &["-t", "nat"]);
    let mut chains: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        if let Some(rule) = line.strip_prefix("-A ") {
            let (chain, rest) = rule.split_once(' ').unwrap_or((rule, ""));
            chains.entry(chain.to_string()).or_default().push(rest.to_string());
        }
    }
    chains
}

fn iptables_backends(cluster: &Cluster, dest: &str) -> Vec<String> {
    let parts: Vec<&str> = dest.split(" . ").collect();
    let [ip, protocol, port] = parts[..] else { panic!("not a destination: {dest}") };
    let chains = iptables_nat(cluster);
    let entry = format!("-d {ip}/32 -p {protocol} -m {protocol} --dport {port} -j ");
    let Some(pick) = chains
        .iter()
        .filter(|(name, _)| name.starts_with("KPNG-SH-"))
        .flat_map(|(_, rules)| rules)
        .find_map(|r| r.strip_prefix(&entry))
    else {
        return Vec::new();
    };
    let seps: BTreeSet<&str> = chains[pick]
        .iter()
        .filter_map(|r| r.rsplit("-j ").next())
        .filter(|target| target.starts_with("KPNG-SEP-"))
        .collect();
    seps.iter()
        .filter_map(|sep| {
            let dnat =
                chains.get(*sep)?.iter().find_map(|r| r.split("--to-destination ").nth(1))?;
            let (ip, port) = dnat.rsplit_once(':')?;
            Some(format!("{ip} . {port}"))
        })
        .collect()
}

/// Conntrack entries in the node namespace matching `filter` (`conntrack -L` arguments).
pub fn conntrack(cluster: &Cluster, filter: &[&str]) -> Vec<String> {
    let mut args = vec!["-L"];
    args.extend_from_slice(filter);
    let out = cluster.node.output("conntrack", &args);
    String::from_utf8_lossy(&out.stdout).lines().map(str::to_string).collect()
}

/// Polls `probe` until it gives `want` (the dataplane converges after a file edit).
pub fn eventually(mut probe: impl FnMut() -> Outcome, want: impl Fn(&Outcome) -> bool) -> Outcome {
    let start = std::time::Instant::now();
    loop {
        let outcome = probe();
        if want(&outcome) || start.elapsed() > std::time::Duration::from_secs(20) {
            return outcome;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// What kpng logs when a verification finds drift, whether the verification repairs it
/// where it found it or the whole state does.
pub const DRIFT: &str = "the kernel no longer holds what kpng committed";

pub const HTTP_PORTS: &str = "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n  - {name: dns, protocol: UDP, port: 53, targetPort: 8080}\n";
pub const NODE_PORTS: &str = "  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080}\n  - {name: dns, protocol: UDP, port: 53, targetPort: 8080, nodePort: 30053}\n";
pub const SLICE_PORTS: &str =
    "- {name: http, protocol: TCP, port: 8080}\n- {name: dns, protocol: UDP, port: 8080}\n";
pub const SLICE_HTTP: &str = "- {name: http, protocol: TCP, port: 8080}\n";
pub const PORT_HTTP: &str = "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n";
/// An endpoint: address, node, ready, serving, terminating.
pub type Ep<'a> = (&'a str, &'a str, bool, bool, bool);
/// The ready pod `web-a` on node-a, and `web-b` on node-b.
pub const WEB_A: Ep<'static> = ("10.244.0.10", "node-a", true, true, false);
pub const WEB_B: Ep<'static> = ("10.244.1.10", "node-b", true, true, false);
pub const DNS_PORT: &str = "  - {name: dns, protocol: UDP, port: 53, targetPort: 8080}\n";
pub const SLICE_DNS: &str = "- {name: dns, protocol: UDP, port: 8080}\n";

pub const NODE_A: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/zone: zone-1}
spec:
  podCIDRs: [10.244.0.0/24, "fd00:244::/64"]
status:
  addresses:
  - {type: InternalIP, address: 192.168.10.1}
  - {type: InternalIP, address: "fd00:10::1"}
"#;

/// kpng running with `--watch` in the node namespace over a manifests file; stopped on drop.
pub struct Watched {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Watched {
    pub fn start(cluster: &Cluster, dp: Dataplane, manifests: &str) -> Watched {
        Watched::start_with(cluster, dp, manifests, &[])
    }

    pub fn start_with(
        cluster: &Cluster,
        dp: Dataplane,
        manifests: &str,
        extra: &[&str],
    ) -> Watched {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.yaml");
        std::fs::write(&path, format!("{NODE_A}{manifests}")).unwrap();
        let log = std::fs::File::create(dir.path().join("kpng.log")).unwrap();
        let child = dp.kpng(cluster, &dp.args(&path, true, extra)).stderr(log).spawn().unwrap();
        Watched { dir, child }
    }

    /// Replaces the manifests the way editors do (write, then rename).
    pub fn write(&self, manifests: &str) {
        let tmp = self.dir.path().join("edit.tmp");
        std::fs::write(&tmp, format!("{NODE_A}{manifests}")).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("cluster.yaml")).unwrap();
    }

    /// The process id of this kpng.
    pub fn pid(&self) -> u32 {
        // `ip netns exec` and `nsenter` replace themselves with kpng: the child's pid is
        // kpng's.
        self.child.id()
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kpng.log")).unwrap_or_default()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The packets that arrive on the node's LAN interface from and to `address`: counted at
/// its ingress, before anything of the IP stack (nftlb forwards there), by a table of the
/// test's own.
pub struct Counters<'c> {
    node: &'c kpng_testkit::netns::Netns,
}

impl<'c> Counters<'c> {
    pub fn install(node: &'c kpng_testkit::netns::Netns, address: &str) -> Counters<'c> {
        let script = format!(
            "table netdev probe {{\nchain lan {{\n\
             type filter hook ingress device \"eth0\" priority -500;\n\
             ip daddr {address} counter\nip saddr {address} counter\n}}\n}}\n"
        );
        let mut nft = node.command("nft", &["-f", "-"]);
        nft.stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped());
        let mut child = nft.spawn().expect("running nft");
        let mut stdin = child.stdin.take().expect("nft's standard input");
        std::io::Write::write_all(&mut stdin, script.as_bytes()).unwrap();
        drop(stdin);
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        Counters { node }
    }

    /// Packets to the address, and from it.
    pub fn read(&self) -> (u64, u64) {
        let out = self.node.output("nft", &["list", "table", "netdev", "probe"]);
        let text = String::from_utf8_lossy(&out.stdout);
        let packets: Vec<u64> = text
            .split("packets ")
            .skip(1)
            .map(|rest| rest.split(' ').next().unwrap().parse().unwrap())
            .collect();
        assert_eq!(packets.len(), 2, "{text} {out:?}");
        (packets[0], packets[1])
    }
}
