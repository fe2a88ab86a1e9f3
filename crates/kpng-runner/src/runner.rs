//! [`run_node`]: from store revisions to backend change sets, for one node; [`run_remote`]:
//! the same from change sets received from another process.
//!
//! # Layout
//! - this file: the options, the errors, and the loop that follows the store.
//! - [`slots`]: each backend's [`Standing`](slots::Standing) (due for
//!   the whole state, or in sync), a state machine stepped by what happens to it, and the
//!   delivery of change sets.
//! - `stats`: [`NodeStats`] and [`Health`].
//! - `remote`: [`run_remote`].
//! - `stop`: [`Stop`].

use std::sync::Arc;
use std::time::Duration;

use kpng_backend::{Backend, BackendError};
use kpng_local::{NodeLocal, NodeProjector};
use kpng_store::{Revision, StoreReader};
use tokio::time::Instant;

mod remote;
pub mod slots;
mod stats;
mod stop;

pub use kpng_backend::pace::{Pace, REST_AFTER, REST_MAX, SYNC_BURST};
pub use remote::run_remote;
pub use stats::{Health, NodeStats, parse_rfc3339};
pub use stop::Stop;

use slots::Slots;
use stats::observe_programming;

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
    /// Where the runner reports, for `/readyz`, that the node is not in the source.
    pub problems: kpng_backend::Problems,
}

/// Updates of the node's own addresses (each the whole list), from whoever watches them.
pub type AddressUpdates = tokio::sync::mpsc::Receiver<Vec<std::net::IpAddr>>;

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
            problems: kpng_backend::Problems::default(),
        }
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

/// Feeds `backends` with node `options.node`'s ENLS until the store's writer goes away (or,
/// with `once`, until every backend applied it once). Each backend gets `Reset` and the full
/// state first, then only the changes; a failed backend is retried with backoff and gets the
/// full state again. A revision that does not change this node's ENLS reaches no backend.
///
/// The ENLS is not kept beside the model: only its fingerprints, which tell what changed.
/// Backends read it from the store's model, under the store's read lock, as of the revision
/// the change set was projected at; a change set that reads every service (a full state,
/// or a change of the node, which every service may render) reads one projected whole under
/// the lock and delivered without it, then dropped.
///
/// Once `options.stop` is set, nothing more is applied and it returns `Ok`; a backend that
/// fails permanently ends it with an error.
#[tracing::instrument(name = "runner", skip_all, fields(node = %options.node))]
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
    // Only the fingerprints of the node state are kept; backends read it from the model.
    let mut projector = NodeProjector::lean(options.node.clone(), options.local.clone());
    let mut seen: Option<Revision> = None;
    let once = options.once;
    let verify_period = options.verify_period;
    let mut slots = Slots::new(backends, options, stats);
    let mut next_verify = verify_period.map(|p| Instant::now() + p);
    // The node's change when its own addresses moved, delivered with the next revision.
    let mut readdressed = Vec::new();

    loop {
        let retry = slots.next_retry().filter(|_| seen.is_some());
        tokio::select! {
            revision = reader.wait_after(seen) => if revision.is_none() { return Ok(()) },
            update = next_addresses(&mut addresses) => {
                readdressed = projector.set_addresses(update);
                if readdressed.is_empty() || seen.is_none() {
                    continue;
                }
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
        // The state is delivered as of the revision it was projected at: the store's lock
        // is held from the projection to the delivery, unless the delivery reads a whole
        // state (then projected whole under the lock, and delivered without it).
        let snapshot = reader.snapshot();
        let changes = snapshot.changes_since(seen);
        seen = Some(snapshot.revision());
        let readdressed = std::mem::take(&mut readdressed);
        // While every backend waits for a full state, the differences are not needed.
        let (ops, changed) = if slots.want_ops() {
            let mut ops = readdressed;
            ops.extend(projector.update(snapshot.model(), &changes));
            let changed = !ops.is_empty();
            (ops, changed)
        } else {
            let changed = projector.refresh(snapshot.model(), &changes);
            (Vec::new(), changed || !readdressed.is_empty())
        };
        slots.count_revision(changed, &ops);
        // The whole state a full recomputation made, or one projected for this delivery.
        let projected = (projector.whole().is_none() && slots.reads_whole(&ops, Instant::now()))
            .then(|| {
                let (name, local) = (projector.node_name(), projector.local());
                kpng_local::project_node_state_with(snapshot.model(), name, local)
            });
        match projector.whole().or(projected.as_ref()) {
            Some(whole) => {
                drop(snapshot);
                let delivered = slots.deliver(&ops, whole);
                drop(projected);
                projector.settle();
                crate::heap::release_free_memory();
                delivered?;
            }
            None => {
                let delivered = slots.deliver(&ops, &projector.view(snapshot.model()));
                drop(snapshot);
                delivered?;
            }
        }
        slots.pace.finished(syncing.elapsed());
        if changed && slots.all_applied() {
            observe_programming(&slots.stats, &reader, &ops);
        }
        if once && slots.all_applied() {
            return Ok(());
        }
    }
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

#[cfg(test)]
mod tests;
