//! Service semantics: what each kind of address and policy does to packets.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

use crate::harness::*;

pub fn cluster_ip_node_port_and_rejects(dp: Dataplane) {
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
    program(&cluster, dp, &manifests, &[]);

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
    // reaches itself (hairpin), which is masqueraded; translated at connect(), the pod
    // talks to itself and nothing needs masquerading.
    let pod_ip: IpAddr = "10.244.0.10".parse().unwrap();
    let mut seen = BTreeSet::new();
    let mut pod = dp.local(&cluster.pod("web-a").ns);
    for _ in 0..24 {
        let (name, peer, _) = pod.reach("10.96.0.10:80");
        match (name.as_str(), dp.translates_sockets()) {
            ("web-b", _) => {
                assert_eq!(peer, pod_ip, "pod traffic to a remote endpoint is not masqueraded")
            }
            (_, false) => assert_ne!(peer, pod_ip, "hairpin traffic is masqueraded"),
            (_, true) => assert_eq!(peer, pod_ip, "the pod reaches itself"),
        }
        seen.insert(name);
    }
    assert_eq!(seen.len(), 2);
}

pub fn external_ips_and_load_balancer_source_ranges(dp: Dataplane) {
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
    program(&cluster, dp, &manifests, &[]);

    // External IP: served, and masqueraded (externalTrafficPolicy Cluster).
    let (name, peer) = reach(&cluster.client, "192.0.2.50:80");
    assert_eq!((name.as_str(), peer), ("web-a", ip("192.168.10.1")));
    // LB IP whose ranges include the client: allowed.
    assert_eq!(reach(&cluster.client, "203.0.113.21:80").0, "web-a");
    // LB IP whose ranges exclude the client: dropped, for pods too.
    assert_eq!(Cluster::tcp(&cluster.client, "203.0.113.22:80"), Outcome::Timeout);
    assert_eq!(dp.local(&cluster.pod("web-a").ns).tcp("203.0.113.22:80").0, Outcome::Timeout);
    // Neither the ClusterIP nor the NodePort of that service is filtered by the ranges.
    assert_eq!(reach(&cluster.client, "10.96.0.22:80").0, "web-a");
    assert_eq!(reach(&cluster.client, "192.168.10.1:30022").0, "web-a");
}

pub fn external_traffic_policy_local(dp: Dataplane) {
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
    program(&cluster, dp, &manifests, &[]);

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
    let (name, peer, _) = dp.local(&cluster.pod("client-pod").ns).reach("203.0.113.31:80");
    assert_eq!((name.as_str(), peer), ("web-b", ip("10.244.0.20")));
    // The node itself reaches it too (masqueraded on the packet path).
    assert_eq!(dp.local(&cluster.node).reach("203.0.113.31:80").0, "web-b");
    // The ClusterIP uses the Cluster set.
    assert_eq!(reach(&cluster.client, "10.96.0.31:80").0, "web-b");
}

pub fn internal_policy_local_terminating_fallback_and_dual_stack(dp: Dataplane) {
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
    program(&cluster, dp, &manifests, &[]);

    assert_eq!(dp.local(&cluster.pod("web-a").ns).tcp("10.96.0.40:80").0, Outcome::Timeout);
    assert_eq!(reach(&cluster.client, "10.96.0.41:80").0, "web-b");
    assert_eq!(reach(&cluster.client, "10.96.0.42:80").0, "web-a");
    let (name, _) = reach(&cluster.client, "[fd00:96::42]:80");
    assert_eq!(name, "web-a");
    assert_eq!(reach(&cluster.client, "10.96.0.43:80").0, "web-a");
    assert_eq!(Cluster::tcp(&cluster.client, "[fd00:96::43]:80"), Outcome::Refused);
}

