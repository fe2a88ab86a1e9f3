//! Two node states → the ops that lead from one to the other.

use std::net::IpAddr;

use kpng_model::local::LocalServiceState;
use kpng_model::{
    Item, ItemRef, LocalEndpoint, LocalNode, LocalService, LocalState, Op, ServiceKey,
};

/// What a diff needs of a service's previous state: the state itself, or its fingerprints
/// ([`crate::prints`]).
pub trait Before {
    /// Whether the service itself (not its endpoints) was `new`.
    fn same_service(&self, new: &LocalService) -> bool;
    /// The endpoints' addresses, in order.
    fn endpoint_ips(&self) -> Vec<IpAddr>;
    /// Whether the endpoint at `new`'s address was `new`.
    fn same_endpoint(&self, new: &LocalEndpoint) -> bool;
    /// Whether port `port` (by position) yielded address `ip` to an older service.
    fn yields(&self, port: usize, ip: &IpAddr) -> bool;
    /// Whether port `port` had no NodePort.
    fn lacks_node_port(&self, port: usize) -> bool;
}

/// What a diff reads of a whole previous state: the state itself, or its fingerprints.
pub trait Prior {
    /// The node.
    fn node(&self) -> &Option<LocalNode>;
    /// What is known of service `key`.
    fn before(&self, key: &ServiceKey) -> Option<&dyn Before>;
    /// Every service, in key order.
    fn keys(&self) -> Box<dyn Iterator<Item = &ServiceKey> + '_>;
}

impl Prior for LocalState {
    fn node(&self) -> &Option<LocalNode> {
        &self.node
    }

    fn before(&self, key: &ServiceKey) -> Option<&dyn Before> {
        self.services.get(key).map(|s| s as &dyn Before)
    }

    fn keys(&self) -> Box<dyn Iterator<Item = &ServiceKey> + '_> {
        Box::new(self.services.keys())
    }
}

impl Before for LocalServiceState {
    fn same_service(&self, new: &LocalService) -> bool {
        self.service == *new
    }

    fn endpoint_ips(&self) -> Vec<IpAddr> {
        self.endpoints.keys().copied().collect()
    }

    fn same_endpoint(&self, new: &LocalEndpoint) -> bool {
        self.endpoints.get(&new.ip) == Some(new)
    }

    fn yields(&self, port: usize, ip: &IpAddr) -> bool {
        self.service.ports.get(port).is_some_and(|p| p.yielded.contains(ip))
    }

    fn lacks_node_port(&self, port: usize) -> bool {
        self.service.ports.get(port).is_some_and(|p| p.node_port.is_none())
    }
}

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
        old: Option<&dyn Before>,
        new: Option<&LocalServiceState>,
    ) {
        match (old, new) {
            (None, None) => {}
            (Some(old), None) => {
                for ip in old.endpoint_ips() {
                    self.endpoint_deletes
                        .push(Op::Delete(ItemRef::Endpoint { service: key.clone(), ip }));
                }
                self.service_deletes.push(Op::Delete(ItemRef::Service(key.clone())));
            }
            (old, Some(new)) => {
                if !old.is_some_and(|o| o.same_service(&new.service)) {
                    self.service_sets.push(Op::Set(Item::Service(new.service.clone())));
                }
                if let Some(old) = old {
                    for ip in old.endpoint_ips() {
                        if !new.endpoints.contains_key(&ip) {
                            let gone = ItemRef::Endpoint { service: key.clone(), ip };
                            self.endpoint_deletes.push(Op::Delete(gone));
                        }
                    }
                }
                for endpoint in &new.endpoints {
                    if !old.is_some_and(|o| o.same_endpoint(endpoint)) {
                        let item =
                            Item::Endpoint { service: key.clone(), endpoint: endpoint.clone() };
                        self.endpoint_sets.push(Op::Set(item));
                    }
                }
            }
        }
    }

    fn node(&mut self, old: &Option<LocalNode>, new: &Option<LocalNode>) {
        match (old, new) {
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
    diff_from(old, new)
}

/// [`diff`] from what is known of the previous state.
pub(crate) fn diff_from(old: &dyn Prior, new: &LocalState) -> Vec<Op> {
    let mut changes = ChangeSet::default();
    changes.node(old.node(), &new.node);
    for key in old.keys() {
        changes.service(key, old.before(key), new.services.get(key));
    }
    for (key, service) in new.services.iter().filter(|(k, _)| old.before(k).is_none()) {
        changes.service(key, None, Some(service));
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
    diff_services_from(old, new, keys)
}

/// [`diff_services`] from what is known of the previous state.
pub(crate) fn diff_services_from<'k>(
    old: &dyn Prior,
    new: &LocalState,
    keys: impl IntoIterator<Item = &'k ServiceKey>,
) -> Vec<Op> {
    let mut changes = ChangeSet::default();
    changes.node(old.node(), &new.node);
    for key in keys {
        changes.service(key, old.before(key), new.services.get(key));
    }
    changes.into_ops()
}
