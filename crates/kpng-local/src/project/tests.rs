use kpng_model::global::{Hints, IpMode, LoadBalancerIngress, Outside, ServiceType, TrafficPolicy};
use kpng_model::local::EndpointPort;
use kpng_model::{Family, GlobalModel, Object, PerFamily, Protocol, ServiceKey};
use kpng_testkit::builders::{endpoint, node, service, slice};

use super::*;

const HTTP: (&str, Protocol, u16) = ("http", Protocol::Tcp, 80);
const DNS: (&str, Protocol, u16) = ("dns", Protocol::Udp, 53);

fn model(objects: Vec<Object>) -> GlobalModel {
    let mut model = GlobalModel::new();
    for o in objects {
        model.apply(o);
    }
    model
}

fn key() -> ServiceKey {
    ServiceKey::new("ns", "web")
}

fn view() -> NodeView<'static> {
    NodeView { name: "a", zone: None }
}

fn port(name: &str, protocol: Protocol, port: u16, cluster: bool, local: bool) -> EndpointPort {
    EndpointPort { name: name.into(), protocol, port, cluster, local }
}

#[test]
fn endpoint_ports_match_service_ports_by_name_and_protocol() {
    let svc = service("ns", "web", &["10.96.0.1"], &[HTTP, DNS]);
    let s1 = slice(
        "ns",
        "web-1",
        "web",
        &[("http", Protocol::Tcp, 8080), ("dns", Protocol::Tcp, 5353)],
        vec![endpoint("10.0.0.1", "b")],
    );
    let state = project_service(
        &model(vec![Object::Service(svc), Object::EndpointSlice(s1)]),
        &key(),
        &view(),
    )
    .unwrap();
    let ep = &state.endpoints[&"10.0.0.1".parse().unwrap()];
    // dns/TCP does not serve dns/UDP; the endpoint port number comes from the slice.
    assert_eq!(*ep.ports, [port("http", Protocol::Tcp, 8080, true, false)]);
    assert!(!ep.local);
    assert_eq!(state.service.ports[0].has_endpoints, PerFamily { v4: true, v6: false });
    assert_eq!(state.service.ports[1].has_endpoints, PerFamily { v4: false, v6: false });
}

#[test]
fn port_names_are_the_models_copies() {
    let svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    let endpoints = vec![endpoint("10.0.0.1", "b"), endpoint("10.0.0.2", "a")];
    let s1 = slice("ns", "web-1", "web", &[("http", Protocol::Tcp, 8080)], endpoints);
    let model = model(vec![Object::Service(svc), Object::EndpointSlice(s1)]);
    let state = project_service(&model, &key(), &view()).unwrap();
    let held = &model.service(&key()).unwrap().ports[0].name;
    assert!(Arc::ptr_eq(&state.service.ports[0].name, held));
    assert_eq!(state.endpoints.len(), 2);
    for endpoint in state.endpoints.values() {
        assert!(Arc::ptr_eq(&endpoint.ports[0].name, held), "{}", endpoint.ip);
    }
}

#[test]
fn duplicate_endpoints_count_once_and_non_terminating_wins() {
    let svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    let mut dying = endpoint("10.0.0.1", "a");
    dying.ready = false;
    dying.terminating = true;
    let s1 = slice("ns", "web-1", "web", &[("http", Protocol::Tcp, 8080)], vec![dying]);
    let s2 = slice(
        "ns",
        "web-2",
        "web",
        &[("http", Protocol::Tcp, 8080)],
        vec![endpoint("10.0.0.1", "a")],
    );
    let state = project_service(
        &model(vec![Object::Service(svc), Object::EndpointSlice(s1), Object::EndpointSlice(s2)]),
        &key(),
        &view(),
    )
    .unwrap();
    assert_eq!(state.endpoints.len(), 1);
    let ep = state.endpoints.values().next().unwrap();
    assert!(ep.ready && !ep.terminating && ep.local);
    assert_eq!(*ep.ports, [port("http", Protocol::Tcp, 8080, true, false)]);
}

#[test]
fn copies_count_once_and_non_terminating_wins_among_few_or_many_endpoints() {
    // Few endpoints are scanned for copies; beyond, an index takes over.
    for count in [4, SCANNED_CANDIDATES as u8 + 8] {
        let svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
        let copy = |i: u8, node: &str, dying: bool| {
            let mut e = endpoint(&format!("10.0.0.{i}"), node);
            (e.ready, e.terminating) = (!dying, dying);
            e
        };
        // Every endpoint twice, first on node b then on this node: the even ones dying then
        // ready, the odd ones ready twice. A later copy replaces one before it unless it
        // is terminating.
        let first = (1..=count).map(|i| copy(i, "b", i % 2 == 0)).collect();
        let later = (1..=count).map(|i| copy(i, "a", false)).collect();
        let http = &[("http", Protocol::Tcp, 8080)];
        let s1 = slice("ns", "web-1", "web", http, first);
        let s2 = slice("ns", "web-2", "web", http, later);
        let objects =
            vec![Object::Service(svc), Object::EndpointSlice(s1), Object::EndpointSlice(s2)];
        let state = project_service(&model(objects), &key(), &view()).unwrap();
        assert_eq!(state.endpoints.len(), usize::from(count));
        for ep in state.endpoints.values() {
            assert!(ep.ready && !ep.terminating && ep.local, "{} kept the first copy", ep.ip);
            let once = [port("http", Protocol::Tcp, 8080, true, false)];
            assert_eq!(*ep.ports, once, "{} of {count}", ep.ip);
        }
    }
}