pub fn sctp_cluster_ip_and_node_port(dp: Dataplane) {
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
    program(&cluster, dp, &manifests, &[]);
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

pub fn node_ports_on_primary_or_chosen_addresses(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("client-pod", true, 20, &[9999]);
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
    // The same for a pod on the node.
    program(&cluster, dp, &manifests, &[]);
    let mut pod = dp.local(&cluster.pod("client-pod").ns);
    assert_eq!(reach(&cluster.client, "192.168.10.1:30090").0, "web-a");
    assert_eq!(Cluster::tcp(&cluster.client, "192.168.10.50:30090"), Outcome::Refused);
    assert_eq!(pod.reach("192.168.10.1:30090").0, "web-a");
    assert_eq!(pod.tcp("192.168.10.50:30090").0, Outcome::Refused);
    // With CIDRs: every local address inside them.
    program(&cluster, dp, &manifests, &["--nodeport-addresses", "192.168.10.0/24"]);
    assert_eq!(reach(&cluster.client, "192.168.10.50:30090").0, "web-a");
    assert_eq!(reach(&cluster.client, "192.168.10.1:30090").0, "web-a");
    assert_eq!(pod.reach("192.168.10.50:30090").0, "web-a");
    assert_eq!(pod.reach("192.168.10.1:30090").0, "web-a");
    // --node-ip (kube-proxy's --bind-address): another primary IP than the Node object's.
    program(&cluster, dp, &manifests, &["--node-ip", "192.168.10.50"]);
    assert_eq!(reach(&cluster.client, "192.168.10.50:30090").0, "web-a");
    assert_eq!(Cluster::tcp(&cluster.client, "192.168.10.1:30090"), Outcome::Refused);
}

/// A Node object without an IPv6 address (a single-stack Node on a dual-stack host, say):
/// IPv6 NodePorts are accepted on every local IPv6 address, as kube-proxy falls back to
/// then, while IPv4 keeps to the primary IP.
pub fn node_ports_on_every_address_of_a_family_without_a_primary_ip(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.node.ip(&["addr", "add", "192.168.10.50/24", "dev", "eth0"]);
    let node = NODE_A.replace("  - {type: InternalIP, address: \"fd00:10::1\"}\n", "");
    assert!(!node.contains("fd00:10::1"));
    let manifests = [
        service(
            "web",
            "  type: NodePort\n  clusterIP: 10.96.0.91\n  clusterIPs: [10.96.0.91, \"fd00:96::91\"]\n",
            "  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30091}\n",
        ),
        slice("web-4", "web", "IPv4", SLICE_HTTP, &[("10.244.0.10", "node-a", true, true, false)]),
        slice("web-6", "web", "IPv6", SLICE_HTTP, &[("fd00:244::a", "node-a", true, true, false)]),
    ]
    .concat();
    program_node(&cluster, dp, &node, &manifests, &[]);
    assert_eq!(reach(&cluster.client, "[fd00:10::1]:30091").0, "web-a");
    assert_eq!(reach(&cluster.client, "192.168.10.1:30091").0, "web-a");
    assert_eq!(Cluster::tcp(&cluster.client, "192.168.10.50:30091"), Outcome::Refused);
}

pub fn client_ip_affinity_sticks_across_addresses(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    cluster.add_pod("client-pod", true, 20, &[9999]);
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
    program(&cluster, dp, &web(&[a, b]), &[]);
    let first = reach(&cluster.client, "10.96.0.95:80").0;
    // The same client keeps the same endpoint, on the ClusterIP and on the NodePort.
    for target in ["10.96.0.95:80", "192.168.10.1:30095", "10.96.0.95:80"] {
        for _ in 0..8 {
            assert_eq!(reach(&cluster.client, target).0, first, "{target}");
        }
    }
    // So does a pod on the node.
    let mut pod = dp.local(&cluster.pod("client-pod").ns);
    let chosen = pod.reach("10.96.0.95:80").0;
    for target in ["192.168.10.1:30095", "10.96.0.95:80", "192.168.10.1:30095"] {
        for _ in 0..4 {
            assert_eq!(pod.reach(target).0, chosen, "{target} from the pod");
        }
    }
    // Its endpoint goes away: the client moves to the other one and sticks there.
    let (remaining, other) = if first == "web-a" { (b, "web-b") } else { (a, "web-a") };
    program(&cluster, dp, &web(&[remaining]), &[]);
    for _ in 0..8 {
        assert_eq!(reach(&cluster.client, "10.96.0.95:80").0, other);
    }
    // It comes back: the client stays where it is.
    program(&cluster, dp, &web(&[a, b]), &[]);
    for _ in 0..8 {
        assert_eq!(reach(&cluster.client, "10.96.0.95:80").0, other);
    }
}

pub fn masquerade_all_and_cluster_cidr(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("client-pod", true, 20, &[9999]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let manifests = web("10.96.0.97", &[WEB_B]);
    let mut pod = dp.local(&cluster.pod("client-pod").ns);
    let own = ip("10.244.0.20");
    // Default detector (the node's podCIDRs): a local pod keeps its address.
    program(&cluster, dp, &manifests, &[]);
    assert_eq!(pod.reach("10.96.0.97:80").1, own);
    // --masquerade-all: every connection to a ClusterIP is masqueraded.
    program(&cluster, dp, &manifests, &["--masquerade-all"]);
    assert!(dp.shows_masqueraded(pod.reach("10.96.0.97:80").1, own));
    // --cluster-cidr that does not cover the pod: it counts as outside, and is masqueraded.
    program(&cluster, dp, &manifests, &["--cluster-cidr", "10.200.0.0/16"]);
    assert!(dp.shows_masqueraded(pod.reach("10.96.0.97:80").1, own));
    program(&cluster, dp, &manifests, &["--cluster-cidr", "10.244.0.0/16"]);
    assert_eq!(pod.reach("10.96.0.97:80").1, own);
}
