//! [`EbpfBackend`]: the eBPF dataplane as an instance of kpng's backend template
//! ([`kpng_backend::reconcile`]): [`EbpfRender`] turns a service into map elements,
//! [`EbpfKernel`] writes them through a [`Dataplane`] one element at a time in the order
//! that keeps every reader consistent ([`Unit::Write`]), growing the maps when they no
//! longer fit. The change loop, resets, verification and counters are the template's.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kpng_backend::Target;
use kpng_backend::reconcile::{
    self, Filed, Kernel, Objects, Plan, Rank, Reconciler, Render, Unit, Wanted,
};
use kpng_model::local::LocalServiceState;
use kpng_model::{NodePortAddresses, NodeState, ServiceKey};

use crate::dataplane::{Batch, Capacities, Dataplane, capacities_for};
use crate::error::EbpfError;
use crate::maps::{Key, MapName, Value};
use crate::render::{Slots, render_service, seed_slots};

/// Counters of the eBPF kernel beyond the template's ([`reconcile::Stats`]).
#[derive(Debug, Default)]
pub struct EbpfStats {
    /// Times the maps were replaced by larger ones.
    pub grows: AtomicU64,
    /// Programs found not running on their cgroup at the last check (detached behind
    /// kpng's back, or their cgroup created again), until attached again.
    pub unattached: AtomicU64,
    /// Programs found not running on their cgroup, over every check.
    pub detachments: AtomicU64,
}

/// The render: a service into map elements. Its NodePort frontends yield to another
/// service's address frontend on the same address and port (as nftables matches NodePorts
/// after every service address).
#[derive(Debug)]
pub struct EbpfRender {
    /// Slots of each service's groups, kept so that positions stay stable.
    slots: HashMap<ServiceKey, Slots>,
    /// How long an unconnected UDP socket's flow keeps its endpoint without sending.
    flow_seconds: u32,
}

impl Default for EbpfRender {
    fn default() -> Self {
        EbpfRender { slots: HashMap::new(), flow_seconds: crate::render::FLOW_SECONDS }
    }
}

impl Filed for Key {}

impl Rank for Key {
    /// Maps in [`MapName::ALL`]'s order: endpoints before the groups that count them,
    /// groups before the frontends that point at them.
    fn rank(&self) -> u8 {
        MapName::ALL.iter().position(|m| *m == self.map()).unwrap_or(0) as u8
    }
}

impl Render for EbpfRender {
    type Key = Key;
    type Value = Value;
    /// Where the node accepts NodePorts: every NodePort frontend moves with it.
    type Facts = NodePortAddresses;
    type Error = std::convert::Infallible; // rendering never fails

    fn facts(&self, state: &dyn NodeState) -> NodePortAddresses {
        state.node().map(|n| n.nodeport_addresses.clone()).unwrap_or_default()
    }

    fn service(
        &mut self,
        nodeports: &NodePortAddresses,
        service: &LocalServiceState,
        held: &dyn kpng_backend::reconcile::Lookup<Key, Value>,
    ) -> Result<Wanted<Key, Value>, std::convert::Infallible> {
        let key = &service.service.key;
        let previous = match self.slots.get(key) {
            Some(slots) => slots.clone(),
            None => seed_slots(service, nodeports, |k| held.lookup(k).map(|v| *v)),
        };
        let rendered = render_service(service, nodeports, &previous, self.flow_seconds);
        self.slots.insert(key.clone(), rendered.slots);
        Ok(Wanted { objects: rendered.elements, yielding: rendered.nodeports })
    }

    fn forget(&mut self, key: &ServiceKey) {
        self.slots.remove(key);
    }

    fn reset(&mut self) {
        self.slots.clear();
    }

    fn unsupported(
        &self,
        lb: &kpng_model::global::LoadBalancing,
    ) -> Vec<(kpng_model::global::AnnotationKey, &'static str)> {
        // None of the kube-nftlb settings has a translation here yet.
        kpng_backend::unsupported::all_settings(lb)
    }
}