#[test]
fn each_family_stands_alone() {
    let svc = service("ns", "web", &["10.96.0.1", "fd00::1"], &[HTTP]);
    let s4 = slice(
        "ns",
        "web-4",
        "web",
        &[("http", Protocol::Tcp, 8080)],
        vec![endpoint("10.0.0.1", "b")],
    );
    let state = project_service(
        &model(vec![Object::Service(svc.clone()), Object::EndpointSlice(s4.clone())]),
        &key(),
        &view(),
    )
    .unwrap();
    assert_eq!(state.service.ports[0].has_endpoints, PerFamily { v4: true, v6: false });

    // A v6 slice of a service without a v6 cluster IP does not exist for this node.
    let v4_only = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    let s6 = slice(
        "ns",
        "web-6",
        "web",
        &[("http", Protocol::Tcp, 8080)],
        vec![endpoint("fd00::10", "a")],
    );
    let state = project_service(
        &model(vec![
            Object::Service(v4_only),
            Object::EndpointSlice(s6),
            Object::EndpointSlice(s4),
        ]),
        &key(),
        &view(),
    )
    .unwrap();
    assert_eq!(state.endpoints.keys().map(Family::of).collect::<Vec<_>>(), vec![Family::V4]);
}

#[test]
fn internal_policy_local_keeps_only_local_endpoints_but_knows_about_others() {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.internal_traffic_policy = TrafficPolicy::Local;
    let s1 = slice(
        "ns",
        "web-1",
        "web",
        &[("http", Protocol::Tcp, 8080)],
        vec![endpoint("10.0.0.1", "b")],
    );
    let state = project_service(
        &model(vec![Object::Service(svc), Object::EndpointSlice(s1)]),
        &key(),
        &view(),
    )
    .unwrap();
    assert!(state.endpoints.is_empty(), "a remote endpoint is in no set this node uses");
    assert!(state.service.internal_local);
    assert!(state.service.ports[0].has_endpoints.v4, "DROP, not REJECT: endpoints exist elsewhere");
}

#[test]
fn external_policy_local_uses_both_sets() {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.service_type = ServiceType::LoadBalancer;
    svc.ports[0].node_port = Some(30080);
    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.health_check_node_port = Some(32000);
    svc.outside = Outside {
        load_balancer_ingress: Box::new([
            LoadBalancerIngress { ip: "198.51.100.1".parse().unwrap(), ip_mode: IpMode::VIP },
            LoadBalancerIngress { ip: "198.51.100.2".parse().unwrap(), ip_mode: IpMode::Proxy },
        ]),
        ..Outside::default()
    }
    .boxed();
    let s1 = slice(
        "ns",
        "web-1",
        "web",
        &[("http", Protocol::Tcp, 8080)],
        vec![endpoint("10.0.0.1", "a"), endpoint("10.0.0.2", "b")],
    );
    let state = project_service(
        &model(vec![Object::Service(svc), Object::EndpointSlice(s1)]),
        &key(),
        &view(),
    )
    .unwrap();
    assert!(state.service.external_local);
    assert_eq!(state.service.health_check_node_port, Some(32000));
    assert_eq!(
        state.service.load_balancer_ips(),
        ["198.51.100.1".parse::<std::net::IpAddr>().unwrap()]
    );
    let local = &state.endpoints[&"10.0.0.1".parse().unwrap()];
    let remote = &state.endpoints[&"10.0.0.2".parse().unwrap()];
    assert_eq!(*local.ports, [port("http", Protocol::Tcp, 8080, true, true)]);
    assert_eq!(*remote.ports, [port("http", Protocol::Tcp, 8080, true, false)]);
}

#[test]
fn external_policy_local_needs_an_external_address() {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.external_traffic_policy = TrafficPolicy::Local;
    let state = project_service(&model(vec![Object::Service(svc)]), &key(), &view()).unwrap();
    assert!(!state.service.external_local);
    assert_eq!(state.service.health_check_node_port, None);
}

#[test]
fn node_projection_carries_zone_primary_ips_and_drain_state() {
    let mut n = node("a", Some("z1"), &["192.168.0.1", "fd00::a"]);
    n.to_be_deleted = true;
    let m = model(vec![Object::Node(n)]);
    let local = project_node(&m, "a").unwrap();
    assert_eq!(local.zone.as_deref(), Some("z1"));
    assert_eq!(local.primary_ip(Family::V6), Some("fd00::a".parse().unwrap()));
    assert!(local.draining);
    assert!(project_node(&m, "b").is_none());
}

