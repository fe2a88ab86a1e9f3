//! Tests of the render: which frontends point at which groups, and what an empty group does.

use kpng_model::global::ServiceType;
use kpng_model::local::{EndpointPort, LocalServicePort};
use kpng_model::{LocalEndpoint, LocalOutside, LocalService, NodePortAddresses, PerFamily};

use super::*;

pub(crate) fn port(
    name: &str,
    protocol: Protocol,
    port: u16,
    node_port: Option<u16>,
) -> LocalServicePort {
    LocalServicePort {
        name: name.into(),
        protocol,
        port,
        node_port,
        has_endpoints: PerFamily { v4: true, v6: true },
        yielded: Box::default(),
    }
}

pub(crate) fn endpoint(
    ip: &str,
    local: bool,
    ports: &[(&str, Protocol, u16, bool, bool)],
) -> LocalEndpoint {
    LocalEndpoint {
        ip: ip.parse().unwrap(),
        local,
        ready: true,
        serving: true,
        terminating: false,
        pod_name: None,
        ports: ports
            .iter()
            .map(|(name, protocol, port, cluster, local)| EndpointPort {
                name: (*name).into(),
                protocol: *protocol,
                port: *port,
                cluster: *cluster,
                local: *local,
            })
            .collect(),
    }
}

pub(crate) fn state(
    name: &str,
    cluster_ips: &[&str],
    ports: Vec<LocalServicePort>,
    endpoints: Vec<LocalEndpoint>,
) -> LocalServiceState {
    LocalServiceState {
        service: LocalService {
            key: ServiceKey::new("test", name),
            service_type: ServiceType::ClusterIP,
            cluster_ips: cluster_ips.iter().map(|ip| ip.parse().unwrap()).collect(),
            outside: None,
            ports: ports.into(),
            affinity_timeout_seconds: None,
            internal_local: false,
            external_local: false,
            health_check_node_port: None,
            load_balancing: Default::default(),
        },
        endpoints: endpoints.into_iter().collect(),
    }
}

/// No NodePort address.
fn none() -> NodePortAddresses {
    NodePortAddresses::default()
}

/// NodePorts on `addresses`.
fn on(addresses: &[&str]) -> NodePortAddresses {
    let addresses = addresses.iter().map(|ip| ip.parse().unwrap()).collect();
    NodePortAddresses { all_local: PerFamily::default(), addresses }
}

fn frontend(ip: &str, protocol: Protocol, port: u16) -> Key {
    Key::Frontend(Frontend { ip: ip.parse().unwrap(), protocol, port })
}

fn target(rendered: &Rendered, key: &Key) -> (GroupId, Empty) {
    match rendered.elements.get(key) {
        Some(Value::Frontend { group, empty, .. }) => (*group, *empty),
        other => panic!("{key}: {other:?}"),
    }
}

fn endpoints_of(rendered: &Rendered, group: GroupId) -> BTreeSet<Target> {
    rendered.slots.get(&group).map(|s| s.iter().copied().collect()).unwrap_or_default()
}

const TCP: Protocol = Protocol::Tcp;

#[test]
fn cluster_ip_uses_the_cluster_set_and_never_an_entry_in_neither_set() {
    let svc = state(
        "web",
        &["10.96.0.10"],
        vec![port("http", TCP, 80, None), port("sctp", Protocol::Sctp, 80, None)],
        vec![
            endpoint("10.244.0.1", true, &[("http", TCP, 8080, true, true)]),
            endpoint("10.244.1.1", false, &[("http", TCP, 8080, true, false)]),
            endpoint("10.244.2.1", false, &[("http", TCP, 8080, false, false)]),
        ],
    );
    let rendered = render_service(&svc, &none(), &Slots::new(), FLOW_SECONDS);
    let (group, empty) = target(&rendered, &frontend("10.96.0.10", TCP, 80));
    assert_eq!(empty, Empty::Drop);
    let expected: BTreeSet<Target> =
        [("10.244.0.1".parse().unwrap(), 8080), ("10.244.1.1".parse().unwrap(), 8080)].into();
    assert_eq!(endpoints_of(&rendered, group), expected);
    assert_eq!(
        rendered.elements.get(&Key::Group(group)),
        Some(&Value::Group { count: 2, affinity_seconds: 0 })
    );
    assert!(rendered.elements.contains_key(&Key::ClusterIp("10.96.0.10".parse().unwrap())));
    // SCTP stays on the packet path.
    assert!(!rendered.elements.contains_key(&frontend("10.96.0.10", Protocol::Sctp, 80)));
    // No IPv6 cluster IP, no IPv6 element.
    assert!(rendered.elements.keys().all(|k| match k {
        Key::Frontend(f) => f.ip.is_ipv4(),
        Key::ClusterIp(ip) => ip.is_ipv4(),
        _ => true,
    }));
}