/// The kernel: programs and maps behind a [`Dataplane`], written one element at a time,
/// and grown (new maps filled, then programs swapped) when what they must hold no longer
/// fits.
pub struct EbpfKernel {
    dataplane: Box<dyn Dataplane>,
    /// The maps' capacities: as last read back, then as installed or grown.
    capacities: Option<Capacities>,
    /// Elements per map, as last committed: counted whole at a reset, then moved by each
    /// plan (a change must not count the maps).
    counts: BTreeMap<MapName, usize>,
    stats: Arc<EbpfStats>,
}

impl EbpfKernel {
    /// The kernel behind `dataplane`.
    pub fn new(dataplane: Box<dyn Dataplane>) -> Self {
        EbpfKernel { dataplane, capacities: None, counts: BTreeMap::new(), stats: Arc::default() }
    }
}

/// `counts` moved by what `plan` creates and deletes.
fn counted(
    mut counts: BTreeMap<MapName, usize>,
    plan: &Plan<Key, Value>,
) -> BTreeMap<MapName, usize> {
    for (key, _, _) in plan.upserts.iter().filter(|(_, old, _)| old.is_none()) {
        *counts.entry(key.map()).or_default() += 1;
    }
    for (key, _) in &plan.deletes {
        let count = counts.entry(key.map()).or_default();
        *count = count.saturating_sub(1);
    }
    counts
}

/// `counts` of a state after `plan`, taken back to before it.
fn uncounted(
    mut counts: BTreeMap<MapName, usize>,
    plan: &Plan<Key, Value>,
) -> BTreeMap<MapName, usize> {
    for (key, _, _) in plan.upserts.iter().filter(|(_, old, _)| old.is_none()) {
        let count = counts.entry(key.map()).or_default();
        *count = count.saturating_sub(1);
    }
    for (key, _) in &plan.deletes {
        *counts.entry(key.map()).or_default() += 1;
    }
    counts
}

/// Elements per map.
fn counts(elements: &Objects<Key, Value>) -> BTreeMap<MapName, usize> {
    let mut counts = BTreeMap::new();
    for (key, _) in elements.iter() {
        *counts.entry(key.map()).or_default() += 1;
    }
    counts
}

impl Kernel for EbpfKernel {
    type Key = Key;
    type Value = Value;
    type Error = EbpfError;

    const UNIT: Unit = Unit::Write;
    const WHAT: &'static str = "eBPF maps";
    const APPLIED: &'static str = "written";

    fn read(&mut self) -> Result<Option<HashMap<Key, Value>>, EbpfError> {
        let snapshot = self.dataplane.read()?;
        Ok(snapshot.map(|s| {
            self.capacities = Some(s.capacities);
            s.elements
        }))
    }

    fn prepare(
        &mut self,
        plan: &Plan<Key, Value>,
        after: &Objects<Key, Value>,
        installed: bool,
    ) -> Result<(), EbpfError> {
        let counts = counts(after);
        let capacities = match (installed, self.capacities.take()) {
            (true, Some(read)) => read,
            _ => capacities_for(&counts),
        };
        // What the maps hold before the plan, which its commit counts in.
        self.counts = uncounted(counts, plan);
        self.dataplane.install(&capacities)?;
        self.capacities = Some(capacities);
        self.stats.unattached.store(0, Ordering::Relaxed);
        Ok(())
    }

