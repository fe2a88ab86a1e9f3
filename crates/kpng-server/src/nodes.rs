//! The node streams' content: every connected node's ENLS as frames, brought up to each
//! store revision by one task for all nodes.
//!
//! A node's state is a vector of shared [`ServiceFrames`], one per service (by slot): the
//! services it gets like many other nodes point to the same frames, so a node costs a
//! pointer per service, not a copy of its ENLS. At each revision the task recomputes only
//! the touched services' inputs, then, per node, looks up the variant it falls in and, if
//! it differs from the one it holds, the frames that lead from one to the other (computed
//! once per pair of variants, shared by every node that makes the same move).
//!
//! Kept in one file on purpose: the task that brings every node up to a revision and
//! the per-node state it updates are one algorithm; the variants are in `variants`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, Weak};

use kpng_local::project_node;
use kpng_model::{Changes, GlobalModel, Item, ItemRef, Op, ServiceKey, Touched};
use kpng_store::{Revision, StoreReader};
use tokio::sync::Notify;

use crate::feed::{Content, Feed};
use crate::frame::Frame;
use crate::variants::{ServiceFrames, ServiceVariants, Transition};

/// A node's state at one version.
#[derive(Debug, Clone, Default)]
pub struct NodeSnapshot {
    /// The node's own item (`Set`), when the model has the node.
    node: Option<Frame>,
    /// The node's zone, which the services' variants depend on.
    zone: Option<String>,
    /// By service slot.
    services: Vec<Option<Arc<ServiceFrames>>>,
    /// The slots in service-key order.
    order: Arc<[u32]>,
}

/// One node's stream content.
#[derive(Debug, Default)]
pub struct NodeContent {
    snapshot: Arc<NodeSnapshot>,
}

impl Content for NodeContent {
    type Cursor = NodeCursor;

    fn full(&mut self) -> NodeCursor {
        NodeCursor { snapshot: self.snapshot.clone(), phase: Phase::Reset }
    }
}

/// Reads a node's whole state in the order of `kpng_local::full_state_ops`: `Reset`, the
/// node, every service, then every endpoint.
pub struct NodeCursor {
    snapshot: Arc<NodeSnapshot>,
    phase: Phase,
}

enum Phase {
    Reset,
    Node,
    Services(usize),
    Endpoints(usize, usize),
    Done,
}

impl NodeCursor {
    fn service(&self, position: usize) -> Option<Option<&ServiceFrames>> {
        let slot = *self.snapshot.order.get(position)? as usize;
        Some(self.snapshot.services.get(slot).and_then(|s| s.as_deref()))
    }
}

impl Iterator for NodeCursor {
    type Item = Frame;

    fn next(&mut self) -> Option<Frame> {
        loop {
            match self.phase {
                Phase::Reset => {
                    self.phase = Phase::Node;
                    return Some(Frame::reset());
                }
                Phase::Node => {
                    self.phase = Phase::Services(0);
                    if let Some(node) = &self.snapshot.node {
                        return Some(node.clone());
                    }
                }
                Phase::Services(i) => {
                    let service = self.service(i).map(|s| s.map(|s| s.service.clone()));
                    match service {
                        None => self.phase = Phase::Endpoints(0, 0),
                        Some(frame) => {
                            self.phase = Phase::Services(i + 1);
                            if frame.is_some() {
                                return frame;
                            }
                        }
                    }
                }
                Phase::Endpoints(i, j) => {
                    let endpoint = self
                        .service(i)
                        .map(|s| s.and_then(|s| s.endpoints.get(j)).map(|e| e.1.clone()));
                    match endpoint {
                        None => self.phase = Phase::Done,
                        Some(Some(frame)) => {
                            self.phase = Phase::Endpoints(i, j + 1);
                            return Some(frame);
                        }
                        Some(None) => self.phase = Phase::Endpoints(i + 1, 0),
                    }
                }
                Phase::Done => return None,
            }
        }
    }
}

/// The node feeds that exist, and those waiting for their first state.
#[derive(Default)]
pub struct NodeRegistry {
    inner: Mutex<Registry>,
    joined: Notify,
}

#[derive(Default)]
struct Registry {
    feeds: HashMap<String, Weak<Feed<NodeContent>>>,
    joining: Vec<Member>,
    closed: bool,
}

