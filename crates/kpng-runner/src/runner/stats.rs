//! [`NodeStats`]: a node runner's counters and [`Health`], and the network-programming
//! latency observed from the slices' trigger times.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kpng_model::local::LocalServiceState;
use kpng_model::{NodeState, Op, ServiceKey};
use kpng_store::StoreReader;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use crate::readiness::Latch;

/// Counters and health of one node's runner.
#[derive(Debug)]
pub struct NodeStats {
    pub(super) enls_revisions: AtomicU64,
    pub(super) change_sets: AtomicU64,
    pub(super) failures: AtomicU64,
    pub(super) repairs: AtomicU64,
    health: std::sync::Mutex<Health>,
    pub(super) sync_durations: Histogram,
    pub(super) full_sync_durations: Histogram,
    pub(super) partial_sync_durations: Histogram,
    programming: Histogram,
    /// Service and endpoint changes of the node's state not applied by every backend yet.
    pub(super) pending_services: AtomicU64,
    pub(super) pending_endpoints: AtomicU64,
    no_local: std::sync::Mutex<NoLocal>,
    /// Released once every backend has applied a state.
    pub(super) synced: Latch,
}

/// Services whose Local traffic policy finds no endpoint on this node, and services that
/// yield a destination to an older service claiming it too.
#[derive(Debug, Default)]
struct NoLocal {
    internal: std::collections::HashSet<kpng_model::ServiceKey>,
    external: std::collections::HashSet<kpng_model::ServiceKey>,
    yielding: std::collections::HashSet<kpng_model::ServiceKey>,
}

impl Default for NodeStats {
    fn default() -> Self {
        NodeStats {
            enls_revisions: AtomicU64::new(0),
            change_sets: AtomicU64::new(0),
            failures: AtomicU64::new(0),
            repairs: AtomicU64::new(0),
            health: std::sync::Mutex::new(Health::default()),
            // kube-proxy's buckets (its dashboards read them): 1 ms to about 16 s.
            sync_durations: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            full_sync_durations: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            partial_sync_durations: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            programming: Histogram::new(programming_buckets()),
            pending_services: AtomicU64::new(0),
            pending_endpoints: AtomicU64::new(0),
            no_local: Default::default(),
            synced: Latch::new(),
        }
    }
}

/// kube-proxy's network programming buckets: 0, 0.25 s and 0.5 s, every second to a
/// minute, every 5 s to 2 minutes, every 30 s to 5 minutes.
fn programming_buckets() -> Vec<f64> {
    let mut buckets = vec![0.0, 0.25, 0.5];
    buckets.extend((1..=59).map(f64::from));
    buckets.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
    buckets.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
    buckets
}

/// Whether the node's backends keep up, as `/healthz` reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    /// Since when a change of the node's state has waited for a backend to apply it (none:
    /// everything is applied). On the runtime's clock, like every duration the runner
    /// measures, so tests that pause time see health follow it.
    pub pending_since: Option<tokio::time::Instant>,
    /// When every backend last held the current state.
    pub last_applied: Option<std::time::SystemTime>,
    /// When the node's state last changed (a sync was queued).
    pub last_queued: Option<std::time::SystemTime>,
    /// The node is being deleted or is tainted for deletion.
    pub node_draining: bool,
}

impl NodeStats {
    /// Times the node's ENLS changed (the first state counts as one).
    pub fn enls_revisions(&self) -> u64 {
        self.enls_revisions.load(Ordering::Relaxed)
    }

    /// Change sets applied successfully, over all backends.
    pub fn change_sets(&self) -> u64 {
        self.change_sets.load(Ordering::Relaxed)
    }

    /// Change sets a backend failed to apply.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Times a backend's dataplane was found changed behind its back and rebuilt from the
    /// whole state (a backend that repairs drift where it found it counts it itself).
    pub fn repairs(&self) -> u64 {
        self.repairs.load(Ordering::Relaxed)
    }

    /// Released once every backend has applied a state (readiness).
    pub fn synced(&self) -> &Latch {
        &self.synced
    }

