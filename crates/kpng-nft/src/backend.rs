//! [`NftBackend`]: turns change sets into one kernel transaction each.

use std::collections::{BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ipnet::IpNet;
use kpng_backend::{Backend, BackendError, ChangeSet};
use kpng_model::{Item, ItemRef, Op, ServiceKey};

use crate::affinity::{AffinityGroup, AffinityOp};
use crate::conntrack::{UdpCheck, UdpTarget, udp_checks};
use crate::objects::{ElementId, Value};
use crate::render::{
    NodeFacts, NodePortAddresses, Slots, local_pods, render_node, render_service, seed_slots,
};
use crate::skeleton::SkeletonOptions;
use crate::state::{KERNEL_OWNER, Ladder, NODE_OWNER, Owner, TableDiff, TableState};

/// Configuration of the nftables backend.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NftOptions {
    /// Static rule options (masquerade-all, mark bit); the detector is filled in from
    /// `cluster_cidrs` or the node.
    pub skeleton: SkeletonOptions,
    /// Where NodePorts are accepted.
    pub nodeport_addresses: NodePortAddresses,
    /// `--cluster-cidr`: the local-traffic detector; empty means the node's pod CIDRs.
    pub cluster_cidrs: Vec<IpNet>,
}

/// Counters of the nftables backend, shared with whoever reports them (metrics).
#[derive(Debug)]
pub struct NftStats {
    /// Transactions committed.
    pub transactions: std::sync::atomic::AtomicU64,
    /// Transactions the kernel refused.
    pub transaction_failures: std::sync::atomic::AtomicU64,
    /// Elements added, over all transactions.
    pub elements_added: std::sync::atomic::AtomicU64,
    /// Elements deleted, over all transactions.
    pub elements_deleted: std::sync::atomic::AtomicU64,
    /// Stale UDP conntrack entries deleted.
    pub conntrack_deleted: std::sync::atomic::AtomicU64,
    /// UDP conntrack cleanups that failed.
    pub conntrack_failures: std::sync::atomic::AtomicU64,
    /// Seconds the kernel took to commit each transaction.
    pub commit_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Elements per committed transaction.
    pub transaction_elements: prometheus_client::metrics::histogram::Histogram,
}

impl Default for NftStats {
    fn default() -> Self {
        use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
        NftStats {
            transactions: Default::default(),
            transaction_failures: Default::default(),
            elements_added: Default::default(),
            elements_deleted: Default::default(),
            conntrack_deleted: Default::default(),
            conntrack_failures: Default::default(),
            // 10 µs to about 1.3 s.
            commit_seconds: Histogram::new(exponential_buckets(0.00001, 2.0, 18)),
            // 1 to about 260,000 elements.
            transaction_elements: Histogram::new(exponential_buckets(1.0, 4.0, 10)),
        }
    }
}

