//! Golden tests: the chains of representative services, as `iptables-save` lines.

use std::collections::BTreeSet;

use kpng_local::project_node_state;
use kpng_model::global::{IpMode, LoadBalancerIngress, Outside, ServiceType, TrafficPolicy};
use kpng_model::{GlobalModel, Object, Protocol, ServiceKey};
use kpng_testkit::builders::{endpoint, node, service, slice};

use super::*;

const HTTP: (&str, Protocol, u16) = ("http", Protocol::Tcp, 80);
const SLICE_HTTP: (&str, Protocol, u16) = ("http", Protocol::Tcp, 8080);

fn ctx() -> Context {
    Context {
        localhost_nodeports: false,
        masquerade_all: false,
        masq_mark: 0x4000,
        drop_mark: 0x8000,
        local: LocalTraffic::Cidrs(vec!["10.244.0.0/16".parse().unwrap()]),
        node_ips: vec!["192.168.0.1".parse().unwrap()],
    }
}

/// Every line of the service's chains, with hashed names replaced by their kind, and its
/// entries as `<table> entry <rule>`.
fn lines(objects: Vec<Object>, ctx: &Context) -> BTreeSet<String> {
    let mut model = GlobalModel::new();
    model.apply(Object::Node(node("a", None, &["192.168.0.1"])));
    for o in objects {
        model.apply(o);
    }
    let state = project_node_state(&model, "a");
    let rendered = render_service(&state.services[&ServiceKey::new("ns", "web")], ctx);
    let mut names: Vec<(String, String)> = Vec::new();
    for (_, _, chain) in rendered.chains.keys() {
        let kind = &chain.as_str()[..8];
        let n = names.iter().filter(|(_, k)| k.starts_with(kind)).count();
        names.push((chain.to_string(), format!("{kind}{n}")));
    }
    let rename = |text: String| names.iter().fold(text, |t, (from, to)| t.replace(from, to));
    let mut out = BTreeSet::new();
    for ((_, table, chain), rules) in &rendered.chains {
        for rule in rules {
            out.insert(rename(format!("{} -A {chain} {rule}", table.as_str())));
        }
    }
    for entry in &rendered.entries {
        out.insert(rename(format!("{} entry {}", entry.table.as_str(), entry.rule)));
    }
    out
}

fn expect(lines: &[&str]) -> BTreeSet<String> {
    lines.iter().map(|s| s.to_string()).collect()
}

#[test]
fn cluster_ip_with_two_endpoints() {
    let got = lines(
        vec![
            Object::Service(service("ns", "web", &["10.96.1.10"], &[HTTP])),
            Object::EndpointSlice(slice(
                "ns",
                "web-1",
                "web",
                &[SLICE_HTTP],
                vec![endpoint("10.244.0.10", "a"), endpoint("10.244.2.10", "b")],
            )),
        ],
        &ctx(),
    );
    assert_eq!(
        got,
        expect(&[
            "nat -A KPNG-SVC0 -d 10.96.1.10/32 -p tcp -m tcp --dport 80 -j KPNG-MASQ-UNLESS-POD",
            "nat -A KPNG-SVC0 -m statistic --mode random --probability 0.50000000000 -j KPNG-SEP0",
            "nat -A KPNG-SVC0 -j KPNG-SEP1",
            "nat -A KPNG-SEP0 -s 10.244.0.10/32 -j KPNG-MARK-MASQ",
            "nat -A KPNG-SEP0 -p tcp -j DNAT --to-destination 10.244.0.10:8080",
            "nat -A KPNG-SEP1 -s 10.244.2.10/32 -j KPNG-MARK-MASQ",
            "nat -A KPNG-SEP1 -p tcp -j DNAT --to-destination 10.244.2.10:8080",
            "nat entry -d 10.96.1.10/32 -p tcp -m tcp --dport 80 -j KPNG-SVC0",
            "filter entry -d 10.96.1.10/32 -j REJECT --reject-with icmp-port-unreachable",
        ])
    );
}

#[test]
fn no_endpoints_rejects_and_internal_local_drops() {
    let got = lines(vec![Object::Service(service("ns", "web", &["10.96.0.1"], &[HTTP]))], &ctx());
    assert_eq!(
        got,
        expect(&[
            "filter entry -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j REJECT --reject-with icmp-port-unreachable",
            "filter entry -d 10.96.0.1/32 -j REJECT --reject-with icmp-port-unreachable",
        ])
    );
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.internal_traffic_policy = TrafficPolicy::Local;
    let remote = slice("ns", "web-1", "web", &[SLICE_HTTP], vec![endpoint("10.244.1.2", "b")]);
    let got = lines(vec![Object::Service(svc), Object::EndpointSlice(remote)], &ctx());
    assert_eq!(
        got,
        expect(&[
            "filter entry -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j DROP",
            "filter entry -d 10.96.0.1/32 -j REJECT --reject-with icmp-port-unreachable",
        ])
    );
}

