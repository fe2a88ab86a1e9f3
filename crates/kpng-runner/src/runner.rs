//! [`run_node`]: from store revisions to backend change sets, for one node; [`run_remote`]:
//! the same from change sets received from another process.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kpng_local::{NodeLocal, NodeProjector, diff};
use kpng_model::ops::ApplyError;
use kpng_model::{LocalState, Op};
use kpng_store::{Revision, StoreReader};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use tokio::time::Instant;

use kpng_backend::{Backend, BackendError, ChangeSet};

mod stop;
pub use stop::Stop;

/// How the runner behaves.
#[derive(Debug, Clone)]
pub struct RunnerOptions {
    /// The node whose ENLS the backends enforce.
    pub node: String,
    /// Stop after every backend has applied the state once.
    pub once: bool,
    /// First delay before retrying a failed backend; doubled per failure.
    pub retry_min: Duration,
    /// Longest delay between retries.
    pub retry_max: Duration,
    /// Least time between two change sets, after a burst of [`SYNC_BURST`]; changes
    /// arriving meanwhile are applied together. Zero: every change at once.
    pub min_sync_period: Duration,
    /// How often each backend checks that the dataplane still holds what it applied
    /// ([`Backend::verify`]); a backend that drifted gets the whole state again. `None`:
    /// never.
    pub verify_period: Option<Duration>,
    /// What only this node knows (where it accepts NodePorts, its addresses).
    pub local: NodeLocal,
    /// Once set, the runner applies nothing more and returns.
    pub stop: Stop,
}

/// Updates of the node's own addresses (each the whole list), from whoever watches them.
pub type AddressUpdates = tokio::sync::mpsc::Receiver<Vec<std::net::IpAddr>>;

/// Change sets allowed back to back before `min_sync_period` paces them.
pub const SYNC_BURST: f64 = 2.0;

/// Shortest sync after which the runner rests before the next one. A sync this long is a
/// large share of the time under a storm of changes: resting as long as it took holds the
/// runner to half a core, and the changes that arrive meanwhile coalesce into the next
/// sync. Shorter syncs (a change set is about 0.1 ms) follow each other at once.
pub const REST_AFTER: Duration = Duration::from_millis(2);

/// The longest rest: a one-off long sync (the whole state at start-up, seconds at 30k
/// services) must not hold back the change after it for as long.
pub const REST_MAX: Duration = Duration::from_millis(100);

impl RunnerOptions {
    /// Options for `node` with the default retry delays (0.5 s doubling up to 30 s).
    pub fn new(node: impl Into<String>) -> Self {
        RunnerOptions {
            node: node.into(),
            once: false,
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
            min_sync_period: Duration::ZERO,
            verify_period: None,
            local: NodeLocal::default(),
            stop: Stop::new(),
        }
    }
}

/// Counters and health of one node's runner.
#[derive(Debug)]
pub struct NodeStats {
    enls_revisions: AtomicU64,
    change_sets: AtomicU64,
    failures: AtomicU64,
    repairs: AtomicU64,
    health: std::sync::Mutex<Health>,
    sync_durations: Histogram,
    programming: Histogram,
    no_local: std::sync::Mutex<NoLocal>,
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
            // 0.1 ms to about 3 s.
            sync_durations: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            // 1 ms to about 65 s.
            programming: Histogram::new(exponential_buckets(0.001, 2.0, 17)),
            no_local: Default::default(),
        }
    }
}

