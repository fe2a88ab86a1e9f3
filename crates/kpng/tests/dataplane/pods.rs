//! What pods on the node see: every kind of socket, and connections made while endpoints
//! come and go. On `to-ebpf` these sockets are translated at `connect()`/`sendmsg()`.

use std::collections::BTreeSet;

use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

use crate::harness::*;

/// `web`: dual-stack ClusterIP 10.96.0.10 / fd00:96::10, TCP 80 and UDP 53 to 8080, on
/// web-a (this node) and web-b (the other node); IPv6 only on web-a. `empty`: no endpoint.
fn web_and_empty() -> String {
    [
        service(
            "web",
            "  clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.10, \"fd00:96::10\"]\n",
            HTTP_PORTS,
        ),
        slice("web-1", "web", "IPv4", SLICE_PORTS, &[WEB_A, WEB_B]),
        slice("web-2", "web", "IPv6", SLICE_PORTS, &[("fd00:244::a", "node-a", true, true, false)]),
        service("empty", "  clusterIP: 10.96.0.11\n", HTTP_PORTS),
    ]
    .concat()
}

pub fn pods_reach_cluster_ips_over_every_kind_of_socket(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    cluster.add_pod("client", true, 50, &[9999]);
    program(&cluster, dp, &web_and_empty(), &[]);
    let mut pod = dp.local(&cluster.pod("client").ns);

    // TCP: both endpoints, port 80 remapped to 8080; the endpoint sees the pod's own
    // address and the pod's getpeername() the service's.
    let both = BTreeSet::from(["web-a".to_string(), "web-b".to_string()]);
    assert_eq!(pod.names("10.96.0.10:80", 24), both);
    let (_, seen, getpeername) = pod.reach("10.96.0.10:80");
    assert_eq!((seen, getpeername.as_str()), (ip("10.244.0.50"), "10.96.0.10:80"));

    // UDP, connected and unconnected: replies come from the service address.
    let udp = pod.udp("10.96.0.10:53");
    assert!(matches!(&udp, Outcome::Answer { name, .. } if name.starts_with("web-")), "{udp}");
    let (outcome, from) = pod.sendto("10.96.0.10:53");
    assert!(matches!(&outcome, Outcome::Answer { name, .. } if name.starts_with("web-")));
    assert_eq!(from, "10.96.0.10:53", "the reply appears to come from the service");

    // No endpoint, or a port the service does not define: rejected. A socket hook refuses
    // at connect()/sendmsg(); the packet path answers with an ICMP error, which an
    // unconnected UDP socket does not hear.
    assert_eq!(pod.tcp("10.96.0.11:80").0, Outcome::Refused);
    assert_eq!(pod.tcp("10.96.0.10:81").0, Outcome::Refused);
    assert_eq!(pod.udp("10.96.0.11:53"), Outcome::Refused);
    let unconnected = if dp.translates_sockets() { Outcome::Refused } else { Outcome::Timeout };
    assert_eq!(pod.sendto("10.96.0.11:53").0, unconnected);

    // An IPv6 socket naming the IPv4 service through a v4-mapped address.
    let (name, _, getpeername) = pod.reach("[::ffff:10.96.0.10]:80");
    assert!(name.starts_with("web-"), "{name}");
    assert_eq!(getpeername, "[::ffff:10.96.0.10]:80");

    // IPv6: only web-a has an IPv6 address.
    let (name, _, getpeername) = pod.reach("[fd00:96::10]:80");
    assert_eq!((name.as_str(), getpeername.as_str()), ("web-a", "[fd00:96::10]:80"));

    // The node's conntrack saw the pod's flows; NATed on the packet path, not when
    // translated at connect(). The client host, outside the cgroup, is NATed either way.
    assert!(!conntrack(&cluster, &["-s", "10.244.0.50"]).is_empty());
    let nated = conntrack(&cluster, &["-s", "10.244.0.50", "--dst-nat"]);
    assert_eq!(nated.is_empty(), dp.translates_sockets(), "{nated:?}");
    let outside = Cluster::tcp(&cluster.client, "10.96.0.10:80");
    assert!(matches!(outside, Outcome::Answer { .. }), "{outside}");
    assert!(!conntrack(&cluster, &["-s", "192.168.10.100", "--dst-nat"]).is_empty());
}