#[test]
fn internal_local_and_external_addresses_choose_their_sets() {
    let mut svc = state(
        "web",
        &["10.96.0.10"],
        vec![port("http", TCP, 80, Some(30080))],
        vec![endpoint("10.244.1.1", false, &[("http", TCP, 8080, true, false)])],
    );
    svc.service.internal_local = true;
    svc.service.external_local = true;
    svc.service.outside = LocalOutside {
        external_ips: Box::new(["192.0.2.1".parse().unwrap()]),
        ..LocalOutside::default()
    }
    .boxed();
    // The ENLS accepts NodePorts on one IPv4 address, and on every local IPv6 address.
    let mut nodeports = on(&["192.168.10.1"]);
    nodeports.all_local.v6 = true;
    let rendered = render_service(&svc, &nodeports, &Slots::new(), FLOW_SECONDS);
    // ClusterIP: the Local set, empty while the service has endpoints elsewhere: drop.
    let (local, empty) = target(&rendered, &frontend("10.96.0.10", TCP, 80));
    assert_eq!(empty, Empty::Drop);
    assert!(endpoints_of(&rendered, local).is_empty());
    assert!(!rendered.elements.contains_key(&Key::Group(local)));
    // External IP and NodePort (IPv4 node address only): the Cluster set, even under
    // externalTrafficPolicy Local, as upstream does for local sockets.
    for key in [frontend("192.0.2.1", TCP, 80), frontend("192.168.10.1", TCP, 30080)] {
        let (group, empty) = target(&rendered, &key);
        assert_eq!(empty, Empty::Reject);
        assert_eq!(endpoints_of(&rendered, group).len(), 1, "{key}");
    }
    // IPv6 NodePorts on every local address stay with nftables (no IPv6 cluster IP here
    // anyway); the NodePort frontend gives way to another service's address frontend.
    assert!(rendered.elements.keys().all(|k| !matches!(k, Key::Frontend(f) if f.ip.is_ipv6())));
    assert_eq!(rendered.nodeports, BTreeSet::from([frontend("192.168.10.1", TCP, 30080)]));
}

#[test]
fn nodeports_follow_the_enls_addresses_and_skip_a_family_accepted_everywhere() {
    let svc = state(
        "np",
        &["10.96.0.14", "fd00:96::14"],
        vec![port("http", TCP, 80, Some(30014))],
        vec![endpoint("10.244.1.1", false, &[("http", TCP, 8080, true, false)])],
    );
    let nodeports = on(&["192.168.10.1", "192.168.10.50", "fd00:10::1"]);
    let rendered = render_service(&svc, &nodeports, &Slots::new(), FLOW_SECONDS);
    for ip in ["192.168.10.1", "192.168.10.50", "fd00:10::1"] {
        assert!(rendered.elements.contains_key(&frontend(ip, TCP, 30014)), "{ip}");
    }
    let everywhere = NodePortAddresses {
        all_local: PerFamily { v4: true, v6: false },
        addresses: vec!["fd00:10::1".parse().unwrap()],
    };
    let rendered = render_service(&svc, &everywhere, &Slots::new(), FLOW_SECONDS);
    let on_nodes: Vec<&Key> = rendered
        .elements
        .keys()
        .filter(|k| match k {
            Key::Frontend(f) => f.port == 30014,
            _ => false,
        })
        .collect();
    assert_eq!(on_nodes, [&frontend("fd00:10::1", TCP, 30014)]);
}

