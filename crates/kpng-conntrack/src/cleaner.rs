//! [`FlowCleaner`]: the backend that removes stale UDP flows after the dataplane backends
//! applied a state: conntrack entries, or (with `to-ebpf`) connected sockets, each through a
//! [`FlowTable`]. The kernel walks its whole conntrack table for every dump, which takes
//! milliseconds on a large table: the dumps and removals run on a thread of their own, so
//! they never hold back the next change set. What a change set calls for
//! is handed to that thread, which merges what arrives while it works; a cleanup that
//! fails stays pending and is retried with backoff, and at every verification, until it
//! succeeds.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use kpng_model::{Family, NodePortAddresses, ServiceKey};

use super::table::{Ctnetlink, FlowTable};
use super::{Serving, UdpCheck, UdpTarget, udp_checks};
use kpng_backend::{Backend, BackendError, ChangeSet};

/// The first retry of a failed cleanup; each failure doubles it up to [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(500);
const RETRY_MAX: Duration = Duration::from_secs(30);

/// The cleanup thread takes at most one [`SHARE`]th of a core: after each cleanup it rests
/// `SHARE - 1` times as long as the cleanup took, at most [`REST_MAX`]. The kernel walks its
/// whole conntrack hash for every dump, locking each bucket: about 10 ms at a table of
/// 262,144 buckets, empty or not, during which it holds a core. Under 100 endpoint changes
/// a second, cleanups that followed the changes closely took a fifth of a core, and the
/// changes that met a walk made the p99 (9 ms); a cleanup at most every second, as
/// kube-proxy's default `--min-sync-period` spaces its own, leaves few changes to meet
/// one. The first change after a quiet time is cleaned at once.
const SHARE: u32 = 100;

/// The longest rest: under a storm a stale flow waits at most this long (plus a cleanup)
/// for the next pass.
const REST_MAX: Duration = Duration::from_secs(1);

/// The rest after a cleanup that took `took`.
fn rest_after(took: Duration) -> Duration {
    (took * (SHARE - 1)).min(REST_MAX)
}

/// Counters of the cleaner.
#[derive(Debug)]
pub struct CleanerStats {
    /// Stale flows removed.
    pub deleted: AtomicU64,
    /// Stale IPv6 flows removed (among `deleted`).
    pub deleted_v6: AtomicU64,
    /// Seconds each cleanup took (kube-proxy's buckets: 1 ms to about 16 s).
    pub durations: prometheus_client::metrics::histogram::Histogram,
    /// Cleanups that failed (and are retried).
    pub failures: AtomicU64,
}

impl Default for CleanerStats {
    fn default() -> Self {
        use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
        CleanerStats {
            deleted: AtomicU64::new(0),
            deleted_v6: AtomicU64::new(0),
            durations: Histogram::new(exponential_buckets(0.001, 2.0, 15)),
            failures: AtomicU64::new(0),
        }
    }
}

/// A destination whose endpoints changed: `required` when an entry towards it may have
/// gone stale; otherwise it only updates a check still pending from a failed cleanup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Update {
    pub(super) serving: Serving,
    pub(super) required: bool,
}

/// What the cleanup thread is handed.
enum Work {
    /// Destinations to check, and where NodePorts are accepted.
    Check(BTreeMap<UdpTarget, Update>, NodePortAddresses),
    /// Retry what is pending now.
    Retry,
}

/// Removes the stale UDP flows of the services each change set touched.
pub struct FlowCleaner {
    /// The backend's name: `conntrack`, `ebpf-sockets`.
    name: &'static str,
    /// The table, until the cleanup thread takes it.
    table: Option<Box<dyn FlowTable>>,
    /// The UDP destinations each service had at its last change, with their endpoints.
    targets: HashMap<ServiceKey, Vec<UdpCheck>>,
    /// Updates collected from the change set being applied.
    pub(super) outbox: BTreeMap<UdpTarget, Update>,
    nodeports: NodePortAddresses,
    worker: Option<(Sender<Work>, std::thread::JoinHandle<()>)>,
    stats: Arc<CleanerStats>,
}

impl Default for FlowCleaner {
    fn default() -> Self {
        Self::conntrack()
    }
}

impl FlowCleaner {
    /// The cleaner of UDP conntrack entries; its thread and netlink socket start with the
    /// first cleanup.
    pub fn conntrack() -> Self {
        Self::new("conntrack", Box::<Ctnetlink>::default())
    }

    /// A cleaner of the flows `table` holds, named `name` (its thread is `kpng-<name>`).
    pub fn new(name: &'static str, table: Box<dyn FlowTable>) -> Self {
        FlowCleaner {
            name,
            table: Some(table),
            targets: HashMap::new(),
            outbox: BTreeMap::new(),
            nodeports: NodePortAddresses::default(),
            worker: None,
            stats: Arc::default(),
        }
    }

    /// The cleaner's counters.
    pub fn stats(&self) -> Arc<CleanerStats> {
        self.stats.clone()
    }