/// `local` (internalTrafficPolicy Local) on web-a and web-b, `nolocal` (the same) on
/// web-b only, `sticky` (ClientIP affinity) and `web` on `endpoints`.
fn policies(sticky: &[Ep<'_>], web: &[Ep<'_>]) -> String {
    [
        service("local", "  clusterIP: 10.96.0.20\n  internalTrafficPolicy: Local\n", PORT_HTTP),
        slice("local-1", "local", "IPv4", SLICE_HTTP, &[WEB_A, WEB_B]),
        service("nolocal", "  clusterIP: 10.96.0.21\n  internalTrafficPolicy: Local\n", PORT_HTTP),
        slice("nolocal-1", "nolocal", "IPv4", SLICE_HTTP, &[WEB_B]),
        service(
            "sticky",
            "  clusterIP: 10.96.0.22\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n",
            PORT_HTTP,
        ),
        slice("sticky-1", "sticky", "IPv4", SLICE_HTTP, sticky),
        service("web", "  clusterIP: 10.96.0.23\n", PORT_HTTP),
        slice("web-1", "web", "IPv4", SLICE_HTTP, web),
    ]
    .concat()
}

pub fn pods_keep_connecting_while_endpoints_come_and_go(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    cluster.add_pod("web-c", true, 12, &[8080]);
    cluster.add_pod("client", true, 50, &[9999]);
    let (a, b, c) = (WEB_A, WEB_B, ("10.244.0.12", "node-a", true, true, false));
    let kpng = Watched::start(&cluster, dp, &policies(&[a, b], &[a, b]));
    let mut pod = dp.local(&cluster.pod("client").ns);
    wait_until("web answers", || matches!(pod.tcp("10.96.0.23:80").0, Outcome::Answer { .. }));
    cluster.node.output("conntrack", &["-F"]);

    // internalTrafficPolicy Local: the local endpoint only; none local: dropped.
    assert_eq!(pod.names("10.96.0.20:80", 12), BTreeSet::from(["web-a".to_string()]));
    assert_eq!(pod.tcp("10.96.0.21:80").0, Outcome::Timeout, "no local endpoint: dropped");

    // ClientIP affinity: one endpoint, every time.
    let sticky = pod.names("10.96.0.22:80", 12);
    assert_eq!(sticky.len(), 1, "{sticky:?}");
    let chosen = sticky.into_iter().next().expect("one endpoint");

    // Endpoints leave while the pod keeps connecting: every connection succeeds, and
    // neither web-b nor the sticky endpoint that left is chosen again.
    let remaining = if chosen == "web-a" { b } else { a };
    kpng.write(&policies(&[remaining], &[a]));
    let mut quiet = 0;
    let start = std::time::Instant::now();
    while quiet < 16 {
        assert!(start.elapsed().as_secs() < 30, "web-b still chosen: {}", kpng.log());
        let (name, ..) = pod.reach("10.96.0.23:80");
        quiet = if name == "web-b" { 0 } else { quiet + 1 };
    }
    let expected = if chosen == "web-a" { "web-b" } else { "web-a" };
    // The sticky service's change is its own: through an aggregator it may be committed
    // after the one above.
    let only_expected = BTreeSet::from([expected.to_string()]);
    let mut sticky = pod.names("10.96.0.22:80", 8);
    while sticky != only_expected && start.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(100));
        sticky = pod.names("10.96.0.22:80", 8);
    }
    assert_eq!(
        sticky,
        BTreeSet::from([expected.to_string()]),
        "the endpoint that left is not reused"
    );

    // An endpoint joins while the pod keeps connecting.
    kpng.write(&policies(&[remaining], &[a, c]));
    let mut seen = BTreeSet::new();
    while !seen.contains("web-c") {
        assert!(start.elapsed().as_secs() < 60, "web-c never chosen: {}", kpng.log());
        seen.insert(pod.reach("10.96.0.23:80").0);
    }
    assert!(!seen.contains("web-b"), "{seen:?}");
    // Translated at connect(), none of those connections was NATed.
    let nated = conntrack(&cluster, &["-s", "10.244.0.50", "--dst-nat"]);
    assert_eq!(nated.is_empty(), dp.translates_sockets(), "{nated:?}");
}
