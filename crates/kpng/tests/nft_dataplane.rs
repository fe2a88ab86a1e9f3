//! Real packets through a real kernel: kpng programs a node namespace with `to-nft`, and
//! clients in other namespaces talk to pods through it.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpng_testkit::privileged::require;
use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

const NODE_A: &str = r#"
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

/// A Service manifest.
fn service(name: &str, extra: &str, ports: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec:\n{extra}  ports:\n{ports}"
    )
}

/// An EndpointSlice manifest with `(ip, node, ready, serving, terminating)` endpoints.
fn slice(
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

/// Runs kpng once in the node namespace over `manifests`.
fn program(cluster: &Cluster, manifests: &str, extra: &[&str]) {
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
        "to-nft",
        "--once",
    ];
    args.extend_from_slice(extra);
    let out = cluster.node.output(env!("CARGO_BIN_EXE_kpng"), &args);
    assert!(out.status.success(), "kpng failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A TCP probe from `from` that must reach an endpoint: its name and the client address it
/// saw. A timeout is retried twice: on two busy cores a first SYN can wait out the probe's
/// window in neighbour resolution.
fn reach(from: &kpng_testkit::netns::Netns, target: &str) -> (String, IpAddr) {
    let mut outcome = Cluster::tcp(from, target);
    for _ in 0..2 {
        if outcome != Outcome::Timeout {
            break;
        }
        outcome = Cluster::tcp(from, target);
    }
    answer(&outcome)
}

fn answer(outcome: &Outcome) -> (String, IpAddr) {
    match outcome {
        Outcome::Answer { name, peer } => (name.clone(), *peer),
        other => panic!("expected an answer, got {other}"),
    }
}

/// The endpoints that answered `n` TCP probes.
fn tcp_names(from: &kpng_testkit::netns::Netns, target: &str, n: usize) -> BTreeSet<String> {
    (0..n).map(|_| reach(from, target).0).collect()
}

const HTTP_PORTS: &str = "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n  - {name: dns, protocol: UDP, port: 53, targetPort: 8080}\n";
const NODE_PORTS: &str = "  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080}\n  - {name: dns, protocol: UDP, port: 53, targetPort: 8080, nodePort: 30053}\n";
const SLICE_PORTS: &str =
    "- {name: http, protocol: TCP, port: 8080}\n- {name: dns, protocol: UDP, port: 8080}\n";

#[test]
fn cluster_ip_node_port_and_rejects() {
    if !require("cluster_ip_node_port_and_rejects", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let manifests = [
        service("web", "  type: NodePort\n  clusterIP: 10.96.0.10\n", NODE_PORTS),
        slice(
            "web-1",
            "web",
            "IPv4",
            SLICE_PORTS,
            &[
                ("10.244.0.10", "node-a", true, true, false),
                ("10.244.1.10", "node-b", true, true, false),
            ],
        ),
        service("empty", "  clusterIP: 10.96.0.11\n", HTTP_PORTS),
    ]
    .concat();
    program(&cluster, &manifests, &[]);

    // ClusterIP over TCP reaches both endpoints (random choice), port remapped 80 -> 8080;
    // the client is outside the pod network, so it is masqueraded to the node's address.
    let names = tcp_names(&cluster.client, "10.96.0.10:80", 24);
    assert_eq!(names, BTreeSet::from(["web-a".to_string(), "web-b".to_string()]));
    let (_, peer) = reach(&cluster.client, "10.96.0.10:80");
    assert_eq!(
        peer,
        "192.168.10.1".parse::<IpAddr>().unwrap(),
        "ClusterIP traffic from outside is masqueraded"
    );

    // UDP on the same ClusterIP.
    let (name, _) = answer(&Cluster::udp(&cluster.client, "10.96.0.10:53", 0));
    assert!(name.starts_with("web-"), "{name}");

    // A port the service does not define is rejected, and so is a service without endpoints.
    assert_eq!(Cluster::tcp(&cluster.client, "10.96.0.10:81"), Outcome::Refused);
    assert_eq!(Cluster::tcp(&cluster.client, "10.96.0.11:80"), Outcome::Refused);
    assert_eq!(Cluster::udp(&cluster.client, "10.96.0.11:53", 0), Outcome::Refused);

    // NodePort on the node's primary address, both protocols.
    let names = tcp_names(&cluster.client, "192.168.10.1:30080", 24);
    assert_eq!(names, BTreeSet::from(["web-a".to_string(), "web-b".to_string()]));
    let (name, _) = answer(&Cluster::udp(&cluster.client, "192.168.10.1:30053", 0));
    assert!(name.starts_with("web-"), "{name}");

    // From a local pod, ClusterIP traffic keeps the pod's address, except when the pod
    // reaches itself (hairpin), which is masqueraded.
    let pod_ip: IpAddr = "10.244.0.10".parse().unwrap();
    let mut seen = BTreeSet::new();
    for _ in 0..24 {
        let (name, peer) = reach(&cluster.pod("web-a").ns, "10.96.0.10:80");
        match name.as_str() {
            "web-b" => {
                assert_eq!(peer, pod_ip, "pod traffic to a remote endpoint is not masqueraded")
            }
            _ => assert_ne!(peer, pod_ip, "hairpin traffic is masqueraded"),
        }
        seen.insert(name);
    }
    assert_eq!(seen.len(), 2);
}

const SLICE_HTTP: &str = "- {name: http, protocol: TCP, port: 8080}\n";
const PORT_HTTP: &str = "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n";

/// An endpoint: address, node, ready, serving, terminating.
type Ep<'a> = (&'a str, &'a str, bool, bool, bool);
/// The ready pod `web-a` on node-a, and `web-b` on node-b.
const WEB_A: Ep<'static> = ("10.244.0.10", "node-a", true, true, false);
const WEB_B: Ep<'static> = ("10.244.1.10", "node-b", true, true, false);

/// Service `web` on `cluster_ip`, port 80 to 8080, with `endpoints` in one IPv4 slice.
fn web(cluster_ip: &str, endpoints: &[Ep<'_>]) -> String {
    [
        service("web", &format!("  clusterIP: {cluster_ip}\n"), PORT_HTTP),
        slice("web-1", "web", "IPv4", SLICE_HTTP, endpoints),
    ]
    .concat()
}

fn ip(text: &str) -> IpAddr {
    text.parse().unwrap()
}

#[test]
fn restart_changes_nothing_and_keeps_established_connections() {
    if !require("restart_changes_nothing_and_keeps_established_connections", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = web("10.96.0.10", &[WEB_A]);
    program(&cluster, &manifests, &[]);
    // Hold a connection open through the service.
    let (to_conn, from_test) = std::sync::mpsc::channel::<()>();
    let (to_test, from_conn) = std::sync::mpsc::channel::<Vec<String>>();
    let client = cluster.client.name().to_string();
    let holder = std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        let ns = std::fs::File::open(format!("/var/run/netns/{client}")).unwrap();
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let stream = std::net::TcpStream::connect("10.96.0.10:80").unwrap();
        stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut lines = vec![String::new()];
        reader.read_line(&mut lines[0]).unwrap();
        from_test.recv().unwrap();
        (&stream).write_all(b"again\n").unwrap();
        let mut second = String::new();
        let _ = reader.read_line(&mut second);
        lines.push(second);
        to_test.send(lines).unwrap();
    });
    // Restart kpng over the existing table.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, format!("{NODE_A}{manifests}")).unwrap();
    let args = [
        "file",
        "--input",
        path.to_str().unwrap(),
        "to-local",
        "--node",
        "node-a",
        "to-nft",
        "--once",
    ];
    let out = cluster.node.output(env!("CARGO_BIN_EXE_kpng"), &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("already holds this state"),
        "a restart with nothing to change changes nothing: {stderr}"
    );
    to_conn.send(()).unwrap();
    let lines = from_conn.recv().unwrap();
    holder.join().unwrap();
    assert!(lines[0].starts_with("web-a "), "{lines:?}");
    assert!(
        lines[1].starts_with("web-a "),
        "the established connection still works after the restart: {lines:?}"
    );
}

#[test]
fn external_ips_and_load_balancer_source_ranges() {
    if !require("external_ips_and_load_balancer_source_ranges", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let lb = |name: &str, cluster_ip: &str, lb_ip: &str, node_port: u16, ranges: &str| {
        service(
            name,
            &format!(
                "  type: LoadBalancer\n  clusterIP: {cluster_ip}\n  loadBalancerSourceRanges: [{ranges}]\n"
            ),
            &format!(
                "  - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {node_port}}}\n"
            ),
        ) + &format!("status:\n  loadBalancer:\n    ingress: [{{ip: {lb_ip}}}]\n")
    };
    let endpoints = [("10.244.0.10", "node-a", true, true, false)];
    let manifests = [
        service("legacy", "  clusterIP: 10.96.0.20\n  externalIPs: [192.0.2.50]\n", PORT_HTTP),
        slice("legacy-1", "legacy", "IPv4", SLICE_HTTP, &endpoints),
        lb("open", "10.96.0.21", "203.0.113.21", 30021, "192.168.10.0/24"),
        slice("open-1", "open", "IPv4", SLICE_HTTP, &endpoints),
        lb("closed", "10.96.0.22", "203.0.113.22", 30022, "198.51.100.0/24"),
        slice("closed-1", "closed", "IPv4", SLICE_HTTP, &endpoints),
    ]
    .concat();
    program(&cluster, &manifests, &[]);

    // External IP: served, and masqueraded (externalTrafficPolicy Cluster).
    let (name, peer) = reach(&cluster.client, "192.0.2.50:80");
    assert_eq!((name.as_str(), peer), ("web-a", ip("192.168.10.1")));
    // LB IP whose ranges include the client: allowed.
    assert_eq!(reach(&cluster.client, "203.0.113.21:80").0, "web-a");
    // LB IP whose ranges exclude the client: dropped, for pods too.
    assert_eq!(Cluster::tcp(&cluster.client, "203.0.113.22:80"), Outcome::Timeout);
    assert_eq!(Cluster::tcp(&cluster.pod("web-a").ns, "203.0.113.22:80"), Outcome::Timeout);
    // Neither the ClusterIP nor the NodePort of that service is filtered by the ranges.
    assert_eq!(reach(&cluster.client, "10.96.0.22:80").0, "web-a");
    assert_eq!(reach(&cluster.client, "192.168.10.1:30022").0, "web-a");
}

#[test]
fn external_traffic_policy_local() {
    if !require("external_traffic_policy_local", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    cluster.add_pod("client-pod", true, 20, &[9999]);
    let local = |name: &str, cluster_ip: &str, lb_ip: &str, node_port: u16| {
        service(
            name,
            &format!(
                "  type: LoadBalancer\n  clusterIP: {cluster_ip}\n  externalTrafficPolicy: Local\n  healthCheckNodePort: 32000\n"
            ),
            &format!(
                "  - {{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: {node_port}}}\n"
            ),
        ) + &format!("status:\n  loadBalancer:\n    ingress: [{{ip: {lb_ip}}}]\n")
    };
    let manifests = [
        local("both", "10.96.0.30", "203.0.113.30", 30030),
        slice(
            "both-1",
            "both",
            "IPv4",
            SLICE_HTTP,
            &[
                ("10.244.0.10", "node-a", true, true, false),
                ("10.244.1.10", "node-b", true, true, false),
            ],
        ),
        local("remote", "10.96.0.31", "203.0.113.31", 30031),
        slice(
            "remote-1",
            "remote",
            "IPv4",
            SLICE_HTTP,
            &[("10.244.1.10", "node-b", true, true, false)],
        ),
    ]
    .concat();
    program(&cluster, &manifests, &[]);

    // From outside: only the local endpoint, and the client's address is preserved.
    for target in ["203.0.113.30:80", "192.168.10.1:30030"] {
        for _ in 0..8 {
            assert_eq!(
                reach(&cluster.client, target),
                ("web-a".into(), ip("192.168.10.100")),
                "{target}"
            );
        }
    }
    // No local endpoint: outside traffic is dropped, not rejected.
    assert_eq!(Cluster::tcp(&cluster.client, "203.0.113.31:80"), Outcome::Timeout);
    assert_eq!(Cluster::tcp(&cluster.client, "192.168.10.1:30031"), Outcome::Timeout);
    // A local pod short-circuits to the Cluster set and succeeds, keeping its address.
    assert_eq!(
        reach(&cluster.pod("client-pod").ns, "203.0.113.31:80"),
        ("web-b".into(), ip("10.244.0.20"))
    );
    // The node itself reaches it too (masqueraded).
    assert_eq!(reach(&cluster.node, "203.0.113.31:80").0, "web-b");
    // The ClusterIP uses the Cluster set.
    assert_eq!(reach(&cluster.client, "10.96.0.31:80").0, "web-b");
}

#[test]
fn internal_policy_local_terminating_fallback_and_dual_stack() {
    if !require("internal_policy_local_terminating_fallback_and_dual_stack", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let manifests = [
        // internalTrafficPolicy Local with only a remote endpoint: dropped.
        service("itp", "  clusterIP: 10.96.0.40\n  internalTrafficPolicy: Local\n", PORT_HTTP),
        slice("itp-1", "itp", "IPv4", SLICE_HTTP, &[("10.244.1.10", "node-b", true, true, false)]),
        // Only a serving, terminating endpoint: still used.
        service("dying", "  clusterIP: 10.96.0.41\n", PORT_HTTP),
        slice(
            "dying-1",
            "dying",
            "IPv4",
            SLICE_HTTP,
            &[("10.244.1.10", "node-b", false, true, true)],
        ),
        // Dual-stack, endpoints in both families.
        service(
            "dual",
            "  clusterIP: 10.96.0.42\n  clusterIPs: [10.96.0.42, \"fd00:96::42\"]\n",
            PORT_HTTP,
        ),
        slice(
            "dual-4",
            "dual",
            "IPv4",
            SLICE_HTTP,
            &[("10.244.0.10", "node-a", true, true, false)],
        ),
        slice(
            "dual-6",
            "dual",
            "IPv6",
            SLICE_HTTP,
            &[("fd00:244::a", "node-a", true, true, false)],
        ),
        // Dual-stack with IPv4 endpoints only: IPv6 rejects.
        service(
            "half",
            "  clusterIP: 10.96.0.43\n  clusterIPs: [10.96.0.43, \"fd00:96::43\"]\n",
            PORT_HTTP,
        ),
        slice(
            "half-4",
            "half",
            "IPv4",
            SLICE_HTTP,
            &[("10.244.0.10", "node-a", true, true, false)],
        ),
    ]
    .concat();
    program(&cluster, &manifests, &[]);

    assert_eq!(Cluster::tcp(&cluster.pod("web-a").ns, "10.96.0.40:80"), Outcome::Timeout);
    assert_eq!(reach(&cluster.client, "10.96.0.41:80").0, "web-b");
    assert_eq!(reach(&cluster.client, "10.96.0.42:80").0, "web-a");
    let (name, _) = reach(&cluster.client, "[fd00:96::42]:80");
    assert_eq!(name, "web-a");
    assert_eq!(reach(&cluster.client, "10.96.0.43:80").0, "web-a");
    assert_eq!(Cluster::tcp(&cluster.client, "[fd00:96::43]:80"), Outcome::Refused);
}

/// kpng running with `--watch` in the node namespace over a manifests file; stopped on drop.
struct Watched {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl Watched {
    fn start(cluster: &Cluster, manifests: &str) -> Watched {
        Watched::start_with(cluster, manifests, &[])
    }

    fn start_with(cluster: &Cluster, manifests: &str, extra: &[&str]) -> Watched {
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
            "to-nft",
        ];
        args.extend_from_slice(extra);
        let log = std::fs::File::create(dir.path().join("kpng.log")).unwrap();
        let child =
            cluster.node.command(env!("CARGO_BIN_EXE_kpng"), &args).stderr(log).spawn().unwrap();
        Watched { dir, child }
    }

    /// Replaces the manifests the way editors do (write, then rename).
    fn write(&self, manifests: &str) {
        let tmp = self.dir.path().join("edit.tmp");
        std::fs::write(&tmp, format!("{NODE_A}{manifests}")).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("cluster.yaml")).unwrap();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kpng.log")).unwrap_or_default()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `done` holds; fails naming `what` after 30 s.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
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
fn slots(cluster: &Cluster, dest: &str) -> usize {
    let out = cluster.node.output("nft", &["list", "map", "ip", "kpng", "cluster_backends"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split([',', '{', '}'])
        .filter(|element| element.trim().starts_with(&format!("{dest} . ")))
        .count()
}

const DNS_PORT: &str = "  - {name: dns, protocol: UDP, port: 53, targetPort: 8080}\n";
const SLICE_DNS: &str = "- {name: dns, protocol: UDP, port: 8080}\n";

/// Polls `probe` until it gives `want` (the dataplane converges after a file edit).
fn eventually(mut probe: impl FnMut() -> Outcome, want: impl Fn(&Outcome) -> bool) -> Outcome {
    let start = std::time::Instant::now();
    loop {
        let outcome = probe();
        if want(&outcome) || start.elapsed() > std::time::Duration::from_secs(20) {
            return outcome;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn udp_flows_move_when_their_endpoint_goes() {
    if !require("udp_flows_move_when_their_endpoint_goes", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("dns-a", true, 10, &[8080]);
    cluster.add_pod("dns-b", false, 10, &[8080]);
    let to = |ep: &[(&str, &str, bool, bool, bool)]| {
        [
            service("dns", "  clusterIP: 10.96.0.50\n", DNS_PORT),
            slice("dns-1", "dns", "IPv4", SLICE_DNS, ep),
        ]
        .concat()
    };
    let a = ("10.244.0.10", "node-a", true, true, false);
    let b = ("10.244.1.10", "node-b", true, true, false);

    // A flow created before any rule exists: it leaves the node towards its default route.
    assert_eq!(Cluster::udp(&cluster.client, "10.96.0.51:53", 40001), Outcome::Timeout);

    // The flow to the removed endpoint must move to the remaining one: its entry is deleted.
    program(
        &cluster,
        &(to(&[b])
            + &service("late", "  clusterIP: 10.96.0.51\n", DNS_PORT)
            + &slice("late-1", "late", "IPv4", SLICE_DNS, &[a])),
        &[],
    );
    assert_eq!(answer(&Cluster::udp(&cluster.client, "10.96.0.50:53", 40000)).0, "dns-b");
    // The entry that predates the rules is gone too: the same flow now reaches the endpoint.
    assert_eq!(answer(&Cluster::udp(&cluster.client, "10.96.0.51:53", 40001)).0, "dns-a");
    program(&cluster, &to(&[a]), &[]);
    assert_eq!(answer(&Cluster::udp(&cluster.client, "10.96.0.50:53", 40000)).0, "dns-a");

    // Scale to zero while kpng watches the file: the flow is rejected, not blackholed.
    let kpng = Watched::start(&cluster, &to(&[a]));
    let probe = || Cluster::udp(&cluster.client, "10.96.0.50:53", 40002);
    assert_eq!(answer(&eventually(probe, |o| matches!(o, Outcome::Answer { .. }))).0, "dns-a");
    kpng.write(&to(&[]));
    assert_eq!(eventually(probe, |o| *o == Outcome::Refused), Outcome::Refused);
}

#[test]
fn updates_apply_while_traffic_flows() {
    if !require("updates_apply_while_traffic_flows", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let (a, b) = (WEB_A, WEB_B);
    let web = |eps: &[Ep<'_>]| web("10.96.0.60", eps);
    let kpng = Watched::start(&cluster, &web(&[a]));
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.60:80");
    let is = |name: &'static str| move |o: &Outcome| matches!(o, Outcome::Answer { name: n, .. } if n == name);
    assert!(is("web-a")(&eventually(probe, is("web-a"))));

    // Endpoint added: the new one starts answering.
    kpng.write(&web(&[a, b]));
    assert!(is("web-b")(&eventually(probe, is("web-b"))));
    // Endpoint removed: only the other one answers from then on.
    kpng.write(&web(&[b]));
    // Wait until the kernel holds the one-endpoint state, then every probe must agree.
    wait_until("the removal is applied", || slots(&cluster, "10.96.0.60 . tcp . 80") == 1);
    for _ in 0..10 {
        assert!(is("web-b")(&probe()));
    }
    // Service deleted: its address is no longer a service (the node routes it away).
    kpng.write("");
    assert_eq!(eventually(probe, |o| *o == Outcome::Timeout), Outcome::Timeout);
}

#[test]
fn sctp_cluster_ip_and_node_port() {
    if !require("sctp_cluster_ip_and_node_port", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let manifests = [
        service(
            "assoc",
            "  type: NodePort\n  clusterIP: 10.96.0.70\n",
            "  - {name: sctp, protocol: SCTP, port: 80, targetPort: 8080, nodePort: 30070}\n",
        ),
        slice(
            "assoc-1",
            "assoc",
            "IPv4",
            "- {name: sctp, protocol: SCTP, port: 8080}\n",
            &[
                ("10.244.0.10", "node-a", true, true, false),
                ("10.244.1.10", "node-b", true, true, false),
            ],
        ),
    ]
    .concat();
    program(&cluster, &manifests, &[]);
    let mut names = BTreeSet::new();
    for port in 0..24u16 {
        let (name, peer) = answer(&Cluster::sctp(&cluster.client, "10.96.0.70:80", 41000 + port));
        assert_eq!(peer, ip("192.168.10.1"), "SCTP to a ClusterIP from outside is masqueraded");
        names.insert(name);
    }
    assert_eq!(names, BTreeSet::from(["web-a".to_string(), "web-b".to_string()]));
    let (name, _) = answer(&Cluster::sctp(&cluster.client, "192.168.10.1:30070", 42000));
    assert!(name.starts_with("web-"), "{name}");
}

#[test]
fn a_rejected_transaction_is_retried_and_the_table_rebuilt() {
    if !require("a_rejected_transaction_is_retried_and_the_table_rebuilt", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let (a, b) = (WEB_A, WEB_B);
    let web = |eps: &[Ep<'_>]| web("10.96.0.80", eps);
    let kpng = Watched::start(&cluster, &web(&[a, b]));
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.80:80");
    assert!(matches!(
        eventually(probe, |o| matches!(o, Outcome::Answer { .. })),
        Outcome::Answer { .. }
    ));

    // Someone removes one of kpng's elements behind its back: kpng's next transaction,
    // which deletes that element, is rejected by the kernel as a whole.
    cluster.node.exec(
        "nft",
        &[
            "delete",
            "element",
            "ip",
            "kpng",
            "cluster_backends",
            "{ 10.96.0.80 . tcp . 80 . 1 : 10.244.1.10 . 8080 }",
        ],
    );
    kpng.write(&web(&[a]));
    wait_until("the failure is logged", || kpng.log().contains("change set failed"));
    let log = kpng.log();
    assert!(
        log.contains("the kernel rejected `delete element ip kpng"),
        "the failing operation is named:\n{log}"
    );
    // The retry starts from what the kernel holds and converges: only web-a remains.
    wait_until("the table is repaired", || slots(&cluster, "10.96.0.80 . tcp . 80") == 1);
    for _ in 0..8 {
        assert_eq!(answer(&probe()).0, "web-a");
    }
}

#[test]
fn node_ports_on_primary_or_chosen_addresses() {
    if !require("node_ports_on_primary_or_chosen_addresses", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.node.ip(&["addr", "add", "192.168.10.50/24", "dev", "eth0"]);
    let manifests = [
        service(
            "web",
            "  type: NodePort\n  clusterIP: 10.96.0.90\n",
            "  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30090}\n",
        ),
        slice("web-1", "web", "IPv4", SLICE_HTTP, &[("10.244.0.10", "node-a", true, true, false)]),
    ]
    .concat();
    // Default: only the Node object's primary address; elsewhere the port is left alone
    // (nothing listens on the node itself, so the connection is refused by its stack).
    program(&cluster, &manifests, &[]);
    assert_eq!(reach(&cluster.client, "192.168.10.1:30090").0, "web-a");
    assert_eq!(Cluster::tcp(&cluster.client, "192.168.10.50:30090"), Outcome::Refused);
    // With CIDRs: every local address inside them.
    program(&cluster, &manifests, &["--nodeport-addresses", "192.168.10.0/24"]);
    assert_eq!(reach(&cluster.client, "192.168.10.50:30090").0, "web-a");
    assert_eq!(reach(&cluster.client, "192.168.10.1:30090").0, "web-a");
}

#[test]
fn client_ip_affinity_sticks_across_addresses() {
    if !require("client_ip_affinity_sticks_across_addresses", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let a = ("10.244.0.10", "node-a", true, true, false);
    let b = ("10.244.1.10", "node-b", true, true, false);
    let web = |eps: &[(&str, &str, bool, bool, bool)]| {
        [
            service(
                "sticky",
                "  type: NodePort\n  clusterIP: 10.96.0.95\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 300}}\n",
                "  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30095}\n",
            ),
            slice("sticky-1", "sticky", "IPv4", SLICE_HTTP, eps),
        ]
        .concat()
    };
    program(&cluster, &web(&[a, b]), &[]);
    let first = reach(&cluster.client, "10.96.0.95:80").0;
    // The same client keeps the same endpoint, on the ClusterIP and on the NodePort.
    for target in ["10.96.0.95:80", "192.168.10.1:30095", "10.96.0.95:80"] {
        for _ in 0..8 {
            assert_eq!(reach(&cluster.client, target).0, first, "{target}");
        }
    }
    // Its endpoint goes away: the client moves to the other one and sticks there.
    let (remaining, other) = if first == "web-a" { (b, "web-b") } else { (a, "web-a") };
    program(&cluster, &web(&[remaining]), &[]);
    for _ in 0..8 {
        assert_eq!(reach(&cluster.client, "10.96.0.95:80").0, other);
    }
    // It comes back: the client stays where it is.
    program(&cluster, &web(&[a, b]), &[]);
    for _ in 0..8 {
        assert_eq!(reach(&cluster.client, "10.96.0.95:80").0, other);
    }
}

#[test]
fn masquerade_all_and_cluster_cidr() {
    if !require("masquerade_all_and_cluster_cidr", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("client-pod", true, 20, &[9999]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let manifests = web("10.96.0.97", &[WEB_B]);
    let pod = &cluster.pod("client-pod").ns;
    // Default detector (the node's podCIDRs): a local pod keeps its address.
    program(&cluster, &manifests, &[]);
    assert_eq!(reach(pod, "10.96.0.97:80").1, ip("10.244.0.20"));
    // --masquerade-all: every connection to a ClusterIP is masqueraded.
    program(&cluster, &manifests, &["--masquerade-all"]);
    assert_ne!(reach(pod, "10.96.0.97:80").1, ip("10.244.0.20"));
    // --cluster-cidr that does not cover the pod: it counts as outside, and is masqueraded.
    program(&cluster, &manifests, &["--cluster-cidr", "10.200.0.0/16"]);
    assert_ne!(reach(pod, "10.96.0.97:80").1, ip("10.244.0.20"));
    program(&cluster, &manifests, &["--cluster-cidr", "10.244.0.0/16"]);
    assert_eq!(reach(pod, "10.96.0.97:80").1, ip("10.244.0.20"));
}

#[test]
fn a_flushed_table_is_repaired_at_the_next_verification() {
    if !require("a_flushed_table_is_repaired_at_the_next_verification", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = web("10.96.0.80", &[WEB_A]);
    let kpng = Watched::start_with(&cluster, &manifests, &["--sync-period", "1s"]);
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.80:80");
    let answers = |o: &Outcome| matches!(o, Outcome::Answer { .. });
    assert!(answers(&eventually(probe, answers)), "{}", kpng.log());

    // Someone flushes kpng's table: its rules are gone.
    let rules = || {
        let out = cluster.node.output("nft", &["-a", "list", "chain", "ip", "kpng", "services"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().filter(|l| l.contains("# handle") && !l.contains("chain ")).count()
    };
    assert!(rules() > 0, "the services chain has rules");
    let out = cluster.node.output("nft", &["flush", "table", "ip", "kpng"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(rules(), 0, "flushed");
    // The next verification notices and puts everything back.
    let start = std::time::Instant::now();
    while !(kpng.log().contains("dataplane drifted") && rules() > 0) {
        assert!(
            start.elapsed().as_secs() < 30,
            "not repaired; rules {}; log:\n{}",
            rules(),
            kpng.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(answers(&eventually(probe, answers)), "{}", kpng.log());
}

#[test]
fn health_check_node_ports_follow_local_endpoints_and_ports() {
    if !require("health_check_node_ports_follow_local_endpoints_and_ports", &["nft", "ip", "curl"])
    {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let web = |hc_port: u16, endpoints: &[(&str, &str, bool, bool, bool)]| {
        service(
            "lb",
            &format!(
                "  type: LoadBalancer\n  clusterIP: 10.96.0.90\n  externalTrafficPolicy: Local\n  healthCheckNodePort: {hc_port}\n"
            ),
            "  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30090}\n",
        ) + "status:\n  loadBalancer:\n    ingress: [{ip: 203.0.113.90}]\n"
            + &slice("lb-1", "lb", "IPv4", SLICE_HTTP, endpoints)
    };
    let a = ("10.244.0.10", "node-a", true, true, false);
    let b = ("10.244.1.10", "node-b", true, true, false);
    let kpng = Watched::start(&cluster, &web(32100, &[a, b]));
    // What a load balancer's health check sees, from outside the node.
    let check = |port: u16| {
        let url = format!("http://192.168.10.1:{port}/healthz");
        let out = cluster.client.output("curl", &["-s", "-i", "--max-time", "2", &url]);
        String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n")
    };
    let wait = |port: u16, want: &str| {
        let start = std::time::Instant::now();
        loop {
            let got = check(port);
            if got.contains(want) {
                return got;
            }
            assert!(
                start.elapsed().as_secs() < 20,
                "port {port}: want {want:?}, got {got:?}\n{}",
                kpng.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    let ok = wait(32100, "HTTP/1.1 200");
    assert!(ok.contains("x-load-balancing-endpoint-weight: 1"), "{ok}");
    assert!(ok.contains("\"localEndpoints\":1"), "{ok}");
    assert!(ok.contains("\"name\":\"lb\""), "{ok}");

    // No local endpoint left: 503, weight 0.
    kpng.write(&web(32100, &[b]));
    let down = wait(32100, "HTTP/1.1 503");
    assert!(down.contains("x-load-balancing-endpoint-weight: 0"), "{down}");
    assert!(down.contains("\"localEndpoints\":0"), "{down}");

    // The port moves: the new one answers, the old one is closed.
    kpng.write(&web(32101, &[a]));
    wait(32101, "HTTP/1.1 200");
    let start = std::time::Instant::now();
    while !check(32100).is_empty() {
        assert!(start.elapsed().as_secs() < 20, "port 32100 still open");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}