impl NodeRegistry {
    /// The feed of node `name`, shared with its other clients; a new one gets its first
    /// state from the fan-out task.
    pub fn feed(&self, name: &str) -> Arc<Feed<NodeContent>> {
        let mut registry = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(feed) = registry.feeds.get(name).and_then(Weak::upgrade) {
            return feed;
        }
        registry.feeds.retain(|_, feed| feed.strong_count() > 0);
        let feed = Feed::new(NodeContent::default());
        if registry.closed {
            feed.close();
            return feed;
        }
        registry.feeds.insert(name.to_string(), Arc::downgrade(&feed));
        registry.joining.push(Member { name: name.to_string(), feed: Arc::downgrade(&feed) });
        drop(registry);
        self.joined.notify_one();
        feed
    }

    /// Distinct nodes with a feed.
    pub fn nodes(&self) -> usize {
        let registry = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        registry.feeds.values().filter(|f| f.strong_count() > 0).count()
    }

    fn take_joining(&self) -> Vec<Member> {
        std::mem::take(&mut self.inner.lock().unwrap_or_else(|e| e.into_inner()).joining)
    }

    /// Closes every feed; later ones are born closed.
    fn close(&self) {
        let mut registry = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        registry.closed = true;
        for feed in registry.feeds.values().filter_map(Weak::upgrade) {
            feed.close();
        }
    }
}

struct Member {
    name: String,
    feed: Weak<Feed<NodeContent>>,
}

/// Keeps every node feed of `registry` current from `reader`, until the store closes.
pub async fn fan_out(mut reader: StoreReader, registry: Arc<NodeRegistry>) {
    let mut state = Fanout::default();
    let mut seen: Option<Revision> = None;
    loop {
        tokio::select! {
            revision = reader.wait_after(seen) => if revision.is_none() {
                registry.close();
                return;
            },
            () = registry.joined.notified(), if seen.is_some() => {}
        }
        let joining = registry.take_joining();
        let snapshot = reader.snapshot();
        let revision = snapshot.revision();
        let changes = (seen != Some(revision)).then(|| snapshot.changes_since(seen));
        seen = Some(revision);
        state.step(snapshot.model(), changes.as_ref(), joining);
    }
}

/// An `Arc` compared and hashed by address.
#[derive(Clone)]
struct ByAddress(Option<Arc<ServiceFrames>>);

impl ByAddress {
    fn address(&self) -> usize {
        self.0.as_ref().map_or(0, |a| Arc::as_ptr(a) as usize)
    }
}

impl PartialEq for ByAddress {
    fn eq(&self, other: &Self) -> bool {
        self.address() == other.address()
    }
}

impl Eq for ByAddress {}

impl std::hash::Hash for ByAddress {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.address().hash(state);
    }
}

/// What one revision touched.
struct Step<'m> {
    model: &'m GlobalModel,
    /// Slots of touched services the model still has, in key order.
    slots: Vec<u32>,
    /// Slots of services the model no longer has; reused once every node has left them.
    removed: Vec<u32>,
    /// Every node item is touched.
    all_nodes: bool,
    nodes: BTreeSet<&'m str>,
    /// The moves between variants computed in this revision (they hold both ends, so no
    /// address is reused while the revision is processed).
    transitions: HashMap<(ByAddress, ByAddress), Arc<Transition>>,
}

/// The fan-out's own state: the services' inputs and variants, by slot.
#[derive(Default)]
struct Fanout {
    services: Vec<Option<ServiceVariants>>,
    slots: BTreeMap<ServiceKey, u32>,
    free: Vec<u32>,
    order: Arc<[u32]>,
    members: Vec<Member>,
}

impl Fanout {
    fn step(&mut self, model: &GlobalModel, changes: Option<&Changes>, joining: Vec<Member>) {
        if let Some(changes) = changes {
            let mut step = self.apply(model, changes);
            let members = std::mem::take(&mut self.members);
            for member in &members {
                if let Some(feed) = member.feed.upgrade() {
                    self.update(&feed, &member.name, &mut step);
                }
            }
            self.members = members;
            self.free.extend(step.removed);
        }
        self.members.retain(|m| m.feed.strong_count() > 0);
        for member in joining {
            if let Some(feed) = member.feed.upgrade() {
                self.start(model, &feed, &member.name);
                self.members.push(member);
            }
        }
    }

