//! Golden tests: the elements of representative services, compared as sets of lines.

use std::collections::BTreeSet;

use kpng_local::project_node_state;
use kpng_local::project_service;
use kpng_local::select::NodeView;
use kpng_model::global::{
    Helper, IpMode, LoadBalancerIngress, LoadBalancing, LogPath, NatMode, Outside, Persistence,
    PersistenceKey, Scheduler, ServiceType, TrafficPolicy,
};

use crate::objects::PickKind;
use kpng_model::{GlobalModel, Object, Protocol, ServiceKey};
use kpng_testkit::builders::{endpoint, node, service, slice};

use super::*;
use crate::text::element_text;

const HTTP: (&str, Protocol, u16) = ("http", Protocol::Tcp, 80);
const SLICE_HTTP: (&str, Protocol, u16) = ("http", Protocol::Tcp, 8080);

fn lines(rendered: &[(ElementId, Value)]) -> BTreeSet<String> {
    rendered
        .iter()
        .map(|(id, v)| {
            format!(
                "{} {} {}",
                crate::objects::table_family(id.family),
                id.map,
                element_text(&id.key, v)
            )
        })
        .collect()
}

fn expect(lines_: &[&str]) -> BTreeSet<String> {
    lines_.iter().map(|s| s.to_string()).collect()
}

fn render(objects: Vec<Object>, node_name: &str) -> BTreeSet<String> {
    let mut model = GlobalModel::new();
    for o in objects {
        model.apply(o);
    }
    let view = NodeView { name: node_name, zone: None };
    let state = project_service(&model, &ServiceKey::new("ns", "web"), &view).expect("service");
    let node_state = project_node_state(&model, node_name);
    let facts = NodeFacts::from_node(node_state.node.as_ref(), 0x4000);
    lines(&render_service(&state, &facts, &Slots::new()).elements)
}

#[test]
fn cluster_ip_with_endpoints() {
    let got = render(
        vec![
            Object::Service(service("ns", "web", &["10.96.0.1"], &[HTTP])),
            Object::EndpointSlice(slice(
                "ns",
                "web-1",
                "web",
                &[SLICE_HTTP],
                vec![endpoint("10.0.0.1", "a"), endpoint("10.0.0.2", "b")],
            )),
        ],
        "a",
    );
    assert_eq!(
        got,
        expect(&[
            "ip cluster_ips 10.96.0.1",
            "ip hairpin 10.0.0.1 . 10.0.0.1",
            "ip hairpin 10.0.0.2 . 10.0.0.2",
            "ip cluster_dests 10.96.0.1 . tcp . 80",
            "ip cluster_bit_0 10.96.0.1 . tcp . 80",
            "ip cluster_backends_2 10.96.0.1 . tcp . 80 . 0 : 10.0.0.1 . 8080",
            "ip cluster_backends_2 10.96.0.1 . tcp . 80 . 1 : 10.0.0.2 . 8080",
        ])
    );
}

#[test]
fn no_endpoints_rejects_and_internal_local_drops() {
    let got = render(vec![Object::Service(service("ns", "web", &["10.96.0.1"], &[HTTP]))], "a");
    assert_eq!(got, expect(&["ip cluster_ips 10.96.0.1", "ip reject_dests 10.96.0.1 . tcp . 80"]));

    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.internal_traffic_policy = TrafficPolicy::Local;
    let got = render(
        vec![
            Object::Service(svc),
            Object::EndpointSlice(slice(
                "ns",
                "web-1",
                "web",
                &[SLICE_HTTP],
                vec![endpoint("10.0.0.2", "b")],
            )),
        ],
        "a",
    );
    assert_eq!(got, expect(&["ip cluster_ips 10.96.0.1", "ip drop_dests 10.96.0.1 . tcp . 80"]));
}

#[test]
fn dual_stack_with_only_ipv4_endpoints_rejects_on_ipv6() {
    let got = render(
        vec![
            Object::Service(service("ns", "web", &["10.96.0.1", "fd00::1"], &[HTTP])),
            Object::EndpointSlice(slice(
                "ns",
                "web-1",
                "web",
                &[SLICE_HTTP],
                vec![endpoint("10.0.0.2", "b")],
            )),
        ],
        "a",
    );
    assert_eq!(
        got,
        expect(&[
            "ip cluster_ips 10.96.0.1",
            "ip hairpin 10.0.0.2 . 10.0.0.2",
            "ip cluster_dests 10.96.0.1 . tcp . 80",
            "ip cluster_backends_1 10.96.0.1 . tcp . 80 . 0 : 10.0.0.2 . 8080",
            "ip6 cluster_ips fd00::1",
            "ip6 reject_dests fd00::1 . tcp . 80",
        ])
    );
}

