//! [`StoreStats`]: counters of what reached the store and what changed it.

use std::sync::atomic::{AtomicU64, Ordering};

use kpng_model::Kind;

/// Counters shared by the store and whoever reports on it. Source events count every
/// `Applied` and `Deleted` event; changes count only those that changed a value.
#[derive(Debug, Default)]
pub struct StoreStats {
    events: AtomicU64,
    changes: AtomicU64,
    revisions: AtomicU64,
    events_by_kind: [AtomicU64; KINDS],
    changes_by_kind: [AtomicU64; KINDS],
}

/// The number of kinds, which index the per-kind counters (`Kind as usize`).
const KINDS: usize = Kind::ALL.len();

/// Events and changes of one batch, by kind (indexed by `Kind as usize`).
#[derive(Debug, Default)]
pub(crate) struct KindCounts {
    pub events: [u64; KINDS],
    pub changes: [u64; KINDS],
}

/// The counters at one moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Object events received from sources.
    pub events: u64,
    /// Events that changed the model.
    pub changes: u64,
    /// Revisions published (one per batch with changes).
    pub revisions: u64,
}

impl StoreStats {
    pub(crate) fn record(&self, events: u64, changes: u64, revision: bool) {
        self.events.fetch_add(events, Ordering::Relaxed);
        self.changes.fetch_add(changes, Ordering::Relaxed);
        if revision {
            self.revisions.fetch_add(1, Ordering::Relaxed);
        }
    }

    pub(crate) fn record_kinds(&self, counts: &KindCounts) {
        for i in 0..KINDS {
            self.events_by_kind[i].fetch_add(counts.events[i], Ordering::Relaxed);
            self.changes_by_kind[i].fetch_add(counts.changes[i], Ordering::Relaxed);
        }
    }

    /// Source events and model changes of `kind` so far.
    pub fn by_kind(&self, kind: Kind) -> (u64, u64) {
        let i = kind as usize;
        (
            self.events_by_kind[i].load(Ordering::Relaxed),
            self.changes_by_kind[i].load(Ordering::Relaxed),
        )
    }

    /// The counters now.
    pub fn snapshot(&self) -> StatsSnapshot {
        StatsSnapshot {
            events: self.events.load(Ordering::Relaxed),
            changes: self.changes.load(Ordering::Relaxed),
            revisions: self.revisions.load(Ordering::Relaxed),
        }
    }
}
