//! The store itself: one writer, many readers, one revision per batch of real changes.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, RwLock, RwLockReadGuard};

use kpng_model::{Changes, GlobalModel, Kind, ObjectRef, Touched};
use tokio::sync::watch;

use crate::events::SourceEvent;
use crate::stats::{KindCounts, StoreStats};

/// A store revision. Revision 0 is the empty store; each batch with real changes adds one.
pub type Revision = u64;

/// How many touched entries the change log keeps. A reader further behind recomputes
/// everything, which is what it would cost anyway.
const CHANGE_LOG_CAPACITY: usize = 100_000;

/// What readers can observe without taking the lock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Published {
    revision: Revision,
    ready: bool,
}

struct Inner {
    model: GlobalModel,
    revision: Revision,
    /// `(revision, what it touched)`, oldest first.
    log: VecDeque<(Revision, Vec<Touched>)>,
    log_entries: usize,
    /// The log answers "changes since R" for every R at or after this revision.
    log_base: Revision,
    /// Kinds being (re)listed, with the objects seen so far; `None` for a list that began
    /// with no object of its kind in the model (the first one): every object it leaves was
    /// seen, so nothing is counted and nothing swept.
    listing: BTreeMap<Kind, Option<BTreeSet<ObjectRef>>>,
    /// Kinds whose initial list completed.
    listed: BTreeSet<Kind>,
    /// Kinds that must complete a list before readers are released.
    expected: BTreeSet<Kind>,
}

struct Shared {
    inner: RwLock<Inner>,
    stats: Arc<StoreStats>,
}

/// Creates a store whose readers are released once every kind in `expected` has completed
/// its first list. Returns its only writer and a first reader.
pub fn store(expected: &[Kind]) -> (StoreWriter, StoreReader) {
    let inner = Inner {
        model: GlobalModel::new(),
        revision: 0,
        log: VecDeque::new(),
        log_entries: 0,
        log_base: 0,
        listing: BTreeMap::new(),
        listed: BTreeSet::new(),
        expected: expected.iter().copied().collect(),
    };
    let ready = inner.expected.is_empty();
    let (published, rx) = watch::channel(Published { revision: 0, ready });
    let shared =
        Arc::new(Shared { inner: RwLock::new(inner), stats: Arc::new(StoreStats::default()) });
    (StoreWriter { shared: shared.clone(), published }, StoreReader { shared, rx })
}

/// The store's only writer. It cannot be cloned: sources feed it through one task. When
/// it is dropped, readers waiting for a newer revision learn that none will come.
pub struct StoreWriter {
    shared: Arc<Shared>,
    published: watch::Sender<Published>,
}

impl StoreWriter {
    /// Applies a batch of events. Returns the new revision if the batch changed anything,
    /// `None` if every event was a no-op. Readiness may change either way.
    pub fn apply(&mut self, events: impl IntoIterator<Item = SourceEvent>) -> Option<Revision> {
        let mut inner = self.shared.inner.write().unwrap_or_else(|e| e.into_inner());
        let was_ready = inner.is_ready();
        let mut touched = Vec::new();
        let (mut object_events, mut changes) = (0u64, 0u64);
        let mut by_kind = KindCounts::default();
        for event in events {
            match event {
                SourceEvent::Applied(object) => {
                    object_events += 1;
                    let kind = object.object_ref().kind();
                    by_kind.events[kind as usize] += 1;
                    if let Some(Some(listing)) = inner.listing.get_mut(&kind) {
                        listing.insert(object.object_ref());
                    }
                    if let Some(t) = inner.model.apply(object) {
                        changes += 1;
                        by_kind.changes[kind as usize] += 1;
                        touched.extend(t);
                    }
                }
                SourceEvent::Deleted(key) => {
                    object_events += 1;
                    by_kind.events[key.kind() as usize] += 1;
                    if let Some(Some(listing)) = inner.listing.get_mut(&key.kind()) {
                        listing.remove(&key);
                    }
                    if let Some(t) = inner.model.delete(&key) {
                        changes += 1;
                        by_kind.changes[key.kind() as usize] += 1;
                        touched.extend(t);
                    }
                }
                SourceEvent::Kept(key) => {
                    object_events += 1;
                    by_kind.events[key.kind() as usize] += 1;
                    if let Some(Some(listing)) = inner.listing.get_mut(&key.kind()) {
                        listing.insert(key);
                    }
                }
                SourceEvent::ListStarted(kind) => {
                    let seen = (inner.model.len(kind) > 0).then(BTreeSet::new);
                    inner.listing.insert(kind, seen);
                }
                SourceEvent::ListDone(kind) => {
                    // Without a ListStarted, nothing was seen: everything goes.
                    let swept = match inner.listing.remove(&kind) {
                        Some(None) => Vec::new(),
                        Some(Some(seen)) => inner
                            .model
                            .keys(kind)
                            .into_iter()
                            .filter(|k| !seen.contains(k))
                            .collect(),
                        None => inner.model.keys(kind),
                    };
                    for key in swept {
                        if let Some(t) = inner.model.delete(&key) {
                            changes += 1;
                            by_kind.changes[kind as usize] += 1;
                            touched.extend(t);
                        }
                    }
                    // A list inserts in key order, which leaves tree nodes half full.
                    inner.model.compact(kind);
                    inner.listed.insert(kind);
                }
            }
        }
        let revision = (!touched.is_empty()).then(|| inner.record(touched));
        let ready = inner.is_ready();
        if ready && !was_ready {
            inner.forget_log();
        }
        self.shared.stats.record(object_events, changes, revision.is_some());
        self.shared.stats.record_kinds(&by_kind);
        let published = Published { revision: inner.revision, ready };
        drop(inner);
        self.published.send_if_modified(|p| {
            let modified = *p != published;
            *p = published;
            modified
        });
        revision
    }

