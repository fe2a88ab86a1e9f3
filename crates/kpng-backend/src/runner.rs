//! [`run_node`]: from store revisions to backend change sets, for one node.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kpng_local::NodeProjector;
use kpng_store::{Revision, StoreReader};
use tokio::time::Instant;

use crate::backend::{Backend, BackendError, ChangeSet};

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
}

impl RunnerOptions {
    /// Options for `node` with the default retry delays (0.5 s doubling up to 30 s).
    pub fn new(node: impl Into<String>) -> Self {
        RunnerOptions {
            node: node.into(),
            once: false,
            retry_min: Duration::from_millis(500),
            retry_max: Duration::from_secs(30),
        }
    }
}

/// Counters of one node's runner.
#[derive(Debug, Default)]
pub struct NodeStats {
    enls_revisions: AtomicU64,
    change_sets: AtomicU64,
    failures: AtomicU64,
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
}

struct Slot {
    backend: Box<dyn Backend>,
    /// The backend must be given the whole state (first time, or after a failure).
    needs_reset: bool,
    failures: u32,
    retry_at: Instant,
}

/// Feeds `backends` with node `options.node`'s ENLS until the store's writer goes away (or,
/// with `once`, until every backend applied it once). Each backend gets `Reset` and the full
/// state first, then only the changes; a failed backend is retried with backoff and gets the
/// full state again. A revision that does not change this node's ENLS reaches no backend.
pub async fn run_node(
    mut reader: StoreReader,
    backends: Vec<Box<dyn Backend>>,
    options: RunnerOptions,
    stats: Arc<NodeStats>,
) -> Result<(), RunnerError> {
    let mut projector = NodeProjector::new(options.node.clone());
    let mut seen: Option<Revision> = None;
    let start = Instant::now();
    let mut slots: Vec<Slot> = backends
        .into_iter()
        .map(|backend| Slot { backend, needs_reset: true, failures: 0, retry_at: start })
        .collect();

    loop {
        let retry =
            slots.iter().filter(|s| s.needs_reset && seen.is_some()).map(|s| s.retry_at).min();
        tokio::select! {
            revision = reader.wait_after(seen) => if revision.is_none() { return Ok(()) },
            _ = tokio::time::sleep_until(retry.unwrap_or(start)), if retry.is_some() => {}
        }
        // While every backend waits for a full state, the differences are not needed.
        let want_ops = slots.iter().any(|s| !s.needs_reset);
        let (ops, changed) = {
            let snapshot = reader.snapshot();
            let changes = snapshot.changes_since(seen);
            seen = Some(snapshot.revision());
            if want_ops {
                let ops = projector.update(snapshot.model(), &changes);
                let changed = !ops.is_empty();
                (ops, changed)
            } else {
                (Vec::new(), projector.refresh(snapshot.model(), &changes))
            }
        };
        let first = stats.enls_revisions() == 0;
        if changed || first {
            stats.enls_revisions.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(node = %options.node, ops = ops.len(), revision = ?seen, "node state changed");
        }

        let now = Instant::now();
        for slot in &mut slots {
            let changes = if slot.needs_reset {
                if slot.retry_at > now {
                    continue;
                }
                ChangeSet::full(projector.state())
            } else if !ops.is_empty() {
                ChangeSet::changes(&ops, projector.state())
            } else {
                continue;
            };
            match slot.backend.apply(&changes) {
                Ok(()) => {
                    stats.change_sets.fetch_add(1, Ordering::Relaxed);
                    slot.needs_reset = false;
                    slot.failures = 0;
                }
                Err(source) => {
                    stats.failures.fetch_add(1, Ordering::Relaxed);
                    if options.once {
                        return Err(RunnerError::Once { node: options.node.clone(), source });
                    }
                    slot.failures += 1;
                    let delay = options
                        .retry_min
                        .saturating_mul(1 << slot.failures.min(16).saturating_sub(1));
                    let delay = delay.min(options.retry_max);
                    tracing::error!(backend = slot.backend.name(), error = %crate::backend::error_chain(&source), retry_in = ?delay, "change set failed; will retry with the full state");
                    slot.needs_reset = true;
                    slot.retry_at = now + delay;
                }
            }
        }
        if options.once && slots.iter().all(|s| !s.needs_reset) {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests;