/// Whether the node's backends keep up, as `/healthz` reports it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    /// Since when a change of the node's state has waited for a backend to apply it (none:
    /// everything is applied).
    pub pending_since: Option<std::time::Instant>,
    /// When every backend last held the current state.
    pub last_applied: Option<std::time::SystemTime>,
    /// Every backend has applied a state at least once.
    pub applied_once: bool,
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

    /// Times a backend's dataplane was found changed behind its back and rebuilt.
    pub fn repairs(&self) -> u64 {
        self.repairs.load(Ordering::Relaxed)
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
    fn track_no_local<'k>(
        &self,
        state: &LocalState,
        keys: Option<impl Iterator<Item = &'k kpng_model::ServiceKey>>,
    ) {
        let mut guard = self.no_local.lock().unwrap_or_else(|e| e.into_inner());
        let NoLocal { internal, external, yielding } = &mut *guard;
        let keys: Vec<&kpng_model::ServiceKey> = match keys {
            Some(keys) => keys.collect(),
            None => {
                internal.clear();
                external.clear();
                yielding.clear();
                state.services.keys().collect()
            }
        };
        for key in keys {
            let service = state.services.get(key);
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

    /// Seconds each backend took to apply a change set.
    pub fn sync_durations(&self) -> &Histogram {
        &self.sync_durations
    }

    fn update_health(&self, f: impl FnOnce(&mut Health)) {
        f(&mut self.health.lock().unwrap_or_else(|e| e.into_inner()));
    }
}

/// Why the runner stopped.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    /// With `once`, a backend failed to apply the state.
    #[error("applying the state for node {node}")]
    Once {
        /// The node.
        node: String,
        /// The failure.
        #[source]
        source: BackendError,
    },
    /// A backend failed in a way retrying cannot mend ([`BackendError::is_permanent`]).
    #[error("applying the state for node {node}: the backend cannot continue")]
    Permanent {
        /// The node.
        node: String,
        /// The failure.
        #[source]
        source: BackendError,
    },
    /// The [`Stop`] flag was set (the runner functions return `Ok` for it).
    #[error("stopped")]
    Stopped,
}

/// A runner's result, where being told to stop is a normal end.
fn stopped_is_ok(result: Result<(), RunnerError>) -> Result<(), RunnerError> {
    match result {
        Err(RunnerError::Stopped) => {
            tracing::info!("stopped before the next change set");
            Ok(())
        }
        other => other,
    }
}

struct Slot {
    backend: Box<dyn Backend>,
    /// The backend must be given the whole state (first time, or after a failure).
    needs_reset: bool,
    failures: u32,
    retry_at: Instant,
}

/// The backends of one node and what each has applied.
struct Slots {
    slots: Vec<Slot>,
    options: RunnerOptions,
    stats: Arc<NodeStats>,
    pace: Pace,
}

/// When the next sync may start: a token bucket of [`SYNC_BURST`] syncs at once, then one
/// per `period` (none with a zero period), and a rest after a long sync ([`REST_AFTER`]).
struct Pace {
    period: Duration,
    tokens: f64,
    at: Instant,
    rest_until: Option<Instant>,
}

impl Pace {
    fn new(period: Duration) -> Self {
        Pace { period, tokens: SYNC_BURST, at: Instant::now(), rest_until: None }
    }

    /// When the next sync may start (now if a token is left and no rest is due).
    fn next(&mut self) -> Instant {
        let now = Instant::now();
        let rested = self.rest_until.filter(|&until| until > now).unwrap_or(now);
        if self.period.is_zero() {
            return rested;
        }
        let refill = now.duration_since(self.at).as_secs_f64() / self.period.as_secs_f64();
        self.tokens = (self.tokens + refill).min(SYNC_BURST);
        self.at = now;
        let paced =
            if self.tokens >= 1.0 { now } else { now + self.period.mul_f64(1.0 - self.tokens) };
        paced.max(rested)
    }

    /// Records how long a sync took: after a long one the next waits as long, at most
    /// [`REST_MAX`].
    fn finished(&mut self, took: Duration) {
        self.rest_until = (took >= REST_AFTER).then(|| Instant::now() + took.min(REST_MAX));
    }

    /// Waits until the next sync may start. With a token left it returns at once: a
    /// timer, even one already due, would wait for the timer's next tick (up to 1 ms).
    async fn ready(&mut self) {
        let at = self.next();
        if at > Instant::now() {
            tokio::time::sleep_until(at).await;
        }
    }

    /// Spends a token for a sync that starts now.
    fn spend(&mut self) {
        if !self.period.is_zero() {
            let _ = self.next();
            self.tokens -= 1.0;
        }
    }
}

impl Slots {
    fn new(backends: Vec<Box<dyn Backend>>, options: RunnerOptions, stats: Arc<NodeStats>) -> Self {
        let now = Instant::now();
        let slots = backends
            .into_iter()
            .map(|backend| Slot { backend, needs_reset: true, failures: 0, retry_at: now })
            .collect();
        let pace = Pace::new(options.min_sync_period);
        Slots { slots, options, stats, pace }
    }

