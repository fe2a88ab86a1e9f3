use std::collections::BTreeSet;

use kpng_model::{Object, Protocol};
use kpng_testkit::builders::service;

use super::*;

/// Applies `object` to `model` and updates `projector` with what it touched.
fn apply(projector: &mut NodeProjector, model: &mut GlobalModel, object: Object) -> Vec<Op> {
    let touched: BTreeSet<Touched> = model.apply(object).unwrap_or_default().into_iter().collect();
    projector.update(model, &Changes::Touched(touched))
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
