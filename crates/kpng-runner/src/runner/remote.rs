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
                    let applied = match apply_remote(&mut state, batch, slots.want_ops()) {
                        Ok(applied) => applied,
                        Err(error) => {
                            // The stream broke its own rules: take the next full state.
                            tracing::error!(node = %slots.options.node, %error, "inconsistent change set ignored");
                            continue;
                        }
                    };
                    let first = !std::mem::replace(&mut started, true);
                    match applied {
                        Applied::Ops(ops) => {
                            slots.count_revision(first || !ops.is_empty(), &ops);
                            ops
                        }
                        Applied::Replaced { changed } => {
                            slots.count_replaced(first || changed, &state);
                            Vec::new()
                        }
                    }
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

/// What one remote change set did to the state.
#[derive(Debug, PartialEq)]
enum Applied {
    /// These ops changed it.
    Ops(Vec<Op>),
    /// A whole state replaced it, and no backend takes differences (every one is due for
    /// the whole state): no op list was made.
    Replaced {
        /// It differs from the state it replaced.
        changed: bool,
    },
}

/// Applies one remote change set to `state`. A whole state (one that starts with `Reset`)
/// is compared with the one held: the ops that differ when `want_ops` (some backend takes
/// differences), else only whether it changed, so the first state (as after every
/// reconnection while the backends are due) is never held as ops beside itself. An op of a
/// partial change set that does not fit the state (an endpoint of an unknown service) is
/// reported and dropped.
fn apply_remote(
    state: &mut LocalState,
    batch: Vec<Op>,
    want_ops: bool,
) -> Result<Applied, ApplyError> {
    if matches!(batch.first(), Some(Op::Reset)) {
        let mut fresh = LocalState::default();
        // Each op is dropped once applied.
        for op in batch {
            fresh.apply(&op)?;
        }
        let applied = match want_ops {
            true => Applied::Ops(diff(state, &fresh)),
            false => Applied::Replaced { changed: *state != fresh },
        };
        *state = fresh;
        return Ok(applied);
    }
    let mut applied = Vec::with_capacity(batch.len());
    for op in batch {
        match state.apply(&op) {
            Ok(()) => applied.push(op),
            Err(error) => tracing::error!(%error, "remote op does not fit the node state; dropped"),
        }
    }
    Ok(Applied::Ops(applied))
}

#[cfg(test)]
mod tests {
    use kpng_model::{Item, ItemRef, full_state_ops};

    use super::*;

    fn state(services: &[(&str, &str)]) -> LocalState {
        let mut model = kpng_model::GlobalModel::new();
        for (name, ip) in services {
            let ports = &[("http", kpng_model::Protocol::Tcp, 80)];
            let service = kpng_testkit::builders::service("ns", name, &[ip], ports);
            model.apply(kpng_model::Object::Service(service));
            let eps = vec![kpng_testkit::builders::endpoint("10.244.0.1", "n1")];
            let slice_ports = &[("http", kpng_model::Protocol::Tcp, 8080)];
            let slice_name = format!("{name}-1");
            let slice = kpng_testkit::builders::slice("ns", &slice_name, name, slice_ports, eps);
            model.apply(kpng_model::Object::EndpointSlice(slice));
        }
        kpng_local::project_node_state(&model, "n1")
    }

    fn whole(state: &LocalState) -> Vec<Op> {
        full_state_ops(state).collect()
    }

    #[test]
    fn a_whole_state_makes_no_ops_unless_a_backend_takes_differences() {
        let (one, two) =
            (state(&[("a", "10.96.0.1")]), state(&[("a", "10.96.0.1"), ("b", "10.96.0.2")]));
        let mut held = LocalState::default();
        assert_eq!(
            apply_remote(&mut held, whole(&one), false),
            Ok(Applied::Replaced { changed: true })
        );
        assert_eq!(held, one);
        assert_eq!(
            apply_remote(&mut held, whole(&one), false),
            Ok(Applied::Replaced { changed: false })
        );
        // A backend in sync gets the differences: the service added and its endpoint.
        let Ok(Applied::Ops(ops)) = apply_remote(&mut held, whole(&two), true) else {
            panic!("ops were asked for")
        };
        assert_eq!(ops, diff(&one, &two));
        assert!(
            ops.iter().all(|op| match op {
                Op::Set(Item::Service(s)) => &**s.key.name() == "b",
                Op::Set(Item::Endpoint { service, .. }) => &**service.name() == "b",
                _ => false,
            }),
            "{ops:?}"
        );
        assert_eq!(held, two);
        // A partial change set is applied op by op, as before.
        let gone = Op::Delete(ItemRef::Service(kpng_model::ServiceKey::new("ns", "b")));
        assert_eq!(
            apply_remote(&mut held, vec![gone.clone()], false),
            Ok(Applied::Ops(vec![gone]))
        );
        assert_eq!(held, one);
    }
}
