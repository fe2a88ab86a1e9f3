//! [`NodeProjector`]: keeps one node's ENLS current, one store revision at a time.

use kpng_model::{Changes, GlobalModel, LocalState, Op, ServiceKey, Touched};

use crate::diff::{diff, diff_services};
use crate::project::{NodeLocal, project_node_state_with, project_node_with, project_service};
use crate::select::NodeView;

/// Logs the destinations a service newly yields to an older service claiming them too.
fn report_conflicts(model: &GlobalModel, old: &LocalState, new: &LocalState) {
    use kpng_model::global::Claim;
    for (key, state) in &new.services {
        let Some(service) = model.service(key) else { continue };
        let before = old.services.get(key).map(|s| &s.service);
        for (i, port) in state.service.ports.iter().enumerate() {
            let known = |ip: &std::net::IpAddr| {
                before.and_then(|b| b.ports.get(i)).is_some_and(|p| p.yielded.contains(ip))
            };
            for ip in port.yielded.iter().filter(|ip| !known(ip)) {
                let claim = Claim::Address(*ip, port.protocol, port.port);
                let holder = model
                    .claimants(&claim)
                    .iter()
                    .filter_map(|k| model.service(k))
                    .min_by(|a, b| a.seniority().cmp(&b.seniority()))
                    .map(|s| s.key.to_string())
                    .unwrap_or_default();
                tracing::warn!(service = %key, destination = %claim, %holder, "two services claim one destination; the older one holds it");
            }
            let lost_node_port = service.ports.get(i).and_then(|p| p.node_port).is_some()
                && port.node_port.is_none();
            let had = before.and_then(|b| b.ports.get(i)).is_some_and(|p| p.node_port.is_none());
            if lost_node_port && !had {
                tracing::warn!(service = %key, port = %port.name, "an older service holds this NodePort");
            }
        }
    }
}

/// One node's ENLS, updated incrementally. Only the services a revision touched are
/// projected again, and the node only when its Node object or the set of ServiceCIDRs
/// changed; everything else is left as it is.
#[derive(Debug, Clone)]
pub struct NodeProjector {
    name: String,
    local: NodeLocal,
    state: LocalState,
}

impl NodeProjector {
    /// A projector for node `name`, starting from an empty state.
    pub fn new(name: impl Into<String>) -> Self {
        NodeProjector {
            name: name.into(),
            local: NodeLocal::default(),
            state: LocalState::default(),
        }
    }

    /// A projector for node `name` with what only the node knows.
    pub fn with_local(name: impl Into<String>, local: NodeLocal) -> Self {
        NodeProjector { name: name.into(), local, state: LocalState::default() }
    }

    /// The node's own addresses changed: returns the ops (the node, if its NodePort
    /// addresses changed).
    pub fn set_addresses(&mut self, addresses: Vec<std::net::IpAddr>) -> Vec<Op> {
        self.local.addresses = addresses;
        let Some(node) = &self.state.node else { return Vec::new() };
        let mut updated = node.clone();
        self.local.complete(&mut updated);
        if updated == *node {
            return Vec::new();
        }
        self.state.node = Some(updated.clone());
        vec![Op::Set(kpng_model::Item::Node(updated))]
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.name
    }

    /// The node's current ENLS.
    pub fn state(&self) -> &LocalState {
        &self.state
    }

    /// Brings the ENLS up to `model`, where `changes` says what changed since the previous
    /// update. Returns the ops (without `Sync`) that were applied; empty when this node's
    /// ENLS did not change.
    pub fn update(&mut self, model: &GlobalModel, changes: &Changes) -> Vec<Op> {
        let touched = match changes {
            Changes::All => return self.recompute(model),
            Changes::Touched(touched) => touched,
        };
        let old_node = self.state.node.clone();
        // The node state carries the cluster's service CIDRs as well as the Node object.
        let node_touched = touched.contains(&Touched::Node(self.name.clone()))
            || touched.contains(&Touched::ServiceCidrs);
        let new_node = if node_touched {
            project_node_with(model, &self.name, &self.local)
        } else {
            old_node.clone()
        };
        let zone = |n: &Option<kpng_model::LocalNode>| n.as_ref().and_then(|n| n.zone.clone());
        if zone(&old_node) != zone(&new_node) {
            // Topology depends on the node's zone: every service may change.
            return self.recompute(model);
        }

        let keys: Vec<&ServiceKey> = touched
            .iter()
            .filter_map(|t| match t {
                Touched::Service(key) => Some(key),
                Touched::Node(_) | Touched::ServiceCidrs => None,
            })
            .collect();
        let zone = zone(&new_node);
        let view = NodeView { name: &self.name, zone: zone.as_deref() };
        let mut old_part = LocalState { node: old_node, services: Default::default() };
        let mut new_part = LocalState { node: new_node, services: Default::default() };
        for key in &keys {
            if let Some(old) = self.state.services.get(*key) {
                old_part.services.insert((*key).clone(), old.clone());
            }
            if let Some(new) = project_service(model, key, &view) {
                new_part.services.insert((*key).clone(), new);
            }
        }
        report_conflicts(model, &old_part, &new_part);
        let ops = diff_services(&old_part, &new_part, keys.iter().copied());
        if !ops.is_empty() {
            self.state.node = new_part.node;
            for key in keys {
                match new_part.services.remove(key) {
                    Some(new) => self.state.services.insert(key.clone(), new),
                    None => self.state.services.remove(key),
                };
            }
        }
        ops
    }

    /// Like [`update`](Self::update), for when nobody needs the ops: returns whether the
    /// ENLS changed. A full recomputation (the first one, a zone change) then compares the
    /// states instead of listing every difference.
    pub fn refresh(&mut self, model: &GlobalModel, changes: &Changes) -> bool {
        let Changes::All = changes else { return !self.update(model, changes).is_empty() };
        let new = project_node_state_with(model, &self.name, &self.local);
        report_conflicts(model, &self.state, &new);
        let changed = new != self.state;
        self.state = new;
        changed
    }

    fn recompute(&mut self, model: &GlobalModel) -> Vec<Op> {
        let new = project_node_state_with(model, &self.name, &self.local);
        report_conflicts(model, &self.state, &new);
        let ops = diff(&self.state, &new);
        self.state = new;
        ops
    }
}

#[cfg(test)]
mod tests;