#[test]
fn external_policy_local_short_circuits_pods_and_the_node_and_firewalls_ranges() {
    let mut svc = service("ns", "web", &["10.96.0.1"], &[HTTP]);
    svc.service_type = ServiceType::LoadBalancer;
    svc.ports[0].node_port = Some(30080);
    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.outside = Outside {
        load_balancer_ingress: Box::new([LoadBalancerIngress {
            ip: "203.0.113.1".parse().unwrap(),
            ip_mode: IpMode::VIP,
        }]),
        load_balancer_source_ranges: Box::new(["198.51.100.0/24".parse().unwrap()]),
        ..Outside::default()
    }
    .boxed();
    let remote = slice("ns", "web-1", "web", &[SLICE_HTTP], vec![endpoint("10.244.1.2", "b")]);
    let got = lines(vec![Object::Service(svc), Object::EndpointSlice(remote)], &ctx());
    assert_eq!(
        got,
        expect(&[
            "nat -A KPNG-SVC0 -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KPNG-MASQ-UNLESS-POD",
            "nat -A KPNG-SVC0 -j KPNG-SEP0",
            "nat -A KPNG-SEP0 -s 10.244.1.2/32 -j KPNG-MARK-MASQ",
            "nat -A KPNG-SEP0 -p tcp -j DNAT --to-destination 10.244.1.2:8080",
            "nat -A KPNG-EXT0 -s 10.244.0.0/16 -j KPNG-SVC0",
            "nat -A KPNG-EXT0 -m addrtype --src-type LOCAL -j KPNG-MARK-MASQ",
            "nat -A KPNG-EXT0 -m addrtype --src-type LOCAL -j KPNG-SVC0",
            "nat -A KPNG-FW-0 -s 198.51.100.0/24 -j KPNG-EXT0",
            "nat -A KPNG-FW-0 -j KPNG-MARK-DROP",
            "nat entry -d 10.96.0.1/32 -p tcp -m tcp --dport 80 -j KPNG-SVC0",
            "nat entry -d 203.0.113.1/32 -p tcp -m tcp --dport 80 -j KPNG-FW-0",
            "nat entry -p tcp -m tcp --dport 30080 -j KPNG-EXT0",
            // No local endpoint: outside traffic that no short-circuit took is dropped.
            "filter entry -d 203.0.113.1/32 -p tcp -m tcp --dport 80 -j DROP",
            "filter entry -p tcp -m tcp --dport 30080 -j DROP",
            "filter entry -d 10.96.0.1/32 -j REJECT --reject-with icmp-port-unreachable",
        ])
    );
}

#[test]
fn affinity_checks_then_records_each_endpoint() {
    let mut svc = service("ns", "web", &["fd00::1"], &[HTTP]);
    svc.session_affinity = kpng_model::global::SessionAffinity::ClientIP { timeout_seconds: 60 };
    let eps = slice("ns", "web-1", "web", &[SLICE_HTTP], vec![endpoint("fd00:244::1", "b")]);
    let got = lines(
        vec![Object::Service(svc), Object::EndpointSlice(eps)],
        &Context { masquerade_all: true, ..ctx() },
    );
    let mask = "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff";
    assert!(got.contains(&format!("nat -A KPNG-SVC0 -m recent --rcheck --seconds 60 --reap --name KPNG-SEP0 --mask {mask} --rsource -j KPNG-SEP0")), "{got:#?}");
    assert!(got.contains(&format!("nat -A KPNG-SEP0 -p tcp -m recent --set --name KPNG-SEP0 --mask {mask} --rsource -j DNAT --to-destination [fd00:244::1]:8080")), "{got:#?}");
    assert!(
        got.contains("nat -A KPNG-SVC0 -d fd00::1/128 -p tcp -m tcp --dport 80 -j KPNG-MARK-MASQ"),
        "{got:#?}"
    );
}

#[test]
fn the_crate_docs_example_is_what_render_makes() {
    let mut model = GlobalModel::new();
    model.apply(Object::Service(service("shop", "web", &["10.96.1.10"], &[HTTP])));
    model.apply(Object::EndpointSlice(slice(
        "shop",
        "web-1",
        "web",
        &[SLICE_HTTP],
        vec![endpoint("10.244.0.10", "a"), endpoint("10.244.2.10", "b")],
    )));
    let state = project_node_state(&model, "a");
    let rendered = render_service(&state.services[&ServiceKey::new("shop", "web")], &ctx());
    let docs = include_str!("../lib.rs");
    for ((_, _, chain), rules) in &rendered.chains {
        for rule in rules {
            let line = format!("-A {chain} {rule}");
            assert!(docs.contains(&line), "the crate docs lack {line}");
        }
    }
    for entry in rendered.entries.iter().filter(|e| e.table == Table::Nat) {
        let line = format!("-A KPNG-SH-0A {}", entry.rule);
        assert!(docs.contains(&line), "the crate docs lack {line}");
    }
}