    /// The checks a change set calls for: every service's at a reset; otherwise those of
    /// the touched services where an entry may have gone stale: a destination that went away
    /// (checked with no endpoint at all), one that an endpoint stopped serving, one that had
    /// no endpoint before (entries made before its rules). Endpoints that only joined leave
    /// every entry valid and cost no dump.
    pub(super) fn collect(&mut self, changes: &ChangeSet<'_>) {
        let state = changes.state;
        if changes.is_reset() {
            // Every service of the state, then those gone since the last change set, without
            // a list of every key beside the state.
            let mut before = std::mem::take(&mut self.targets);
            for service in state.services() {
                let key = &service.service.key;
                let old = before.remove(key).unwrap_or_default();
                self.review(key, udp_checks(&service), old, true);
            }
            for (key, old) in before {
                self.review(&key, Vec::new(), old, true);
            }
        } else {
            for key in changes.touched().0 {
                let checks = state.service(&key).map(|s| udp_checks(&s)).unwrap_or_default();
                let old = self.targets.remove(&key).unwrap_or_default();
                self.review(&key, checks, old, false);
            }
        }
        if let Some(node) = state.node() {
            self.nodeports = node.nodeport_addresses.clone();
        }
    }

    /// Files the updates that service `key`'s new `checks` call for against those it had
    /// `before` (all of them at a reset), and keeps the new ones.
    fn review(
        &mut self,
        key: &ServiceKey,
        checks: Vec<UdpCheck>,
        before: Vec<UdpCheck>,
        reset: bool,
    ) {
        for gone in before.iter().filter(|b| !checks.iter().any(|c| c.target == b.target)) {
            let update = Update { serving: Serving::default(), required: true };
            self.outbox.insert(gone.target, update);
        }
        for check in &checks {
            let previous = before.iter().find(|b| b.target == check.target);
            if !reset && previous.is_some_and(|p| p.serving == check.serving) {
                continue;
            }
            let required = reset
                || previous
                    .is_none_or(|p| p.serving.is_empty() || !p.serving.is_subset(&check.serving));
            let update = Update { serving: check.serving.clone(), required };
            self.outbox.insert(check.target, update);
        }
        if !checks.is_empty() {
            self.targets.insert(key.clone(), checks);
        }
    }

    /// Hands the collected updates to the cleanup thread (started at the first).
    /// A thread that cannot start (the process is out of threads or memory) is logged;
    /// the next cleanup tries again.
    fn send(&mut self, work: Work) {
        if self.worker.is_none() {
            let Some(table) = self.table.take() else { return };
            let (sender, receiver) = std::sync::mpsc::channel();
            let stats = self.stats.clone();
            let (table_back, returned) = std::sync::mpsc::channel();
            let spawned =
                std::thread::Builder::new().name(format!("kpng-{}", self.name)).spawn(move || {
                    if let Ok(table) = returned.recv() {
                        Cleanup::new(table, stats).run(receiver);
                    }
                });
            match spawned {
                Ok(thread) => {
                    let _ = table_back.send(table);
                    self.worker = Some((sender, thread));
                }
                Err(error) => {
                    self.table = Some(table);
                    tracing::warn!(%error, cleaner = self.name, "UDP flow cleanup: cannot start its thread; stale flows stay until the next change");
                    return;
                }
            }
        }
        if let Some((sender, _)) = &self.worker {
            // The thread only ends when the sender is dropped.
            let _ = sender.send(work);
        }
    }
}

impl Drop for FlowCleaner {
    /// Lets the thread finish what it was handed (a `--once` run exits right after).
    fn drop(&mut self) {
        if let Some((sender, thread)) = self.worker.take() {
            drop(sender);
            let _ = thread.join();
        }
    }
}

/// The cleanup thread's state.
struct Cleanup {
    table: Box<dyn FlowTable>,
    /// Checks not done yet, by destination.
    pending: BTreeMap<UdpTarget, Serving>,
    nodeports: NodePortAddresses,
    stats: Arc<CleanerStats>,
}

impl Cleanup {
    fn new(table: Box<dyn FlowTable>, stats: Arc<CleanerStats>) -> Self {
        Cleanup { table, pending: BTreeMap::new(), nodeports: NodePortAddresses::default(), stats }
    }

    fn merge(&mut self, work: Work) {
        if let Work::Check(updates, nodeports) = work {
            for (target, update) in updates {
                if update.required || self.pending.contains_key(&target) {
                    self.pending.insert(target, update.serving);
                }
            }
            self.nodeports = nodeports;
        }
    }

    /// Cleans what arrives until the cleaner is dropped, then what is left, once.
    fn run(mut self, work: Receiver<Work>) {
        // The wait before the next retry, and the one after it.
        let (mut retry, mut delay) = (RETRY_FIRST, RETRY_FIRST);
        loop {
            let next = if self.pending.is_empty() {
                work.recv().map_err(|_| RecvTimeoutError::Disconnected)
            } else {
                work.recv_timeout(retry)
            };
            let open = match next {
                Ok(w) => {
                    self.merge(w);
                    true
                }
                Err(RecvTimeoutError::Timeout) => true,
                Err(RecvTimeoutError::Disconnected) => false,
            };
            while let Ok(w) = work.try_recv() {
                self.merge(w);
            }
            let started = std::time::Instant::now();
            if self.clean() {
                delay = RETRY_FIRST;
            } else {
                retry = delay;
                delay = (delay * 2).min(RETRY_MAX);
            }
            if !open {
                return;
            }
            // What arrives meanwhile is cleaned in one pass after the rest.
            std::thread::sleep(rest_after(started.elapsed()));
        }
    }

