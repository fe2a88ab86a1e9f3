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
        UdpCheck { target: UdpTarget::NodePort(Family::V4, 30053), serving: Serving::default() };
    let entries = [
        entry("192.168.10.100:4000", "192.168.10.1:30053", "10.244.1.7:53"),
        entry("192.168.10.100:4001", "172.17.0.1:30053", "172.17.0.1:30053"),
    ];
    let got = stale(&entries, &check, &["192.168.10.1".parse().unwrap()]);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].orig_src.port(), 4000);
}

#[test]
fn flow_by_flow_checks_agree_with_the_entry_dump() {
    let checks = [
        check("10.96.0.10:53", &["10.244.0.5:53"]),
        UdpCheck { target: UdpTarget::NodePort(Family::V4, 30053), serving: Serving::default() },
    ];
    let addrs = ["192.168.10.1".parse().unwrap()];
    let index = StaleChecks::new(&checks, &addrs);
    let flows = [
        ("10.96.0.10:53", "10.244.0.5:53", false), // serving endpoint: kept
        ("10.96.0.10:53", "10.244.1.7:53", true),  // removed endpoint
        ("10.96.0.11:53", "10.244.1.7:53", false), // no check covers it
        ("192.168.10.1:30053", "10.244.1.7:53", true), // a NodePort with no endpoint left
        ("172.17.0.1:30053", "10.244.1.7:53", false), // not a NodePort address
    ];
    for (dest, endpoint, expected) in flows {
        let (dest, endpoint) = (dest.parse().unwrap(), endpoint.parse().unwrap());
        assert_eq!(index.stale(dest, endpoint), expected, "{dest} answered by {endpoint}");
        let entry = Entry {
            orig_src: "10.244.0.9:4000".parse().unwrap(),
            orig_dst: dest,
            reply_src: endpoint,
            zone: 0,
        };
        let by_dump = checks.iter().any(|c| !stale(&[entry], c, &addrs).is_empty());
        assert_eq!(by_dump, expected, "the dump's verdict on {dest} answered by {endpoint}");
    }
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
        }]
        .into(),
    }
}

fn dns(endpoints: Vec<LocalEndpoint>) -> LocalServiceState {
    let service = LocalService {
        key: ServiceKey::new("ns", "dns"),
        service_type: ServiceType::ClusterIP,
        cluster_ips: vec!["10.96.0.10".parse().unwrap()].into(),
        outside: None,
        ports: vec![LocalServicePort {
            name: "dns".into(),
            protocol: Protocol::Udp,
            port: 53,
            node_port: None,
            has_endpoints: Default::default(),
            yielded: Box::default(),
        }]
        .into(),
        affinity_timeout_seconds: None,
        internal_local: false,
        external_local: false,
        health_check_node_port: None,
        load_balancing: Default::default(),
    };
    LocalServiceState { service, endpoints: endpoints.into_iter().collect() }
}

#[test]
fn every_serving_endpoint_keeps_its_flows_whether_picked_or_not() {
    let state = dns(vec![
        endpoint("10.244.0.5", true, true, true),    // picked
        endpoint("10.244.1.5", true, true, false),   // ready elsewhere, not picked (topology)
        endpoint("10.244.2.5", false, true, false),  // terminating but serving
        endpoint("10.244.3.5", false, false, false), // gone from serving
    ]);
    let checks = udp_checks(&state);
    assert_eq!(checks.len(), 1);
    let serving: Vec<String> = checks[0].serving.iter().map(|a| a.to_string()).collect();
    assert_eq!(serving, ["10.244.0.5:53", "10.244.1.5:53", "10.244.2.5:53"]);
}

#[test]
fn only_a_change_that_can_leave_stale_entries_requires_a_check() {
    use kpng_backend::ChangeSet;
    use kpng_model::{ItemRef, LocalState, Op};

    let key = ServiceKey::new("ns", "dns");
    let touched = [Op::Delete(ItemRef::Service(key.clone()))];
    let mut cleaner = FlowCleaner::conntrack();
    let mut state = LocalState::default();
    // What one change set hands over: (required, endpoints) per destination.
    let mut collect = |cleaner: &mut FlowCleaner, endpoints: &[(&str, bool)]| {
        let endpoints = endpoints.iter().map(|(ip, ready)| endpoint(ip, *ready, *ready, true));
        state.services.insert(key.clone(), dns(endpoints.collect()));
        cleaner.collect(&ChangeSet::changes(&touched, &state));
        let out: Vec<(bool, usize)> =
            cleaner.outbox.values().map(|u| (u.required, u.serving.len())).collect();
        cleaner.outbox.clear();
        out
    };
    // A new destination: entries may predate its rules.
    assert_eq!(collect(&mut cleaner, &[("10.244.0.5", true)]), [(true, 1)]);
    // Nothing changed for it: nothing handed over.
    assert_eq!(collect(&mut cleaner, &[("10.244.0.5", true)]), []);
    // An endpoint joins: every entry stays valid; only a pending check would follow it.
    let both = [("10.244.0.5", true), ("10.244.1.5", true)];
    assert_eq!(collect(&mut cleaner, &both), [(false, 2)]);
    // One stops serving: its entries are stale.
    assert_eq!(collect(&mut cleaner, &[("10.244.0.5", true), ("10.244.1.5", false)]), [(true, 1)]);
    // Down to none, then back from none: both required.
    assert_eq!(collect(&mut cleaner, &[]), [(true, 0)]);
    assert_eq!(collect(&mut cleaner, &[("10.244.2.5", true)]), [(true, 1)]);
    // The service goes: everything towards it is stale.
    state.services.clear();
    cleaner.collect(&ChangeSet::changes(&touched, &state));
    let out: Vec<(bool, usize)> =
        cleaner.outbox.values().map(|u| (u.required, u.serving.len())).collect();
    assert_eq!(out, [(true, 0)]);
}