    /// The runner's health now.
    pub fn health(&self) -> Health {
        *self.health.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Seconds from an EndpointSlice change (its `endpoints.kubernetes.io/
    /// last-change-trigger-time`) until every backend applied it.
    pub fn network_programming(&self) -> &Histogram {
        &self.programming
    }

    /// Services with internalTrafficPolicy Local, and with externalTrafficPolicy Local,
    /// that have no endpoint on this node.
    pub fn no_local_endpoints(&self) -> (usize, usize) {
        let no_local = self.no_local.lock().unwrap_or_else(|e| e.into_inner());
        (no_local.internal.len(), no_local.external.len())
    }

    /// Services that yield a destination (an address and port, or a NodePort) to an older
    /// service claiming it too.
    pub fn conflicts(&self) -> usize {
        self.no_local.lock().unwrap_or_else(|e| e.into_inner()).yielding.len()
    }

    /// Updates the services without local endpoints: all of `state` when `keys` is `None`.
    pub(super) fn track_no_local<'k>(
        &self,
        state: &dyn NodeState,
        keys: Option<impl Iterator<Item = &'k kpng_model::ServiceKey>>,
    ) {
        let mut guard = self.no_local.lock().unwrap_or_else(|e| e.into_inner());
        let NoLocal { internal, external, yielding } = &mut *guard;
        let services: Box<dyn Iterator<Item = (ServiceKey, Option<Cow<'_, LocalServiceState>>)>> =
            match keys {
                Some(keys) => Box::new(keys.map(|k| (k.clone(), state.service(k)))),
                None => {
                    internal.clear();
                    external.clear();
                    yielding.clear();
                    Box::new(state.services().map(|s| (s.service.key.clone(), Some(s))))
                }
            };
        for (key, service) in services {
            let key = &key;
            let service = service.as_deref();
            let empty = service.is_some_and(|s| !s.endpoints.values().any(|e| e.local));
            let track = |set: &mut std::collections::HashSet<_>, on: bool| match on {
                true => set.insert(key.clone()),
                false => set.remove(key),
            };
            track(internal, empty && service.is_some_and(|s| s.service.internal_local));
            track(external, empty && service.is_some_and(|s| s.service.external_local));
            track(
                yielding,
                service.is_some_and(|s| s.service.ports.iter().any(|p| !p.yielded.is_empty())),
            );
        }
    }

    /// Seconds each dataplane backend took to apply a change set.
    pub fn sync_durations(&self) -> &Histogram {
        &self.sync_durations
    }

    /// The same, for whole states (a start, a repair) only.
    pub fn full_sync_durations(&self) -> &Histogram {
        &self.full_sync_durations
    }

    /// The same, for changes only.
    pub fn partial_sync_durations(&self) -> &Histogram {
        &self.partial_sync_durations
    }

    /// Service and endpoint changes not yet applied by every backend.
    pub fn pending_changes(&self) -> (u64, u64) {
        (
            self.pending_services.load(Ordering::Relaxed),
            self.pending_endpoints.load(Ordering::Relaxed),
        )
    }

    pub(super) fn update_health(&self, f: impl FnOnce(&mut Health)) {
        f(&mut self.health.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// The service an op concerns.
pub(super) fn op_service(op: &Op) -> Option<&kpng_model::ServiceKey> {
    use kpng_model::{Item, ItemRef};
    match op {
        Op::Set(Item::Service(s)) => Some(&s.key),
        Op::Set(Item::Endpoint { service, .. })
        | Op::Delete(ItemRef::Service(service))
        | Op::Delete(ItemRef::Endpoint { service, .. }) => Some(service),
        _ => None,
    }
}

/// Observes, for each service whose endpoints `ops` changed, the time since the newest
/// trigger time of its slices.
pub(super) fn observe_programming(stats: &NodeStats, reader: &StoreReader, ops: &[Op]) {
    let services: std::collections::BTreeSet<&kpng_model::ServiceKey> = ops
        .iter()
        .filter(|op| {
            matches!(
                op,
                Op::Set(kpng_model::Item::Endpoint { .. })
                    | Op::Delete(kpng_model::ItemRef::Endpoint { .. })
            )
        })
        .filter_map(op_service)
        .collect();
    if services.is_empty() {
        return;
    }
    let now = std::time::SystemTime::now();
    let snapshot = reader.snapshot();
    for key in services {
        let newest = snapshot
            .model()
            .slices_of(key)
            .filter_map(|s| s.trigger_time.as_deref().and_then(parse_rfc3339))
            .max();
        if let Some(elapsed) = newest.and_then(|t| now.duration_since(t).ok()) {
            stats.programming.observe(elapsed.as_secs_f64());
        }
    }
}

/// An RFC 3339 time (`2026-11-22T04:35:06Z`, optional fraction, `Z` or `±hh:mm`).
pub fn parse_rfc3339(text: &str) -> Option<std::time::SystemTime> {
    let b = text.as_bytes();
    if b.len() < 20 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't') {
        return None;
    }
    let num = |r: std::ops::Range<usize>| text.get(r)?.parse::<i64>().ok();
    let (year, month, day) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hour, minute, second) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
    {
        return None;
    }
    let mut rest = &text[19..];
    let mut nanos = 0u32;
    if let Some(fraction) = rest.strip_prefix('.') {
        let digits = fraction.find(|c: char| !c.is_ascii_digit()).unwrap_or(fraction.len());
        let padded = format!("{:0<9}", &fraction[..digits.min(9)]);
        nanos = padded.parse().ok()?;
        rest = &fraction[digits..];
    }
    let offset = match rest {
        "Z" | "z" => 0,
        _ => {
            let sign = match rest.as_bytes().first()? {
                b'+' => 1,
                b'-' => -1,
                _ => return None,
            };
            let h: i64 = rest.get(1..3)?.parse().ok()?;
            let m: i64 = rest.get(4..6)?.parse().ok()?;
            sign * (h * 3600 + m * 60)
        }
    };
    // Days since 1970-01-01 (proleptic Gregorian).
    let (y, m) = if month <= 2 { (year - 1, month + 9) } else { (year, month - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second - offset;
    let secs = u64::try_from(secs).ok()?;
    Some(std::time::UNIX_EPOCH + Duration::new(secs, nanos))
}
