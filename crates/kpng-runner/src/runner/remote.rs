//! [`run_remote`]: the runner fed with change sets from another process's stream.

use std::sync::Arc;

use kpng_backend::Backend;
use kpng_local::{NodeLocal, diff};
use kpng_model::ops::ApplyError;
use kpng_model::{LocalState, Op};
use tokio::time::Instant;

use super::slots::Slots;
use super::{
    AddressUpdates, NodeStats, RunnerError, RunnerOptions, next_addresses, sleep_until,
    stopped_is_ok,
};

/// Feeds `backends` with change sets that arrive from elsewhere (another process's
/// stream) until `changes` ends. Each item is the ops of one change set without `Sync`; one
/// that starts with `Reset` describes the whole state again (after a reconnection): it is
/// compared with the state already held, and only the differences reach the backends, so
/// a reconnection that finds nothing new costs them nothing. It stops as
/// [`run_node`](super::run_node) does.
#[tracing::instrument(name = "runner", skip_all, fields(node = %options.node, remote = true))]
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
                slots.count_revision(true, &ops);
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
                        slots.count_revision(true, &ops);
                    } else {
                        slots.count_revision(!ops.is_empty(), &ops);
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