/// Where transactions go: the kernel, or a printer for `--dry-run`, or a test fake.
pub trait Kernel: Send {
    /// Installs (or refreshes) the static skeleton.
    fn load_skeleton(&mut self, options: &SkeletonOptions) -> Result<(), BackendError>;
    /// Applies one transaction atomically. On error nothing of it is in force.
    fn commit(&mut self, diff: &TableDiff) -> Result<(), BackendError>;
    /// The local addresses of the node (for `--nodeport-addresses` CIDRs).
    fn local_addresses(&mut self) -> Vec<IpAddr> {
        Vec::new()
    }
    /// Deletes the stale UDP conntrack entries of `checks` (see [`crate::conntrack`]) and
    /// returns how many went.
    fn clear_udp(
        &mut self,
        checks: &[UdpCheck],
        nodeport_addrs: &[IpAddr],
    ) -> Result<usize, BackendError> {
        let _ = (checks, nodeport_addrs);
        Ok(0)
    }
    /// Removes kpng's tables (to rebuild them from nothing after they were damaged).
    fn drop_tables(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
    /// What kpng's tables hold now (elements, count sets, affinity groups), when the kernel can say;
    /// `None` when it cannot (a dry run starts from nothing).
    fn current(&mut self) -> Result<Option<KernelContents>, BackendError> {
        Ok(None)
    }
}

/// The new elements (and slots) of one owner.
struct OwnerUpdate {
    owner: Owner,
    elements: Vec<(ElementId, Value)>,
    /// `None` for the node, which has no slots.
    slots: Option<Slots>,
    /// The service's UDP destinations and their endpoints now (`None` for the node).
    udp: Option<Vec<UdpCheck>>,
    /// The service this owner stood for, when it no longer exists.
    gone: Option<ServiceKey>,
    /// The service's ClientIP affinity groups (`None` for the node).
    affinity: Option<Vec<AffinityGroup>>,
}

/// What the kernel holds of kpng's tables.
#[derive(Debug, Clone, Default)]
pub struct KernelContents {
    /// Every element of kpng's sets and maps.
    pub elements: Vec<(ElementId, Value)>,
    /// The count sets (with their pick rules).
    pub ladders: BTreeSet<Ladder>,
    /// Affinity groups: family, hash, number of slots, timeout (seconds).
    pub affinity: Vec<(kpng_model::Family, u64, usize, u32)>,
    /// Rules in kpng's table of each family (none once someone flushed it).
    pub rules: Vec<(kpng_model::Family, usize)>,
}

/// The nftables backend.
pub struct NftBackend {
    options: NftOptions,
    kernel: Box<dyn Kernel>,
    state: TableState,
    /// The skeleton options last loaded into the kernel.
    loaded_skeleton: Option<SkeletonOptions>,
    /// The count sets (and pick rules) that exist in the kernel. They are kept once made:
    /// an endpoint count that comes back reuses them.
    ladders: BTreeSet<Ladder>,
    owners: HashMap<ServiceKey, Owner>,
    next_owner: Owner,
    slots: HashMap<Owner, Slots>,
    /// The UDP destinations each service had at its last commit.
    udp: HashMap<Owner, Vec<UdpTarget>>,
    /// The affinity groups each service has in the kernel.
    groups: HashMap<Owner, Vec<AffinityGroup>>,
    /// Affinity groups found in the kernel at a reset and not yet claimed.
    kernel_groups: HashMap<u64, AffinityGroup>,
    /// A verification found rules or count sets missing: the next reset rebuilds the
    /// tables from nothing instead of adopting what is left of them.
    rebuild: bool,
    stats: Arc<NftStats>,
}

impl NftBackend {
    /// The backend's counters.
    pub fn stats(&self) -> Arc<NftStats> {
        self.stats.clone()
    }

    /// A backend sending its transactions to `kernel`.
    pub fn new(options: NftOptions, kernel: Box<dyn Kernel>) -> Self {
        NftBackend {
            options,
            kernel,
            state: TableState::new(),
            loaded_skeleton: None,
            ladders: BTreeSet::new(),
            owners: HashMap::new(),
            next_owner: NODE_OWNER + 1,
            slots: HashMap::new(),
            udp: HashMap::new(),
            groups: HashMap::new(),
            kernel_groups: HashMap::new(),
            rebuild: false,
            stats: Arc::default(),
        }
    }

    /// The elements currently committed.
    pub fn state(&self) -> &TableState {
        &self.state
    }

    /// The count sets (each with one pick rule) that exist in the kernel.
    pub fn ladders(&self) -> &BTreeSet<Ladder> {
        &self.ladders
    }

    fn owner(&mut self, key: &ServiceKey) -> Owner {
        if let Some(owner) = self.owners.get(key) {
            return *owner;
        }
        let owner = self.next_owner;
        self.next_owner += 1;
        self.owners.insert(key.clone(), owner);
        owner
    }

