//! What every dataplane shares in the real-packet tests: the manifests, how kpng is run in
//! the node namespace, and the probes' helpers.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpng_testkit::privileged::require;
use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

/// A dataplane backend the scenarios run against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dataplane {
    /// `to-nft`.
    Nft,
}

impl Dataplane {
    /// The backend on kpng's command line.
    pub fn backend(self) -> &'static str {
        match self {
            Dataplane::Nft => "to-nft",
        }
    }

    /// The commands its scenarios need.
    fn tools(self) -> &'static [&'static str] {
        match self {
            Dataplane::Nft => &["nft", "ip", "curl"],
        }
    }
}

/// Runs scenario `f` on dataplane `dp`, when the machine can (root, tools; under CI=true it
/// must).
pub fn run(name: &str, dp: Dataplane, f: fn(Dataplane)) {
    if require(&format!("{name} ({})", dp.backend()), dp.tools()) {
        f(dp);
    }
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
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, format!("{NODE_A}{manifests}")).unwrap();
    let mut args = vec![
        "file",
        "--input",
        path.to_str().unwrap(),
        "to-local",
        "--node",
        "node-a",
        dp.backend(),
        "--once",
    ];
    args.extend_from_slice(extra);
    let out = cluster.node.output(env!("CARGO_BIN_EXE_kpng"), &args);
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

/// How many endpoint slots the node's `ip kpng` table holds for a ClusterIP destination
/// (`10.96.0.60 . tcp . 80`).
pub fn slots(cluster: &Cluster, dest: &str) -> usize {
    let out = cluster.node.output("nft", &["list", "map", "ip", "kpng", "cluster_backends"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split([',', '{', '}'])
        .filter(|element| element.trim().starts_with(&format!("{dest} . ")))
        .count()
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
        let mut args = vec![
            "file",
            "--input",
            path.to_str().unwrap(),
            "--watch",
            "to-local",
            "--node",
            "node-a",
            dp.backend(),
        ];
        args.extend_from_slice(extra);
        let log = std::fs::File::create(dir.path().join("kpng.log")).unwrap();
        let child =
            cluster.node.command(env!("CARGO_BIN_EXE_kpng"), &args).stderr(log).spawn().unwrap();
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
        // `ip netns exec` replaces itself with kpng: the child's pid is kpng's.
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