    fn commit(
        &mut self,
        plan: &Plan<Key, Value>,
        after: &Objects<Key, Value>,
    ) -> Result<(), EbpfError> {
        let counts = counted(std::mem::take(&mut self.counts), plan);
        let capacities = self.capacities.clone().unwrap_or_default();
        let full: Vec<MapName> = counts
            .iter()
            .filter(|(map, count)| **count > capacities.get(map).copied().unwrap_or(0) as usize)
            .map(|(map, _)| *map)
            .collect();
        if full.is_empty() {
            let batch = Batch {
                upserts: plan.upserts.iter().map(|(k, _, v)| (*k, *v)).collect(),
                deletes: plan.deletes.iter().map(|(k, _)| *k).collect(),
            };
            self.dataplane.write(&batch)?;
            self.counts = counts;
            return Ok(());
        }
        let grown = capacities_for(&counts);
        tracing::info!(
            maps = ?full.iter().map(|m| m.object_name()).collect::<Vec<_>>(),
            capacities = ?grown.iter().map(|(m, c)| (m.object_name(), *c)).collect::<Vec<_>>(),
            "eBPF: growing maps (new maps filled, then programs swapped)"
        );
        self.dataplane.grow(&grown, &after.to_map())?;
        self.counts = counts;
        self.capacities = Some(grown);
        self.stats.grows.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    fn faults(&mut self) -> Result<Vec<String>, EbpfError> {
        if self.capacities.is_none() {
            return Ok(Vec::new());
        }
        let unattached = self.dataplane.unattached()?;
        self.stats.unattached.store(unattached.len() as u64, Ordering::Relaxed);
        self.stats.detachments.fetch_add(unattached.len() as u64, Ordering::Relaxed);
        if !unattached.is_empty() {
            tracing::warn!(programs = ?unattached, "eBPF: programs detached behind kpng's back: attaching them again");
        }
        Ok(unattached.iter().map(|p| format!("{p} not running on the cgroup")).collect())
    }
}

/// The eBPF backend: one ordered batch of map writes per change set, nothing at all when
/// nothing changed.
pub struct EbpfBackend {
    inner: Reconciler<EbpfRender, EbpfKernel>,
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
        let mut backend = EbpfBackend::new(dataplane);
        backend.inner = backend.inner.with_dry_run(dry_run);
        backend.sockets = sockets;
        Ok(backend)
    }

    /// The connected UDP sockets the programs translate, for the cleanup that destroys
    /// those whose endpoint stopped serving; `None` with `--dry-run`.
    pub fn connected_udp(&self) -> Option<crate::ConnectedUdp> {
        self.sockets.clone()
    }

    /// A backend writing to `dataplane`.
    pub fn new(dataplane: Box<dyn Dataplane>) -> Self {
        let kernel = EbpfKernel::new(dataplane);
        let inner = Reconciler::new(crate::NAME, EbpfRender::default(), kernel);
        EbpfBackend { inner, sockets: None }
    }

    /// Unconnected UDP sockets' flows keep their endpoint until they have not sent for
    /// `timeout` (conntrack's UDP stream timeout on this node; default 120 s).
    pub fn with_udp_flow_timeout(mut self, timeout: std::time::Duration) -> Self {
        let seconds = u32::try_from(timeout.as_secs()).unwrap_or(u32::MAX).max(1);
        self.inner.render_mut().flow_seconds = seconds;
        self
    }

    /// Reports programs found not running on their cgroup to `problems` (which `/readyz`
    /// lists) until they run again.
    pub fn with_problems(mut self, problems: kpng_backend::Problems) -> Self {
        self.inner = self.inner.with_problems(problems);
        self
    }

    /// The template's counters.
    pub fn stats(&self) -> Arc<reconcile::Stats> {
        self.inner.stats()
    }

    /// The eBPF kernel's own counters.
    pub fn ebpf_stats(&self) -> Arc<EbpfStats> {
        self.inner.kernel().stats.clone()
    }

    /// What the maps hold, as far as the backend knows.
    pub fn held(&self) -> &Objects<Key, Value> {
        self.inner.held()
    }

    /// The installed maps' capacities.
    pub fn capacities(&self) -> Option<&Capacities> {
        self.inner.kernel().capacities.as_ref()
    }
}

kpng_backend::delegate_backend!(EbpfBackend, inner);

#[cfg(test)]
mod tests;
