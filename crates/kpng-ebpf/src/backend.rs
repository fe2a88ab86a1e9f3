//! [`EbpfBackend`]: turns change sets into map writes.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use kpng_backend::{Backend, BackendError, ChangeSet, Target};
use kpng_model::{LocalState, NodePortAddresses, ServiceKey};

use crate::dataplane::{Capacities, Dataplane, capacities_for};
use crate::error::EbpfError;
use crate::maps::{Key, MapName, Value};
use crate::render::{Slots, render_service, seed_slots};
use crate::state::{Batch, MapState, Render, Wanted};

/// Counters of the eBPF backend, shared with whoever reports them (metrics, benchmarks).
#[derive(Debug, Default)]
pub struct EbpfStats {
    /// Change sets that wrote something.
    pub updates: AtomicU64,
    /// Element writes (upserts and deletions), growth copies included.
    pub map_writes: AtomicU64,
    /// Times the maps were replaced by larger ones.
    pub grows: AtomicU64,
    /// Failed change sets.
    pub failures: AtomicU64,
    /// Programs found not running on their cgroup at the last check (detached behind
    /// kpng's back, or their cgroup created again), until attached again.
    pub unattached: AtomicU64,
    /// Programs found not running on their cgroup, over every check.
    pub detachments: AtomicU64,
}

/// The eBPF backend: one map-write batch per change set, nothing at all when nothing
/// changed.
pub struct EbpfBackend {
    dataplane: Box<dyn Dataplane>,
    state: MapState,
    /// Slots of each service's groups, kept so that positions stay stable.
    slots: HashMap<ServiceKey, Slots>,
    /// Where the node accepts NodePorts, as its ENLS says.
    nodeports: NodePortAddresses,
    /// The installed maps' capacities, once installed.
    capacities: Option<Capacities>,
    stats: Arc<EbpfStats>,
    /// Where a program found not running on the cgroup is reported until it runs again.
    problems: kpng_backend::Problems,
    /// `--dry-run`: map writes are printed, and the log says so.
    dry_run: bool,
    /// How long an unconnected UDP socket's flow keeps its endpoint without sending.
    flow_seconds: u32,
    /// The connected UDP sockets of the cgroup, when the kernel is the target.
    sockets: Option<crate::ConnectedUdp>,
}

/// What `to-ebpf` is told on the command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EbpfOptions {
    /// The cgroup v2 whose sockets are translated (`None`: the hierarchy's root).
    pub cgroup: Option<std::path::PathBuf>,
    /// Where programs and maps are pinned under bpffs.
    pub pin_root: std::path::PathBuf,
}

impl EbpfBackend {
    /// A backend with `options` that writes to `target`: the kernel's programs and maps
    /// (the machine checked, naming what is missing), or the map writes printed
    /// (`--dry-run`).
    pub fn open(options: EbpfOptions, target: Target) -> Result<Self, EbpfError> {
        let dry_run = target.is_dry_run();
        let mut sockets = None;
        let dataplane: Box<dyn Dataplane> = match target {
            Target::DryRun(out) => Box::new(crate::MemoryDataplane::printing(out)),
            Target::Kernel => {
                let cgroup = match options.cgroup {
                    Some(path) => path,
                    None => crate::support::cgroup2_root()?,
                };
                let options = crate::KernelOptions { cgroup, pin_root: options.pin_root };
                sockets = Some(crate::ConnectedUdp::new(&options));
                Box::new(crate::KernelDataplane::open(options)?)
            }
        };
        Ok(EbpfBackend { dry_run, sockets, ..EbpfBackend::new(dataplane) })
    }

    /// The connected UDP sockets the programs translate, for the cleanup that destroys
    /// those whose endpoint stopped serving; `None` with `--dry-run`.
    pub fn connected_udp(&self) -> Option<crate::ConnectedUdp> {
        self.sockets.clone()
    }