    /// Asks every up-to-date backend whether its dataplane still holds what it applied; one
    /// that drifted (or cannot tell) is due for the whole state at once.
    fn verify(&mut self) {
        let now = Instant::now();
        for slot in self.slots.iter_mut().filter(|s| !s.needs_reset) {
            let held = match slot.backend.verify() {
                Ok(held) => held,
                Err(error) => {
                    tracing::warn!(backend = slot.backend.name(), error = %kpng_backend::error_chain(&error), "verification failed");
                    false
                }
            };
            if !held {
                self.stats.repairs.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(
                    backend = slot.backend.name(),
                    "dataplane drifted; applying the whole state again"
                );
                slot.needs_reset = true;
                slot.retry_at = now;
            }
        }
    }

    /// Whether some backend is up to date and so needs the differences, not a full state.
    fn want_ops(&self) -> bool {
        self.slots.iter().any(|s| !s.needs_reset)
    }

    /// When the earliest failed backend may be retried.
    fn next_retry(&self) -> Option<Instant> {
        self.slots.iter().filter(|s| s.needs_reset).map(|s| s.retry_at).min()
    }

    /// Whether every backend has applied the state (for `once`).
    fn all_applied(&self) -> bool {
        self.slots.iter().all(|s| !s.needs_reset)
    }

    /// Counts an ENLS revision: one that changed the state, or the first.
    fn count_revision(&self, changed: bool, ops: usize) {
        if changed || self.stats.enls_revisions() == 0 {
            self.stats.enls_revisions.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(node = %self.options.node, ops, "node state changed");
            let now = std::time::Instant::now();
            self.stats.update_health(|h| {
                h.pending_since.get_or_insert(now);
            });
        }
    }

    /// Gives each backend what it lacks: the full `state` to a backend due for one, `ops`
    /// (the changes that led to `state`) to the others.
    fn deliver(&mut self, ops: &[Op], state: &LocalState) -> Result<(), RunnerError> {
        let full = self.slots.iter().any(|s| s.needs_reset);
        let result = self.deliver_each(ops, state);
        if full {
            self.stats.track_no_local(state, None::<std::iter::Empty<&kpng_model::ServiceKey>>);
        } else {
            self.stats.track_no_local(state, Some(ops.iter().filter_map(op_service)));
        }
        let draining = state.node.as_ref().is_some_and(|n| n.draining);
        let applied = self.all_applied();
        self.stats.update_health(|h| {
            h.node_draining = draining;
            if applied {
                h.pending_since = None;
                h.last_applied = Some(std::time::SystemTime::now());
                h.applied_once = true;
            }
        });
        result
    }

    fn deliver_each(&mut self, ops: &[Op], state: &LocalState) -> Result<(), RunnerError> {
        let now = Instant::now();
        // Dataplane backends first; those that follow them only once all hold the state.
        for follower in [false, true] {
            let pending_dataplane = self
                .slots
                .iter()
                .filter(|s| !s.backend.follows_dataplane() && s.needs_reset)
                .map(|s| s.retry_at)
                .max();
            for i in 0..self.slots.len() {
                if self.slots[i].backend.follows_dataplane() != follower {
                    continue;
                }
                if let (true, Some(retry_at)) = (follower, pending_dataplane) {
                    // It must see the state the dataplanes hold: the whole state, later.
                    let slot = &mut self.slots[i];
                    slot.needs_reset = true;
                    slot.retry_at = retry_at.max(now);
                    continue;
                }
                self.deliver_one(i, ops, state, now)?;
            }
        }
        Ok(())
    }

    fn deliver_one(
        &mut self,
        i: usize,
        ops: &[Op],
        state: &LocalState,
        now: Instant,
    ) -> Result<(), RunnerError> {
        if self.options.stop.is_stopped() {
            return Err(RunnerError::Stopped);
        }
        let slot = &mut self.slots[i];
        let changes = if slot.needs_reset {
            if slot.retry_at > now {
                return Ok(());
            }
            ChangeSet::full(state)
        } else if !ops.is_empty() {
            ChangeSet::changes(ops, state)
        } else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        let result = slot.backend.apply(&changes);
        self.stats.sync_durations.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(()) => {
                self.stats.change_sets.fetch_add(1, Ordering::Relaxed);
                slot.needs_reset = false;
                slot.failures = 0;
            }
            Err(source) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                if source.is_permanent() {
                    let node = self.options.node.clone();
                    return Err(RunnerError::Permanent { node, source });
                }
                if self.options.once {
                    let node = self.options.node.clone();
                    return Err(RunnerError::Once { node, source });
                }
                slot.failures += 1;
                let delay = self
                    .options
                    .retry_min
                    .saturating_mul(1 << slot.failures.min(16).saturating_sub(1));
                let delay = delay.min(self.options.retry_max);
                tracing::error!(backend = slot.backend.name(), error = %kpng_backend::error_chain(&source), retry_in = ?delay, "change set failed; will retry with the full state");
                slot.needs_reset = true;
                slot.retry_at = now + delay;
            }
        }
        Ok(())
    }
}

