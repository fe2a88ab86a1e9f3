//! [`NftBackend`]: turns change sets into one kernel transaction each (a cold start, over
//! tables without an element: the skeleton, then whole services in transactions of a
//! bounded size; see [`NftOptions::cold_start_transaction`]).
//!
//! The backend is in one of two states ([`TableSync`]). While it does not know what the
//! kernel holds (at start-up, after a failed transaction, after a verification found
//! drift), the next change set reads kpng's tables back and reconciles them with the
//! whole node state in one transaction: a restart over a table that is already right
//! changes nothing, a damaged table is repaired in place, and nothing is ever deleted
//! first. The cluster IPs are read first: when the table holds far more services than the
//! state (at least 256 more, and more than twice as many more), the other element sets
//! are not read but flushed and refilled in the same transaction. In sync, a change set renders only the services it touched and commits their
//! element changes (and, rarely, the layout changes they need) in one transaction.
//!
//! Kept in one file on purpose: the change path and the table-sync state machine that
//! decides it (see [`TableSync`]) read best together; the resync is in `resync`.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use ipnet::IpNet;
use kpng_backend::proxy::LocalDetection;
use kpng_backend::reconcile::KnownGeneration;
use kpng_backend::{Backend, BackendError, ChangeSet, Target};
use kpng_model::global::{AnnotationKey, LoadBalancing, NatMode, Scheduler};
use kpng_model::local::LocalServiceState;
use kpng_model::{Family, LocalNode, ServiceKey};

use crate::error::NftError;
use crate::kernel::Kernel;
use crate::layout::{LargeCount, Layout, groups_wanted};
use crate::objects::{ElementId, MapName, Value};
use crate::plan::Plan;
use crate::reconcile::{Reconciled, Wanted, reconcile};
use crate::render::{NodeFacts, Slots, render_node, render_service, seed_slots};
use crate::skeleton::SkeletonOptions;
use crate::state::{Owner, TableState};
use crate::stats::NftStats;

mod resync;

/// Configuration of the nftables backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftOptions {
    /// Masquerade all traffic to cluster IPs (`--masquerade-all`).
    pub masquerade_all: bool,
    /// The packet-mark bit that flags connections for masquerading.
    pub masquerade_bit: u8,
    /// How traffic from local pods is recognised (`--detect-local-mode`).
    pub local_detection: LocalDetection,
    /// `--cluster-cidr`.
    pub cluster_cidrs: Vec<IpNet>,
    /// Over tables without an element (a cold start), the skeleton is committed first
    /// (while the first services are rendered), then the elements of whole services in
    /// transactions of about this many elements rather than in one: the kernel inserts
    /// half a million elements a quarter faster in ten transactions than in one, each is
    /// rendered and prepared while the one before commits, and kpng never lists the whole
    /// table's elements at once. Each service is programmed atomically; services not yet committed
    /// are simply not there yet, as before kpng started. A change, and a restart or a
    /// repair over tables that hold elements, stay one transaction.
    pub cold_start_transaction: usize,
}

/// The default [`NftOptions::cold_start_transaction`].
const COLD_START_TRANSACTION: usize = 50_000;

impl Default for NftOptions {
    fn default() -> Self {
        NftOptions {
            masquerade_all: false,
            masquerade_bit: 14,
            local_detection: LocalDetection::Auto,
            cluster_cidrs: Vec::new(),
            cold_start_transaction: COLD_START_TRANSACTION,
        }
    }
}

/// Whether the backend knows what the kernel holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSync {
    /// Unknown: the next change set reads the tables back and reconciles them whole.
    Unknown,
    /// The kernel holds what the backend last committed: changes are applied as they come.
    InSync,
}

/// Numbers for the services the backend has seen.
#[derive(Debug, Default)]
struct ServiceOwners {
    numbers: HashMap<ServiceKey, u32>,
    next: u32,
}

impl ServiceOwners {
    fn owner(&mut self, key: &ServiceKey) -> Owner {
        let next = &mut self.next;
        Owner::Service(*self.numbers.entry(key.clone()).or_insert_with(|| {
            *next += 1;
            *next
        }))
    }
}