    /// The owners whose elements a change set may change, with their new elements.
    fn render(&mut self, changes: &ChangeSet<'_>) -> Vec<OwnerUpdate> {
        let state = changes.state;
        let node_facts = NodeFacts::from_node(state.node.as_ref());
        let mut keys: Vec<ServiceKey> = Vec::new();
        let mut node_changed = changes.is_reset();
        // A reset renders every service below: its ops need not be read.
        let ops = if node_changed { None } else { Some(changes.ops()) };
        for op in ops.into_iter().flatten() {
            match &*op {
                Op::Set(Item::Node(_)) | Op::Delete(ItemRef::Node) => node_changed = true,
                Op::Set(Item::Service(s)) => keys.push(s.key.clone()),
                Op::Set(Item::Endpoint { service, .. }) => keys.push(service.clone()),
                Op::Delete(ItemRef::Service(k))
                | Op::Delete(ItemRef::Endpoint { service: k, .. }) => keys.push(k.clone()),
                Op::Reset | Op::Sync => {}
            }
        }
        if node_changed {
            // Node IPs shape firewall elements: render every service again.
            keys = state.services.keys().cloned().collect();
            if changes.is_reset() {
                keys.extend(self.owners.keys().cloned());
            }
        }
        keys.sort();
        keys.dedup();
        let mut updates = Vec::new();
        if node_changed {
            let addrs = match self.options.nodeport_addresses {
                NodePortAddresses::Primary => Vec::new(),
                NodePortAddresses::Cidrs(_) => self.kernel.local_addresses(),
            };
            let elements =
                render_node(state.node.as_ref(), &self.options.nodeport_addresses, &addrs);
            updates.push(OwnerUpdate {
                owner: NODE_OWNER,
                elements,
                slots: None,
                udp: None,
                gone: None,
                affinity: None,
            });
        }
        for key in keys {
            let owner = self.owner(&key);
            match state.services.get(&key) {
                Some(service) => {
                    let previous = match self.slots.get(&owner) {
                        Some(slots) => slots.clone(),
                        None => seed_slots(service, |id| self.state.get(id).copied()),
                    };
                    let rendered = render_service(service, &node_facts, &previous);
                    updates.push(OwnerUpdate {
                        owner,
                        elements: rendered.elements,
                        slots: Some(rendered.slots),
                        udp: Some(udp_checks(service)),
                        gone: None,
                        affinity: Some(rendered.affinity),
                    });
                }
                None => updates.push(OwnerUpdate {
                    owner,
                    elements: Vec::new(),
                    slots: Some(Slots::new()),
                    udp: Some(Vec::new()),
                    gone: Some(key),
                    affinity: Some(Vec::new()),
                }),
            }
        }
        updates
    }
}

impl Backend for NftBackend {
    fn name(&self) -> &'static str {
        "to-nft"
    }

    /// Reads kpng's tables back (one dump per set, only at this check) and compares them
    /// with what was committed: every element, every count set, and the rules being there.
    fn verify(&mut self) -> Result<bool, BackendError> {
        if self.loaded_skeleton.is_none() {
            return Ok(true);
        }
        let contents = match self.kernel.current() {
            Ok(Some(contents)) => contents,
            Ok(None) => return Ok(true),
            Err(error) => {
                tracing::warn!(error = %kpng_backend::error_chain(&error), "nftables: kpng's tables cannot be read back");
                return Ok(false);
            }
        };
        let mut held = contents.elements;
        held.sort_unstable();
        let mut committed: Vec<(ElementId, Value)> =
            self.state.iter().map(|(id, value)| (*id, *value)).collect();
        committed.sort_unstable();
        let elements = held == committed;
        let ladders = self.ladders.is_subset(&contents.ladders);
        let rules = contents.rules.iter().all(|(_, n)| *n > 0);
        self.rebuild = !(ladders && rules);
        if !(elements && ladders && rules) {
            tracing::warn!(
                elements_held = held.len(),
                elements_committed = committed.len(),
                count_sets_missing = !ladders,
                rules = ?contents.rules,
                "nftables: the kernel no longer holds what kpng committed"
            );
        }
        Ok(elements && ladders && rules)
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        let start = std::time::Instant::now();
        if changes.is_reset() && self.rebuild {
            tracing::warn!("nftables: rebuilding kpng's tables from nothing");
            self.kernel.drop_tables()?;
            self.loaded_skeleton = None;
            self.state = TableState::new();
            self.ladders.clear();
            self.owners.clear();
            self.slots.clear();
            self.udp.clear();
            self.groups.clear();
            self.kernel_groups.clear();
            self.rebuild = false;
        }
        self.load_skeleton(changes)?;
        let skeleton = start.elapsed();
        if changes.is_reset() {
            // Start from what the kernel holds, so that a restart changes only what differs.
            if let Some(contents) = self.kernel.current()? {
                self.state = TableState::adopt(contents.elements);
                self.ladders = contents.ladders;
                self.groups.clear();
                // Groups found in the kernel: their endpoints are unknown, so the first
                // commit rewrites (or removes) them.
                self.kernel_groups = contents
                    .affinity
                    .into_iter()
                    .map(|(family, hash, slots, timeout)| {
                        let unknown = (std::net::IpAddr::from([0, 0, 0, 0]), 0);
                        let group = AffinityGroup {
                            hash,
                            family,
                            protocol: kpng_model::Protocol::Tcp,
                            timeout,
                            slots: vec![unknown; slots],
                        };
                        (hash, group)
                    })
                    .collect();
                self.owners.clear();
                self.slots.clear();
                self.udp.clear();
            }
        }
        let read = start.elapsed();
        let mut updates = self.render(changes);
        let rendered = start.elapsed();
        if changes.is_reset() {
            updates.push(OwnerUpdate {
                owner: KERNEL_OWNER,
                elements: Vec::new(),
                slots: None,
                udp: None,
                gone: None,
                affinity: None,
            });
        }
        let committed = self.commit(&mut updates)?;
        let done = start.elapsed();
        if !committed && changes.is_reset() {
            tracing::info!(
                elements = self.state.len(),
                "nftables: the kernel already holds this state"
            );
        }
        self.forget_gone(&updates);
        // Stale UDP flows: after every change, and at a reset even when the table was
        // already right (entries may predate the rules).
        if committed || changes.is_reset() {
            self.clean_conntrack(updates);
        } else {
            self.remember(updates);
        }
        tracing::debug!(
            skeleton = ?skeleton,
            read = ?(read - skeleton),
            render = ?(rendered - read),
            commit = ?(done - rendered),
            conntrack = ?(start.elapsed() - done),
            "nftables sync timings"
        );
        Ok(())
    }
}