    /// A backend writing to `dataplane`.
    pub fn new(dataplane: Box<dyn Dataplane>) -> Self {
        EbpfBackend {
            dataplane,
            state: MapState::new(),
            slots: HashMap::new(),
            nodeports: NodePortAddresses::default(),
            capacities: None,
            stats: Arc::default(),
            problems: kpng_backend::Problems::default(),
            dry_run: false,
            flow_seconds: crate::render::FLOW_SECONDS,
            sockets: None,
        }
    }

    /// Unconnected UDP sockets' flows keep their endpoint until they have not sent for
    /// `timeout` (conntrack's UDP stream timeout on this node; default 120 s).
    pub fn with_udp_flow_timeout(mut self, timeout: std::time::Duration) -> Self {
        self.flow_seconds = u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX).max(1);
        self
    }

    /// Reports programs found not running on their cgroup to `problems` (which `/readyz`
    /// lists) until they run again.
    pub fn with_problems(mut self, problems: kpng_backend::Problems) -> Self {
        self.problems = problems;
        self
    }

    /// The backend's counters.
    pub fn stats(&self) -> Arc<EbpfStats> {
        self.stats.clone()
    }

    /// What the maps hold, as far as the backend knows.
    pub fn held(&self) -> &HashMap<Key, Value> {
        self.state.held()
    }

    /// The installed maps' capacities.
    pub fn capacities(&self) -> Option<&Capacities> {
        self.capacities.as_ref()
    }

    fn render(
        &mut self,
        state: &LocalState,
        key: &ServiceKey,
        held: Option<&HashMap<Key, Value>>,
    ) -> Render {
        let Some(service) = state.services.get(key) else {
            self.slots.remove(key);
            return (key.clone(), None);
        };
        let previous = match (self.slots.get(key), held) {
            (Some(slots), _) => slots.clone(),
            (None, Some(held)) => seed_slots(service, &self.nodeports, |k| held.get(k).copied()),
            (None, None) => Slots::new(),
        };
        let rendered = render_service(service, &self.nodeports, &previous, self.flow_seconds);
        self.slots.insert(key.clone(), rendered.slots);
        let wanted = Wanted { elements: rendered.elements, yielding: rendered.nodeports };
        (key.clone(), Some(wanted))
    }

    /// A change set from scratch: read the maps back, render everything, write the
    /// difference (growing the maps first when they are too small).
    fn reset(&mut self, state: &LocalState) -> Result<Batch, EbpfError> {
        let snapshot = self.dataplane.read()?;
        let held = snapshot.as_ref().map(|s| s.elements.clone()).unwrap_or_default();
        self.nodeports = nodeports_of(state);
        self.slots.clear();
        let mut keys: Vec<ServiceKey> = state.services.keys().cloned().collect();
        keys.extend(self.state.services().cloned());
        keys.sort();
        keys.dedup();
        let renders = keys.iter().map(|k| self.render(state, k, Some(&held))).collect();
        let batch = self.state.replace_all(held, renders);
        let capacities = match snapshot {
            Some(snapshot) => snapshot.capacities,
            None => capacities_for(&self.state.held_counts()),
        };
        self.dataplane.install(&capacities)?;
        self.problems.clear(crate::NAME);
        self.stats.unattached.store(0, Ordering::Relaxed);
        self.capacities = Some(capacities);
        self.commit(batch)
    }

    /// A change set after others: render the services it touches.
    fn update(&mut self, changes: &ChangeSet<'_>) -> Result<Batch, EbpfError> {
        let state = changes.state;
        let (mut keys, node_changed) = changes.touched();
        let nodeports = nodeports_of(state);
        if node_changed && nodeports != self.nodeports {
            // NodePort frontends of every service move.
            self.nodeports = nodeports;
            keys = state.services.keys().cloned().collect();
            keys.extend(self.state.services().cloned());
            keys.sort();
            keys.dedup();
        }
        let renders = keys.iter().map(|k| self.render(state, k, None)).collect();
        let batch = self.state.update(renders);
        self.commit(batch)
    }

    /// Writes `batch`, or grows the maps when what they must hold no longer fits.
    fn commit(&mut self, batch: Batch) -> Result<Batch, EbpfError> {
        if batch.is_empty() {
            return Ok(batch);
        }
        let counts = self.state.held_counts();
        let capacities = self.capacities.clone().unwrap_or_default();
        let full: Vec<MapName> = counts
            .iter()
            .filter(|(map, count)| **count > capacities.get(map).copied().unwrap_or(0) as usize)
            .map(|(map, _)| *map)
            .collect();
        if full.is_empty() {
            self.dataplane.write(&batch)?;
            self.stats.map_writes.fetch_add(batch.len() as u64, Ordering::Relaxed);
        } else {
            let grown = capacities_for(&counts);
            tracing::info!(
                maps = ?full.iter().map(|m| m.object_name()).collect::<Vec<_>>(),
                capacities = ?grown.iter().map(|(m, c)| (m.object_name(), *c)).collect::<Vec<_>>(),
                "eBPF: growing maps (new maps filled, then programs swapped)"
            );
            self.dataplane.grow(&grown, self.state.held())?;
            self.capacities = Some(grown);
            self.stats.grows.fetch_add(1, Ordering::Relaxed);
            self.stats.map_writes.fetch_add(self.state.held().len() as u64, Ordering::Relaxed);
        }
        self.stats.updates.fetch_add(1, Ordering::Relaxed);
        Ok(batch)
    }
}

