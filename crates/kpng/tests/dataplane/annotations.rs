//! The kube-nftlb load-balancing annotations, enforced by `to-nft`: round robin, hash and
//! symmetric hash, timed persistence, `dnat`, `snat`, `stlsdnat` and `dsr` modes, logging
//! of new connections, and the FTP conntrack helper.

use std::collections::BTreeSet;
use std::time::Duration;

use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

use crate::harness::*;

const PREFIX: &str = "service.kubernetes.io/kube-nftlb-load-balancer-";
pub const CLIENT: &str = "192.168.10.100";

/// Service `name` at `cluster_ip` with `annotations` (`key: value` pairs), further `spec`
/// lines, and endpoints web-a and web-b.
fn annotated(name: &str, cluster_ip: &str, annotations: &[(&str, &str)], spec: &str) -> String {
    annotated_on(name, cluster_ip, annotations, spec, &[WEB_A, WEB_B])
}

/// The same with these endpoints.
pub fn annotated_on(
    name: &str,
    cluster_ip: &str,
    annotations: &[(&str, &str)],
    spec: &str,
    endpoints: &[Ep<'_>],
) -> String {
    annotated_ports(name, cluster_ip, annotations, spec, endpoints, (PORT_HTTP, SLICE_HTTP))
}

/// The same with these ports: the service's and the slice's.
fn annotated_ports(
    name: &str,
    cluster_ip: &str,
    annotations: &[(&str, &str)],
    spec: &str,
    endpoints: &[Ep<'_>],
    (port, slice_port): (&str, &str),
) -> String {
    let annotations: Vec<String> =
        annotations.iter().map(|(k, v)| format!("{PREFIX}{k}: \"{v}\"")).collect();
    let service = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: {name}\n  namespace: test\n  annotations: {{{}}}\nspec:\n  clusterIP: {cluster_ip}\n{spec}  ports:\n{port}",
        annotations.join(", ")
    );
    [service, slice(&format!("{name}-1"), name, "IPv4", slice_port, endpoints)].concat()
}

fn two_pods() -> Cluster {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    cluster
}

pub fn round_robin_takes_the_endpoints_in_turn(dp: Dataplane) {
    let cluster = two_pods();
    program(&cluster, dp, &annotated("rr", "10.96.0.120", &[("scheduler", "rr")], ""), &[]);
    let names: Vec<String> = (0..10).map(|_| reach(&cluster.client, "10.96.0.120:80").0).collect();
    for pair in names.windows(2) {
        assert_ne!(pair[0], pair[1], "each connection takes the next endpoint: {names:?}");
    }
}

pub fn hash_persistence_keeps_a_client_on_one_endpoint(dp: Dataplane) {
    let cluster = two_pods();
    let settings = [("scheduler", "hash"), ("persistence", "srcip")];
    let log = program(&cluster, dp, &annotated("hashed", "10.96.0.121", &settings, ""), &[]);
    let first = reach(&cluster.client, "10.96.0.121:80").0;
    for _ in 0..12 {
        assert_eq!(reach(&cluster.client, "10.96.0.121:80").0, first, "{log}");
    }
    let ruleset = cluster.node.output("nft", &["list", "table", "ip", "kpng"]);
    let ruleset = String::from_utf8_lossy(&ruleset.stdout);
    assert!(ruleset.contains("jhash ip saddr mod 2"), "{ruleset}");
}

/// The endpoint that answers a UDP flow from the client to `target` from each of `ports`.
fn flow_endpoints(cluster: &Cluster, target: &str, ports: &[u16]) -> Vec<String> {
    ports.iter().map(|port| answer(&udp_flow(&cluster.client, target, *port)).0).collect()
}

pub fn symmetric_hash_keeps_each_flow_on_one_endpoint(dp: Dataplane) {
    let cluster = two_pods();
    let manifests = annotated_ports(
        "sym",
        "10.96.0.124",
        &[("scheduler", "symhash")],
        "",
        &[WEB_A, WEB_B],
        (DNS_PORT, SLICE_DNS),
    );
    let log = program(&cluster, dp, &manifests, &[]);
    // Sixteen flows from as many source ports of one client.
    let ports: Vec<u16> = (40100..40116).collect();
    let first = flow_endpoints(&cluster, "10.96.0.124:53", &ports);
    assert!(
        first.iter().any(|e| e == "web-a") && first.iter().any(|e| e == "web-b"),
        "flows of different ports spread over both endpoints: {first:?}"
    );
    // Forgotten by conntrack, each flow is hashed again to the same endpoint: the choice
    // is a function of the flow's addresses and ports (a random one would move about
    // half of them).
    let flushed =
        cluster.node.output("conntrack", &["-D", "-p", "udp", "--orig-dst", "10.96.0.124"]);
    assert!(flushed.status.success() || flushed.status.code() == Some(1), "{flushed:?}");
    assert_eq!(flow_endpoints(&cluster, "10.96.0.124:53", &ports), first, "{log}");
    let ruleset = cluster.node.output("nft", &["list", "table", "ip", "kpng"]);
    let ruleset = String::from_utf8_lossy(&ruleset.stdout);
    assert!(ruleset.contains("symhash mod 2"), "{ruleset}");
}

pub fn stateless_dnat_rewrites_both_ways_without_conntrack(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-c", true, 11, &[8080]);
    // Both endpoints answer through the node, as stateless DNAT needs.
    let web_c: Ep<'_> = ("10.244.0.11", "node-a", true, true, false);
    let manifests = annotated_ports(
        "stateless",
        "10.96.0.126",
        &[("mode", "stlsdnat")],
        "  externalIPs: [192.0.2.126]\n",
        &[WEB_A, web_c],
        (&[PORT_HTTP, DNS_PORT].concat(), &[SLICE_HTTP, SLICE_DNS].concat()),
    );
    let log = program(&cluster, dp, &manifests, &[]);
    let ruleset = cluster.node.output("nft", &["list", "table", "ip", "kpng"]);
    let ruleset = String::from_utf8_lossy(&ruleset.stdout);
    assert!(ruleset.contains("notrack"), "{ruleset}\n{log}");
    // TCP: every packet of a connection is rewritten to the same endpoint and back (the
    // client would reset a reply from any other address), which sees the client itself.
    for _ in 0..6 {
        assert_eq!(reach(&cluster.client, "10.96.0.126:80").1, ip(CLIENT), "{log}");
    }
    // UDP: flows of different source ports spread over both endpoints, and a flow asked
    // again reaches the same one (the hash of address and port, not a remembered choice).
    let ports: Vec<u16> = (40200..40216).collect();
    let first = flow_endpoints(&cluster, "10.96.0.126:53", &ports);
    assert!(
        first.iter().any(|e| e == "web-a") && first.iter().any(|e| e == "web-c"),
        "flows spread over both endpoints: {first:?}"
    );
    assert_eq!(flow_endpoints(&cluster, "10.96.0.126:53", &ports), first);
    // Conntrack saw none of it, in either direction.
    let tracked = cluster.node.output("conntrack", &["-L"]);
    let tracked = String::from_utf8_lossy(&tracked.stdout);
    for address in ["10.96.0.126", CLIENT] {
        assert!(!tracked.contains(address), "{address} tracked:\n{tracked}");
    }
    // The endpoints' replies always leave as the ClusterIP: the external IP, whose replies
    // would be rewritten too, is rejected instead of half served.
    assert_eq!(Cluster::tcp(&cluster.client, "192.0.2.126:80"), Outcome::Refused);
    // A restart reads the stateless chains back (rewrites, notrack, the route-type base
    // chain) as what it would write.
    let again = program(&cluster, dp, &manifests, &[]);
    assert!(dp.started_without_changes(&again), "{again}");
}

/// Endpoints `web-l` and `web-m` on the node's LAN (192.168.10.3 and .4), each holding
/// `cluster_ip` on its loopback and serving port 80, as direct server return needs; and the
/// manifests of service `direct` at `cluster_ip` with `mode: dsr` over them.
pub fn direct_endpoints(cluster: &mut Cluster, cluster_ip: &str) -> String {
    for (name, n) in [("web-l", 3), ("web-m", 4)] {
        let host = cluster.add_lan_host(name, n, &[80]);
        host.ns.ip(&["link", "set", "lo", "up"]);
        host.ns.ip(&["addr", "add", &format!("{cluster_ip}/32"), "dev", "lo"]);
    }
    let on_lan = |address| (address, "node-b", true, true, false);
    let ports = "  - {name: http, protocol: TCP, port: 80, targetPort: 80}\n";
    let slice_ports = "- {name: http, protocol: TCP, port: 80}\n";
    annotated_ports(
        "direct",
        cluster_ip,
        &[("mode", "dsr")],
        "",
        &[on_lan("192.168.10.3"), on_lan("192.168.10.4")],
        (ports, slice_ports),
    )
}

/// Twenty connections to `target`, a [`direct_endpoints`] service: each reaches one
/// endpoint, which sees the client itself and answers it as the ClusterIP (every packet of
/// a connection reaches the same endpoint: another would reset it); they spread over both
/// (all twenty on one: 2^-19); the node counts every request and no answer, which went
/// from the endpoints straight to the client over the LAN.
pub fn answered_directly(cluster: &Cluster, target: &str, context: &dyn Fn() -> String) {
    let cluster_ip = target.split(':').next().unwrap();
    let counters = Counters::install(&cluster.node, cluster_ip);
    let mut seen = BTreeSet::new();
    for _ in 0..20 {
        let (name, peer) = reach(&cluster.client, target);
        assert_eq!(peer, ip(CLIENT), "{}", context());
        seen.insert(name);
    }
    assert_eq!(seen.len(), 2, "{seen:?}");
    let (requests, replies) = counters.read();
    assert!(requests >= 20 * 3, "{requests} requests counted");
    assert_eq!(replies, 0, "answers came through the node");
}

pub fn direct_server_return_answers_the_client_straight(dp: Dataplane) {
    let mut cluster = Cluster::new();
    let manifests = direct_endpoints(&mut cluster, "10.96.0.127");
    let log = program(&cluster, dp, &manifests, &[]);
    answered_directly(&cluster, "10.96.0.127:80", &|| log.clone());
    // Conntrack saw none of it.
    let tracked = cluster.node.output("conntrack", &["-L"]);
    let tracked = String::from_utf8_lossy(&tracked.stdout);
    assert!(!tracked.contains("10.96.0.127"), "{tracked}");
    // A restart reads the chains back as what it would write.
    let again = program(&cluster, dp, &manifests, &[]);
    assert!(dp.started_without_changes(&again), "{again}");
}

pub fn persistence_sticks_until_its_timeout(dp: Dataplane) {
    let cluster = two_pods();
    // The annotation's key with the affinity config's timeout (1 s).
    let spec =
        "  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 1}}\n";
    program(
        &cluster,
        dp,
        &annotated("sticky", "10.96.0.122", &[("persistence", "srcip")], spec),
        &[],
    );
    let first = reach(&cluster.client, "10.96.0.122:80").0;
    for _ in 0..8 {
        assert_eq!(reach(&cluster.client, "10.96.0.122:80").0, first, "sticky");
    }
    // Once the client has been idle for longer than the timeout it chooses again: with
    // two endpoints it lands on the other one within a few tries (1 in 2^20 never does in
    // twenty; the scenario runs on several dataplanes in every test run).
    let moved = (0..20).any(|_| {
        std::thread::sleep(Duration::from_millis(1600));
        reach(&cluster.client, "10.96.0.122:80").0 != first
    });
    assert!(moved, "the client never chose again after the timeout");
}

pub fn dnat_shows_the_client_and_snat_always_masquerades(dp: Dataplane) {
    let mut cluster = two_pods();
    cluster.add_pod("client-pod", true, 20, &[9999]);
    let mut pod = dp.local(&cluster.pod("client-pod").ns);
    let own = ip("10.244.0.20");
    let client = ip(CLIENT);
    // web-a only: it answers through the node, as dnat needs (web-b, on the client's LAN,
    // would answer the client directly).
    let web =
        |settings: &[(&str, &str)]| annotated_on("plain", "10.96.0.123", settings, "", &[WEB_A]);
    // Without annotations: an outside client is masqueraded, a local pod is not.
    program(&cluster, dp, &web(&[]), &[]);
    assert_ne!(reach(&cluster.client, "10.96.0.123:80").1, client);
    assert_eq!(pod.reach("10.96.0.123:80").1, own);
    // dnat: the endpoint sees the outside client's own address.
    program(&cluster, dp, &web(&[("mode", "dnat")]), &[]);
    for _ in 0..4 {
        assert_eq!(reach(&cluster.client, "10.96.0.123:80").1, client);
    }
    // snat: even a local pod is masqueraded.
    program(&cluster, dp, &web(&[("mode", "snat")]), &[]);
    for _ in 0..4 {
        assert_ne!(pod.reach("10.96.0.123:80").1, own);
    }
}

pub fn the_ftp_helper_follows_active_data_connections(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("ftp-a", true, 30, &[]);
    kpng_testkit::ftp::serve(&cluster.pod("ftp-a").ns, "ftp-a", 8080);
    let ftp_a: Ep<'_> = ("10.244.0.30", "node-a", true, true, false);
    let manifests = annotated_on("files", "10.96.0.125", &[("helper", "ftp")], "", &[ftp_a]);
    let log = program(&cluster, dp, &manifests, &[]);
    let ruleset = cluster.node.output("nft", &["list", "table", "ip", "kpng"]);
    let ruleset = String::from_utf8_lossy(&ruleset.stdout);
    assert!(ruleset.contains("ct helper helper_ftp_tcp"), "{ruleset}\n{log}");
    // The server opens the data connection to the address the client gave in PORT.
    let server = "10.96.0.125:80".parse().unwrap();
    let got = kpng_testkit::ftp::retrieve(&cluster.client, server).expect("an active-mode RETR");
    // The control connection is masqueraded, and the NAT helper rewrote the client's PORT
    // to the masquerading address, which leads the data connection back to the client.
    let words: Vec<&str> = got.content.split(' ').collect();
    assert_eq!(words.len(), 3, "{got:?}");
    assert_eq!(words[0], "ftp-a");
    assert_ne!(words[1], CLIENT, "masqueraded: {got:?}");
    assert_eq!(words[1], words[2], "PORT rewritten to the masquerading address: {got:?}");
    // Conntrack tracks the control connection with the FTP helper.
    let tracked =
        cluster.node.output("conntrack", &["-L", "-p", "tcp", "--orig-dst", "10.96.0.125"]);
    let tracked = String::from_utf8_lossy(&tracked.stdout);
    assert!(tracked.contains("helper=ftp"), "{tracked}");
}

/// Sets a sysctl for the test's lifetime, restoring its value even on failure.
struct Sysctl {
    path: &'static str,
    before: String,
}

impl Sysctl {
    fn set(path: &'static str, value: &str) -> Sysctl {
        let before = std::fs::read_to_string(path).expect("reading the sysctl");
        std::fs::write(path, value).expect("writing the sysctl");
        Sysctl { path, before }
    }
}

impl Drop for Sysctl {
    fn drop(&mut self) {
        let _ = std::fs::write(self.path, self.before.trim());
    }
}

pub fn new_connections_are_logged_with_the_service_name(dp: Dataplane) {
    // Netfilter logs from a network namespace other than the host's only when allowed.
    let _all_netns = Sysctl::set("/proc/sys/net/netfilter/nf_log_all_netns", "1");
    let cluster = two_pods();
    let name = format!("logged{}", std::process::id());
    let manifests = annotated(&name, "10.96.0.124", &[("log", "forward")], "");
    program(&cluster, dp, &manifests, &[]);
    reach(&cluster.client, "10.96.0.124:80");
    let prefix = format!("kpng test/{name} ");
    wait_until("the kernel logs the connection", || {
        let out = std::process::Command::new("dmesg").output().expect("running dmesg");
        String::from_utf8_lossy(&out.stdout).contains(&prefix)
    });
    let dmesg = std::process::Command::new("dmesg").output().unwrap();
    let text = String::from_utf8_lossy(&dmesg.stdout);
    let line = text.lines().rev().find(|l| l.contains(&prefix)).unwrap();
    assert!(line.contains("SRC=192.168.10.100") && line.contains("DST=10.96.0.124"), "{line}");
}
