//! [`NodeProjector`]: keeps one node's ENLS current, one store revision at a time.

use std::borrow::Cow;

use kpng_model::local::LocalServiceState;
use kpng_model::{Changes, GlobalModel, LocalNode, LocalState, Op, ServiceKey, Touched};

use crate::diff::{Prior, diff_from, diff_services_from};
use crate::on_demand::OnDemand;
use crate::prints::Fingerprints;
use crate::project::{NodeLocal, project_node_state_with, project_node_with, project_service};
use crate::select::NodeView;

/// Logs the destinations a service newly yields to an older service claiming them too.
fn report_conflicts(model: &GlobalModel, old: &impl Held, new: &LocalState) {
    use kpng_model::global::Claim;
    for (key, state) in &new.services {
        let Some(service) = model.service(key) else { continue };
        let before = old.before(key);
        for (i, port) in state.service.ports.iter().enumerate() {
            let known = |ip: &std::net::IpAddr| before.is_some_and(|b| b.yields(i, ip));
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
            let had = before.is_some_and(|b| b.lacks_node_port(i));
            if lost_node_port && !had {
                tracing::warn!(service = %key, port = %port.name, "an older service holds this NodePort");
            }
        }
    }
}

/// What a [`NodeProjector`] keeps of the state it last computed, to tell the next one's
/// differences: the state itself ([`LocalState`]), or its [`Fingerprints`], which cost a
/// fraction of it and give the same ops.
pub trait Held: Prior + Default + Clone + std::fmt::Debug {
    /// Replaces the node.
    fn set_node(&mut self, node: Option<LocalNode>);
    /// Keeps `new` as service `key` (`None`: it is gone).
    fn record(&mut self, key: &ServiceKey, new: Option<LocalServiceState>);
    /// Keeps `new` in place of everything; hands it back when it is not kept whole, to be
    /// [`settle`](Self::settle)d once it has been read.
    fn keep(&mut self, new: LocalState) -> Option<LocalState>;
    /// Takes in `whole`, which [`keep`](Self::keep) handed back.
    fn settle(&mut self, whole: LocalState);
    /// Whether what is kept is `new`.
    fn holds(&self, new: &LocalState) -> bool;
}

impl Held for LocalState {
    fn set_node(&mut self, node: Option<LocalNode>) {
        self.node = node;
    }

    fn record(&mut self, key: &ServiceKey, new: Option<LocalServiceState>) {
        match new {
            Some(new) => self.services.insert(key.clone(), new),
            None => self.services.remove(key),
        };
    }

    fn keep(&mut self, new: LocalState) -> Option<LocalState> {
        *self = new;
        None
    }

    fn settle(&mut self, _: LocalState) {}

    fn holds(&self, new: &LocalState) -> bool {
        self == new
    }
}

impl Held for Fingerprints {
    fn set_node(&mut self, node: Option<LocalNode>) {
        self.node = node;
    }

    fn record(&mut self, key: &ServiceKey, new: Option<LocalServiceState>) {
        Fingerprints::record(self, key, new.as_ref());
    }

    fn keep(&mut self, new: LocalState) -> Option<LocalState> {
        // The services' fingerprints wait until the state has been read: they are not
        // held beside it while it is delivered.
        self.node = new.node.clone();
        Some(new)
    }

    fn settle(&mut self, whole: LocalState) {
        *self = Fingerprints::from_state(whole);
    }

    fn holds(&self, new: &LocalState) -> bool {
        Fingerprints::matches(self, new)
    }
}

/// One node's ENLS, updated incrementally. Only the services a revision touched are
/// projected again, and the node only when its Node object or the set of ServiceCIDRs
/// changed; everything else is left as it is.
///
/// It keeps the state whole by default ([`state`](NodeProjector::state)); a projector made
/// by [`lean`](NodeProjector::lean) keeps only its [`Fingerprints`] and reads the state
/// from the model when asked ([`view`](NodeProjector::view)). Both make the same ops.
#[derive(Debug, Clone)]
pub struct NodeProjector<H: Held = LocalState> {
    name: String,
    local: NodeLocal,
    held: H,
    /// The whole state of the last full recomputation, when `held` does not keep it, until
    /// it is settled.
    whole: Option<LocalState>,
}

impl NodeProjector {
    /// A projector for node `name`, starting from an empty state.
    pub fn new(name: impl Into<String>) -> Self {
        Self::with_local(name, NodeLocal::default())
    }

