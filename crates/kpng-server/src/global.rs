//! The global stream's content: every service, endpoint and node of the model as encoded
//! `globalv1` infos, updated once per store revision for all clients.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};

use kpng_api::global::{
    GlobalItem, delete_op, model_items, node_item, service_cidr_item, service_items,
};
use kpng_api::localv1;
use kpng_model::{Changes, GlobalModel, ServiceKey, Touched};
use kpng_store::{Revision, StoreReader};

use crate::feed::{Content, Feed};
use crate::frame::Frame;

type ItemKey = (localv1::Set, String);

/// The whole global model, as frames.
#[derive(Default)]
pub struct GlobalContent {
    items: BTreeMap<ItemKey, Frame>,
    /// The items each service owns: its own and its slices' endpoints.
    owned: BTreeMap<ServiceKey, Vec<ItemKey>>,
    /// The whole state as frames, made for the first client that needs it after a change
    /// and shared by the clients that read it.
    full: Option<Arc<[Frame]>>,
}

impl GlobalContent {
    fn replace(&mut self, old: Vec<ItemKey>, new: Vec<GlobalItem>, ops: &mut Vec<Frame>) {
        let keys: BTreeSet<ItemKey> = new.iter().map(|i| (i.set, i.path.clone())).collect();
        for key in old.into_iter().filter(|k| !keys.contains(k)) {
            if self.items.remove(&key).is_some() {
                ops.push(Frame::of_item(&delete_op(key.0, &key.1)));
            }
        }
        for item in new {
            let frame = Frame::of_item(&item.set_op());
            let key = (item.set, item.path);
            if self.items.get(&key) != Some(&frame) {
                ops.push(frame.clone());
                self.items.insert(key, frame);
            }
        }
    }

    /// Brings the content to `model`; returns the frames (without `Sync`) that changed it.
    pub fn update(&mut self, model: &GlobalModel, changes: &Changes) -> Vec<Frame> {
        let mut ops = Vec::new();
        match changes {
            Changes::All => {
                let old: Vec<_> = self.items.keys().cloned().collect();
                self.replace(old, model_items(model), &mut ops);
                self.owned.clear();
                let keys = model.services().map(|s| s.key.clone());
                // Slices of services the model lacks are served too.
                let orphans = model
                    .slices()
                    .map(|s| s.service_key())
                    .filter(|key| model.service(key).is_none());
                for key in keys.chain(orphans) {
                    let items = service_items(model, &key).into_iter().map(|i| (i.set, i.path));
                    self.owned.insert(key, items.collect());
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
        if !ops.is_empty() {
            self.full = None;
        }
        ops
    }
}

/// Reads a shared whole state.
pub struct GlobalCursor {
    frames: Arc<[Frame]>,
    next: usize,
}

impl Iterator for GlobalCursor {
    type Item = Frame;

    fn next(&mut self) -> Option<Frame> {
        let frame = self.frames.get(self.next)?.clone();
        self.next += 1;
        Some(frame)
    }
}

impl Content for GlobalContent {
    type Cursor = GlobalCursor;

    fn full(&mut self) -> GlobalCursor {
        let items = &self.items;
        let frames = self.full.get_or_insert_with(|| {
            std::iter::once(Frame::reset()).chain(items.values().cloned()).collect()
        });
        GlobalCursor { frames: frames.clone(), next: 0 }
    }
}

/// Keeps `feed` current from `reader` until the last client drops the feed (noticed at the
/// next revision) or the store closes.
pub async fn follow(feed: Weak<Feed<GlobalContent>>, mut reader: StoreReader) {
    let mut seen: Option<Revision> = None;
    loop {
        let revision = reader.wait_after(seen).await;
        let Some(feed) = feed.upgrade() else { return };
        if revision.is_none() {
            feed.close();
            return;
        }
        let number = {
            let snapshot = reader.snapshot();
            let changes = snapshot.changes_since(seen);
            seen = Some(snapshot.revision());
            let mut log = feed.lock();
            let frames = log.content.update(snapshot.model(), &changes);
            log.record(frames)
        };
        feed.publish(number);
    }
}
