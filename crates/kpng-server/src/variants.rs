//! [`ServiceVariants`]: a service's projection, computed and encoded once for all the
//! nodes that would get the same.
//!
//! A service's part of a node's ENLS depends on the node through two inputs only (see
//! `kpng_local::select`): the node's name, compared with the endpoints' `nodeName` (the
//! Local set, the `local` flag) and with their node hints; and the node's zone, compared
//! with their zone hints. A node whose name no endpoint of the service mentions gets what
//! every such node gets; so does a node whose zone no zone hint names. The projection is
//! therefore keyed by a [`Variant`]: which mentioned name the node has, if any, and which
//! hinted zone, if any. At 1,000 services of 4 endpoints and 1,000 nodes, a service has
//! about 5 variants instead of 1,000 copies.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

use kpng_local::project_service;
use kpng_local::select::NodeView;
use kpng_model::{GlobalModel, Item, ItemRef, Op, ServiceKey};

use crate::frame::Frame;

/// A service as one class of nodes gets it: its items, encoded.
#[derive(Debug, PartialEq, Eq)]
pub struct ServiceFrames {
    /// The service.
    pub key: ServiceKey,
    /// `Set` of the service.
    pub service: Frame,
    /// `Set` of each endpoint, by IP (sorted).
    pub endpoints: Vec<(IpAddr, Frame)>,
}

/// The class of nodes a service's projection is the same for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Variant {
    /// The node's name, if the service's endpoints mention it (by number).
    node: Option<u32>,
    /// The node's zone, if the service's zone hints name it (by number).
    zone: Option<u32>,
}

/// One service's inputs and the projections computed so far.
#[derive(Debug)]
pub struct ServiceVariants {
    key: ServiceKey,
    /// Node names the endpoints run on or name in node hints, numbered.
    nodes: HashMap<String, u32>,
    /// Zones the endpoints name in zone hints, numbered.
    zones: HashMap<String, u32>,
    variants: HashMap<Variant, Arc<ServiceFrames>>,
}

fn number(map: &mut HashMap<String, u32>, name: &str) {
    if !map.contains_key(name) {
        let n = map.len() as u32;
        map.insert(name.to_string(), n);
    }
}

impl ServiceVariants {
    /// The inputs of service `key` in `model`; no projection yet.
    pub fn new(model: &GlobalModel, key: &ServiceKey) -> Self {
        let (mut nodes, mut zones) = (HashMap::new(), HashMap::new());
        for endpoint in model.slices_of(key).flat_map(|s| &s.endpoints) {
            let hints = endpoint.node_hints().iter().map(String::as_str);
            for name in endpoint.node_name().into_iter().chain(hints) {
                number(&mut nodes, name);
            }
            for zone in endpoint.zone_hints() {
                number(&mut zones, zone);
            }
        }
        ServiceVariants { key: key.clone(), nodes, zones, variants: HashMap::new() }
    }

    /// The class of node `node` in zone `zone`.
    pub fn variant(&self, node: &str, zone: Option<&str>) -> Variant {
        let lookup = |map: &HashMap<String, u32>, name: Option<&str>| {
            if map.is_empty() { None } else { name.and_then(|n| map.get(n).copied()) }
        };
        Variant { node: lookup(&self.nodes, Some(node)), zone: lookup(&self.zones, zone) }
    }

    /// The service as node `node` in zone `zone` gets it, projected from `model` (which
    /// must be the model the inputs were read from) the first time a node of its class
    /// asks. `None` when the model lacks the service.
    pub fn frames(
        &mut self,
        model: &GlobalModel,
        node: &str,
        zone: Option<&str>,
    ) -> Option<Arc<ServiceFrames>> {
        let variant = self.variant(node, zone);
        if let Some(frames) = self.variants.get(&variant) {
            return Some(frames.clone());
        }
        let view = NodeView { name: node, zone };
        let state = project_service(model, &self.key, &view)?;
        let key = &state.service.key;
        let frames = Arc::new(ServiceFrames {
            key: key.clone(),
            service: Frame::of_op(&Op::Set(Item::Service(state.service.clone()))),
            endpoints: state
                .endpoints
                .values()
                .map(|endpoint| {
                    let item = Item::Endpoint { service: key.clone(), endpoint: endpoint.clone() };
                    (endpoint.ip, Frame::of_op(&Op::Set(item)))
                })
                .collect(),
        });
        self.variants.insert(variant, frames.clone());
        Some(frames)
    }
}

/// What one service's change costs a node, by phase of a change set.
#[derive(Debug, Default)]
pub struct Transition {
    /// The service set.
    pub service_sets: Vec<Frame>,
    /// Endpoints deleted.
    pub endpoint_deletes: Vec<Frame>,
    /// Endpoints set.
    pub endpoint_sets: Vec<Frame>,
    /// The service deleted.
    pub service_deletes: Vec<Frame>,
}

impl Transition {
    /// The frames that bring a node from `old` to `new`, as `kpng_local::diff` orders ops:
    /// a service is set before its endpoints, its endpoints deleted before it.
    pub fn between(old: Option<&ServiceFrames>, new: Option<&ServiceFrames>) -> Transition {
        let mut t = Transition::default();
        let delete = |key: &ServiceKey, ip: IpAddr| {
            Frame::of_op(&Op::Delete(ItemRef::Endpoint { service: key.clone(), ip }))
        };
        match (old, new) {
            (None, None) => {}
            (Some(old), None) => {
                t.endpoint_deletes =
                    old.endpoints.iter().map(|(ip, _)| delete(&old.key, *ip)).collect();
                t.service_deletes
                    .push(Frame::of_op(&Op::Delete(ItemRef::Service(old.key.clone()))));
            }
            (old, Some(new)) => {
                if old.map(|o| &o.service) != Some(&new.service) {
                    t.service_sets.push(new.service.clone());
                }
                let before = |ip: &IpAddr| {
                    old.and_then(|o| {
                        o.endpoints
                            .binary_search_by(|(i, _)| i.cmp(ip))
                            .ok()
                            .map(|i| &o.endpoints[i].1)
                    })
                };
                if let Some(old) = old {
                    for (ip, _) in &old.endpoints {
                        if new.endpoints.binary_search_by(|(i, _)| i.cmp(ip)).is_err() {
                            t.endpoint_deletes.push(delete(&new.key, *ip));
                        }
                    }
                }
                for (ip, frame) in &new.endpoints {
                    if before(ip) != Some(frame) {
                        t.endpoint_sets.push(frame.clone());
                    }
                }
            }
        }
        t
    }

    /// Appends this transition's frames to the phases of a change set.
    pub fn add_to(&self, set: &mut Transition) {
        set.service_sets.extend(self.service_sets.iter().cloned());
        set.endpoint_deletes.extend(self.endpoint_deletes.iter().cloned());
        set.endpoint_sets.extend(self.endpoint_sets.iter().cloned());
        set.service_deletes.extend(self.service_deletes.iter().cloned());
    }
}
