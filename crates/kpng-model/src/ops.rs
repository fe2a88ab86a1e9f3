//! [`Op`]: how a consumer learns the ENLS, one change set at a time.
//!
//! A change set is a run of `Set` and `Delete` ops closed by `Sync`. Within a change set a
//! service is set before its endpoints, and its endpoints are deleted before it.

use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::global::ServiceKey;
use crate::local::{LocalEndpoint, LocalNode, LocalService, LocalServiceState, LocalState};

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
                state.endpoints.insert(endpoint.clone());
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
/// in the order a diff from an empty state emits them. Produced one at a time, so a full state is never
/// held twice.
pub fn full_state_ops(state: &LocalState) -> impl Iterator<Item = Op> + '_ {
    let node = state.node.iter().map(|node| Op::Set(Item::Node(node.clone())));
    let services = state.services.values().map(|s| Op::Set(Item::Service(s.service.clone())));
    let endpoints = state.services.iter().flat_map(|(key, s)| {
        s.endpoints.values().map(move |endpoint| {
            Op::Set(Item::Endpoint { service: key.clone(), endpoint: endpoint.clone() })
        })
    });
    std::iter::once(Op::Reset).chain(node).chain(services).chain(endpoints)
}