#[test]
fn node_port_and_external_ip_with_policy_cluster_masquerade() {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.service_type = ServiceType::NodePort;
    svc.ports[0].node_port = Some(30080);
    svc.outside =
        Outside { external_ips: Box::new(["192.0.2.5".parse().unwrap()]), ..Outside::default() }
            .boxed();
    let got = render(
        vec![
            Object::Service(svc),
            Object::EndpointSlice(slice(
                "ns",
                "web-1",
                "web",
                &[SLICE_HTTP],
                vec![endpoint("10.0.0.2", "b")],
            )),
        ],
        "a",
    );
    assert_eq!(
        got,
        expect(&[
            "ip cluster_ips 10.96.0.1",
            "ip hairpin 10.0.0.2 . 10.0.0.2",
            "ip cluster_dests 10.96.0.1 . tcp . 80",
            "ip cluster_backends_1 10.96.0.1 . tcp . 80 . 0 : 10.0.0.2 . 8080",
            "ip masq_dests 192.0.2.5 . tcp . 80",
            "ip cluster_dests 192.0.2.5 . tcp . 80",
            "ip cluster_backends_1 192.0.2.5 . tcp . 80 . 0 : 10.0.0.2 . 8080",
            "ip masq_nodeports tcp . 30080",
            "ip nodeport_cluster_dests tcp . 30080",
            "ip nodeport_cluster_backends_1 tcp . 30080 . 0 : 10.0.0.2 . 8080",
        ])
    );
}

#[test]
fn load_balancer_with_local_policy_and_source_ranges() {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.service_type = ServiceType::LoadBalancer;
    svc.ports[0].node_port = Some(30080);
    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.outside = Outside {
        load_balancer_ingress: Box::new([LoadBalancerIngress {
            ip: "198.51.100.1".parse().unwrap(),
            ip_mode: IpMode::VIP,
        }]),
        load_balancer_source_ranges: Box::new([
            "203.0.113.0/24".parse().unwrap(),
            "192.168.0.0/16".parse().unwrap(),
        ]),
        ..Outside::default()
    }
    .boxed();
    let got = render(
        vec![
            Object::Service(svc),
            Object::EndpointSlice(slice(
                "ns",
                "web-1",
                "web",
                &[SLICE_HTTP],
                vec![endpoint("10.0.0.2", "b")],
            )),
            Object::Node(node("a", None, &["192.168.0.10"])),
        ],
        "a",
    );
    assert_eq!(
        got,
        expect(&[
            "ip cluster_ips 10.96.0.1",
            "ip hairpin 10.0.0.2 . 10.0.0.2",
            "ip cluster_dests 10.96.0.1 . tcp . 80",
            "ip cluster_backends_1 10.96.0.1 . tcp . 80 . 0 : 10.0.0.2 . 8080",
            // No local endpoint: outsiders are dropped, pods and the node short-circuit.
            "ip external_local_dests 198.51.100.1 . tcp . 80",
            "ip cluster_backends_1 198.51.100.1 . tcp . 80 . 0 : 10.0.0.2 . 8080",
            "ip drop_dests 198.51.100.1 . tcp . 80",
            "ip firewall_dests 198.51.100.1 . tcp . 80",
            "ip firewall_allow 198.51.100.1 . tcp . 80 . 203.0.113.0/24",
            "ip firewall_allow 198.51.100.1 . tcp . 80 . 192.168.0.0/16",
            // The node's IP is inside a range: the LB IP itself is an allowed source.
            "ip firewall_allow 198.51.100.1 . tcp . 80 . 198.51.100.1/32",
            "ip nodeport_local_dests tcp . 30080",
            "ip nodeport_cluster_backends_1 tcp . 30080 . 0 : 10.0.0.2 . 8080",
            "ip drop_nodeports tcp . 30080",
        ])
    );
}

#[test]
fn node_elements_are_the_nodeport_addresses() {
    let addresses = ["192.168.0.10".parse().unwrap(), "fd00::10".parse().unwrap()];
    let got = lines(&render_node(&addresses));
    assert_eq!(got, expect(&["ip nodeport_addrs 192.168.0.10", "ip6 nodeport_addrs fd00::10"]));
}

