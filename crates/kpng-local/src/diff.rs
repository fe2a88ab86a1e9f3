//! Two node states → the ops that lead from one to the other.

use kpng_model::local::LocalServiceState;
use kpng_model::{Item, ItemRef, LocalState, Op, ServiceKey};

/// Ops of one change set, gathered by phase so that the emitted order is always valid:
/// the node first, then services set, then endpoints deleted and set, then services deleted.
#[derive(Debug, Default)]
struct ChangeSet {
    node: Vec<Op>,
    service_sets: Vec<Op>,
    endpoint_deletes: Vec<Op>,
    endpoint_sets: Vec<Op>,
    service_deletes: Vec<Op>,
}

impl ChangeSet {
    fn into_ops(self) -> Vec<Op> {
        let mut ops = self.node;
        ops.extend(self.service_sets);
        ops.extend(self.endpoint_deletes);
        ops.extend(self.endpoint_sets);
        ops.extend(self.service_deletes);
        ops
    }

    fn service(
        &mut self,
        key: &ServiceKey,
        old: Option<&LocalServiceState>,
        new: Option<&LocalServiceState>,
    ) {
        match (old, new) {
            (None, None) => {}
            (Some(old), None) => {
                for ip in old.endpoints.keys() {
                    self.endpoint_deletes
                        .push(Op::Delete(ItemRef::Endpoint { service: key.clone(), ip: *ip }));
                }
                self.service_deletes.push(Op::Delete(ItemRef::Service(key.clone())));
            }
            (old, Some(new)) => {
                if old.map(|o| &o.service) != Some(&new.service) {
                    self.service_sets.push(Op::Set(Item::Service(new.service.clone())));
                }
                if let Some(old) = old {
                    for ip in old.endpoints.keys().filter(|ip| !new.endpoints.contains_key(ip)) {
                        self.endpoint_deletes
                            .push(Op::Delete(ItemRef::Endpoint { service: key.clone(), ip: *ip }));
                    }
                }
                for endpoint in &new.endpoints {
                    if old.and_then(|o| o.endpoints.get(&endpoint.ip)) != Some(endpoint) {
                        let item =
                            Item::Endpoint { service: key.clone(), endpoint: endpoint.clone() };
                        self.endpoint_sets.push(Op::Set(item));
                    }
                }
            }
        }
    }

    fn node(&mut self, old: &LocalState, new: &LocalState) {
        match (&old.node, &new.node) {
            (old, Some(node)) if old.as_ref() != Some(node) => {
                self.node.push(Op::Set(Item::Node(node.clone())))
            }
            (Some(_), None) => self.node.push(Op::Delete(ItemRef::Node)),
            _ => {}
        }
    }
}

/// The ops (without the closing `Sync`) that turn `old` into `new`; empty when they are equal.
pub fn diff(old: &LocalState, new: &LocalState) -> Vec<Op> {
    let mut changes = ChangeSet::default();
    changes.node(old, new);
    let keys =
        old.services.keys().chain(new.services.keys().filter(|k| !old.services.contains_key(*k)));
    for key in keys {
        changes.service(key, old.services.get(key), new.services.get(key));
    }
    changes.into_ops()
}

/// Like [`diff`], but comparing only the node and the services named in `keys`: the cost is
/// proportional to what changed, not to the size of the states.
pub fn diff_services<'k>(
    old: &LocalState,
    new: &LocalState,
    keys: impl IntoIterator<Item = &'k ServiceKey>,
) -> Vec<Op> {
    let mut changes = ChangeSet::default();
    changes.node(old, new);
    for key in keys {
        changes.service(key, old.services.get(key), new.services.get(key));
    }
    changes.into_ops()
}
