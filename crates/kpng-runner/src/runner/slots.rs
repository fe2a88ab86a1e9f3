//! `Slots`: the backends of one node, where each stands ([`Standing`]), and the delivery
//! of change sets to them.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kpng_backend::{Backend, ChangeSet};
use kpng_model::{LocalState, NodeState, Op};
use tokio::time::Instant;

use super::stats::op_service;
use super::{NodeStats, RunnerError, RunnerOptions};
use kpng_backend::pace::Pace;

/// Where one backend stands with the node's state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// It must be given the whole state, not before `at`: at start and after drift at
    /// once, after `failures` failed change sets after a backoff.
    Due {
        /// The earliest time to give it the whole state.
        at: Instant,
        /// Failed change sets in a row.
        failures: u32,
    },
    /// It holds the state of the last change set it was given: it gets the differences.
    InSync,
}

/// What happens to a backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// It applied a change set.
    Applied,
    /// It failed to apply a change set at `now`.
    Failed {
        /// When.
        now: Instant,
    },
    /// Its dataplane was found changed behind its back (or could not be checked) at `now`.
    Drifted {
        /// When.
        now: Instant,
    },
    /// It follows the dataplane backends, which do not all hold the state yet: it gets the
    /// whole state, once they do, not before `until`.
    Waits {
        /// The earliest time the dataplanes may hold it.
        until: Instant,
    },
}

impl Standing {
    /// Due at once, without failures: a backend that has not applied anything yet.
    pub fn due_now() -> Standing {
        Standing::Due { at: Instant::now(), failures: 0 }
    }

    /// Where a backend stands after `event`. A failure backs off from `retry_min`, doubling
    /// with each failure in a row, up to `retry_max`.
    pub fn step(self, event: Event, options: &RunnerOptions) -> Standing {
        let failures = match self {
            Standing::Due { failures, .. } => failures,
            Standing::InSync => 0,
        };
        match event {
            Event::Applied => Standing::InSync,
            Event::Failed { now } => {
                let failures = failures + 1;
                let delay =
                    options.retry_min.saturating_mul(1 << failures.min(16).saturating_sub(1));
                Standing::Due { at: now + delay.min(options.retry_max), failures }
            }
            Event::Drifted { now } => Standing::Due { at: now, failures: 0 },
            Event::Waits { until } => Standing::Due { at: until, failures },
        }
    }

    /// Whether the backend must be given the whole state.
    pub fn is_due(&self) -> bool {
        matches!(self, Standing::Due { .. })
    }

    /// When the whole state may be given (`None`: in sync).
    pub fn due_at(&self) -> Option<Instant> {
        match self {
            Standing::Due { at, .. } => Some(*at),
            Standing::InSync => None,
        }
    }
}

/// One backend and where it stands.
struct Slot {
    backend: Box<dyn Backend>,
    standing: Standing,
}

/// The backends of one node and what each has applied.
pub(super) struct Slots {
    slots: Vec<Slot>,
    pub(super) options: RunnerOptions,
    pub(super) stats: Arc<NodeStats>,
    pub(super) pace: Pace,
    /// Load-balancing settings backends cannot enforce, logged once.
    unsupported: kpng_backend::unsupported::UnsupportedSettings,
    /// Whether the node's own object was in the last state delivered (`None`: none yet).
    node_known: Option<bool>,
}

impl Slots {
    pub(super) fn new(
        backends: Vec<Box<dyn Backend>>,
        options: RunnerOptions,
        stats: Arc<NodeStats>,
    ) -> Self {
        let slots = backends
            .into_iter()
            .map(|backend| Slot { backend, standing: Standing::due_now() })
            .collect();
        let pace = Pace::new(options.min_sync_period);
        Slots { slots, options, stats, pace, unsupported: Default::default(), node_known: None }
    }

    /// Says when the node's own object is missing from the state (a wrong `--node`, or a
    /// source that does not list it) and when it appears: without it, the node's zone, pod
    /// CIDRs and primary addresses are unknown. `/readyz` names it while it lasts.
    fn note_node(&mut self, state: &dyn NodeState) {
        let known = state.node().is_some();
        if self.node_known == Some(known) {
            return;
        }
        let first = self.node_known.is_none();
        self.node_known = Some(known);
        let node = &self.options.node;
        match known {
            false => {
                tracing::warn!(
                    %node,
                    "node {node} is not in the source (no Node object by that name: is --node \
                     right?): its zone, pod CIDRs and primary addresses are unknown, so NodePorts \
                     on primary addresses, NodeCIDR detection and topology hints do not apply"
                );
                let text = format!("node {node} is not in the source (--node)");
                self.options.problems.report("node", text);
            }
            true if !first => {
                tracing::info!(%node, "node {node} is in the source now");
                self.options.problems.clear("node");
            }
            true => {}
        }
    }