/// Feeds `backends` with node `options.node`'s ENLS until the store's writer goes away (or,
/// with `once`, until every backend applied it once). Each backend gets `Reset` and the full
/// state first, then only the changes; a failed backend is retried with backoff and gets the
/// full state again. A revision that does not change this node's ENLS reaches no backend.
///
/// Once `options.stop` is set, nothing more is applied and it returns `Ok`; a backend that
/// fails permanently ends it with an error.
pub async fn run_node(
    reader: StoreReader,
    backends: Vec<Box<dyn Backend>>,
    options: RunnerOptions,
    stats: Arc<NodeStats>,
    addresses: Option<AddressUpdates>,
) -> Result<(), RunnerError> {
    stopped_is_ok(follow_store(reader, backends, options, stats, addresses).await)
}

async fn follow_store(
    mut reader: StoreReader,
    backends: Vec<Box<dyn Backend>>,
    options: RunnerOptions,
    stats: Arc<NodeStats>,
    mut addresses: Option<AddressUpdates>,
) -> Result<(), RunnerError> {
    let mut projector = NodeProjector::with_local(options.node.clone(), options.local.clone());
    let mut seen: Option<Revision> = None;
    let once = options.once;
    let verify_period = options.verify_period;
    let mut slots = Slots::new(backends, options, stats);
    let mut next_verify = verify_period.map(|p| Instant::now() + p);

    loop {
        let retry = slots.next_retry().filter(|_| seen.is_some());
        tokio::select! {
            revision = reader.wait_after(seen) => if revision.is_none() { return Ok(()) },
            update = next_addresses(&mut addresses) => {
                let ops = projector.set_addresses(update);
                if !ops.is_empty() && seen.is_some() {
                    slots.count_revision(true, ops.len());
                    slots.deliver(&ops, projector.state())?;
                }
                continue;
            }
            _ = sleep_until(retry), if retry.is_some() => {}
            _ = sleep_until(next_verify), if next_verify.is_some() && seen.is_some() => {
                slots.verify();
                next_verify = verify_period.map(|p| Instant::now() + p);
            }
        }
        // Paced: revisions that arrive meanwhile are applied together.
        slots.pace.ready().await;
        slots.pace.spend();
        let syncing = Instant::now();
        // While every backend waits for a full state, the differences are not needed.
        let (ops, changed) = {
            let snapshot = reader.snapshot();
            let changes = snapshot.changes_since(seen);
            seen = Some(snapshot.revision());
            if slots.want_ops() {
                let ops = projector.update(snapshot.model(), &changes);
                let changed = !ops.is_empty();
                (ops, changed)
            } else {
                (Vec::new(), projector.refresh(snapshot.model(), &changes))
            }
        };
        slots.count_revision(changed, ops.len());
        slots.deliver(&ops, projector.state())?;
        slots.pace.finished(syncing.elapsed());
        if changed && slots.all_applied() {
            observe_programming(&slots.stats, &reader, &ops);
        }
        if once && slots.all_applied() {
            return Ok(());
        }
    }
}

