//! [`Op`]: how a consumer learns the ENLS, one change set at a time.
//!
//! A change set is a run of `Set` and `Delete` ops closed by `Sync`. Within a change set a
//! service is set before its endpoints, and its endpoints are deleted before it.

use std::borrow::Cow;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::global::ServiceKey;
use crate::local::{
    EndpointPort, LocalEndpoint, LocalNode, LocalService, LocalServiceState, LocalState, NodeState,
};

/// One entry of the ENLS.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Item {
    /// The node itself.
    Node(LocalNode),
    /// A service (without its endpoints).
    Service(LocalService),
    /// An endpoint of `service`.
    Endpoint {
        /// The service the endpoint belongs to.
        service: ServiceKey,
        /// The endpoint.
        endpoint: LocalEndpoint,
    },
}

impl Item {
    /// The key of this item.
    pub fn item_ref(&self) -> ItemRef {
        match self {
            Item::Node(_) => ItemRef::Node,
            Item::Service(s) => ItemRef::Service(s.key.clone()),
            Item::Endpoint { service, endpoint } => {
                ItemRef::Endpoint { service: service.clone(), ip: endpoint.ip }
            }
        }
    }
}

/// The key of one entry of the ENLS.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ItemRef {
    /// The node itself.
    Node,
    /// A service.
    Service(ServiceKey),
    /// An endpoint of a service.
    Endpoint {
        /// The service.
        service: ServiceKey,
        /// The endpoint's IP.
        ip: IpAddr,
    },
}

/// One step of the ENLS stream. Every sink and backend consumes this vocabulary.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Op {
    /// Forget everything: the following ops describe the whole state from scratch. A
    /// backend should keep enforcing what it has until the next `Sync`, then remove what the
    /// new state no longer holds.
    Reset,
    /// Create or replace an item. Setting a service keeps its endpoints.
    Set(Item),
    /// Remove an item. Deleting a service also removes any endpoint it still has.
    Delete(ItemRef),
    /// The ops since the previous `Sync` (or `Reset`) form a consistent state: enforce it.
    Sync,
}

/// An op that does not fit the state it is applied to.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// An endpoint was set for a service the state does not hold.
    #[error("endpoint {ip} set for unknown service {service}")]
    UnknownService {
        /// The service.
        service: ServiceKey,
        /// The endpoint's IP.
        ip: IpAddr,
    },
}

/// `endpoint` holding what its service already has: the port list of an endpoint beside
/// it when equal (a service's endpoints nearly all serve the same ports in the same sets),
/// else the service's copies of its port names. A state built from ops (a node stream
/// decoded endpoint by endpoint) then keeps one list per service, as a projected one does.
fn sharing(endpoint: &LocalEndpoint, state: &LocalServiceState) -> LocalEndpoint {
    let mut endpoint = endpoint.clone();
    if let Some(near) = state.endpoints.beside(endpoint.ip).find(|e| e.ports == endpoint.ports) {
        endpoint.ports = near.ports.clone();
        return endpoint;
    }
    let named = |port: &EndpointPort| {
        let service_port = state.service.ports.iter().find(|p| p.name == port.name);
        EndpointPort {
            name: service_port.map_or(port.name.clone(), |p| p.name.clone()),
            ..port.clone()
        }
    };
    endpoint.ports = endpoint.ports.iter().map(named).collect();
    endpoint
}

