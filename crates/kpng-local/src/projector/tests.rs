use std::collections::BTreeSet;

use ipnet::IpNet;
use kpng_model::{Item, Object, ObjectRef, Protocol};
use kpng_testkit::builders::{node, service, service_cidr};

use super::*;

fn nets(list: &[&str]) -> Vec<IpNet> {
    list.iter().map(|n| n.parse().unwrap()).collect()
}

/// Applies `object` to `model` and updates `projector` with what it touched.
fn apply(projector: &mut NodeProjector, model: &mut GlobalModel, object: Object) -> Vec<Op> {
    let touched: BTreeSet<Touched> = model.apply(object).unwrap_or_default().into_iter().collect();
    projector.update(model, &Changes::Touched(touched))
}

fn delete(projector: &mut NodeProjector, model: &mut GlobalModel, key: ObjectRef) -> Vec<Op> {
    let touched: BTreeSet<Touched> = model.delete(&key).unwrap_or_default().into_iter().collect();
    projector.update(model, &Changes::Touched(touched))
}

/// The service CIDRs of the node state each op sets.
fn node_cidrs(ops: &[Op]) -> Vec<Vec<String>> {
    ops.iter()
        .map(|op| match op {
            Op::Set(Item::Node(n)) => n.service_cidrs.iter().map(ToString::to_string).collect(),
            other => panic!("only the node changes, not {other:?}"),
        })
        .collect()
}

#[test]
fn service_cidr_objects_reach_the_node_state_with_the_nodes_own() {
    let local = NodeLocal { service_cidrs: nets(&["10.100.0.0/16"]), ..NodeLocal::default() };
    let mut projector = NodeProjector::with_local("a", local);
    let mut model = GlobalModel::new();
    model.apply(Object::Node(node("a", None, &["192.168.0.1"])));
    model.apply(Object::Service(service(
        "ns",
        "web",
        &["10.96.0.1"],
        &[("http", Protocol::Tcp, 80)],
    )));
    projector.update(&model, &Changes::All);
    let cidrs = |p: &NodeProjector| p.state().node.as_ref().unwrap().service_cidrs.clone();
    assert_eq!(cidrs(&projector), nets(&["10.100.0.0/16"]), "the option alone");

    // A ServiceCIDR appears: the node is set again, and no service is touched.
    let first = service_cidr("kubernetes", &["fd00:96::/112", "10.96.0.0/16"]);
    let ops = apply(&mut projector, &mut model, Object::ServiceCidr(first));
    assert_eq!(node_cidrs(&ops), [["10.96.0.0/16", "10.100.0.0/16", "fd00:96::/112"]]);
    assert_eq!(projector.state(), &crate::project_node_state_with(&model, "a", &projector.local));

    // A second object over a range already in force changes nothing on the node.
    let same = service_cidr("extra", &["10.100.0.0/16"]);
    assert!(apply(&mut projector, &mut model, Object::ServiceCidr(same)).is_empty());
    let wider = service_cidr("extra", &["10.100.0.0/16", "10.101.0.0/16"]);
    let ops = apply(&mut projector, &mut model, Object::ServiceCidr(wider));
    assert_eq!(
        node_cidrs(&ops),
        [["10.96.0.0/16", "10.100.0.0/16", "10.101.0.0/16", "fd00:96::/112"]]
    );

    // Deleted, the objects' ranges go; the option's stay.
    delete(&mut projector, &mut model, ObjectRef::ServiceCidr("extra".into()));
    let ops = delete(&mut projector, &mut model, ObjectRef::ServiceCidr("kubernetes".into()));
    assert_eq!(node_cidrs(&ops), [["10.100.0.0/16"]]);
    assert_eq!(projector.state(), &crate::project_node_state_with(&model, "a", &projector.local));
}

#[test]
fn without_a_node_object_service_cidrs_wait_for_it() {
    let mut projector = NodeProjector::new("a");
    let mut model = GlobalModel::new();
    let cidr = service_cidr("kubernetes", &["10.96.0.0/16"]);
    assert!(apply(&mut projector, &mut model, Object::ServiceCidr(cidr)).is_empty());
    let ops = apply(&mut projector, &mut model, Object::Node(node("a", None, &["192.168.0.1"])));
    assert_eq!(node_cidrs(&ops), [["10.96.0.0/16"]]);
}

#[test]
fn completing_a_node_twice_changes_nothing_more() {
    let local = NodeLocal { service_cidrs: nets(&["10.100.7.0/16"]), ..NodeLocal::default() };
    let mut model = GlobalModel::new();
    model.apply(Object::Node(node("a", None, &["192.168.0.1"])));
    model.apply(Object::ServiceCidr(service_cidr("kubernetes", &["10.96.0.0/16"])));
    let mut projected = crate::project_node_with(&model, "a", &local).unwrap();
    assert_eq!(projected.service_cidrs, nets(&["10.96.0.0/16", "10.100.0.0/16"]), "truncated");
    let once = projected.clone();
    local.complete(&mut projected);
    assert_eq!(projected, once);
}

#[test]
fn a_new_creation_time_moves_destinations_between_rivals() {
    let dns = [("dns", Protocol::Udp, 53)];
    let mut older = service("b", "dns", &["10.0.0.100"], &dns);
    older.created_at = Some(1_500_000_000);
    let rival = service("a", "dns", &["10.0.0.100"], &dns);
    let mut projector = NodeProjector::new("a");
    let mut model = GlobalModel::new();
    apply(&mut projector, &mut model, Object::Service(older.clone()));
    apply(&mut projector, &mut model, Object::Service(rival));
    let yielded = |p: &NodeProjector, namespace: &str| {
        let key = kpng_model::ServiceKey::new(namespace, "dns");
        !p.state().services[&key].service.ports[0].yielded.is_empty()
    };
    assert!(yielded(&projector, "a") && !yielded(&projector, "b"), "b/dns is older");
    // b/dns was re-created meanwhile: unknown age now, so a/dns wins by name.
    older.created_at = None;
    apply(&mut projector, &mut model, Object::Service(older));
    assert!(!yielded(&projector, "a") && yielded(&projector, "b"));
    assert_eq!(projector.state(), &crate::project_node_state(&model, "a"));
}