/// One service's rendering, ready to commit.
struct ServiceUpdate {
    owner: Owner,
    key: ServiceKey,
    elements: Vec<(ElementId, Value)>,
    slots: Slots,
    groups: Vec<crate::affinity::AffinityGroup>,
    gone: bool,
}

/// The nftables backend.
pub struct NftBackend {
    options: NftOptions,
    kernel: Box<dyn Kernel>,
    sync: TableSync,
    state: TableState,
    layout: Layout,
    owners: ServiceOwners,
    slots: HashMap<Owner, Slots>,
    /// The affinity groups of each service, by hash (the groups are in the layout).
    group_hashes: HashMap<Owner, Vec<u64>>,
    stats: Arc<NftStats>,
    /// `--dry-run`: transactions are printed, and the log says so.
    dry_run: bool,
    /// The ruleset generation kpng's tables were last known right at (after kpng's own
    /// commit, or a read-back that found them unchanged): while the kernel's generation is
    /// still that one, nothing can have changed them.
    known: KnownGeneration,
}

impl NftBackend {
    /// A backend with `options` that commits to `target`: the kernel over netlink, or the
    /// `nft` text of each transaction (`--dry-run`).
    pub fn open(options: NftOptions, target: Target) -> Result<Self, NftError> {
        let dry_run = target.is_dry_run();
        let kernel: Box<dyn Kernel> = match target {
            Target::Kernel => Box::new(crate::NetlinkKernel::open()?),
            Target::DryRun(out) => Box::new(crate::DryRunKernel::new(out)),
        };
        Ok(NftBackend { dry_run, ..NftBackend::new(options, kernel) })
    }