impl LocalState {
    /// Applies one op. `Reset` empties the state; `Sync` changes nothing.
    pub fn apply(&mut self, op: &Op) -> Result<(), ApplyError> {
        match op {
            Op::Reset => *self = LocalState::default(),
            Op::Sync => {}
            Op::Set(Item::Node(node)) => self.node = Some(node.clone()),
            Op::Set(Item::Service(service)) => match self.services.get_mut(&service.key) {
                Some(state) => state.service = service.clone(),
                None => {
                    let state = LocalServiceState {
                        service: service.clone(),
                        endpoints: Default::default(),
                    };
                    self.services.insert(service.key.clone(), state);
                }
            },
            Op::Set(Item::Endpoint { service, endpoint }) => {
                let state = self.services.get_mut(service).ok_or_else(|| {
                    ApplyError::UnknownService { service: service.clone(), ip: endpoint.ip }
                })?;
                let endpoint = sharing(endpoint, state);
                state.endpoints.insert(endpoint);
            }
            Op::Delete(ItemRef::Node) => self.node = None,
            Op::Delete(ItemRef::Service(key)) => {
                self.services.remove(key);
            }
            Op::Delete(ItemRef::Endpoint { service, ip }) => {
                if let Some(state) = self.services.get_mut(service) {
                    state.endpoints.remove(ip);
                }
            }
        }
        Ok(())
    }
}

/// The ops that describe `state` from nothing: `Reset`, then every item (without `Sync`),
/// in the order a diff from an empty state emits them. Produced one at a time, so a full
/// state is never held twice.
pub fn full_state_ops(state: &dyn NodeState) -> impl Iterator<Item = Op> + '_ {
    let node = state.node().map(|node| Op::Set(Item::Node(node.clone())));
    let services = state.services().map(|s| {
        let service = match s {
            Cow::Borrowed(s) => s.service.clone(),
            Cow::Owned(s) => s.service,
        };
        Op::Set(Item::Service(service))
    });
    let endpoints = state.services().flat_map(|s| {
        let (key, endpoints): (ServiceKey, Vec<LocalEndpoint>) = match s {
            Cow::Borrowed(s) => (s.service.key.clone(), s.endpoints.values().cloned().collect()),
            Cow::Owned(s) => (s.service.key, s.endpoints.into_iter().collect()),
        };
        let set = move |endpoint| Op::Set(Item::Endpoint { service: key.clone(), endpoint });
        endpoints.into_iter().map(set)
    });
    std::iter::once(Op::Reset).chain(node).chain(services).chain(endpoints)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::global::ServiceType;
    use crate::local::LocalServicePort;
    use crate::net::Protocol;

    fn endpoint(ip: [u8; 4], local: bool) -> LocalEndpoint {
        let port = EndpointPort {
            name: Arc::from(String::from("http")),
            protocol: Protocol::Tcp,
            port: 8080,
            cluster: true,
            local,
        };
        LocalEndpoint {
            ip: ip.into(),
            local,
            ready: true,
            serving: true,
            terminating: false,
            pod_name: None,
            ports: Arc::new([port]),
        }
    }

    #[test]
    fn endpoints_set_by_ops_share_their_services_port_names_and_lists() {
        let key = ServiceKey::new("ns", "web");
        let service = LocalService {
            key: key.clone(),
            service_type: ServiceType::ClusterIP,
            cluster_ips: vec![[10, 96, 0, 1].into()].into(),
            outside: None,
            ports: vec![LocalServicePort {
                name: "http".into(),
                protocol: Protocol::Tcp,
                port: 80,
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
        let sent = [endpoint([10, 0, 0, 2], false), endpoint([10, 0, 0, 1], false)];
        let other = endpoint([10, 0, 0, 9], true);
        let mut state = LocalState::default();
        state.apply(&Op::Set(Item::Service(service))).unwrap();
        for endpoint in sent.iter().chain([&other]) {
            let op = Op::Set(Item::Endpoint { service: key.clone(), endpoint: endpoint.clone() });
            state.apply(&op).unwrap();
        }
        let held = &state.services[&key];
        let name = &held.service.ports[0].name;
        let [a, b, c] =
            [[10, 0, 0, 1], [10, 0, 0, 2], [10, 0, 0, 9]].map(|ip| &held.endpoints[&ip.into()]);
        assert_eq!((a, b, c), (&sent[1], &sent[0], &other));
        assert!(Arc::ptr_eq(&a.ports, &b.ports));
        assert!(!Arc::ptr_eq(&a.ports, &c.ports));
        for endpoint in [a, c] {
            assert!(Arc::ptr_eq(&endpoint.ports[0].name, name), "{}", endpoint.ip);
        }
    }
}