#[test]
fn endpoint_counts_become_bits_of_the_pick_tree() {
    let names = |n| {
        count_sets(PickKind::Cluster, n).iter().map(|m| m.name().into_owned()).collect::<Vec<_>>()
    };
    assert!(names(1).is_empty(), "one endpoint is the tree's first leaf");
    assert_eq!(names(6), ["cluster_bit_0", "cluster_bit_2"], "6 - 1 = 0b101");
    assert_eq!(names(256).len(), 8);
    assert_eq!(names(257), ["cluster_count_257"], "beyond the tree: a count set");
}

#[test]
fn endpoints_of_every_node_get_a_hairpin_pair() {
    let mut e = endpoint("10.0.0.3", "b");
    e.placement = Default::default();
    let got = render(
        vec![
            Object::Service(service("ns", "web", &["10.96.0.1"], &[HTTP])),
            Object::EndpointSlice(slice("ns", "web-1", "web", &[SLICE_HTTP], vec![e])),
        ],
        "a",
    );
    assert!(
        got.contains("ip hairpin 10.0.0.3 . 10.0.0.3"),
        "a slice entry without nodeName: {got:?}"
    );
}

/// `svc` (named `ns/web`) with endpoints 10.0.0.2 on node b and 10.0.0.1 on node a,
/// rendered for node a with these facts.
fn render_web(svc: kpng_model::global::Service, facts: &NodeFacts) -> Rendered {
    let mut model = GlobalModel::new();
    model.apply(Object::Service(svc));
    model.apply(Object::EndpointSlice(slice(
        "ns",
        "web-1",
        "web",
        &[SLICE_HTTP],
        vec![endpoint("10.0.0.2", "b"), endpoint("10.0.0.1", "a")],
    )));
    let view = NodeView { name: "a", zone: None };
    let state = project_service(&model, &ServiceKey::new("ns", "web"), &view).unwrap();
    render_service(&state, facts, &Slots::new())
}

#[test]
fn affinity_services_enter_their_group_chain() {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.session_affinity = kpng_model::global::SessionAffinity::ClientIP { timeout_seconds: 600 };
    let rendered = render_web(svc, &NodeFacts::default());
    assert_eq!(rendered.affinity.len(), 1);
    let group = &rendered.affinity[0];
    assert_eq!(group.timeout, 600);
    let targets: Vec<String> =
        group.slots.iter().flatten().map(|(ip, port)| format!("{ip}:{port}")).collect();
    assert_eq!(targets, ["10.0.0.1:8080", "10.0.0.2:8080"]);
    let chain = crate::objects::affinity_chain(group.hash);
    let got = lines(&rendered.elements);
    assert!(
        got.contains(&format!("ip affinity_cluster 10.96.0.1 . tcp . 80 : goto {chain}")),
        "{got:?}"
    );
    assert!(
        !got.iter().any(|l| l.contains("cluster_bit_")),
        "no pick tree for an affinity service: {got:?}"
    );
    // The slot record a restart reads back.
    assert!(got.contains("ip cluster_backends_2 10.96.0.1 . tcp . 80 . 0 : 10.0.0.1 . 8080"));
    // The group's chains: a known client goes to its slot, a new one picks uniformly.
    let rules: Vec<String> = group.entry_rules().into_iter().map(|r| r.text).collect();
    assert_eq!(rules.len(), 2 + 1 + 1);
    assert!(rules[2].starts_with("numgen random mod 2 == 0 goto"), "{rules:?}");
    assert!(group.slot_rule(1).unwrap().text.ends_with("dnat ip to 10.0.0.2:8080"));
}

/// The entry rules of `web`'s group (endpoints 10.0.0.1 and 10.0.0.2) with these settings
/// and, optionally, ClientIP affinity.
fn annotated_rules(lb: LoadBalancing, affinity: bool) -> Option<(Vec<String>, AffinityGroup)> {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.load_balancing = lb;
    if affinity {
        svc.session_affinity =
            kpng_model::global::SessionAffinity::ClientIP { timeout_seconds: 600 };
    }
    let facts = NodeFacts { node_ips: Vec::new(), masquerade_mark: 0x4000, without_helpers: false };
    let rendered = render_web(svc, &facts);
    let group = rendered.affinity.first()?.clone();
    Some((group.entry_rules().into_iter().map(|r| r.text).collect(), group))
}