    /// What the log says a transaction became.
    fn done(&self) -> &'static str {
        kpng_backend::backend::done(self.dry_run, "committed")
    }

    /// A backend sending its transactions to `kernel`.
    pub fn new(options: NftOptions, kernel: Box<dyn Kernel>) -> Self {
        NftBackend {
            options,
            kernel,
            sync: TableSync::Unknown,
            state: TableState::new(),
            layout: Layout::default(),
            owners: ServiceOwners::default(),
            slots: HashMap::new(),
            group_hashes: HashMap::new(),
            stats: Arc::default(),
            dry_run: false,
            known: KnownGeneration::default(),
        }
    }

    /// The backend's counters.
    pub fn stats(&self) -> Arc<NftStats> {
        self.stats.clone()
    }

    /// The elements currently committed.
    pub fn state(&self) -> &TableState {
        &self.state
    }

    /// What the tables hold besides elements.
    pub fn layout(&self) -> &Layout {
        &self.layout
    }

    /// The whole table as it stands, as `nft -f` input that builds it from nothing.
    pub fn ruleset(&self) -> String {
        let created = reconcile(&self.layout.wanted(), &crate::reconcile::Present::default());
        let mut elements: Vec<(ElementId, Value)> = self.state.iter().collect();
        elements.sort_unstable();
        let mut plan = Plan::new();
        plan.commands.extend(created.before);
        plan.elements(true, &elements);
        plan.text()
    }

    /// Whether the backend knows what the kernel holds.
    pub fn sync(&self) -> TableSync {
        self.sync
    }

    /// The packet-mark bit flagging connections for masquerading.
    fn masquerade_mark(&self) -> u32 {
        1 << self.options.masquerade_bit
    }

    /// What shapes service elements: `node`'s facts and what the kernel supports.
    fn facts(&self, node: Option<&LocalNode>) -> NodeFacts {
        NodeFacts {
            without_helpers: !self.kernel.ct_helpers(),
            ..NodeFacts::from_node(node, self.masquerade_mark())
        }
    }

    /// The skeleton's options for the node state's `node`.
    fn skeleton_options(&self, node: Option<&LocalNode>) -> SkeletonOptions {
        SkeletonOptions {
            masquerade_all: self.options.masquerade_all,
            local_detector: self.options.local_detection.resolve(node, &self.options.cluster_cidrs),
            masquerade_bit: self.options.masquerade_bit,
            nodeports_on_all_local: node
                .map(|n| n.nodeport_addresses.all_local)
                .unwrap_or_default(),
            // The node state carries the ServiceCIDR objects' ranges and `--service-cidr`.
            service_cidrs: node.map(|n| n.service_cidrs.clone()).unwrap_or_default(),
        }
    }

    /// Applies the changes of one change set, touching only what they concern.
    fn apply_changes(&mut self, changes: &ChangeSet<'_>) -> Result<bool, NftError> {
        let state = changes.state;
        let (mut keys, node_changed) = changes.touched();
        let options = self.skeleton_options(state.node.as_ref());
        if node_changed {
            // Node IPs shape firewall elements: render every service again.
            keys.extend(state.services.keys().cloned());
            keys.extend(self.owners.numbers.keys().cloned());
        }
        let facts = self.facts(state.node.as_ref());
        let mut services = Vec::with_capacity(keys.len());
        for key in &keys {
            let owner = self.owners.owner(key);
            let table = &self.state;
            let committed =
                |service: &LocalServiceState| seed_slots(service, |id| table.wanted(owner, id));
            let service = state.services.get(key);
            let update = render_update(&self.slots, owner, key, service, &facts, &committed);
            services.push(update);
        }
        let mut updates = Vec::with_capacity(services.len() + 1);
        if node_changed {
            updates.push((Owner::Node, node_elements(state.node.as_ref())));
        }
        let (old_groups, new_groups) = self.group_changes(&services);
        for update in &mut services {
            updates.push((update.owner, std::mem::take(&mut update.elements)));
        }
        let new_large: BTreeSet<LargeCount> = large_counts(updates.iter().flat_map(|(_, e)| e))
            .difference(&self.layout.large)
            .copied()
            .collect();
        let reconciled = self.layout_changes(&options, &new_large, &old_groups, &new_groups);
        let previous: Vec<(Owner, Vec<(ElementId, Value)>)> =
            updates.iter().map(|(owner, _)| (*owner, self.state.owned(*owner).collect())).collect();
        let diff = self.state.update(updates);
        let mut plan = Plan::new();
        plan.commands.extend(reconciled.before.iter().cloned());
        plan.elements(false, &diff.deletes);
        plan.elements(true, &diff.adds);
        plan.commands.extend(reconciled.after.iter().cloned());
        if plan.is_empty() {
            tracing::debug!(elements = self.state.len(), "nftables: nothing to change");
        } else if let Err(error) = self.commit(&plan, false) {
            self.state.update(previous);
            return Err(error);
        }
        self.layout.options = options;
        self.layout.large.extend(new_large);
        for hash in old_groups.iter().map(|g| g.hash) {
            self.layout.groups.remove(&hash);
        }
        for group in new_groups {
            self.layout.groups.insert(group.hash, group);
        }
        for update in services {
            self.remember(update);
        }
        Ok(!plan.is_empty())
    }

    /// The affinity groups the touched services had, and the ones they have now.
    fn group_changes(
        &self,
        services: &[ServiceUpdate],
    ) -> (Vec<crate::affinity::AffinityGroup>, Vec<crate::affinity::AffinityGroup>) {
        let mut old = Vec::new();
        let mut new = Vec::new();
        for update in services {
            let hashes =
                self.group_hashes.get(&update.owner).map(Vec::as_slice).unwrap_or_default();
            old.extend(hashes.iter().filter_map(|h| self.layout.groups.get(h)).cloned());
            new.extend(update.groups.iter().cloned());
        }
        (old, new)
    }

    /// What the layout must change: the skeleton when its options changed, the counts
    /// chains when counts beyond the tree appear, the touched services' affinity groups.
    fn layout_changes(
        &self,
        options: &SkeletonOptions,
        new_large: &BTreeSet<LargeCount>,
        old_groups: &[crate::affinity::AffinityGroup],
        new_groups: &[crate::affinity::AffinityGroup],
    ) -> Reconciled {
        let mut wanted = groups_wanted(new_groups);
        let mut present = groups_wanted(old_groups).as_present();
        let mut next = Layout {
            options: options.clone(),
            large: self.layout.large.clone(),
            ..Layout::default()
        };
        next.large.extend(new_large.iter().copied());
        if *options != self.layout.options {
            for family in Family::ALL {
                let mut before = Wanted::default();
                self.layout.add_skeleton(&mut before, family);
                self.layout.add_counts(&mut before, kpng_pick_kinds(), &[family]);
                extend(&mut present, before.as_present());
                next.add_skeleton(&mut wanted, family);
                next.add_counts(&mut wanted, kpng_pick_kinds(), &[family]);
            }
        } else if !new_large.is_empty() {
            let families: Vec<Family> = new_large.iter().map(|l| l.family).collect();
            let kinds: BTreeSet<crate::objects::PickKind> =
                new_large.iter().map(|l| l.kind).collect();
            let mut before = Wanted::default();
            self.layout.add_counts(&mut before, kinds.iter().copied(), &families);
            extend(&mut present, before.as_present());
            next.add_counts(&mut wanted, kinds.iter().copied(), &families);
        }
        // Tables are not part of an incremental comparison.
        present.tables = wanted.tables.clone();
        reconcile(&wanted, &present)
    }

    /// Keeps what a committed update needs next time: slots and group hashes, or nothing
    /// for a service that is gone.
    fn remember(&mut self, update: ServiceUpdate) {
        let owner = update.owner;
        self.slots.remove(&owner);
        self.group_hashes.remove(&owner);
        if update.gone {
            self.owners.numbers.remove(&update.key);
            return;
        }
        if !update.slots.is_empty() {
            self.slots.insert(owner, update.slots);
        }
        if !update.groups.is_empty() {
            self.group_hashes.insert(owner, update.groups.iter().map(|g| g.hash).collect());
        }
    }

    /// The kernel's ruleset generation, if it can say (a failure to ask is no failure).
    fn generation(&mut self) -> Option<u64> {
        self.kernel.generation().ok().flatten().map(u64::from)
    }

    /// Commits `plan`; a `whole` one (planned from nothing) replaces kpng's tables.
    fn commit(&mut self, plan: &Plan<'_>, whole: bool) -> Result<(), NftError> {
        // The generation before and after: one more means the transaction was kpng's alone.
        let before = self.generation();
        self.known.forget();
        let started = std::time::Instant::now();
        let result = match whole {
            true => self.kernel.replace(plan),
            false => self.kernel.commit(plan),
        };
        let took = started.elapsed();
        if result.is_ok() {
            let after = self.generation();
            self.known.committed(before, after, 1);
        }
        if let Err(error) = result {
            self.stats.transaction_failures.fetch_add(1, Ordering::Relaxed);
            self.sync = TableSync::Unknown;
            return Err(error);
        }
        let (adds, deletes) = plan.element_count();
        self.stats.record_commit(adds, deletes, took);
        tracing::info!(added = adds, deleted = deletes, rules = plan.changes_rules(), kernel = ?took, "nftables transaction {}", self.done());
        Ok(())
    }
}