#[test]
fn addresses_an_older_service_holds_get_no_frontend() {
    let mut ports = vec![port("http", TCP, 80, None), port("dns", Protocol::Udp, 53, None)];
    // This service's cluster IP and external IP on port 80 belong to an older service.
    ports[0].yielded = Box::new(["10.96.0.15".parse().unwrap(), "192.0.2.15".parse().unwrap()]);
    let mut svc = state(
        "late",
        &["10.96.0.15"],
        ports,
        vec![endpoint(
            "10.244.1.1",
            false,
            &[("http", TCP, 8080, true, false), ("dns", Protocol::Udp, 8053, true, false)],
        )],
    );
    svc.service.outside = LocalOutside {
        external_ips: Box::new(["192.0.2.15".parse().unwrap(), "192.0.2.16".parse().unwrap()]),
        ..LocalOutside::default()
    }
    .boxed();
    let rendered = render_service(&svc, &none(), &Slots::new(), FLOW_SECONDS);
    assert!(!rendered.elements.contains_key(&frontend("10.96.0.15", TCP, 80)));
    assert!(!rendered.elements.contains_key(&frontend("192.0.2.15", TCP, 80)));
    assert!(rendered.elements.contains_key(&frontend("192.0.2.16", TCP, 80)));
    // Its other port keeps them, and the cluster IP stays listed.
    assert!(rendered.elements.contains_key(&frontend("10.96.0.15", Protocol::Udp, 53)));
    assert!(rendered.elements.contains_key(&frontend("192.0.2.15", Protocol::Udp, 53)));
    assert!(rendered.elements.contains_key(&Key::ClusterIp("10.96.0.15".parse().unwrap())));
}

#[test]
fn a_udp_endpoint_in_neither_set_is_never_chosen() {
    // The ENLS lists a serving endpoint that no set picks (for its conntrack entries).
    let svc = state(
        "dns",
        &["10.96.0.16"],
        vec![port("dns", Protocol::Udp, 53, None)],
        vec![
            endpoint("10.244.1.1", false, &[("dns", Protocol::Udp, 8053, true, false)]),
            endpoint("10.244.1.2", false, &[("dns", Protocol::Udp, 8053, false, false)]),
        ],
    );
    let rendered = render_service(&svc, &none(), &Slots::new(), FLOW_SECONDS);
    let (group, _) = target(&rendered, &frontend("10.96.0.16", Protocol::Udp, 53));
    assert_eq!(
        endpoints_of(&rendered, group),
        BTreeSet::from([("10.244.1.1".parse().unwrap(), 8053)])
    );
    assert!(
        !rendered
            .elements
            .values()
            .any(|v| *v == Value::Backend(("10.244.1.2".parse().unwrap(), 8053)))
    );
}

#[test]
fn load_balancer_ips_with_source_ranges_stay_with_nftables() {
    let mut svc = state(
        "lb",
        &["10.96.0.13", "fd00:96::13"],
        vec![port("http", TCP, 80, None)],
        vec![endpoint("10.244.1.1", false, &[("http", TCP, 8080, true, false)])],
    );
    svc.service.outside = LocalOutside {
        load_balancer_ips: Box::new([
            "203.0.113.1".parse().unwrap(),
            "fd00:113::1".parse().unwrap(),
        ]),
        load_balancer_source_ranges: Box::new(["198.51.100.0/24".parse().unwrap()]),
        ..LocalOutside::default()
    }
    .boxed();
    let rendered = render_service(&svc, &none(), &Slots::new(), FLOW_SECONDS);
    assert!(!rendered.elements.contains_key(&frontend("203.0.113.1", TCP, 80)));
    // IPv6 has no range: its load-balancer IP is translated.
    assert!(rendered.elements.contains_key(&frontend("fd00:113::1", TCP, 80)));
}

#[test]
fn without_endpoints_anywhere_the_cluster_ip_rejects() {
    let mut ports = vec![port("http", TCP, 80, None)];
    ports[0].has_endpoints = PerFamily { v4: false, v6: false };
    let svc = state("empty", &["10.96.0.11", "fd00:96::11"], ports, Vec::new());
    let rendered = render_service(&svc, &none(), &Slots::new(), FLOW_SECONDS);
    for ip in ["10.96.0.11", "fd00:96::11"] {
        assert_eq!(target(&rendered, &frontend(ip, TCP, 80)).1, Empty::Reject);
    }
    assert!(rendered.slots.is_empty());
}