#[test]
fn zone_of_the_node_drives_topology() {
    let svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    let mut e1 = endpoint("10.0.0.1", "b");
    e1.set_hints(Hints::new(vec!["z1".into()], vec![]));
    let mut e2 = endpoint("10.0.0.2", "c");
    e2.set_hints(Hints::new(vec!["z2".into()], vec![]));
    let m = model(vec![
        Object::Service(svc),
        Object::EndpointSlice(slice(
            "ns",
            "web-1",
            "web",
            &[("http", Protocol::Tcp, 8080)],
            vec![e1, e2],
        )),
        Object::Node(node("a", Some("z2"), &["192.168.0.1"])),
    ]);
    let state = project_node_state(&m, "a");
    let eps: Vec<_> = state.services[&key()].endpoints.keys().map(|ip| ip.to_string()).collect();
    assert_eq!(eps, vec!["10.0.0.2"]);
}

#[test]
fn projecting_on_several_threads_gives_what_one_thread_gives() {
    let mut objects = vec![Object::Node(node("a", Some("z1"), &["192.168.10.1"]))];
    for i in 0..40u8 {
        let name = format!("s{i}");
        objects.push(Object::Service(service("ns", &name, &[&format!("10.96.0.{i}")], &[HTTP])));
        let eps = (0..=i % 4)
            .map(|e| endpoint(&format!("10.244.{e}.{i}"), if e == 0 { "a" } else { "b" }))
            .collect();
        objects.push(Object::EndpointSlice(slice("ns", &format!("{name}-1"), &name, &[HTTP], eps)));
    }
    let model = model(objects);
    let keys: Vec<&ServiceKey> = model.services().map(|s| &s.key).collect();
    let one = project_services_on(&model, &keys, &view(), 1);
    assert_eq!(one.len(), 40);
    assert!(one.iter().all(|(_, state)| !state.endpoints.is_empty()));
    for threads in [2, 3, 7] {
        assert_eq!(project_services_on(&model, &keys, &view(), threads), one, "{threads} threads");
    }
}

#[test]
fn endpoints_serving_the_same_ports_share_one_list() {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP, DNS]);
    // NodePorts with externalTrafficPolicy Local: a local endpoint is in both sets.
    svc.service_type = ServiceType::NodePort;
    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.ports[0].node_port = Some(30080);
    svc.ports[1].node_port = Some(30053);
    let ports = &[("http", Protocol::Tcp, 8080), ("dns", Protocol::Udp, 5353)];
    let endpoints = ["10.0.0.1", "10.0.0.2", "10.0.0.3"].map(|ip| endpoint(ip, "b"));
    let mut local = endpoint("10.0.0.4", "a");
    local.pod_name = Some("web-local".into());
    let s1 = slice("ns", "web-1", "web", ports, [endpoints.to_vec(), vec![local]].concat());
    // Another port number: a list of its own.
    let s2 = slice("ns", "web-2", "web", &[("http", Protocol::Tcp, 9090)], {
        vec![endpoint("10.0.0.5", "b")]
    });
    let objects = vec![Object::Service(svc), Object::EndpointSlice(s1), Object::EndpointSlice(s2)];
    let state = project_service(&model(objects), &key(), &view()).unwrap();
    let ports_of = |ip: &str| state.endpoints[&ip.parse().unwrap()].ports.clone();
    let remote = ports_of("10.0.0.1");
    assert_eq!(
        *remote,
        [
            port("dns", Protocol::Udp, 5353, true, false),
            port("http", Protocol::Tcp, 8080, true, false)
        ]
    );
    for ip in ["10.0.0.2", "10.0.0.3"] {
        assert!(Arc::ptr_eq(&remote, &ports_of(ip)), "{ip} shares the list of 10.0.0.1");
    }
    let local = ports_of("10.0.0.4");
    assert!(local.iter().all(|p| p.local), "the local endpoint is in the Local set");
    assert!(!Arc::ptr_eq(&remote, &local));
    assert_eq!(*ports_of("10.0.0.5"), [port("http", Protocol::Tcp, 9090, true, false)]);
}

#[test]
fn node_ip_overrides_the_primary_ip_of_its_family_only() {
    let mut node = LocalNode {
        name: "node-a".into(),
        zone: None,
        primary_ips: vec!["192.168.10.1".parse().unwrap(), "fd00:10::1".parse().unwrap()],
        pod_cidrs: Vec::new(),
        draining: false,
        nodeport_addresses: Default::default(),
        service_cidrs: Vec::new(),
    };
    let local =
        NodeLocal { node_ips: vec!["192.168.10.50".parse().unwrap()], ..NodeLocal::default() };
    local.complete(&mut node);
    let want: Vec<IpAddr> = vec!["192.168.10.50".parse().unwrap(), "fd00:10::1".parse().unwrap()];
    assert_eq!(node.primary_ips, want);
    assert_eq!(node.nodeport_addresses.addresses, want, "NodePorts follow it");
    local.complete(&mut node);
    assert_eq!(node.primary_ips, want, "completing twice changes nothing more");
}