impl NftBackend {
    /// Loads the static skeleton at a reset, or when the local-pod detector changed.
    fn load_skeleton(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        let skeleton = SkeletonOptions {
            local_pods: local_pods(changes.state.node.as_ref(), &self.options.cluster_cidrs),
            ..self.options.skeleton.clone()
        };
        if changes.is_reset() || self.loaded_skeleton.as_ref() != Some(&skeleton) {
            self.kernel.load_skeleton(&skeleton)?;
            self.loaded_skeleton = Some(skeleton);
        }
        Ok(())
    }

    /// Commits what `updates` change, if anything. On failure the state is rolled back.
    fn commit(&mut self, updates: &mut [OwnerUpdate]) -> Result<bool, BackendError> {
        let previous: Vec<(Owner, Vec<(ElementId, Value)>)> =
            updates.iter().map(|u| (u.owner, self.state.owned(u.owner).collect())).collect();
        let mut diff = self.state.update(
            updates.iter_mut().map(|u| (u.owner, std::mem::take(&mut u.elements))).collect(),
        );
        diff.new_ladders = diff.ladders_used().filter(|l| !self.ladders.contains(l)).collect();
        let mut unclaimed = self.kernel_groups.clone();
        (diff.affinity_before, diff.affinity_after) = self.affinity_ops(updates, &mut unclaimed);
        if diff.is_empty() {
            tracing::debug!(elements = self.state.len(), "nftables: nothing to change");
            return Ok(false);
        }
        let kernel_start = std::time::Instant::now();
        let result = self.kernel.commit(&diff);
        let took = kernel_start.elapsed();
        tracing::debug!(kernel = ?took, "nftables commit");
        if let Err(e) = result {
            // Nothing of the transaction is in force: forget it.
            self.stats.transaction_failures.fetch_add(1, Ordering::Relaxed);
            self.state.update(previous);
            return Err(e);
        }
        self.stats.transactions.fetch_add(1, Ordering::Relaxed);
        self.stats.elements_added.fetch_add(diff.adds.len() as u64, Ordering::Relaxed);
        self.stats.elements_deleted.fetch_add(diff.deletes.len() as u64, Ordering::Relaxed);
        self.stats.commit_seconds.observe(took.as_secs_f64());
        self.stats.transaction_elements.observe((diff.adds.len() + diff.deletes.len()) as f64);
        self.ladders.extend(diff.new_ladders.iter().copied());
        self.kernel_groups.clear();
        for update in updates {
            if let Some(groups) = &update.affinity {
                match groups.is_empty() {
                    true => self.groups.remove(&update.owner),
                    false => self.groups.insert(update.owner, groups.clone()),
                };
            }
        }
        tracing::info!(
            added = diff.adds.len(),
            deleted = diff.deletes.len(),
            new_count_sets = diff.new_ladders.len(),
            "nftables transaction committed"
        );
        Ok(true)
    }

    /// What `updates` do to affinity groups: creations and rewrites (before elements
    /// point at them) and removals (after). Groups found in the kernel at a reset and
    /// still unclaimed when `updates` is a full reset are removed.
    fn affinity_ops(
        &self,
        updates: &[OwnerUpdate],
        unclaimed: &mut HashMap<u64, AffinityGroup>,
    ) -> (Vec<AffinityOp>, Vec<AffinityOp>) {
        let (mut before, mut after) = (Vec::new(), Vec::new());
        for update in updates {
            let Some(new) = &update.affinity else { continue };
            let old = self.groups.get(&update.owner).map(Vec::as_slice).unwrap_or_default();
            for group in new {
                let known = old
                    .iter()
                    .find(|g| g.hash == group.hash)
                    .cloned()
                    .or_else(|| unclaimed.remove(&group.hash));
                match known {
                    None => before.push(AffinityOp::Create(group.clone())),
                    Some(old) if old != *group => {
                        before.push(AffinityOp::Replace { old, new: group.clone() })
                    }
                    Some(_) => {}
                }
            }
            for group in old.iter().filter(|g| !new.iter().any(|n| n.hash == g.hash)) {
                after.push(AffinityOp::Remove(group.clone()));
            }
        }
        if updates.iter().any(|u| u.owner == KERNEL_OWNER) {
            after.extend(unclaimed.drain().map(|(_, g)| AffinityOp::Remove(g)));
        }
        (before, after)
    }

