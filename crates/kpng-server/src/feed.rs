//! [`Feed`]: one stream's content computed once per store revision and shared by every
//! client of that stream, with a bounded log of recent change sets.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, Weak};

use kpng_api::global::{
    GlobalItem, delete_op, model_items, node_item, service_cidr_item, service_items,
};
use kpng_api::localv1::{self, OpItem};
use kpng_local::{NodeProjector, full_state_ops};
use kpng_model::{Changes, GlobalModel, ServiceKey, Touched};
use kpng_store::{Revision, StoreReader};
use tokio::sync::watch;

/// Items kept in a feed's log; a client further behind gets the whole state again.
const LOG_ITEMS: usize = 16 * 1024;

/// What a feed serves: brought up to each store revision, it says what changed.
pub trait Content: Send + 'static {
    /// Brings the content to `model`; returns the ops (without `Sync`) that changed it.
    fn update(&mut self, model: &GlobalModel, changes: &Changes) -> Vec<OpItem>;
    /// Every item of the content as `Set` ops (without `Reset` and `Sync`).
    fn full(&self) -> Vec<OpItem>;
}

/// The published version of a feed: 0 before the first revision; `closed` once the store
/// is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    /// Increases with each change of the content.
    pub number: u64,
    /// The store is gone: no further version will come.
    pub closed: bool,
}

/// A feed's content and its recent change sets.
pub struct Log<C> {
    content: C,
    version: u64,
    entries: VecDeque<(u64, Arc<Vec<OpItem>>)>,
    items: usize,
}

impl<C: Content> Log<C> {
    /// The version and the ops that bring a client from `sent` (none: nothing yet) to it:
    /// the logged change sets in order, or `Reset` and everything.
    pub fn since(&self, sent: Option<u64>) -> (u64, Vec<OpItem>) {
        if let Some(sent) = sent {
            let first = self.entries.front().map_or(self.version + 1, |(v, _)| *v);
            if sent + 1 >= first {
                let items = self
                    .entries
                    .iter()
                    .filter(|(v, _)| *v > sent)
                    .flat_map(|(_, items)| items.iter().cloned())
                    .collect();
                return (self.version, items);
            }
        }
        let mut items = vec![OpItem { op: Some(localv1::op_item::Op::Reset(localv1::EmptyOp {})) }];
        items.extend(self.content.full());
        (self.version, items)
    }
}

/// A shared stream content.
pub struct Feed<C> {
    log: Mutex<Log<C>>,
    version: watch::Sender<Version>,
}

impl<C: Content> Feed<C> {
    /// A feed of `content`, kept current from `reader` by a task that ends when the last
    /// `Arc` of the feed is dropped (at the next revision) or the store closes.
    pub fn start(content: C, reader: StoreReader) -> Arc<Self> {
        let log = Log { content, version: 0, entries: VecDeque::new(), items: 0 };
        let (version, _) = watch::channel(Version { number: 0, closed: false });
        let feed = Arc::new(Feed { log: Mutex::new(log), version });
        tokio::spawn(follow(Arc::downgrade(&feed), reader));
        feed
    }

    /// Watches the published version.
    pub fn subscribe(&self) -> watch::Receiver<Version> {
        self.version.subscribe()
    }

    /// The log, locked.
    pub fn lock(&self) -> std::sync::MutexGuard<'_, Log<C>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }
}

async fn follow<C: Content>(feed: Weak<Feed<C>>, mut reader: StoreReader) {
    let mut seen: Option<Revision> = None;
    loop {
        let revision = reader.wait_after(seen).await;
        let Some(feed) = feed.upgrade() else { return };
        if revision.is_none() {
            feed.version.send_modify(|v| v.closed = true);
            return;
        }
        let number = {
            let snapshot = reader.snapshot();
            let changes = snapshot.changes_since(seen);
            seen = Some(snapshot.revision());
            let mut log = feed.lock();
            let items = log.content.update(snapshot.model(), &changes);
            if !items.is_empty() || log.version == 0 {
                log.version += 1;
            }
            if !items.is_empty() {
                let version = log.version;
                log.items += items.len();
                log.entries.push_back((version, Arc::new(items)));
                while log.items > LOG_ITEMS && log.entries.len() > 1 {
                    let (_, dropped) = log.entries.pop_front().expect("more than one entry");
                    log.items -= dropped.len();
                }
            }
            log.version
        };
        feed.version.send_if_modified(|v| {
            let changed = v.number != number;
            v.number = number;
            changed
        });
    }
}

