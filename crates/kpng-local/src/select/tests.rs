use super::*;
use kpng_model::global::{Hints, Placement};

fn ep(ip: &str, node: &str) -> Endpoint {
    Endpoint {
        address: ip.parse().unwrap(),
        ready: true,
        serving: true,
        terminating: false,
        placement: Placement::new(Some(node), None),
        pod_name: None,
    }
}

fn terminating(mut e: Endpoint, serving: bool) -> Endpoint {
    e.ready = false;
    e.serving = serving;
    e.terminating = true;
    e
}

fn zone_hinted(mut e: Endpoint, zones: &[&str]) -> Endpoint {
    let zones = zones.iter().map(|z| z.to_string()).collect();
    e.set_hints(Hints::new(zones, e.node_hints().to_vec()));
    e
}

fn node_hinted(mut e: Endpoint, nodes: &[&str]) -> Endpoint {
    let nodes = nodes.iter().map(|n| n.to_string()).collect();
    e.set_hints(Hints::new(e.zone_hints().to_vec(), nodes));
    e
}

const BOTH: SetsUsed = SetsUsed { cluster: true, local: true };
const NODE_A: NodeView<'static> = NodeView { name: "a", zone: Some("z1") };

fn select(eps: &[Endpoint], node: NodeView<'_>, used: SetsUsed) -> Selection {
    let refs: Vec<&Endpoint> = eps.iter().collect();
    select_endpoints(&refs, &node, used)
}

#[test]
fn ready_endpoints_form_both_sets() {
    let eps = [ep("10.0.0.1", "a"), ep("10.0.0.2", "b")];
    let s = select(&eps, NODE_A, BOTH);
    assert_eq!(s.cluster, [true, true]);
    assert_eq!(s.local, [true, false]);
    assert!(s.has_endpoints);
}

#[test]
fn not_ready_and_not_serving_are_excluded() {
    let mut not_ready = ep("10.0.0.2", "a");
    not_ready.ready = false;
    let eps = [ep("10.0.0.1", "b"), not_ready, terminating(ep("10.0.0.3", "a"), true)];
    let s = select(&eps, NODE_A, BOTH);
    assert_eq!(s.cluster, [true, false, false]);
    // The local endpoint 10.0.0.3 is serving+terminating and no local endpoint is ready.
    assert_eq!(s.local, [false, false, true]);
}

#[test]
fn terminating_fallback_only_when_nothing_ready() {
    let eps = [terminating(ep("10.0.0.1", "a"), true), terminating(ep("10.0.0.2", "b"), false)];
    let s = select(&eps, NODE_A, BOTH);
    assert_eq!(s.cluster, [true, false]);
    assert_eq!(s.local, [true, false]);
    assert!(s.has_endpoints);

    let eps = [terminating(ep("10.0.0.1", "a"), false)];
    let s = select(&eps, NODE_A, BOTH);
    assert_eq!(s.cluster, [false]);
    assert!(!s.has_endpoints);
}

#[test]
fn zone_hints_filter_the_cluster_set_only() {
    let eps = [
        zone_hinted(ep("10.0.0.1", "b"), &["z1"]),
        zone_hinted(ep("10.0.0.2", "c"), &["z2"]),
        zone_hinted(ep("10.0.0.3", "a"), &["z2"]),
    ];
    let s = select(&eps, NODE_A, BOTH);
    assert_eq!(s.cluster, [true, false, false]);
    // Local set ignores topology.
    assert_eq!(s.local, [false, false, true]);
}

#[test]
fn zone_hints_ignored_unless_every_ready_endpoint_has_one() {
    let eps = [zone_hinted(ep("10.0.0.1", "b"), &["z1"]), ep("10.0.0.2", "c")];
    assert_eq!(select(&eps, NODE_A, BOTH).cluster, [true, true]);
    // Not-ready endpoints without hints do not disable topology.
    let mut unhinted_not_ready = ep("10.0.0.3", "c");
    unhinted_not_ready.ready = false;
    let eps = [
        zone_hinted(ep("10.0.0.1", "b"), &["z1"]),
        zone_hinted(ep("10.0.0.2", "c"), &["z2"]),
        unhinted_not_ready,
    ];
    assert_eq!(select(&eps, NODE_A, BOTH).cluster, [true, false, false]);
}

#[test]
fn zone_hints_ignored_when_none_matches_or_node_has_no_zone() {
    let eps =
        [zone_hinted(ep("10.0.0.1", "b"), &["z2"]), zone_hinted(ep("10.0.0.2", "c"), &["z3"])];
    assert_eq!(select(&eps, NODE_A, BOTH).cluster, [true, true]);
    let eps =
        [zone_hinted(ep("10.0.0.1", "b"), &["z1"]), zone_hinted(ep("10.0.0.2", "c"), &["z2"])];
    let no_zone = NodeView { name: "a", zone: None };
    assert_eq!(select(&eps, no_zone, BOTH).cluster, [true, true]);
}

#[test]
fn node_hints_win_over_zone_hints() {
    let eps = [
        node_hinted(zone_hinted(ep("10.0.0.1", "b"), &["z1"]), &["b"]),
        node_hinted(zone_hinted(ep("10.0.0.2", "a"), &["z1"]), &["a"]),
    ];
    assert_eq!(select(&eps, NODE_A, BOTH).cluster, [false, true]);
    // No endpoint hinted for this node: fall back to zone hints.
    let other = NodeView { name: "c", zone: Some("z1") };
    assert_eq!(select(&eps, other, BOTH).cluster, [true, true]);
}

#[test]
fn unused_sets_stay_empty() {
    let eps = [ep("10.0.0.1", "a"), ep("10.0.0.2", "b")];
    let s = select(&eps, NODE_A, SetsUsed { cluster: false, local: true });
    assert_eq!(s.cluster, [false, false]);
    assert_eq!(s.local, [true, false]);
    assert!(s.has_endpoints);
    let s = select(&eps, NODE_A, SetsUsed { cluster: true, local: false });
    assert_eq!(s.local, [false, false]);
}

#[test]
fn topology_with_terminating_fallback_ignores_hints() {
    let eps = [
        zone_hinted(terminating(ep("10.0.0.1", "b"), true), &["z2"]),
        zone_hinted(terminating(ep("10.0.0.2", "c"), true), &["z1"]),
    ];
    assert_eq!(select(&eps, NODE_A, BOTH).cluster, [true, true]);
}