    /// Asks every up-to-date backend whether its dataplane still holds what it applied; one
    /// that drifted (or cannot tell) is due for the whole state at once.
    pub(super) fn verify(&mut self) {
        let now = Instant::now();
        for slot in self.slots.iter_mut().filter(|s| !s.standing.is_due()) {
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
                slot.standing = slot.standing.step(Event::Drifted { now }, &self.options);
            }
        }
    }

    /// Whether some backend is up to date and so needs the differences, not a full state.
    pub(super) fn want_ops(&self) -> bool {
        self.slots.iter().any(|s| !s.standing.is_due())
    }

    /// Whether delivering `ops` now reads every service of the state: some backend is due
    /// for the whole state by `now`, none takes differences (so no op names what changed),
    /// or the node changed (a backend whose objects depend on it renders every service).
    pub(super) fn reads_whole(&self, ops: &[Op], now: Instant) -> bool {
        use kpng_model::{Item, ItemRef};
        let due_now = |s: &Slot| matches!(s.standing, Standing::Due { at, .. } if at <= now);
        let node = |op: &Op| matches!(op, Op::Set(Item::Node(_)) | Op::Delete(ItemRef::Node));
        !self.want_ops() || self.slots.iter().any(due_now) || ops.iter().any(node)
    }

    /// When the earliest backend due for the whole state may have it.
    pub(super) fn next_retry(&self) -> Option<Instant> {
        self.slots.iter().filter_map(|s| s.standing.due_at()).min()
    }

    /// Whether every backend has applied the state (for `once`).
    pub(super) fn all_applied(&self) -> bool {
        self.slots.iter().all(|s| !s.standing.is_due())
    }

    /// Counts an ENLS revision: one that changed the state, or the first.
    pub(super) fn count_revision(&self, changed: bool, ops: &[Op]) {
        let endpoints = ops.iter().filter(|op| is_endpoint_op(op)).count() as u64;
        let services = ops.iter().filter(|op| op_service(op).is_some()).count() as u64 - endpoints;
        self.count_pending(changed, services, endpoints);
    }

    /// Counts an ENLS revision that replaced the state whole with `state` (no op list was
    /// made): every service and endpoint of it is pending.
    pub(super) fn count_replaced(&self, changed: bool, state: &LocalState) {
        let endpoints = state.services.values().map(|s| s.endpoints.len() as u64).sum();
        self.count_pending(changed, state.services.len() as u64, endpoints);
    }

    fn count_pending(&self, changed: bool, services: u64, endpoints: u64) {
        if changed || self.stats.enls_revisions() == 0 {
            self.stats.enls_revisions.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(node = %self.options.node, services, endpoints, "node state changed");
            let now = Instant::now();
            self.stats.update_health(|h| {
                h.pending_since.get_or_insert(now);
                h.last_queued = Some(std::time::SystemTime::now());
            });
            self.stats.pending_services.fetch_add(services, Ordering::Relaxed);
            self.stats.pending_endpoints.fetch_add(endpoints, Ordering::Relaxed);
        }
    }

    /// Gives each backend what it lacks: the full `state` to a backend due for one, `ops`
    /// (the changes that led to `state`) to the others.
    ///
    /// `ops` name every service that changed unless no backend takes differences: only then
    /// is every service of `state` read for the node's counters.
    pub(super) fn deliver(&mut self, ops: &[Op], state: &dyn NodeState) -> Result<(), RunnerError> {
        self.note_node(state);
        let full = !self.want_ops();
        let result = self.deliver_each(ops, state);
        if full {
            self.stats.track_no_local(state, None::<std::iter::Empty<&kpng_model::ServiceKey>>);
        } else {
            self.stats.track_no_local(state, Some(ops.iter().filter_map(op_service)));
        }
        let draining = state.node().is_some_and(|n| n.draining);
        let applied = self.all_applied();
        if applied {
            self.stats.synced.release();
            self.stats.pending_services.store(0, Ordering::Relaxed);
            self.stats.pending_endpoints.store(0, Ordering::Relaxed);
        }
        self.stats.update_health(|h| {
            h.node_draining = draining;
            if applied {
                h.pending_since = None;
                h.last_applied = Some(std::time::SystemTime::now());
            }
        });
        result
    }

    fn deliver_each(&mut self, ops: &[Op], state: &dyn NodeState) -> Result<(), RunnerError> {
        let now = Instant::now();
        // Dataplane backends first; those that follow them only once all hold the state.
        for follower in [false, true] {
            let pending_dataplane = self
                .slots
                .iter()
                .filter(|s| !s.backend.follows_dataplane())
                .filter_map(|s| s.standing.due_at())
                .max();
            for i in 0..self.slots.len() {
                if self.slots[i].backend.follows_dataplane() != follower {
                    continue;
                }
                if let (true, Some(until)) = (follower, pending_dataplane) {
                    // It must see the state the dataplanes hold: the whole state, later.
                    let slot = &mut self.slots[i];
                    let until = until.max(now);
                    slot.standing = slot.standing.step(Event::Waits { until }, &self.options);
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
        state: &dyn NodeState,
        now: Instant,
    ) -> Result<(), RunnerError> {
        if self.options.stop.is_stopped() {
            return Err(RunnerError::Stopped);
        }
        let slot = &mut self.slots[i];
        let changes = match slot.standing {
            Standing::Due { at, .. } if at > now => return Ok(()),
            Standing::Due { .. } => ChangeSet::full(state),
            Standing::InSync if ops.is_empty() => return Ok(()),
            Standing::InSync => ChangeSet::changes(ops, state),
        };
        self.unsupported.check(slot.backend.as_ref(), &changes);
        let name = slot.backend.name();
        let _sync =
            tracing::debug_span!("sync", backend = name, full = changes.is_reset()).entered();
        if changes.is_reset() {
            // What was read and projected before it and freed (the start-up's lists) goes
            // back first: the full sync's peak then starts from what is live.
            crate::heap::release_free_memory();
        }
        let started = std::time::Instant::now();
        let result = slot.backend.apply(&changes);
        if !slot.backend.follows_dataplane() {
            let took = started.elapsed().as_secs_f64();
            self.stats.sync_durations.observe(took);
            match changes.is_reset() {
                true => self.stats.full_sync_durations.observe(took),
                false => self.stats.partial_sync_durations.observe(took),
            }
        }
        match result {
            Ok(()) => {
                self.stats.change_sets.fetch_add(1, Ordering::Relaxed);
                slot.standing = slot.standing.step(Event::Applied, &self.options);
                if changes.is_reset() {
                    crate::heap::release_free_memory();
                }
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
                slot.standing = slot.standing.step(Event::Failed { now }, &self.options);
                let retry_in = slot.standing.due_at().map(|at| at - now);
                tracing::error!(backend = slot.backend.name(), error = %kpng_backend::error_chain(&source), ?retry_in, "change set failed; will retry with the full state");
            }
        }
        Ok(())
    }
}

/// Whether `op` changes an endpoint (rather than a service itself).
fn is_endpoint_op(op: &Op) -> bool {
    use kpng_model::{Item, ItemRef};
    matches!(op, Op::Set(Item::Endpoint { .. }) | Op::Delete(ItemRef::Endpoint { .. }))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn failures_back_off_drift_is_due_at_once_and_success_clears_failures() {
        let options = RunnerOptions {
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(2),
            ..RunnerOptions::new("n")
        };
        let now = Instant::now();
        let fail = |s: Standing| s.step(Event::Failed { now }, &options);
        let first = fail(Standing::InSync);
        assert_eq!(first, Standing::Due { at: now + Duration::from_millis(500), failures: 1 });
        assert_eq!(fail(first), Standing::Due { at: now + Duration::from_secs(1), failures: 2 });
        let capped = fail(fail(fail(first)));
        assert_eq!(capped, Standing::Due { at: now + Duration::from_secs(2), failures: 4 });
        // A follower waiting for the dataplanes keeps its failures.
        let until = now + Duration::from_secs(5);
        assert_eq!(capped.step(Event::Waits { until }, &options).due_at(), Some(until));
        assert_eq!(
            capped.step(Event::Waits { until }, &options),
            Standing::Due { at: until, failures: 4 }
        );
        assert_eq!(capped.step(Event::Applied, &options), Standing::InSync);
        assert!(!Standing::InSync.is_due() && Standing::InSync.due_at().is_none());
        // Drift: the whole state at once, and a later failure starts the backoff afresh.
        let drifted = Standing::InSync.step(Event::Drifted { now }, &options);
        assert_eq!(drifted, Standing::Due { at: now, failures: 0 });
        assert_eq!(fail(drifted), first);
    }
}