#[test]
fn annotated_services_get_group_chains_that_follow_their_settings() {
    let lb = |f: fn(&mut LoadBalancing)| {
        let mut lb = LoadBalancing::default();
        f(&mut lb);
        lb
    };
    let slot = |group: &AffinityGroup, i| crate::objects::affinity_slot(group.hash, i);

    // Round robin: each rule's counter counts the connections that reach it.
    let (rules, g) =
        annotated_rules(lb(|l| l.scheduler = Some(Scheduler::RoundRobin)), false).expect("a group");
    assert_eq!(
        rules,
        [format!("numgen inc mod 2 == 0 goto {}", slot(&g, 0)), format!("goto {}", slot(&g, 1))]
    );
    assert!(g.slot_rule(0).unwrap().text.starts_with("meta l4proto tcp dnat"), "no stickiness");

    // hash: the persistence key, no stickiness.
    let hashed = |l: &mut LoadBalancing| {
        l.scheduler = Some(Scheduler::Hash);
        l.persistence =
            Some(Persistence { key: PersistenceKey::SrcIpDstPort, timeout_seconds: 60 });
    };
    let (rules, g) = annotated_rules(lb(hashed), false).unwrap();
    assert_eq!(
        rules,
        [
            format!("jhash ip saddr . th dport mod 2 seed 0x0 == 0 goto {}", slot(&g, 0)),
            format!("goto {}", slot(&g, 1)),
        ],
        "the last slot takes what the hash left"
    );
    let (rules, _) =
        annotated_rules(lb(|l| l.scheduler = Some(Scheduler::SymmetricHash)), false).unwrap();
    assert!(rules[0].starts_with("symhash mod 2 == 0 goto"), "{rules:?}");

    // persistence wins over ClientIP affinity: its key and timeout.
    let sticky = |l: &mut LoadBalancing| {
        l.persistence = Some(Persistence { key: PersistenceKey::SrcIpSrcPort, timeout_seconds: 5 });
    };
    let (rules, g) = annotated_rules(lb(sticky), true).unwrap();
    assert_eq!(g.timeout, 5);
    assert_eq!(rules[0], format!("ip saddr . th sport @{0} goto {0}", slot(&g, 0)));
    assert!(rules[2].starts_with("numgen random mod 2 == 0"), "{rules:?}");
    assert!(g.slot_rule(1).unwrap().text.contains("update @aff_"), "{:?}", g.slot_rule(1));

    // mode and log come first.
    let (rules, _) = annotated_rules(lb(|l| l.mode = Some(NatMode::Dnat)), false).unwrap();
    assert_eq!(rules[0], "meta mark set meta mark & 0xffffbfff");
    let (rules, _) = annotated_rules(lb(|l| l.mode = Some(NatMode::Snat)), false).unwrap();
    assert_eq!(rules[0], "meta mark set meta mark | 0x4000");
    let (rules, _) = annotated_rules(lb(|l| l.log = Some(LogPath::Forward)), false).unwrap();
    assert_eq!(
        rules[0],
        r#"fib saddr type != local limit rate 10/second burst 5 packets log prefix "kpng ns/web " level warn"#
    );

    // helper: a ct helper object of the table for the port's protocol, assigned first.
    let (rules, g) = annotated_rules(lb(|l| l.helper = Some(Helper::Ftp)), false).unwrap();
    assert_eq!(rules[0], r#"ct helper set "helper_ftp_tcp""#);
    let object = g.helper_object().unwrap();
    assert_eq!((object.helper.as_str(), object.l4proto), ("ftp", 6));
    // A helper that does not serve the port's protocol (TFTP is UDP) assigns nothing.
    let (rules, g) = annotated_rules(lb(|l| l.helper = Some(Helper::Tftp)), false).unwrap();
    assert!(g.helper_object().is_none() && !rules[0].contains("helper"), "{rules:?}");

    // No settings, no chains.
    assert!(annotated_rules(LoadBalancing::default(), false).is_none());
}

/// The rules of `group`'s chain `chain`, as text.
fn chain_rules(group: &AffinityGroup, chain: &str) -> Vec<String> {
    let (_, rules) = group.chains().into_iter().find(|(spec, _)| spec.name == chain).unwrap();
    rules.into_iter().map(|r| r.text).collect()
}

#[test]
fn stateless_services_rewrite_packets_before_conntrack() {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.load_balancing.mode = Some(NatMode::StatelessDnat);
    // Any scheduler but symhash hashes, and ClientIP affinity changes nothing.
    svc.load_balancing.scheduler = Some(Scheduler::RoundRobin);
    svc.session_affinity = kpng_model::global::SessionAffinity::ClientIP { timeout_seconds: 60 };
    svc.outside =
        Outside { external_ips: Box::new(["192.0.2.1".parse().unwrap()]), ..Outside::default() }
            .boxed();
    let rendered = render_web(svc, &NodeFacts::default());
    let group = &rendered.affinity[0];
    let entry = crate::objects::affinity_chain(group.hash);
    let slot = |i| crate::objects::affinity_slot(group.hash, i);
    let rules = |chain: &str| chain_rules(group, chain);
    assert_eq!(
        rules(&entry),
        [
            format!("jhash ip saddr . th sport mod 2 seed 0x0 == 0 goto {}", slot(0)),
            format!("goto {}", slot(1)),
        ],
        "hashed by source address and port, no stickiness"
    );
    assert_eq!(rules(&slot(1)), ["ip daddr set 10.0.0.2 tcp dport set 8080"]);
    let prerouting = format!("{entry}_prerouting");
    assert_eq!(
        rules(&prerouting),
        [
            format!("ip daddr 10.96.0.1 tcp dport 80 notrack goto {entry}"),
            "ip saddr 10.0.0.1 tcp sport 8080 notrack ip saddr set 10.96.0.1 tcp sport set 80"
                .to_string(),
            "ip saddr 10.0.0.2 tcp sport 8080 notrack ip saddr set 10.96.0.1 tcp sport set 80"
                .to_string(),
        ]
    );
    let hooks: Vec<(String, Option<kpng_netlink::nftables::objects::Hook>)> = group
        .chains()
        .into_iter()
        .filter(|(s, _)| s.hook.is_some())
        .map(|(s, _)| (s.name, s.hook))
        .collect();
    assert_eq!(hooks.len(), 2, "{hooks:?}");
    for (_, hook) in &hooks {
        assert_eq!(hook.as_ref().unwrap().priority, crate::affinity::STATELESS_PRIORITY);
    }
    assert_eq!(rules(&format!("{entry}_output")), [rules(&prerouting)[0].clone()]);
    // The external IP would get the ClusterIP's replies: rejected, not served.
    let got = lines(&rendered.elements);
    assert!(got.contains("ip reject_dests 192.0.2.1 . tcp . 80"), "{got:?}");
    assert!(!got.iter().any(|l| l.contains("192.0.2.1") && !l.contains("reject")), "{got:?}");
}

#[test]
fn direct_return_services_send_unchanged_copies_to_their_endpoints() {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.load_balancing.mode = Some(NatMode::Dsr);
    svc.load_balancing.scheduler = Some(Scheduler::SymmetricHash);
    let rendered = render_web(svc, &NodeFacts::default());
    let group = &rendered.affinity[0];
    let entry = crate::objects::affinity_chain(group.hash);
    let slot = |i| crate::objects::affinity_slot(group.hash, i);
    let rules = |chain: &str| chain_rules(group, chain);
    assert_eq!(
        rules(&entry),
        [format!("symhash mod 2 == 0 goto {}", slot(0)), format!("goto {}", slot(1))]
    );
    assert_eq!(rules(&slot(0)), ["dup to 10.0.0.1 drop"]);
    // The endpoint answers the client itself: nothing to rewrite on the way back.
    let request = format!("ip daddr 10.96.0.1 tcp dport 80 notrack goto {entry}");
    assert_eq!(rules(&format!("{entry}_prerouting")), [request.as_str()]);
    assert_eq!(rules(&format!("{entry}_output")), [format!("ct state != untracked {request}")]);
}

#[test]
fn helpers_the_kernel_has_for_ipv4_only_are_not_made_in_ipv6_tables() {
    use crate::affinity::helper_object;
    for helper in [Helper::Irc, Helper::Pptp] {
        assert!(helper_object(helper, Protocol::Tcp, Family::V4).is_some(), "{helper:?}");
        assert!(helper_object(helper, Protocol::Tcp, Family::V6).is_none(), "{helper:?}");
    }
    for helper in [Helper::NetbiosNs, Helper::Snmp] {
        assert!(helper_object(helper, Protocol::Udp, Family::V4).is_some(), "{helper:?}");
        assert!(helper_object(helper, Protocol::Udp, Family::V6).is_none(), "{helper:?}");
    }
    for (helper, protocol) in [(Helper::Ftp, Protocol::Tcp), (Helper::Sip, Protocol::Udp)] {
        assert!(helper_object(helper, protocol, Family::V6).is_some(), "{helper:?}");
    }
}