/// One service's rendering; `slots` are the remembered ones (services with groups of their
/// own), `seed` finds the others.
fn render_update(
    slots: &HashMap<Owner, Slots>,
    owner: Owner,
    key: &ServiceKey,
    service: Option<&LocalServiceState>,
    facts: &NodeFacts,
    seed: &dyn Fn(&LocalServiceState) -> Slots,
) -> ServiceUpdate {
    let Some(service) = service else {
        return ServiceUpdate {
            owner,
            key: key.clone(),
            elements: Vec::new(),
            slots: Slots::new(),
            groups: Vec::new(),
            gone: true,
        };
    };
    let previous = match slots.get(&owner) {
        Some(slots) => slots.clone(),
        None => seed(service),
    };
    let rendered = render_service(service, facts, &previous);
    // Ordinary slots are in the backends elements committed for the service, where the
    // next render finds them; only groups' slots, which keep holes, are remembered.
    let grouped = crate::render::group_policy(&service.service, facts).is_some();
    ServiceUpdate {
        owner,
        key: key.clone(),
        elements: rendered.elements,
        slots: if grouped { rendered.slots } else { Slots::new() },
        groups: rendered.affinity,
        gone: false,
    }
}

fn kpng_pick_kinds() -> impl Iterator<Item = crate::objects::PickKind> + Clone {
    crate::objects::PickKind::ALL.into_iter()
}