    /// Runs the pending checks; on failure they stay pending. True when none is left.
    fn clean(&mut self) -> bool {
        if self.pending.is_empty() {
            return true;
        }
        let checks: Vec<UdpCheck> = self
            .pending
            .iter()
            .map(|(target, serving)| UdpCheck { target: *target, serving: serving.clone() })
            .collect();
        let started = std::time::Instant::now();
        let result = self.delete_stale(&checks);
        self.stats.durations.observe(started.elapsed().as_secs_f64());
        match result {
            Ok(removed) => {
                let deleted = removed.total();
                self.stats.deleted_v6.fetch_add(removed.v6 as u64, Ordering::Relaxed);
                self.pending.clear();
                if deleted > 0 {
                    self.stats.deleted.fetch_add(deleted as u64, Ordering::Relaxed);
                    tracing::info!(count = deleted, "removed stale {}", self.table.flows());
                }
                true
            }
            Err(error) => {
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %kpng_backend::error_chain(&*error), pending = self.pending.len(), "removing stale {} failed; it will be retried", self.table.flows());
                false
            }
        }
    }

    fn delete_stale(&mut self, checks: &[UdpCheck]) -> Result<super::Removed, super::FlowError> {
        let mut addresses = self.nodeports.addresses.clone();
        let all = self.nodeports.all_local;
        if all.v4 || all.v6 {
            addresses.extend(
                self.table
                    .local_addresses()?
                    .into_iter()
                    .filter(|ip| !ip.is_loopback() && *all.get(Family::of(ip))),
            );
        }
        self.table.remove_stale(checks, &addresses)
    }
}

impl Backend for FlowCleaner {
    fn name(&self) -> &'static str {
        self.name
    }

    fn follows_dataplane(&self) -> bool {
        true
    }

    /// Never fails: a cleanup that cannot run now is retried later, and the dataplane's
    /// rules are in force either way.
    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        self.collect(changes);
        if !self.outbox.is_empty() {
            let updates = std::mem::take(&mut self.outbox);
            self.send(Work::Check(updates, self.nodeports.clone()));
        }
        Ok(())
    }

    fn verify(&mut self) -> Result<bool, BackendError> {
        if self.worker.is_some() {
            self.send(Work::Retry);
        }
        Ok(true)
    }
}

/// A cleaner's counters as Prometheus metrics: a name and help for flows removed, and for
/// cleanups that failed.
#[derive(Debug)]
pub struct CleanerMetrics {
    stats: Arc<CleanerStats>,
    removed: (&'static str, &'static str),
    failures: (&'static str, &'static str),
    /// Also kube-proxy's conntrack reconciler series (its dashboards read them).
    kube_proxy: bool,
}

impl CleanerMetrics {
    /// The conntrack cleaner's metrics.
    pub fn conntrack(stats: Arc<CleanerStats>) -> Self {
        CleanerMetrics {
            stats,
            removed: ("kpng_conntrack_entries_deleted", "Stale UDP conntrack entries deleted."),
            failures: (
                "kpng_conntrack_cleanup_failures",
                "UDP conntrack cleanups that failed (they are retried).",
            ),
            kube_proxy: true,
        }
    }

    /// Metrics named and explained as given.
    pub fn new(
        stats: Arc<CleanerStats>,
        removed: (&'static str, &'static str),
        failures: (&'static str, &'static str),
    ) -> Self {
        CleanerMetrics { stats, removed, failures, kube_proxy: false }
    }
}

impl prometheus_client::collector::Collector for CleanerMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let counters = [
            (self.removed.0, self.removed.1, &self.stats.deleted),
            (self.failures.0, self.failures.1, &self.stats.failures),
        ];
        kpng_backend::metrics::encode_counters(&mut encoder, &counters)?;
        if self.kube_proxy {
            kpng_backend::metrics::encode_per_family(
                &mut encoder,
                "kubeproxy_conntrack_reconciler_sync_duration_seconds",
                "Time a UDP conntrack cleanup took (it covers both families).",
                &self.stats.durations,
            )?;
            let v6 = self.stats.deleted_v6.load(Ordering::Relaxed);
            let v4 = self.stats.deleted.load(Ordering::Relaxed).saturating_sub(v6);
            kpng_backend::metrics::encode_counter_family(
                &mut encoder,
                "kubeproxy_conntrack_reconciler_deleted_entries",
                "Stale UDP conntrack entries deleted.",
                "ip_family",
                kpng_backend::metrics::IP_FAMILIES.into_iter().zip([v4, v6]),
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests;