    /// Recomputes the inputs of what `changes` touched.
    fn apply<'m>(&mut self, model: &'m GlobalModel, changes: &'m Changes) -> Step<'m> {
        let mut keys: BTreeSet<ServiceKey> = BTreeSet::new();
        let mut nodes = BTreeSet::new();
        let all_nodes = match changes {
            Changes::All => {
                keys.extend(self.slots.keys().cloned());
                keys.extend(model.services().map(|s| s.key.clone()));
                true
            }
            Changes::Touched(touched) => {
                let mut all_nodes = false;
                for t in touched {
                    match t {
                        Touched::Service(key) => {
                            keys.insert(key.clone());
                        }
                        Touched::Node(name) => {
                            nodes.insert(name.as_str());
                        }
                        // Every node's item carries the cluster's service CIDRs.
                        Touched::ServiceCidrs => all_nodes = true,
                    }
                }
                all_nodes
            }
        };
        let (mut slots, mut removed) = (Vec::new(), Vec::new());
        let mut reordered = false;
        for key in keys {
            let present = model.service(&key).is_some();
            match (self.slots.get(&key).copied(), present) {
                (Some(slot), true) => {
                    self.services[slot as usize] = Some(ServiceVariants::new(model, &key));
                    slots.push(slot);
                }
                (Some(slot), false) => {
                    self.services[slot as usize] = None;
                    self.slots.remove(&key);
                    removed.push(slot);
                    reordered = true;
                }
                (None, true) => {
                    let slot = self.free.pop().unwrap_or(self.services.len() as u32);
                    if slot as usize == self.services.len() {
                        self.services.push(None);
                    }
                    self.services[slot as usize] = Some(ServiceVariants::new(model, &key));
                    self.slots.insert(key, slot);
                    slots.push(slot);
                    reordered = true;
                }
                (None, false) => {}
            }
        }
        if reordered {
            self.order = self.slots.values().copied().collect();
        }
        let transitions = HashMap::new();
        Step { model, slots, removed, all_nodes, nodes, transitions }
    }

    /// Brings one node's feed to the step's model and publishes the change set.
    fn update(&mut self, feed: &Feed<NodeContent>, name: &str, step: &mut Step<'_>) {
        let version = {
            let mut log = feed.lock();
            let snapshot = Arc::make_mut(&mut log.content.snapshot);
            let mut node_frames = Vec::new();
            let mut every_service = false;
            if step.all_nodes || step.nodes.contains(name) {
                let node = project_node(step.model, name);
                let zone = node.as_ref().and_then(|n| n.zone.clone());
                let frame = node.map(|n| Frame::of_op(&Op::Set(Item::Node(n))));
                if frame != snapshot.node {
                    let op =
                        frame.clone().unwrap_or_else(|| Frame::of_op(&Op::Delete(ItemRef::Node)));
                    node_frames.push(op);
                    snapshot.node = frame;
                }
                if zone != snapshot.zone {
                    // The variant of every service may change with the zone.
                    snapshot.zone = zone;
                    every_service = true;
                }
            }
            snapshot.order = self.order.clone();
            snapshot.services.resize(self.services.len(), None);
            let mut set = Transition::default();
            // The order holds every present service; removed ones are not in it.
            let slots: Vec<u32> = match every_service {
                true => self.order.iter().chain(&step.removed).copied().collect(),
                false => step.slots.iter().chain(&step.removed).copied().collect(),
            };
            for slot in slots {
                let zone = snapshot.zone.as_deref();
                let new = self.services[slot as usize]
                    .as_mut()
                    .and_then(|v| v.frames(step.model, name, zone));
                let old = std::mem::replace(&mut snapshot.services[slot as usize], new.clone());
                let (old, new) = (ByAddress(old), ByAddress(new));
                if old == new {
                    continue;
                }
                let transition =
                    step.transitions.entry((old.clone(), new.clone())).or_insert_with(|| {
                        Arc::new(Transition::between(old.0.as_deref(), new.0.as_deref()))
                    });
                transition.add_to(&mut set);
            }
            node_frames.extend(set.service_sets);
            node_frames.extend(set.endpoint_deletes);
            node_frames.extend(set.endpoint_sets);
            node_frames.extend(set.service_deletes);
            log.record(node_frames)
        };
        feed.publish(version);
    }

    /// Gives a new node feed its first state.
    fn start(&mut self, model: &GlobalModel, feed: &Feed<NodeContent>, name: &str) {
        let version = {
            let mut log = feed.lock();
            let node = project_node(model, name);
            let zone = node.as_ref().and_then(|n| n.zone.clone());
            let mut services = vec![None; self.services.len()];
            for &slot in self.order.iter() {
                services[slot as usize] = self.services[slot as usize]
                    .as_mut()
                    .and_then(|v| v.frames(model, name, zone.as_deref()));
            }
            let node = node.map(|n| Frame::of_op(&Op::Set(Item::Node(n))));
            let snapshot = NodeSnapshot { node, zone, services, order: self.order.clone() };
            log.content.snapshot = Arc::new(snapshot);
            log.record(Vec::new())
        };
        feed.publish(version);
    }
}

#[cfg(test)]
mod tests;