fn extend(present: &mut crate::reconcile::Present, more: crate::reconcile::Present) {
    present.sets.extend(more.sets);
    present.chains.extend(more.chains);
}

/// The node-level elements of `node`.
fn node_elements(node: Option<&LocalNode>) -> Vec<(ElementId, Value)> {
    node.map(|n| render_node(&n.nodeport_addresses.addresses)).unwrap_or_default()
}

/// The counts beyond the pick tree that `elements` use.
fn large_counts<'e>(
    elements: impl Iterator<Item = &'e (ElementId, Value)>,
) -> BTreeSet<LargeCount> {
    elements
        .filter_map(|(id, _)| match id.map {
            MapName::Count(kind, count) => Some(LargeCount { family: id.family, kind, count }),
            _ => None,
        })
        .collect()
}

impl Backend for NftBackend {
    fn unsupported(&self, lb: &LoadBalancing) -> Vec<(AnnotationKey, &'static str)> {
        let mut out = Vec::new();
        let stateless = matches!(lb.mode, Some(NatMode::StatelessDnat | NatMode::Dsr));
        if let Some(helper) = lb.helper.filter(|_| stateless || !self.kernel.ct_helpers()) {
            out.push((AnnotationKey::Helper, helper.as_str()));
        }
        if stateless {
            // Without conntrack there are no connections to log or to take turns, and
            // every packet of a flow must hash the same way.
            if let Some(log) = lb.log {
                out.push((AnnotationKey::Log, log.as_str()));
            }
            if let Some(Scheduler::RoundRobin) = lb.scheduler {
                out.push((AnnotationKey::Scheduler, Scheduler::RoundRobin.as_str()));
            }
        }
        out
    }

    fn name(&self) -> &'static str {
        "to-nft"
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        let result = match (self.sync, changes.is_reset()) {
            (TableSync::InSync, false) => self.apply_changes(changes),
            _ => self.resync(changes.state),
        };
        result.map(drop).map_err(NftError::into_backend)
    }

    /// Reads kpng's tables back (never on the change path) and compares them with what was
    /// committed: every set, chain and rule by content, and every element.
    fn verify(&mut self) -> Result<bool, BackendError> {
        if self.sync != TableSync::InSync || self.kernel.publishes_whole() {
            return Ok(true);
        }
        // No transaction since kpng's tables were known: nothing can have changed them.
        let before = self.generation();
        if self.known.may_skip(before) {
            self.stats.readbacks_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        self.stats.readbacks.fetch_add(1, Ordering::Relaxed);
        let Some(contents) = self.kernel.read().map_err(NftError::into_backend)? else {
            return Ok(true);
        };
        let reconciled = reconcile(&self.layout.wanted(), &contents.present);
        // Compared in place: a copy of the committed elements would double the memory a
        // verification takes.
        let held = contents.elements;
        let same = held.iter().filter(|(id, value)| self.state.get(id) == Some(*value)).count();
        if reconciled.is_empty() && same == held.len() && same == self.state.len() {
            // Read back whole and unchanged while the generation held: known from there on.
            let after = self.generation();
            self.known.read_back(before, after);
            return Ok(true);
        }
        self.known.forget();
        let missing = self.state.len().saturating_sub(same);
        let extra = held.len() - same;
        let shown: Vec<&str> = reconciled.reasons.iter().take(8).map(String::as_str).collect();
        tracing::warn!(
            differences = reconciled.reasons.len(),
            first = %shown.join("; "),
            elements_missing = missing,
            elements_extra = extra,
            "nftables: the kernel no longer holds what kpng committed"
        );
        self.sync = TableSync::Unknown;
        Ok(false)
    }
}