/// Where the node accepts NodePorts, from its ENLS (none before the node is known).
fn nodeports_of(state: &LocalState) -> NodePortAddresses {
    state.node.as_ref().map(|n| n.nodeport_addresses.clone()).unwrap_or_default()
}

impl Backend for EbpfBackend {
    fn unsupported(
        &self,
        lb: &kpng_model::global::LoadBalancing,
    ) -> Vec<(kpng_model::global::AnnotationKey, &'static str)> {
        // None of the kube-nftlb settings has a translation here yet.
        kpng_backend::unsupported::all_settings(lb)
    }

    fn name(&self) -> &'static str {
        crate::NAME
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        let start = Instant::now();
        let result = match changes.is_reset() {
            true => self.reset(changes.state),
            false => self.update(changes),
        };
        match result {
            Ok(batch) if batch.is_empty() => {
                tracing::debug!(elements = self.state.held().len(), "eBPF: nothing to change");
                Ok(())
            }
            Ok(batch) => {
                tracing::info!(
                    updated = batch.upserts.len(),
                    deleted = batch.deletes.len(),
                    elements = self.state.held().len(),
                    took = ?start.elapsed(),
                    "eBPF maps {}",
                    kpng_backend::backend::done(self.dry_run, "written")
                );
                Ok(())
            }
            Err(error) => {
                // Some writes may be in: the next change set is a reset, which reads the
                // maps back and writes what differs.
                self.stats.failures.fetch_add(1, Ordering::Relaxed);
                Err(error.into_backend_error())
            }
        }
    }

    fn verify(&mut self) -> Result<bool, BackendError> {
        if self.capacities.is_none() {
            return Ok(true);
        }
        let unattached = self.dataplane.unattached().map_err(EbpfError::into_backend_error)?;
        self.stats.unattached.store(unattached.len() as u64, Ordering::Relaxed);
        if !unattached.is_empty() {
            self.stats.detachments.fetch_add(unattached.len() as u64, Ordering::Relaxed);
            let text = format!(
                "to-ebpf: {} not running on the cgroup (attaching again)",
                unattached.join(", ")
            );
            tracing::warn!(programs = ?unattached, "eBPF: programs detached behind kpng's back: attaching them again");
            self.problems.report(crate::NAME, text);
        }
        let held =
            self.dataplane.verify(self.state.held()).map_err(EbpfError::into_backend_error)?;
        if !held {
            tracing::warn!("eBPF: the maps no longer hold what kpng wrote");
        }
        Ok(held && unattached.is_empty())
    }
}

#[cfg(test)]
mod tests;
