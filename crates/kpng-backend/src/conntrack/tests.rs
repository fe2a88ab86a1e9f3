use super::*;

use kpng_model::global::{ServiceKey, ServiceType};
use kpng_model::local::{EndpointPort, LocalServicePort};
use kpng_model::{LocalEndpoint, LocalService};

fn entry(src: &str, dst: &str, reply: &str) -> Entry {
    Entry {
        orig_src: src.parse().unwrap(),
        orig_dst: dst.parse().unwrap(),
        reply_src: reply.parse().unwrap(),
        zone: 0,
    }
}

fn check(target: &str, serving: &[&str]) -> UdpCheck {
    UdpCheck {
        target: UdpTarget::Dest(target.parse().unwrap()),
        serving: serving.iter().map(|s| s.parse().unwrap()).collect(),
    }
}

#[test]
fn stale_entries_answer_from_elsewhere() {
    let check = check("10.96.0.10:53", &["10.244.0.5:53"]);
    let entries = [
        entry("10.244.0.9:4000", "10.96.0.10:53", "10.244.0.5:53"), // serving endpoint: kept
        entry("10.244.0.9:4001", "10.96.0.10:53", "10.244.1.7:53"), // removed endpoint
        entry("10.244.0.9:4002", "10.96.0.10:53", "10.96.0.10:53"), // created before the rules
        entry("10.244.0.9:4003", "10.96.0.11:53", "10.244.1.7:53"), // another service
    ];
    let got: Vec<u16> = stale(&entries, &check, &[]).iter().map(|e| e.orig_src.port()).collect();
    assert_eq!(got, [4001, 4002]);
    // Scaled to zero: everything towards the service goes.
    assert_eq!(stale(&entries, &super::tests::check("10.96.0.10:53", &[]), &[]).len(), 3);
}

#[test]
fn node_ports_only_on_node_port_addresses() {
    let check =
        UdpCheck { target: UdpTarget::NodePort(Family::V4, 30053), serving: BTreeSet::new() };
    let entries = [
        entry("192.168.10.100:4000", "192.168.10.1:30053", "10.244.1.7:53"),
        entry("192.168.10.100:4001", "172.17.0.1:30053", "172.17.0.1:30053"),
    ];
    let got = stale(&entries, &check, &["192.168.10.1".parse().unwrap()]);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].orig_src.port(), 4000);
}

fn endpoint(ip: &str, ready: bool, serving: bool, cluster: bool) -> LocalEndpoint {
    LocalEndpoint {
        ip: ip.parse().unwrap(),
        local: false,
        ready,
        serving,
        terminating: !ready,
        pod_name: None,
        ports: vec![EndpointPort {
            name: "dns".into(),
            protocol: Protocol::Udp,
            port: 53,
            cluster,
            local: false,
        }],
    }
}

#[test]
fn every_serving_endpoint_keeps_its_flows_whether_picked_or_not() {
    let service = LocalService {
        key: ServiceKey::new("ns", "dns"),
        service_type: ServiceType::ClusterIP,
        cluster_ips: vec!["10.96.0.10".parse().unwrap()],
        external_ips: vec![],
        load_balancer_ips: vec![],
        load_balancer_source_ranges: vec![],
        ports: vec![LocalServicePort {
            name: "dns".into(),
            protocol: Protocol::Udp,
            port: 53,
            node_port: None,
            has_endpoints: Default::default(),
            yielded: vec![],
        }],
        affinity_timeout_seconds: None,
        internal_local: false,
        external_local: false,
        health_check_node_port: None,
    };
    let state = LocalServiceState {
        service,
        endpoints: [
            endpoint("10.244.0.5", true, true, true),    // picked
            endpoint("10.244.1.5", true, true, false),   // ready elsewhere, not picked (topology)
            endpoint("10.244.2.5", false, true, false),  // terminating but serving
            endpoint("10.244.3.5", false, false, false), // gone from serving
        ]
        .into_iter()
        .collect(),
    };
    let checks = udp_checks(&state);
    assert_eq!(checks.len(), 1);
    let serving: Vec<String> = checks[0].serving.iter().map(ToString::to_string).collect();
    assert_eq!(serving, ["10.244.0.5:53", "10.244.1.5:53", "10.244.2.5:53"]);
}