#[test]
fn affinity_groups_list_their_members_and_slots_stay_put() {
    let mut svc = state(
        "sticky",
        &["10.96.0.12"],
        vec![port("http", TCP, 80, None)],
        vec![
            endpoint("10.244.0.1", true, &[("http", TCP, 8080, true, true)]),
            endpoint("10.244.0.2", true, &[("http", TCP, 8080, true, true)]),
            endpoint("10.244.0.3", true, &[("http", TCP, 8080, true, true)]),
        ],
    );
    svc.service.affinity_timeout_seconds = Some(600);
    let first = render_service(&svc, &none(), &Slots::new(), FLOW_SECONDS);
    let (group, _) = target(&first, &frontend("10.96.0.12", TCP, 80));
    assert_eq!(
        first.elements.get(&Key::Group(group)),
        Some(&Value::Group { count: 3, affinity_seconds: 600 })
    );
    let members = first.elements.keys().filter(|k| matches!(k, Key::Member(..))).count();
    assert_eq!(members, 3);
    // The first endpoint leaves: the last one moves into its slot, the middle one stays.
    svc.endpoints.remove(&"10.244.0.1".parse().unwrap());
    let second = render_service(&svc, &none(), &first.slots, FLOW_SECONDS);
    let slots = &second.slots[&group];
    assert_eq!(
        slots,
        &vec![("10.244.0.3".parse().unwrap(), 8080), ("10.244.0.2".parse().unwrap(), 8080)]
    );
    // Seeding from the maps gives back the same slots.
    let seeded = seed_slots(&svc, &none(), |k| second.elements.get(k).copied());
    assert_eq!(seeded, second.slots);
}

#[test]
fn group_ids_differ_by_every_field() {
    let key = ServiceKey::new("a", "b");
    let base = group_id(&key, "http", TCP, Family::V4, false);
    assert_eq!(base, group_id(&key, "http", TCP, Family::V4, false));
    for other in [
        group_id(&ServiceKey::new("a", "c"), "http", TCP, Family::V4, false),
        group_id(&key, "dns", TCP, Family::V4, false),
        group_id(&key, "http", Protocol::Udp, Family::V4, false),
        group_id(&key, "http", TCP, Family::V6, false),
        group_id(&key, "http", TCP, Family::V4, true),
    ] {
        assert_ne!(base, other);
    }
}

#[test]
fn udp_flows_keep_an_endpoint_while_it_serves() {
    const UDP: Protocol = Protocol::Udp;
    let ready = endpoint("10.244.0.1", true, &[("dns", UDP, 53, true, true)]);
    // Terminating but serving: in neither set, listed for the flows towards it.
    let mut terminating = endpoint("10.244.0.2", false, &[("dns", UDP, 53, false, false)]);
    (terminating.ready, terminating.terminating) = (false, true);
    let svc = state(
        "dns",
        &["10.96.0.10"],
        vec![port("dns", UDP, 53, None), port("tcp", TCP, 53, None)],
        vec![ready, terminating],
    );
    let rendered = render_service(&svc, &none(), &Slots::new(), 90);
    let udp = frontend("10.96.0.10", UDP, 53);
    let (group, _) = target(&rendered, &udp);
    let picked: BTreeSet<Target> = [("10.244.0.1".parse().unwrap(), 53)].into();
    assert_eq!(endpoints_of(&rendered, group), picked, "only the ready one is picked");
    let serving: BTreeSet<Target> = rendered
        .elements
        .keys()
        .filter_map(|k| match k {
            Key::Member(id, target) if *id == group.serving() => Some(*target),
            _ => None,
        })
        .collect();
    let both = ["10.244.0.1", "10.244.0.2"].map(|ip| (ip.parse().unwrap(), 53)).into();
    assert_eq!(serving, both, "flows keep either while it serves");
    let seconds = |key: &Key| match rendered.elements.get(key) {
        Some(Value::Frontend { flow_seconds, .. }) => *flow_seconds,
        other => panic!("{key}: {other:?}"),
    };
    assert_eq!(seconds(&udp), 90);
    assert_eq!(seconds(&frontend("10.96.0.10", TCP, 53)), 0, "TCP has no flows to keep");
}