/// The service an op concerns.
fn op_service(op: &Op) -> Option<&kpng_model::ServiceKey> {
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
fn observe_programming(stats: &NodeStats, reader: &StoreReader, ops: &[Op]) {
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

/// The next address update; never, without a source (or once it is gone).
async fn next_addresses(source: &mut Option<AddressUpdates>) -> Vec<std::net::IpAddr> {
    match source {
        Some(updates) => match updates.recv().await {
            Some(addresses) => addresses,
            None => {
                *source = None;
                std::future::pending().await
            }
        },
        None => std::future::pending().await,
    }
}

async fn sleep_until(at: Option<Instant>) {
    if let Some(at) = at {
        tokio::time::sleep_until(at).await;
    }
}

/// Feeds `backends` with change sets that arrive from elsewhere (another process's
/// stream) until `changes` ends. Each item is the ops of one change set without `Sync`; one
/// that starts with `Reset` describes the whole state again (after a reconnection): it is
/// compared with the state already held, and only the differences reach the backends, so
/// a reconnection that finds nothing new costs them nothing. It stops as
/// [`run_node`] does.
pub async fn run_remote(
    changes: tokio::sync::mpsc::Receiver<Vec<Op>>,
    backends: Vec<Box<dyn Backend>>,
    options: RunnerOptions,
    stats: Arc<NodeStats>,
    addresses: Option<AddressUpdates>,
) -> Result<(), RunnerError> {
    stopped_is_ok(follow_changes(changes, backends, options, stats, addresses).await)
}

async fn follow_changes(
    mut changes: tokio::sync::mpsc::Receiver<Vec<Op>>,
    backends: Vec<Box<dyn Backend>>,
    options: RunnerOptions,
    stats: Arc<NodeStats>,
    mut addresses: Option<AddressUpdates>,
) -> Result<(), RunnerError> {
    let mut local = options.local.clone();
    let mut state = LocalState::default();
    let mut started = false;
    let once = options.once;
    let verify_period = options.verify_period;
    let mut slots = Slots::new(backends, options, stats);
    let mut next_verify = verify_period.map(|p| Instant::now() + p);
    loop {
        let retry = slots.next_retry().filter(|_| started);
        let ops = tokio::select! {
            update = next_addresses(&mut addresses) => {
                local.addresses = update;
                let Some(node) = &state.node else { continue };
                let mut completed = node.clone();
                local.complete(&mut completed);
                if completed == *node {
                    continue;
                }
                state.node = Some(completed.clone());
                let ops = vec![Op::Set(kpng_model::Item::Node(completed))];
                slots.count_revision(true, ops.len());
                ops
            }
            _ = sleep_until(next_verify), if next_verify.is_some() && started => {
                slots.verify();
                next_verify = verify_period.map(|p| Instant::now() + p);
                Vec::new()
            }
            batch = changes.recv() => match batch {
                Some(mut batch) => {
                    // Paced: change sets that arrive meanwhile are applied together.
                    slots.pace.ready().await;
                    slots.pace.spend();
                    while let Ok(more) = changes.try_recv() {
                        if matches!(more.first(), Some(Op::Reset)) {
                            batch = more;
                        } else {
                            batch.extend(more);
                        }
                    }
                    complete_nodes(&mut batch, &local);
                    let ops = match apply_remote(&mut state, batch) {
                        Ok(ops) => ops,
                        Err(error) => {
                            // The stream broke its own rules: take the next full state.
                            tracing::error!(node = %slots.options.node, %error, "inconsistent change set ignored");
                            continue;
                        }
                    };
                    if !started {
                        started = true;
                        slots.count_revision(true, ops.len());
                    } else {
                        slots.count_revision(!ops.is_empty(), ops.len());
                    }
                    ops
                }
                None => return Ok(()),
            },
            _ = sleep_until(retry), if retry.is_some() => Vec::new(),
        };
        let delivering = Instant::now();
        slots.deliver(&ops, &state)?;
        slots.pace.finished(delivering.elapsed());
        if once && slots.all_applied() {
            return Ok(());
        }
    }
}

/// Fills in what only this node knows in the node items of a remote change set.
fn complete_nodes(batch: &mut [Op], local: &NodeLocal) {
    for op in batch {
        if let Op::Set(kpng_model::Item::Node(node)) = op {
            local.complete(node);
        }
    }
}

/// Applies one remote change set to `state`; returns the ops that changed it. An op that
/// does not fit the state (an endpoint of an unknown service) is reported and dropped.
fn apply_remote(state: &mut LocalState, batch: Vec<Op>) -> Result<Vec<Op>, ApplyError> {
    if matches!(batch.first(), Some(Op::Reset)) {
        let mut fresh = LocalState::default();
        for op in &batch {
            fresh.apply(op)?;
        }
        let ops = diff(state, &fresh);
        *state = fresh;
        return Ok(ops);
    }
    let mut applied = Vec::with_capacity(batch.len());
    for op in batch {
        match state.apply(&op) {
            Ok(()) => applied.push(op),
            Err(error) => tracing::error!(%error, "remote op does not fit the node state; dropped"),
        }
    }
    Ok(applied)
}

#[cfg(test)]
mod tests;