/// One node's ENLS.
pub struct NodeContent(pub NodeProjector);

impl Content for NodeContent {
    fn update(&mut self, model: &GlobalModel, changes: &Changes) -> Vec<OpItem> {
        self.0.update(model, changes).iter().map(kpng_api::local::encode_op).collect()
    }

    fn full(&self) -> Vec<OpItem> {
        full_state_ops(self.0.state()).skip(1).map(|op| kpng_api::local::encode_op(&op)).collect()
    }
}

/// The whole global model, as items.
#[derive(Default)]
pub struct GlobalContent {
    items: BTreeMap<(localv1::Set, String), Vec<u8>>,
    /// The items each service owns: its own and its slices' endpoints.
    owned: BTreeMap<ServiceKey, Vec<(localv1::Set, String)>>,
}

impl GlobalContent {
    fn replace(
        &mut self,
        old: Vec<(localv1::Set, String)>,
        new: Vec<GlobalItem>,
        ops: &mut Vec<OpItem>,
    ) {
        let keys: std::collections::BTreeSet<(localv1::Set, String)> =
            new.iter().map(|i| (i.set, i.path.clone())).collect();
        for key in old.into_iter().filter(|k| !keys.contains(k)) {
            if self.items.remove(&key).is_some() {
                ops.push(delete_op(key.0, &key.1));
            }
        }
        for item in new {
            let key = (item.set, item.path.clone());
            if self.items.get(&key) != Some(&item.bytes) {
                ops.push(item.set_op());
                self.items.insert(key, item.bytes);
            }
        }
    }
}

impl Content for GlobalContent {
    fn update(&mut self, model: &GlobalModel, changes: &Changes) -> Vec<OpItem> {
        let mut ops = Vec::new();
        match changes {
            Changes::All => {
                let old: Vec<_> = self.items.keys().cloned().collect();
                self.replace(old, model_items(model), &mut ops);
                self.owned.clear();
                for service in model.services() {
                    let keys = service_items(model, &service.key)
                        .into_iter()
                        .map(|i| (i.set, i.path))
                        .collect();
                    self.owned.insert(service.key.clone(), keys);
                }
                // Slices of services the model lacks are served too.
                for slice in model.slices() {
                    let key = slice.service_key();
                    if model.service(&key).is_none() {
                        let keys = service_items(model, &key).into_iter().map(|i| (i.set, i.path));
                        self.owned.insert(key, keys.collect());
                    }
                }
            }
            Changes::Touched(touched) => {
                // One replacement for everything touched: an item that moved between two
                // touched services (a slice re-pointed) is updated, never deleted.
                let (mut old, mut new) = (Vec::new(), Vec::new());
                let mut by_service = Vec::new();
                for t in touched {
                    match t {
                        Touched::Service(key) => {
                            old.extend(self.owned.remove(key).unwrap_or_default());
                            let items = service_items(model, key);
                            let keys: Vec<_> =
                                items.iter().map(|i| (i.set, i.path.clone())).collect();
                            by_service.push((key.clone(), keys));
                            new.extend(items);
                        }
                        Touched::Node(name) => {
                            old.push((localv1::Set::GlobalNodeInfos, name.clone()));
                            new.extend(model.node(name).map(node_item));
                        }
                        Touched::ServiceCidrs => {
                            let set = localv1::Set::GlobalServiceCidrInfos;
                            old.extend(self.items.keys().filter(|(s, _)| *s == set).cloned());
                            new.extend(model.service_cidrs().map(service_cidr_item));
                        }
                    }
                }
                self.replace(old, new, &mut ops);
                for (key, keys) in by_service.into_iter().filter(|(_, k)| !k.is_empty()) {
                    self.owned.insert(key, keys);
                }
            }
        }
        ops
    }

    fn full(&self) -> Vec<OpItem> {
        self.items
            .iter()
            .map(|((set, path), bytes)| {
                GlobalItem { set: *set, path: path.clone(), bytes: bytes.clone() }.set_op()
            })
            .collect()
    }
}