    /// A reader of this store.
    pub fn reader(&self) -> StoreReader {
        StoreReader { shared: self.shared.clone(), rx: self.published.subscribe() }
    }
}

impl Inner {
    fn is_ready(&self) -> bool {
        self.expected.is_subset(&self.listed)
    }

    fn record(&mut self, mut touched: Vec<Touched>) -> Revision {
        touched.sort();
        touched.dedup();
        self.revision += 1;
        self.log_entries += touched.len();
        self.log.push_back((self.revision, touched));
        while self.log_entries > CHANGE_LOG_CAPACITY {
            let Some((rev, t)) = self.log.pop_front() else { break };
            self.log_entries -= t.len();
            self.log_base = rev;
        }
        self.revision
    }

    /// Forgets what every revision so far touched. Done when the first lists complete:
    /// readers are released then, and each one's first read is the whole model, so the
    /// log of those lists (one entry per object, 2.5 MiB at 30,000 services) would never
    /// be read. A reader that looked earlier recomputes everything, as it would anyway.
    fn forget_log(&mut self) {
        self.log = VecDeque::new();
        self.log_entries = 0;
        self.log_base = self.revision;
    }

    fn changes_since(&self, since: Option<Revision>) -> Changes {
        match since {
            Some(since) if since >= self.log_base => {
                let mut touched = BTreeSet::new();
                for (_, t) in self.log.iter().filter(|(rev, _)| *rev > since) {
                    touched.extend(t.iter().cloned());
                }
                Changes::Touched(touched)
            }
            _ => Changes::All,
        }
    }
}

/// A read-only handle on the store. Cheap to clone; each clone waits on its own.
pub struct StoreReader {
    shared: Arc<Shared>,
    rx: watch::Receiver<Published>,
}

impl Clone for StoreReader {
    fn clone(&self) -> Self {
        let mut rx = self.rx.clone();
        rx.mark_changed();
        StoreReader { shared: self.shared.clone(), rx }
    }
}

/// A consistent view of the model at one revision, holding the store's read lock: keep it
/// briefly (the writer waits while it lives).
pub struct Snapshot<'a> {
    guard: RwLockReadGuard<'a, Inner>,
}

impl Snapshot<'_> {
    /// The model.
    pub fn model(&self) -> &GlobalModel {
        &self.guard.model
    }

    /// The revision of this view.
    pub fn revision(&self) -> Revision {
        self.guard.revision
    }

    /// What changed after revision `since` up to this view; `None` means "from nothing",
    /// which is [`Changes::All`].
    pub fn changes_since(&self, since: Option<Revision>) -> Changes {
        self.guard.changes_since(since)
    }
}

impl StoreReader {
    /// Waits until the store is ready and its revision is after `after` (any revision when
    /// `after` is `None`), and returns that revision. Returns `None` once the writer is gone
    /// and no such revision will come.
    pub async fn wait_after(&mut self, after: Option<Revision>) -> Option<Revision> {
        let wanted = |p: &Published| p.ready && after.is_none_or(|a| p.revision > a);
        match self.rx.wait_for(wanted).await {
            Ok(p) => Some(p.revision),
            Err(_) => None,
        }
    }

    /// Waits until every expected kind has completed its first list. Returns false if the
    /// writer went away first.
    pub async fn wait_ready(&mut self) -> bool {
        self.rx.wait_for(|p| p.ready).await.is_ok()
    }

    /// Whether readers are released.
    pub fn is_ready(&self) -> bool {
        self.rx.borrow().ready
    }

    /// The current view of the model.
    pub fn snapshot(&self) -> Snapshot<'_> {
        Snapshot { guard: self.shared.inner.read().unwrap_or_else(|e| e.into_inner()) }
    }

    /// The store's counters.
    pub fn stats(&self) -> Arc<StoreStats> {
        self.shared.stats.clone()
    }
}