    /// A projector for node `name` with what only the node knows.
    pub fn with_local(name: impl Into<String>, local: NodeLocal) -> Self {
        NodeProjector { name: name.into(), local, held: LocalState::default(), whole: None }
    }

    /// The node's current ENLS.
    pub fn state(&self) -> &LocalState {
        &self.held
    }
}

impl NodeProjector<Fingerprints> {
    /// A projector for node `name` that keeps only the fingerprints of the state.
    pub fn lean(name: impl Into<String>, local: NodeLocal) -> Self {
        NodeProjector { name: name.into(), local, held: Fingerprints::default(), whole: None }
    }

    /// The fingerprints of the node's current ENLS.
    pub fn fingerprints(&mut self) -> &Fingerprints {
        self.settle();
        &self.held
    }

    /// The node's current ENLS, read from `model` (the model this projector was last
    /// brought up to) a service at a time.
    pub fn view<'a>(&'a self, model: &'a GlobalModel) -> OnDemand<'a> {
        OnDemand::with_node(model, &self.name, self.held.node.as_ref().map(Cow::Borrowed))
    }
}

impl<H: Held> NodeProjector<H> {
    /// The node's own addresses changed: returns the ops (the node, if its NodePort
    /// addresses changed).
    pub fn set_addresses(&mut self, addresses: Vec<std::net::IpAddr>) -> Vec<Op> {
        self.settle();
        self.local.addresses = addresses;
        let Some(node) = self.held.node() else { return Vec::new() };
        let mut updated = node.clone();
        self.local.complete(&mut updated);
        if updated == *node {
            return Vec::new();
        }
        self.held.set_node(Some(updated.clone()));
        vec![Op::Set(kpng_model::Item::Node(updated))]
    }

    /// The node's name.
    pub fn node_name(&self) -> &str {
        &self.name
    }

    /// What only the node knows.
    pub fn local(&self) -> &NodeLocal {
        &self.local
    }

    /// The whole state the last full recomputation made, when this projector does not keep
    /// it: a reader that needs every service reads it rather than projecting it again, then
    /// [`settle`](Self::settle)s it.
    pub fn whole(&self) -> Option<&LocalState> {
        self.whole.as_ref()
    }

    /// Takes in the whole state of the last full recomputation, if any, and drops it: until
    /// then the projector keeps it beside its fingerprints' previous values. Done by every
    /// update if not before.
    pub fn settle(&mut self) {
        if let Some(whole) = self.whole.take() {
            self.held.settle(whole);
        }
    }

    /// Brings the ENLS up to `model`, where `changes` says what changed since the previous
    /// update. Returns the ops (without `Sync`) that were applied; empty when this node's
    /// ENLS did not change.
    pub fn update(&mut self, model: &GlobalModel, changes: &Changes) -> Vec<Op> {
        self.settle();
        let touched = match changes {
            Changes::All => return self.recompute(model),
            Changes::Touched(touched) => touched,
        };
        let old_node = self.held.node().clone();
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
        let mut new_part = LocalState { node: new_node, services: Default::default() };
        for key in &keys {
            if let Some(new) = project_service(model, key, &view) {
                new_part.services.insert((*key).clone(), new);
            }
        }
        report_conflicts(model, &self.held, &new_part);
        let ops = diff_services_from(&self.held, &new_part, keys.iter().copied());
        if !ops.is_empty() {
            self.held.set_node(new_part.node);
            for key in keys {
                self.held.record(key, new_part.services.remove(key));
            }
        }
        ops
    }

    /// Like [`update`](Self::update), for when nobody needs the ops: returns whether the
    /// ENLS changed. A full recomputation (the first one, a zone change) then compares the
    /// states instead of listing every difference.
    pub fn refresh(&mut self, model: &GlobalModel, changes: &Changes) -> bool {
        let Changes::All = changes else { return !self.update(model, changes).is_empty() };
        self.settle();
        let new = project_node_state_with(model, &self.name, &self.local);
        report_conflicts(model, &self.held, &new);
        let changed = !self.held.holds(&new);
        self.whole = self.held.keep(new);
        changed
    }

    fn recompute(&mut self, model: &GlobalModel) -> Vec<Op> {
        let new = project_node_state_with(model, &self.name, &self.local);
        report_conflicts(model, &self.held, &new);
        let ops = diff_from(&self.held, &new);
        self.whole = self.held.keep(new);
        ops
    }
}

#[cfg(test)]
mod tests;
