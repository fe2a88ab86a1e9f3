//! Parity with kube-proxy where users notice: UDP flows to endpoints that still serve,
//! affinity through a scale-down, NodePorts on new addresses, hairpin without `nodeName`,
//! unallocated service addresses (from `--service-cidr` and from ServiceCIDR objects), how
//! pods are recognised, and which services `--service-proxy-name` selects.

use kpng_testkit::netns::Netns;
use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

use crate::harness::*;

fn is(name: &'static str) -> impl Fn(&Outcome) -> bool {
    move |o: &Outcome| matches!(o, Outcome::Answer { name: n, .. } if n == name)
}

/// dns-a on this node, dns-b on another: ready, and dns-a terminating but serving.
const DNS_A: Ep<'static> = ("10.244.0.10", "node-a", true, true, false);
const DNS_A_TERMINATING: Ep<'static> = ("10.244.0.10", "node-a", false, true, true);
const DNS_B: Ep<'static> = ("10.244.1.10", "node-b", true, true, false);

/// A cluster with pods dns-a and dns-b, and the manifests of a UDP service at `cluster_ip`
/// over the endpoints given.
fn dns_cluster(cluster_ip: &str) -> (Cluster, impl Fn(&[Ep<'_>]) -> String) {
    let mut cluster = Cluster::new();
    cluster.add_pod("dns-a", true, 10, &[8080]);
    cluster.add_pod("dns-b", false, 10, &[8080]);
    let spec = format!("  clusterIP: {cluster_ip}\n");
    let dns = move |endpoints: &[Ep<'_>]| {
        [service("dns", &spec, DNS_PORT), slice("dns-1", "dns", "IPv4", SLICE_DNS, endpoints)]
            .concat()
    };
    (cluster, dns)
}

pub fn udp_flows_to_an_endpoint_that_still_serves_are_kept(dp: Dataplane) {
    let (cluster, dns) = dns_cluster("10.96.0.50");
    let (a, a_terminating, b) = (DNS_A, DNS_A_TERMINATING, DNS_B);
    let kpng = Watched::start(&cluster, dp, &dns(&[a]));
    let flow = || udp_flow(&cluster.client, "10.96.0.50:53", 40100);
    assert!(is("dns-a")(&eventually(flow, is("dns-a"))), "{}", kpng.log());

    // dns-a is terminating but still serving, dns-b is ready: new flows go to dns-b, the
    // existing flow stays with dns-a.
    kpng.write(&dns(&[a_terminating, b]));
    wait_until("dns-b is the only endpoint picked", || {
        backends(&cluster, dp, "10.96.0.50 . udp . 53") == ["10.244.1.10 . 8080"]
    });
    for _ in 0..4 {
        let outcome = flow();
        assert!(
            is("dns-a")(&outcome),
            "the flow to a serving endpoint was cut ({outcome}):\n{}",
            kpng.log()
        );
    }
    assert!(is("dns-b")(&Cluster::udp(&cluster.client, "10.96.0.50:53", 40101)));

    // dns-a is gone: its flow moves.
    kpng.write(&dns(&[b]));
    assert!(is("dns-b")(&eventually(flow, is("dns-b"))), "{}", kpng.log());
}

/// The same from a pod on the node, over one unconnected UDP socket (a resolver's): with
/// `to-ebpf` the socket is translated at each `sendmsg()`, and its flow keeps its endpoint
/// while the endpoint still serves, as conntrack keeps it on the packet path.
pub fn a_pods_unconnected_udp_flow_keeps_an_endpoint_that_still_serves(dp: Dataplane) {
    let (mut cluster, dns) = dns_cluster("10.96.0.52");
    cluster.add_pod("client", true, 50, &[9999]);
    let (a, a_terminating, b) = (DNS_A, DNS_A_TERMINATING, DNS_B);
    let kpng = Watched::start(&cluster, dp, &dns(&[a]));
    if matches!(dp, Dataplane::Ebpf(_)) {
        // The flow must start on the path under test, not on nftables before the maps.
        wait_until("kpng wrote its maps", || kpng.log().contains("eBPF maps written"));
    }
    let mut pod = dp.local(&cluster.pod("client").ns);
    assert!(is("dns-a")(&eventually(|| pod.flow("10.96.0.52:53"), is("dns-a"))), "{}", kpng.log());

    // dns-a terminates but still serves, dns-b is ready: a new socket's flow goes to dns-b,
    // the existing flow stays with dns-a.
    kpng.write(&dns(&[a_terminating, b]));
    let mut fresh = dp.local(&cluster.pod("client").ns);
    let new_flow = eventually(|| fresh.sendto("10.96.0.52:53").0, is("dns-b"));
    assert!(is("dns-b")(&new_flow), "{new_flow}\n{}", kpng.log());
    for _ in 0..4 {
        let outcome = pod.flow("10.96.0.52:53");
        assert!(is("dns-a")(&outcome), "the flow moved ({outcome}):\n{}", kpng.log());
    }

    // dns-a is gone: the flow moves.
    kpng.write(&dns(&[b]));
    let moved = eventually(|| pod.flow("10.96.0.52:53"), is("dns-b"));
    assert!(is("dns-b")(&moved), "{moved}\n{}", kpng.log());
}

/// A pod's connected UDP socket (connected once, datagram after datagram) keeps an
/// endpoint that still serves, and leaves one that is gone: on the packet path its flow
/// moves once conntrack's entry is deleted; with `to-ebpf` the socket is pointed at the
/// endpoint itself, so it is destroyed: its owner sees an error and connects again, to an
/// endpoint that serves.
pub fn a_pods_connected_udp_socket_leaves_an_endpoint_that_is_gone(dp: Dataplane) {
    let (mut cluster, dns) = dns_cluster("10.96.0.53");
    cluster.add_pod("client", true, 50, &[9999]);
    let (a, a_terminating, b) = (DNS_A, DNS_A_TERMINATING, DNS_B);
    let kpng = Watched::start(&cluster, dp, &dns(&[a]));
    let ebpf = matches!(dp, Dataplane::Ebpf(_));
    if ebpf {
        wait_until("kpng wrote its maps", || kpng.log().contains("eBPF maps written"));
    }
    let target = "10.96.0.53:53";
    let mut pod = dp.local(&cluster.pod("client").ns);
    let first = eventually(|| pod.connected(target), is("dns-a"));
    assert!(is("dns-a")(&first), "{first}\n{}", kpng.log());

    // dns-a terminates but still serves: a new socket goes to dns-b, this one stays.
    kpng.write(&dns(&[a_terminating, b]));
    let mut fresh = dp.local(&cluster.pod("client").ns);
    let new_socket = eventually(|| fresh.udp(target), is("dns-b"));
    assert!(is("dns-b")(&new_socket), "{new_socket}\n{}", kpng.log());
    for _ in 0..4 {
        let outcome = pod.connected(target);
        assert!(
            is("dns-a")(&outcome),
            "the socket left a serving endpoint ({outcome}):\n{}",
            kpng.log()
        );
    }

    // dns-a is gone (its pod still answers at its own address).
    kpng.write(&dns(&[b]));
    let mut seen = Vec::new();
    let moved = eventually(
        || {
            let outcome = pod.connected(target);
            seen.push(outcome.to_string());
            outcome
        },
        is("dns-b"),
    );
    let tail = &seen[seen.len().saturating_sub(3)..];
    assert!(is("dns-b")(&moved), "the socket stayed with dns-a: ...{tail:?}\n{}", kpng.log());
    let errors = seen.iter().filter(|o| o.starts_with("error: ")).count();
    if ebpf {
        assert!(errors > 0, "to-ebpf: the socket was not destroyed: {seen:?}\n{}", kpng.log());
        assert!(kpng.log().contains("removed stale connected UDP sockets"), "{}", kpng.log());
    } else {
        assert_eq!(errors, 0, "on the packet path the same socket moves: {seen:?}");
    }
}

pub fn client_ip_affinity_survives_a_scale_down(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    cluster.add_pod("web-c", false, 11, &[8080]);
    let clients: Vec<String> = (101..=109).map(|n| format!("192.168.10.{n}")).collect();
    for client in &clients {
        cluster.client.ip(&["addr", "add", &format!("{client}/24"), "dev", "eth0"]);
    }
    let endpoints = [
        ("10.244.0.10", "node-a", true, true, false),
        ("10.244.1.10", "node-b", true, true, false),
        ("10.244.1.11", "node-b", true, true, false),
    ];
    let sticky = |eps: &[Ep<'_>]| {
        [
            service(
                "sticky",
                "  clusterIP: 10.96.0.55\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 600}}\n",
                PORT_HTTP,
            ),
            slice("sticky-1", "sticky", "IPv4", SLICE_HTTP, eps),
        ]
        .concat()
    };
    let kpng = Watched::start(&cluster, dp, &sticky(&endpoints));
    let from = |client: &str| {
        let outcome = eventually(
            || Cluster::tcp_from(&cluster.client, client, "10.96.0.55:80"),
            |o| matches!(o, Outcome::Answer { .. }),
        );
        answer(&outcome).0
    };
    let chosen: Vec<String> = clients.iter().map(|c| from(c)).collect();
    for (client, endpoint) in clients.iter().zip(&chosen) {
        assert_eq!(&from(client), endpoint, "{client} sticks before the change");
    }
    // The endpoint of the first client leaves.
    let gone = chosen[0].clone();
    let remaining: Vec<Ep<'_>> = endpoints
        .iter()
        .copied()
        .filter(|(ip, ..)| *ip != cluster.pod(&gone).ipv4.to_string())
        .collect();
    kpng.write(&sticky(&remaining));
    wait_until("the endpoint is gone from the table", || {
        backends(&cluster, dp, "10.96.0.55 . tcp . 80").len() == 2
    });
    let survivors: Vec<(&String, &String)> =
        clients.iter().zip(&chosen).filter(|(_, e)| **e != gone).collect();
    assert!(!survivors.is_empty(), "every client chose {gone}: {chosen:?}");
    for (client, endpoint) in survivors {
        for _ in 0..3 {
            assert_eq!(
                &from(client),
                endpoint,
                "{client} lost its endpoint in a scale-down:\n{}",
                kpng.log()
            );
        }
    }
    for (client, _) in clients.iter().zip(&chosen).filter(|(_, e)| **e == gone) {
        assert_ne!(from(client), gone, "{client} moves off the endpoint that left");
    }
}

pub fn node_ports_follow_addresses_added_after_start(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("client-pod", true, 20, &[9999]);
    let mut pod = dp.local(&cluster.pod("client-pod").ns);
    let manifests = [
        service(
            "web",
            "  type: NodePort\n  clusterIP: 10.96.0.91\n",
            "  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30091}\n",
        ),
        slice("web-1", "web", "IPv4", SLICE_HTTP, &[WEB_A]),
    ]
    .concat();
    for (option, address) in [("192.168.10.0/24", "192.168.10.61"), ("0.0.0.0/0", "192.168.10.62")]
    {
        let kpng = Watched::start_with(&cluster, dp, &manifests, &["--nodeport-addresses", option]);
        let probe = || Cluster::tcp(&cluster.client, "192.168.10.1:30091");
        assert!(is("web-a")(&eventually(probe, is("web-a"))), "{}", kpng.log());
        // An address the node gains later serves the NodePort too.
        cluster.node.ip(&["addr", "add", &format!("{address}/24"), "dev", "eth0"]);
        let target = format!("{address}:30091");
        let later = || Cluster::tcp(&cluster.client, &target);
        assert!(
            is("web-a")(&eventually(later, is("web-a"))),
            "{option}: {address}\n{}",
            kpng.log()
        );
        // From a pod on the node too.
        let from_pod = eventually(|| pod.tcp(&target).0, is("web-a"));
        assert!(is("web-a")(&from_pod), "{option}: {address} from a pod\n{}", kpng.log());
        drop(kpng);
        cluster.node.ip(&["addr", "del", &format!("{address}/24"), "dev", "eth0"]);
    }
}

pub fn hairpin_without_node_name(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = service("web", "  clusterIP: 10.96.0.65\n", PORT_HTTP)
        + "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: web-1\n  namespace: test\n  labels: {kubernetes.io/service-name: web}\naddressType: IPv4\nports:\n- {name: http, protocol: TCP, port: 8080}\nendpoints:\n- addresses: [\"10.244.0.10\"]\n";
    program(&cluster, dp, &manifests, &[]);
    // The pod reaches itself through the service: masqueraded, so its own reply comes back
    // (translated at connect(), the pod talks to itself: nothing to masquerade).
    let (name, peer, _) = dp.local(&cluster.pod("web-a").ns).reach("10.96.0.65:80");
    assert_eq!(name, "web-a");
    match dp.translates_sockets() {
        false => assert_ne!(peer, ip("10.244.0.10"), "hairpin traffic is masqueraded"),
        true => assert_eq!(peer, ip("10.244.0.10")),
    }
}

/// Pods web-a (node-a) and web-b (node-b), and something answering at 10.96.0.200 outside
/// the node (web-b holds that address too), an address no service is allocated.
fn cluster_with_an_unallocated_answer() -> Cluster {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    cluster.pod("web-b").ns.ip(&["addr", "add", "10.96.0.200/32", "dev", "eth0"]);
    cluster.remote.ip(&["route", "add", "10.96.0.200/32", "dev", "v10"]);
    cluster.node.ip(&["route", "add", "10.96.0.200/32", "via", "192.168.10.2"]);
    cluster
}

pub fn unallocated_service_addresses_are_dropped(dp: Dataplane) {
    let cluster = cluster_with_an_unallocated_answer();
    let manifests = web("10.96.0.10", &[WEB_A]);
    program(&cluster, dp, &manifests, &[]);
    assert!(
        is("web-b")(&Cluster::tcp(&cluster.client, "10.96.0.200:8080")),
        "without service CIDRs it is routed"
    );
    program(&cluster, dp, &manifests, &["--service-cidr", "10.96.0.0/16"]);
    assert_eq!(
        Cluster::tcp(&cluster.client, "10.96.0.200:8080"),
        Outcome::Timeout,
        "an unallocated address is dropped"
    );
    assert_eq!(
        Cluster::tcp(&cluster.client, "10.96.0.10:81"),
        Outcome::Refused,
        "an allocated one still rejects"
    );
    assert_eq!(reach(&cluster.client, "10.96.0.10:80").0, "web-a");
}

pub fn service_cidr_objects_take_effect_as_they_change(dp: Dataplane) {
    let cluster = cluster_with_an_unallocated_answer();
    let manifests = web("10.96.0.10", &[WEB_A]);
    let service_cidr = "---\napiVersion: networking.k8s.io/v1\nkind: ServiceCIDR\nmetadata: {name: kubernetes}\nspec:\n  cidrs: [10.96.0.0/16, \"fd00:96::/112\"]\n";
    let kpng = Watched::start(&cluster, dp, &manifests);
    let unallocated = || Cluster::tcp(&cluster.client, "10.96.0.200:8080");
    assert!(is("web-b")(&eventually(unallocated, is("web-b"))), "routed:\n{}", kpng.log());

    // The ServiceCIDR arrives: its range is the cluster's, the address in it is dropped.
    kpng.write(&format!("{manifests}{service_cidr}"));
    let dropped = |o: &Outcome| *o == Outcome::Timeout;
    assert!(dropped(&eventually(unallocated, dropped)), "dropped:\n{}", kpng.log());
    assert_eq!(Cluster::tcp(&cluster.client, "10.96.0.10:81"), Outcome::Refused);
    assert_eq!(reach(&cluster.client, "10.96.0.10:80").0, "web-a");

    // Deleted, the range no longer applies.
    kpng.write(&manifests);
    assert!(is("web-b")(&eventually(unallocated, is("web-b"))), "routed:\n{}", kpng.log());
}

/// A pod attached to a bridge `cbr0` on the node (10.245.0.5/24, gateway 10.245.0.1).
fn bridged_pod(cluster: &Cluster) -> Netns {
    let pod = Netns::new("bpod");
    cluster.node.ip(&["link", "add", "cbr0", "type", "bridge"]);
    cluster.node.ip(&["addr", "add", "10.245.0.1/24", "dev", "cbr0"]);
    cluster.node.ip(&["link", "set", "cbr0", "up"]);
    cluster.node.veth("b5", &pod, "eth0");
    cluster.node.ip(&["link", "set", "b5", "master", "cbr0"]);
    pod.ip(&["addr", "add", "10.245.0.5/24", "dev", "eth0"]);
    pod.ip(&["route", "add", "default", "via", "10.245.0.1"]);
    cluster.remote.ip(&["route", "add", "10.245.0.0/24", "via", "192.168.10.1"]);
    pod
}

pub fn pods_are_recognised_by_interface_or_bridge(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("client-pod", true, 20, &[9999]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let bridged_ns = bridged_pod(&cluster);
    let manifests = web("10.96.0.98", &[WEB_B]);
    let mut veth_pod = dp.local(&cluster.pod("client-pod").ns);
    let mut bridged = dp.local(&bridged_ns);
    let (veth_ip, bridged_ip) = (ip("10.244.0.20"), ip("10.245.0.5"));
    let prefix = ["--detect-local-mode", "InterfaceNamePrefix", "--pod-interface-name-prefix", "v"];
    program(&cluster, dp, &manifests, &prefix);
    assert_eq!(veth_pod.reach("10.96.0.98:80").1, veth_ip, "a pod on a v* interface");
    let peer = bridged.reach("10.96.0.98:80").1;
    assert!(dp.shows_masqueraded(peer, bridged_ip), "cbr0 is no v* interface: {peer}");
    let bridge = ["--detect-local-mode", "BridgeInterface", "--pod-bridge-interface", "cbr0"];
    program(&cluster, dp, &manifests, &bridge);
    assert_eq!(bridged.reach("10.96.0.98:80").1, bridged_ip, "a pod on the bridge");
    let peer = veth_pod.reach("10.96.0.98:80").1;
    assert!(dp.shows_masqueraded(peer, veth_ip), "not on the bridge: {peer}");
    let node_cidr = ["--detect-local-mode", "NodeCIDR"];
    program(&cluster, dp, &manifests, &node_cidr);
    assert_eq!(veth_pod.reach("10.96.0.98:80").1, veth_ip, "inside the Node's podCIDRs");
    let peer = bridged.reach("10.96.0.98:80").1;
    assert!(dp.shows_masqueraded(peer, bridged_ip), "outside them: {peer}");
}

/// `--service-proxy-name kpng`: only the services labelled with that name are proxied;
/// without the flag, only the unlabelled ones (the labelled belong to another proxy).
pub fn service_proxy_name_selects_the_services_kpng_proxies(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let labelled = format!(
        "---\napiVersion: v1\nkind: Service\nmetadata:\n  name: mine\n  namespace: test\n  labels: {{service.kubernetes.io/service-proxy-name: kpng}}\nspec:\n  clusterIP: 10.96.0.11\n  ports:\n{PORT_HTTP}"
    );
    // EndpointSlices carry their Service's labels, as the EndpointSlice controller copies them.
    let labelled_slice = slice("mine-1", "mine", "IPv4", SLICE_HTTP, &[WEB_A]).replace(
        "labels: {kubernetes.io/service-name: mine}",
        "labels: {kubernetes.io/service-name: mine, service.kubernetes.io/service-proxy-name: kpng}",
    );
    assert!(labelled_slice.contains("service-proxy-name"), "{labelled_slice}");
    let manifests = [web("10.96.0.10", &[WEB_A]), labelled, labelled_slice].concat();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, format!("{NODE_A}{manifests}")).unwrap();
    let run = |source_flags: &[&str]| {
        let mut args = vec!["file".to_string(), "--input".into(), path.display().to_string()];
        args.extend(source_flags.iter().map(|f| f.to_string()));
        args.extend(["--once", "to-local", "--node", "node-a"].map(String::from));
        args.extend(dp.backends());
        let out = dp.kpng(&cluster, &args).output().expect("running kpng");
        let log = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "kpng failed: {log}");
    };
    let answers = |o: &Outcome| matches!(o, Outcome::Answer { .. });

    run(&["--service-proxy-name", "kpng"]);
    assert_eq!(reach(&cluster.client, "10.96.0.11:80").0, "web-a", "the labelled service");
    let unlabelled = Cluster::tcp(&cluster.client, "10.96.0.10:80");
    assert!(!answers(&unlabelled), "an unlabelled service was proxied: {unlabelled}");

    run(&[]);
    assert_eq!(reach(&cluster.client, "10.96.0.10:80").0, "web-a", "the unlabelled service");
    let other = Cluster::tcp(&cluster.client, "10.96.0.11:80");
    assert!(!answers(&other), "another proxy's service was proxied: {other}");
}