#[test]
fn serving_endpoints_answer_as_a_set_whatever_their_order() {
    let addresses =
        |list: &[&str]| -> Vec<SocketAddr> { list.iter().map(|a| a.parse().unwrap()).collect() };
    let all: Serving = addresses(&["10.0.0.3:53", "[fd00::1]:53", "10.0.0.1:53", "10.0.0.3:53"])
        .into_iter()
        .collect();
    assert_eq!(all.len(), 3, "one copy of each");
    for address in addresses(&["10.0.0.1:53", "10.0.0.3:53", "[fd00::1]:53"]) {
        assert!(all.contains(&address), "{address}");
    }
    for address in addresses(&["10.0.0.2:53", "10.0.0.1:54", "[fd00::2]:53"]) {
        assert!(!all.contains(&address), "{address}");
    }
    let some: Serving = addresses(&["[fd00::1]:53", "10.0.0.1:53"]).into_iter().collect();
    assert!(some.is_subset(&all) && !all.is_subset(&some));
    assert!(Serving::default().is_subset(&some) && Serving::default().is_empty());
    assert_eq!(some, addresses(&["10.0.0.1:53", "[fd00::1]:53"]).into_iter().collect());

    // IPv4 addresses alone, kept as bytes, answer alike and come back in order.
    let v4: Serving = addresses(&["10.0.1.1:53", "10.0.0.3:54", "10.0.0.3:53", "9.255.255.255:53"])
        .into_iter()
        .collect();
    let back: Vec<String> = v4.iter().map(|a| a.to_string()).collect();
    assert_eq!(back, ["9.255.255.255:53", "10.0.0.3:53", "10.0.0.3:54", "10.0.1.1:53"]);
    assert!(v4.contains(&"10.0.0.3:54".parse().unwrap()));
    assert!(!v4.contains(&"10.0.0.3:55".parse().unwrap()));
    assert!(!v4.contains(&"[::ffff:10.0.0.3]:53".parse().unwrap()));
    let three: Serving = addresses(&["10.0.0.3:53", "10.0.1.1:53"]).into_iter().collect();
    assert!(three.is_subset(&v4) && !v4.is_subset(&three) && !three.is_subset(&all));
    assert!(Serving::default().is_subset(&v4));
    assert_eq!(Serving::default(), std::iter::empty().collect());
}

#[test]
fn a_reset_checks_every_destination_and_those_of_services_gone_since() {
    use kpng_backend::ChangeSet;
    use kpng_model::{ItemRef, LocalState, Op};

    let dns_key = ServiceKey::new("ns", "dns");
    let mut cleaner = FlowCleaner::conntrack();
    let mut state = LocalState::default();
    state.services.insert(dns_key.clone(), dns(vec![endpoint("10.244.0.5", true, true, true)]));
    cleaner.collect(&ChangeSet::changes(&[Op::Delete(ItemRef::Service(dns_key))], &state));
    cleaner.outbox.clear();
    // A reset (after a failure, say) finds that service gone and another one there.
    let mut other = dns(vec![endpoint("10.244.1.5", true, true, true)]);
    other.service.cluster_ips = Box::new(["10.96.0.11".parse().unwrap()]);
    state.services.clear();
    state.services.insert(ServiceKey::new("ns", "other"), other);
    let reset = |cleaner: &mut FlowCleaner| {
        cleaner.collect(&ChangeSet::full(&state));
        let out: Vec<(UdpTarget, bool, usize)> = std::mem::take(&mut cleaner.outbox)
            .into_iter()
            .map(|(target, u)| (target, u.required, u.serving.len()))
            .collect();
        out
    };
    let dest = |address: &str| UdpTarget::Dest(address.parse().unwrap());
    // The gone service's destination is checked with no endpoint, the new one with its own.
    let expected = [(dest("10.96.0.10:53"), true, 0), (dest("10.96.0.11:53"), true, 1)];
    assert_eq!(reset(&mut cleaner), expected);
    // Another reset checks what is there again, and forgot the service gone.
    assert_eq!(reset(&mut cleaner), [(dest("10.96.0.11:53"), true, 1)]);
}