    /// Drops the bookkeeping of the services an update removed.
    fn forget_gone(&mut self, updates: &[OwnerUpdate]) {
        for key in updates.iter().filter_map(|u| u.gone.as_ref()) {
            if let Some(owner) = self.owners.remove(key) {
                self.slots.remove(&owner);
            }
        }
    }

    /// Keeps the slots and UDP destinations of a committed update.
    fn remember(&mut self, updates: Vec<OwnerUpdate>) -> Vec<UdpCheck> {
        let mut checks = Vec::new();
        for OwnerUpdate { owner, slots, udp, .. } in updates {
            match slots {
                Some(s) if s.is_empty() => {
                    self.slots.remove(&owner);
                }
                Some(s) => {
                    self.slots.insert(owner, s);
                }
                None => {}
            }
            let Some(now) = udp else { continue };
            let before = self.udp.remove(&owner).unwrap_or_default();
            // Destinations that went away are checked with no endpoint at all.
            for target in before.into_iter().filter(|t| !now.iter().any(|(n, _)| n == t)) {
                checks.push((target, Default::default()));
            }
            if !now.is_empty() {
                self.udp.insert(owner, now.iter().map(|(t, _)| *t).collect());
            }
            checks.extend(now);
        }
        checks
    }

    /// Deletes stale UDP conntrack entries of the updated services. A failure is logged:
    /// the rules are in force, and the next change retries.
    fn clean_conntrack(&mut self, updates: Vec<OwnerUpdate>) {
        let checks = self.remember(updates);
        if checks.is_empty() {
            return;
        }
        let nodeport_addrs: Vec<IpAddr> = self
            .state
            .owned(NODE_OWNER)
            .filter_map(|(id, _)| match id.key {
                crate::objects::Key::Addr(ip)
                    if id.map == crate::objects::MapName::NodePortAddrs =>
                {
                    Some(ip)
                }
                _ => None,
            })
            .collect();
        match self.kernel.clear_udp(&checks, &nodeport_addrs) {
            Ok(0) => {}
            Ok(n) => {
                self.stats.conntrack_deleted.fetch_add(n as u64, Ordering::Relaxed);
                tracing::info!(entries = n, "deleted stale UDP conntrack entries")
            }
            Err(e) => {
                self.stats.conntrack_failures.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(error = %kpng_backend::error_chain(&e), "UDP conntrack cleanup failed")
            }
        }
    }
}

/// The nftables backend's counters as Prometheus metrics.
#[derive(Debug)]
pub struct NftMetrics(pub Arc<NftStats>);

impl prometheus_client::collector::Collector for NftMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
        let stats = &self.0;
        let counters = [
            ("kpng_nft_transactions", "nftables transactions committed.", &stats.transactions),
            (
                "kpng_nft_transaction_failures",
                "nftables transactions the kernel refused.",
                &stats.transaction_failures,
            ),
            ("kpng_nft_elements_added", "Set and map elements added.", &stats.elements_added),
            ("kpng_nft_elements_deleted", "Set and map elements deleted.", &stats.elements_deleted),
            (
                "kpng_conntrack_entries_deleted",
                "Stale UDP conntrack entries deleted.",
                &stats.conntrack_deleted,
            ),
            (
                "kpng_conntrack_cleanup_failures",
                "UDP conntrack cleanups that failed.",
                &stats.conntrack_failures,
            ),
        ];
        for (name, help, value) in counters {
            let metric = ConstCounter::new(value.load(Ordering::Relaxed));
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        let histograms = [
            (
                "kpng_nft_commit_duration_seconds",
                "Time the kernel took to commit one transaction.",
                &stats.commit_seconds,
            ),
            (
                "kpng_nft_transaction_elements",
                "Elements added or deleted per transaction.",
                &stats.transaction_elements,
            ),
        ];
        for (name, help, histogram) in histograms {
            histogram.encode(encoder.encode_descriptor(
                name,
                help,
                None,
                histogram.metric_type(),
            )?)?;
        }
        Ok(())
    }
}
