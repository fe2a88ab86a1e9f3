//! `to-nft` as an instance of kpng's backend template
//! ([`kpng_backend::reconcile`]): [`NftRender`], how services render into the objects of
//! kpng's tables ([`crate::entry`]), and [`Tables`], the template's kernel over any
//! [`Kernel`] of this crate (netlink, dry run, memory, aggregator), which turns a plan of
//! objects into one nf_tables transaction.
//!
//! Who owns what:
//! - the node: each family's table, the skeleton (its sets, chains and rules for the
//!   options in force) and the NodePort addresses;
//! - a service: its elements, and the chains, slot sets and `ct helper` objects of its
//!   affinity groups;
//! - shared ([`Render::shared`]): the counts chains, whose rules list the endpoint counts
//!   beyond the pick tree that any service uses, and those counts' sets. A count once used
//!   keeps its set and rule until the next reset.

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use kpng_backend::reconcile::{Lookup, Rank, Render, Sample, Unit, Wanted};
use kpng_backend::slots::Target;
use kpng_model::global::{AnnotationKey, LoadBalancing, NatMode, Scheduler};
use kpng_model::local::LocalServiceState;
use kpng_model::{Family, LocalNode, NodeState, ServiceKey};
use kpng_netlink::nftables::announce::{Part, Touched};

use crate::entry::{EntryKey, EntryValue, LayoutName, LayoutValue};
use crate::error::NftError;
use crate::kernel::{Kernel, KernelContents};
use crate::layout::{LargeCount, Layout, groups_wanted};
use crate::objects::{ElementId, GroupKey, MapName, PickKind, SetKind, affinity_slot};
use crate::options::NftOptions;
use crate::plan::{Command, Plan};
use crate::reconcile::Wanted as LayoutWanted;
use crate::reconcile::{Present, reconcile};
use crate::render::{NodeFacts, Slots, group_policy, render_node, render_service, seed_slots};
use crate::skeleton::SkeletonOptions;
use crate::stats::NftStats;

/// An object of kpng's tables, as the template keeps it.
pub type Entry = (EntryKey, EntryValue);

/// What of the node shapes kpng's tables.
#[derive(Debug, Clone, PartialEq)]
pub struct NftFacts {
    /// What shapes service elements.
    pub node: NodeFacts,
    /// What shapes the skeleton.
    pub skeleton: SkeletonOptions,
    /// The addresses NodePorts are accepted on.
    pub nodeport_addresses: Vec<std::net::IpAddr>,
}

/// How services render into kpng's tables.
#[derive(Debug, Clone)]
pub struct NftRender {
    options: NftOptions,
    /// Whether `ct helper` objects can be created where the tables go.
    helpers: bool,
    /// The slots of services with groups of their own (they keep holes, which the
    /// committed elements do not show); other services' slots are read from what the
    /// kernel holds.
    grouped: HashMap<ServiceKey, Slots>,
    /// Endpoint counts beyond the pick tree in use since the last reset.
    large: BTreeSet<LargeCount>,
    /// The counts the counts chains were last returned with; `None` after a reset.
    sent: Option<BTreeSet<LargeCount>>,
}

impl NftRender {
    /// A render with `options`; `helpers` says whether `ct helper` objects can be created
    /// where the tables go (not through an aggregator).
    pub fn new(options: NftOptions, helpers: bool) -> Self {
        NftRender { options, helpers, grouped: HashMap::new(), large: BTreeSet::new(), sent: None }
    }

    /// The options.
    pub fn options(&self) -> &NftOptions {
        &self.options
    }

    /// The skeleton's options for `node`.
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

    /// The counts chains and count sets of `families` and `kinds`, for the counts in use.
    fn counts(&self, families: &BTreeSet<(Family, PickKind)>) -> Vec<Entry> {
        let layout = Layout { large: self.large.clone(), ..Layout::default() };
        let mut wanted = LayoutWanted::default();
        for (family, kind) in families {
            layout.add_counts(&mut wanted, std::iter::once(*kind), &[*family]);
        }
        layout_entries(wanted).collect()
    }
}

/// The objects of `wanted` (tables, sets, chains, helpers) as entries.
fn layout_entries(wanted: LayoutWanted) -> impl Iterator<Item = Entry> {
    let tables = wanted.tables.into_iter().map(|f| (LayoutName::Table(f), LayoutValue::Table));
    let sets = (wanted.sets.into_iter())
        .map(|((f, name), set)| (LayoutName::Set(f, name), LayoutValue::Set(set)));
    let chains = (wanted.chains.into_iter()).map(|((f, name), (spec, rules))| {
        (LayoutName::Chain(f, name), LayoutValue::Chain(spec, rules))
    });
    let helpers = (wanted.helpers.into_iter())
        .map(|((f, name), spec)| (LayoutName::Helper(f, name), LayoutValue::Helper(spec)));
    let all = tables.chain(sets).chain(chains).chain(helpers);
    all.map(|(name, value)| (EntryKey::layout(name), EntryValue::layout(value)))
}

/// An element as an entry.
fn element_entry((id, value): &(ElementId, crate::objects::Value)) -> Entry {
    (EntryKey::element(id), EntryValue::element(*value))
}

/// The slots of a group with slots of its own as `held` shows them: the endpoint each slot
/// chain DNATs to, holes where a slot has no chain. A hole of more than [`HOLES`] slots in
/// a row ends the search.
fn held_group_slots(
    held: &dyn Lookup<EntryKey, EntryValue>,
    family: Family,
    hash: u64,
) -> Vec<Option<Target>> {
    let mut slots = Vec::new();
    let mut misses = 0;
    for i in 0.. {
        let name = LayoutName::Chain(family, affinity_slot(hash, i));
        let chain = held.lookup(&EntryKey::layout(name));
        let chain =
            chain.as_deref().and_then(EntryValue::as_layout).and_then(LayoutValue::present_chain);
        let target =
            chain.and_then(|c| c.rules.first().and_then(|r| crate::kernel::dnat_target(r)));
        match target {
            Some(target) => {
                slots.resize(i, None);
                slots.push(Some(target));
                misses = 0;
            }
            None if misses >= HOLES => break,
            None => misses += 1,
        }
    }
    slots
}

/// The longest run of holes a group's slots are searched past (see [`held_group_slots`]).
const HOLES: usize = 16;

/// A service's slots as `held` shows them: from the backends elements, and for groups of
/// their own from their slot chains.
fn held_slots(
    service: &LocalServiceState,
    held: &dyn Lookup<EntryKey, EntryValue>,
    grouped: bool,
) -> Slots {
    let element = |id: &ElementId| held.lookup(&EntryKey::element(id))?.as_element();
    let mut slots = seed_slots(service, element);
    if !grouped {
        return slots;
    }
    let svc = &service.service;
    for family in Family::ALL.into_iter().filter(|f| svc.cluster_ip(*f).is_some()) {
        for port in &svc.ports {
            for kind in [SetKind::Cluster, SetKind::Local] {
                let group =
                    GroupKey { family, port: port.name.clone(), protocol: port.protocol, kind };
                let found = held_group_slots(held, family, group.hash(&svc.key));
                match found.is_empty() {
                    true => slots.remove(&group),
                    false => slots.insert(group, found),
                };
            }
        }
    }
    slots
}

impl Render for NftRender {
    type Key = EntryKey;
    type Value = EntryValue;
    type Facts = NftFacts;
    type Error = Infallible; // rendering never fails

    fn facts(&self, state: &dyn NodeState) -> NftFacts {
        let node = state.node();
        NftFacts {
            node: NodeFacts {
                without_helpers: !self.helpers,
                ..NodeFacts::from_node(node, 1 << self.options.masquerade_bit)
            },
            skeleton: self.skeleton_options(node),
            nodeport_addresses: node
                .map(|n| n.nodeport_addresses.addresses.clone())
                .unwrap_or_default(),
        }
    }

    fn node(&mut self, facts: &NftFacts) -> Wanted<EntryKey, EntryValue> {
        let layout = Layout { options: facts.skeleton.clone(), ..Layout::default() };
        let mut wanted = LayoutWanted::default();
        for family in Family::ALL {
            layout.add_skeleton(&mut wanted, family);
        }
        // The counts chains are shared: the skeleton's rules jump to them.
        wanted
            .chains
            .retain(|(_, name), _| !PickKind::ALL.iter().any(|k| k.counts_chain() == *name));
        let elements = render_node(&facts.nodeport_addresses);
        Wanted::objects(layout_entries(wanted).chain(elements.iter().map(element_entry)))
    }

    fn service(
        &mut self,
        facts: &NftFacts,
        service: &LocalServiceState,
        held: &dyn Lookup<EntryKey, EntryValue>,
    ) -> Result<Wanted<EntryKey, EntryValue>, Infallible> {
        let key = &service.service.key;
        let grouped = group_policy(&service.service, &facts.node).is_some();
        let previous = match self.grouped.get(key) {
            Some(slots) => slots.clone(),
            None => held_slots(service, held, grouped),
        };
        let rendered = render_service(service, &facts.node, &previous);
        match grouped {
            true => self.grouped.insert(key.clone(), rendered.slots),
            false => self.grouped.remove(key),
        };
        for (id, _) in &rendered.elements {
            if let MapName::Count(kind, count) = id.map {
                self.large.insert(LargeCount { family: id.family, kind, count });
            }
        }
        let groups = layout_entries(groups_wanted(&rendered.affinity));
        Ok(Wanted::objects(rendered.elements.iter().map(element_entry).chain(groups)))
    }

    fn shared(&mut self, _: &NftFacts) -> Vec<(EntryKey, Option<EntryValue>)> {
        let changed: BTreeSet<(Family, PickKind)> = match &self.sent {
            None => Family::ALL.iter().flat_map(|f| PickKind::ALL.map(|k| (*f, k))).collect(),
            Some(sent) => self.large.difference(sent).map(|l| (l.family, l.kind)).collect(),
        };
        if changed.is_empty() {
            return Vec::new();
        }
        self.sent = Some(self.large.clone());
        self.counts(&changed).into_iter().map(|(k, v)| (k, Some(v))).collect()
    }

    fn forget(&mut self, key: &ServiceKey) {
        self.grouped.remove(key);
    }

    fn reset(&mut self) {
        self.grouped.clear();
        self.large.clear();
        self.sent = None;
    }

    fn unsupported(&self, lb: &LoadBalancing) -> Vec<(AnnotationKey, &'static str)> {
        let mut out = Vec::new();
        let stateless = matches!(lb.mode, Some(NatMode::StatelessDnat | NatMode::Dsr));
        if let Some(helper) = lb.helper.filter(|_| stateless || !self.helpers) {
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
}

/// The template's kernel over one of this crate's [`Kernel`]s: a plan of objects becomes
/// one nf_tables transaction, whose commands come in the order the kernel needs (tables,
/// sets and chains created and rewritten, elements deleted, elements added, what goes
/// deleted; see [`crate::reconcile`]).
///
/// A cold start over tables that hold nothing is streamed
/// ([`stream`](kpng_backend::reconcile::Kernel::stream)): the layout first, then whole
/// services in transactions of about [`NftOptions::cold_start_transaction`] elements, each
/// with what its services add to the layout (affinity groups, counts beyond the pick
/// tree), committed while the next services render. The kernel inserts half a million
/// elements faster in many transactions than in one; each service is programmed
/// atomically. A refused one leaves those before it in force; the reset that follows
/// reads them back.
///
/// At a reset, the cluster IPs are read first: when the table holds far more services than
/// the state wants (at least [`FLUSH_AT`] more, and more than twice as many more), the
/// other element sets are not read but flushed and refilled by the commit that follows; a
/// set a plan empties likewise is flushed and refilled rather than emptied element by
/// element.
///
/// A kernel that takes whole tables (an aggregator, [`Kernel::publishes_whole`]) gets
/// them whole at every reset, in [`prepare`](kpng_backend::reconcile::Kernel::prepare),
/// and only changes after that; what it reads back (at the first reset only) seeds endpoint
/// positions, and it is not verified (the aggregator owns the tables).
pub struct Tables {
    kernel: Box<dyn Kernel>,
    stats: Arc<NftStats>,
    split: usize,
    /// The cluster IPs the reset under way wants, until its read-back.
    expect: Option<usize>,
    /// Element sets the last read-back skipped (mostly stale): the next commit flushes
    /// them and adds what is wanted.
    unread: BTreeSet<(Family, MapName)>,
    /// A whole publication went out in this reset's `prepare`: its commit is in it.
    published: bool,
}

impl Tables {
    /// The template's kernel over `kernel`, splitting cold starts into transactions of
    /// about `split` elements, counting its transactions in `stats`.
    pub fn new(kernel: Box<dyn Kernel>, split: usize, stats: Arc<NftStats>) -> Self {
        Tables {
            kernel,
            stats,
            split: split.max(1),
            expect: None,
            unread: BTreeSet::new(),
            published: false,
        }
    }

    /// Commits one transaction, counted.
    fn send(&mut self, transaction: &Transaction) -> Result<(), NftError> {
        let plan = transaction.plan();
        let counts = (transaction.adds.len(), transaction.deletes.len());
        self.counted(|kernel| kernel.commit(&plan).map(|()| counts))
    }

    /// Replaces the tables with every object of `held` (for a kernel that takes whole
    /// tables), counted. The layout (a few hundred objects) is planned as a transaction;
    /// the elements go to the kernel one by one from `held`, never listed beside it.
    fn send_whole(&mut self, held: &Committed) -> Result<(), NftError> {
        let layout = whole_transaction(&whole_layout(held), held)?;
        // Planned from nothing, and of layout objects alone: it deletes nothing.
        debug_assert!(
            layout.adds.is_empty() && layout.deletes.is_empty() && layout.after.is_empty()
        );
        let plan = layout.plan();
        self.counted(|kernel| {
            let mut adds = 0;
            let mut elements = held
                .iter()
                .filter_map(|(key, value)| Some((key.as_element()?, value.as_element()?)))
                .inspect(|_| adds += 1);
            kernel.replace(&plan, &mut elements)?;
            Ok((adds, 0))
        })
    }

    /// Runs one transaction through `commit`, which says how many elements it added and
    /// deleted; counted, failed or not.
    fn counted(
        &mut self,
        commit: impl FnOnce(&mut dyn Kernel) -> Result<(usize, usize), NftError>,
    ) -> Result<(), NftError> {
        let started = Instant::now();
        match commit(&mut *self.kernel) {
            Ok((adds, deletes)) => {
                self.stats.record_commit(adds, deletes, started.elapsed());
                Ok(())
            }
            Err(error) => {
                self.stats.transaction_failures.fetch_add(1, Ordering::Relaxed);
                Err(error)
            }
        }
    }
}

/// What the kernel read, as objects.
fn held_of(contents: KernelContents) -> HashMap<EntryKey, EntryValue> {
    let KernelContents { present, elements, .. } = contents;
    let mut held = HashMap::with_capacity(elements.len() + present.chains.len() + 64);
    let layout = |name, value| (EntryKey::layout(name), EntryValue::layout(value));
    for family in present.tables {
        held.extend([layout(LayoutName::Table(family), LayoutValue::Table)]);
    }
    for ((family, name), shape) in present.sets {
        held.extend([layout(LayoutName::Set(family, name), LayoutValue::Shape(shape))]);
    }
    for ((family, name), chain) in present.chains {
        held.extend([layout(LayoutName::Chain(family, name), LayoutValue::Rules(chain))]);
    }
    for ((family, name), spec) in present.helpers {
        held.extend([layout(LayoutName::Helper(family, name), LayoutValue::Helper(spec))]);
    }
    held.extend(elements.iter().map(element_entry));
    held
}

/// A plan of objects as the commands of transactions.
struct Transaction {
    before: Vec<(Family, Command<'static>)>,
    deletes: Vec<(ElementId, crate::objects::Value)>,
    adds: Vec<(ElementId, crate::objects::Value)>,
    after: Vec<(Family, Command<'static>)>,
}

impl Transaction {
    fn plan(&self) -> Plan<'_> {
        let mut plan = Plan::new();
        plan.commands.extend(self.before.iter().cloned());
        plan.elements(false, &self.deletes);
        plan.elements(true, &self.adds);
        plan.commands.extend(self.after.iter().cloned());
        plan
    }
}

type ObjectPlan = kpng_backend::reconcile::Plan<EntryKey, EntryValue>;
type Committed = kpng_backend::reconcile::Objects<EntryKey, EntryValue>;

/// The layout objects of a plan as [`crate::reconcile`] compares them: what is wanted of
/// those the plan writes, and what the kernel has of them.
fn layout_of(plan: &ObjectPlan, after: &Committed) -> Result<(LayoutWanted, Present), NftError> {
    let mut wanted = LayoutWanted::default();
    let mut present = Present::default();
    let declared = |name: &LayoutName, value: &EntryValue| {
        let value = value.as_layout().ok_or_else(|| NftError::Plan(format!("{name:?}")))?;
        Ok::<_, NftError>(value.clone())
    };
    let mut reshaped = false;
    for (key, old, new) in &plan.upserts {
        let Some(name) = key.as_layout() else { continue };
        let new = declared(name, new)?;
        if let Some(old) = old {
            let old = declared(name, old)?;
            reshaped |= matches!(name, LayoutName::Set(..) | LayoutName::Helper(..));
            add_present(&mut present, name, &old);
        }
        add_wanted(&mut wanted, name, new)?;
    }
    for (key, old) in &plan.deletes {
        let Some(name) = key.as_layout() else { continue };
        add_present(&mut present, name, &declared(name, old)?);
    }
    // Tables the plan does not touch are there.
    for family in Family::ALL {
        let table = EntryKey::layout(LayoutName::Table(family));
        let created = plan.upserts.iter().any(|(k, old, _)| *k == table && old.is_none());
        if !created && after.get(&table).is_some() {
            present.tables.insert(family);
        }
    }
    if reshaped {
        // A set or helper made again: every chain referring to it is rewritten, so the
        // chains the plan does not touch are taken from what is committed.
        for (key, value) in after.iter() {
            let Some(name @ LayoutName::Chain(family, chain)) = key.as_layout() else { continue };
            if !wanted.chains.contains_key(&(*family, chain.clone())) {
                let value = declared(name, &value)?;
                add_present(&mut present, name, &value);
                add_wanted(&mut wanted, name, value)?;
            }
        }
    }
    for (key, old, _) in &plan.upserts {
        // A slot chain rewritten makes its set (of the same name) forget its clients.
        let (Some(LayoutName::Chain(family, chain)), Some(_)) = (key.as_layout(), old) else {
            continue;
        };
        let name = LayoutName::Set(*family, chain.clone());
        let Some(value) = after.get(&EntryKey::layout(name.clone())) else { continue };
        if !wanted.sets.contains_key(&(*family, chain.clone())) {
            let value = declared(&name, &value)?;
            add_present(&mut present, &name, &value);
            add_wanted(&mut wanted, &name, value)?;
        }
    }
    Ok((wanted, present))
}

/// Adds what the kernel has of a layout object to `present`.
fn add_present(present: &mut Present, name: &LayoutName, value: &LayoutValue) {
    match (name, value) {
        (LayoutName::Table(family), _) => {
            present.tables.insert(*family);
        }
        (LayoutName::Set(family, set), value) => {
            if let Some(shape) = value.shape() {
                present.sets.insert((*family, set.clone()), shape);
            }
        }
        (LayoutName::Chain(family, chain), value) => {
            if let Some(held) = value.present_chain() {
                present.chains.insert((*family, chain.clone()), held);
            }
        }
        (LayoutName::Helper(family, helper), LayoutValue::Helper(spec)) => {
            present.helpers.insert((*family, helper.clone()), spec.clone());
        }
        (LayoutName::Helper(..), _) => {}
    }
}

/// Adds a layout object kpng declares to `wanted`.
fn add_wanted(
    wanted: &mut LayoutWanted,
    name: &LayoutName,
    value: LayoutValue,
) -> Result<(), NftError> {
    match (name, value) {
        (LayoutName::Table(family), LayoutValue::Table) => {
            wanted.tables.insert(*family);
        }
        (LayoutName::Set(family, set), LayoutValue::Set(declared)) => {
            wanted.sets.insert((*family, set.clone()), declared);
        }
        (LayoutName::Chain(family, chain), LayoutValue::Chain(spec, rules)) => {
            wanted.chains.insert((*family, chain.clone()), (spec, rules));
        }
        (LayoutName::Helper(family, helper), LayoutValue::Helper(spec)) => {
            wanted.helpers.insert((*family, helper.clone()), spec);
        }
        (name, value) => {
            return Err(NftError::Plan(format!("{name:?} cannot be created from {value:?}")));
        }
    }
    Ok(())
}

/// The commands of `plan` over what `after` says is committed once it is in; the layout's
/// differences it writes (a table missing, a chain changed) are logged.
fn transaction(plan: &ObjectPlan, after: &Committed) -> Result<Transaction, NftError> {
    let (transaction, reasons) = commands(plan, after)?;
    log_reasons(&reasons);
    Ok(transaction)
}

/// `plan` (from nothing: [`whole`], [`whole_layout`]) as one transaction, over what
/// `after` says is committed once it is in: the tables whole, for a kernel that takes them
/// so or for printing. Their layout's "differences" (every table missing) are not logged.
fn whole_transaction(plan: &ObjectPlan, after: &Committed) -> Result<Transaction, NftError> {
    Ok(commands(plan, after)?.0)
}

/// The commands of `plan` over `after`, and the layout's differences they write.
fn commands(plan: &ObjectPlan, after: &Committed) -> Result<(Transaction, Vec<String>), NftError> {
    let (wanted, present) = layout_of(plan, after)?;
    let reconciled = reconcile(&wanted, &present);
    // Sets deleted or made again take their elements with them.
    let deleted: BTreeSet<(Family, String)> =
        present.sets.keys().filter(|n| !wanted.sets.contains_key(*n)).cloned().collect();
    let gone = |id: &ElementId| {
        let name = (id.family, id.map.name().into_owned());
        deleted.contains(&name) || reconciled.emptied.contains(&name)
    };
    let element =
        |key: &EntryKey, value: &EntryValue| Some((key.as_element()?, value.as_element()?));
    // Room for what the plan names (a cold start's part is tens of thousands of elements),
    // so neither vector is copied to a larger one while both copies are held.
    let mut deletes = Vec::with_capacity(plan.deletes.len());
    let mut adds = Vec::with_capacity(plan.upserts.len());
    for (key, old, new) in &plan.upserts {
        let Some((id, value)) = element(key, new) else { continue };
        if let Some((_, old)) =
            old.as_ref().and_then(|old| element(key, old)).filter(|(id, _)| !gone(id))
        {
            deletes.push((id, old));
        }
        adds.push((id, value));
    }
    for (key, old) in &plan.deletes {
        if let Some((id, old)) = element(key, old).filter(|(id, _)| !gone(id)) {
            deletes.push((id, old));
        }
    }
    // A set made again over elements the plan keeps gets them back.
    let remade: BTreeSet<&(Family, String)> =
        reconciled.emptied.iter().filter(|n| present.sets.contains_key(*n)).collect();
    if !remade.is_empty() {
        let added: BTreeSet<ElementId> = adds.iter().map(|(id, _)| *id).collect();
        for (key, value) in after.iter() {
            let Some((id, value)) = element(&key, &value) else { continue };
            if remade.contains(&(id.family, id.map.name().into_owned())) && !added.contains(&id) {
                adds.push((id, value));
            }
        }
    }
    deletes.sort_unstable();
    adds.sort_unstable();
    let transaction =
        Transaction { before: reconciled.before, deletes, adds, after: reconciled.after };
    Ok((transaction, reconciled.reasons))
}

fn log_reasons(reasons: &[String]) {
    if reasons.is_empty() {
        return;
    }
    let shown: Vec<&str> = reasons.iter().take(8).map(String::as_str).collect();
    tracing::info!(
        differences = reasons.len(),
        first = %shown.join("; "),
        "nftables: reconciled kpng's tables with the node state"
    );
}

/// A set that loses at least this many elements, and more than twice as many as the state
/// keeps, is flushed and refilled rather than read back and emptied element by element.
pub const FLUSH_AT: usize = 256;

/// Whether a table holding `held` cluster IPs, when the state wants `wanted`, is mostly
/// stale (see [`FLUSH_AT`]).
fn is_mostly_stale(held: usize, wanted: usize) -> bool {
    let stale = held.saturating_sub(wanted);
    stale >= FLUSH_AT && stale > 2 * wanted
}

/// The plan that writes every object of `held` into empty tables, in rank order.
fn whole(held: &Committed) -> ObjectPlan {
    whole_of(held.iter())
}

/// The plan that writes the layout objects of `held` (tables, sets, chains, helpers: not
/// the elements) into empty tables, in rank order.
fn whole_layout(held: &Committed) -> ObjectPlan {
    whole_of(held.iter().filter(|(key, _)| key.as_layout().is_some()))
}

/// The plan that writes `objects` into empty tables, in rank order.
fn whole_of<'a>(
    objects: impl Iterator<Item = (Cow<'a, EntryKey>, Cow<'a, EntryValue>)>,
) -> ObjectPlan {
    let mut upserts: Vec<_> =
        objects.map(|(k, v)| (k.into_owned(), None, v.into_owned())).collect();
    upserts.sort_by(|a, b| (a.0.rank(), &a.0).cmp(&(b.0.rank(), &b.0)));
    ObjectPlan { upserts, deletes: Vec::new() }
}

/// Every object of `held` as `nft -f` input that builds the tables from nothing.
pub fn ruleset(held: &Committed) -> String {
    match whole_transaction(&whole(held), &Committed::new()) {
        Ok(transaction) => transaction.plan().text(),
        Err(error) => format!("# {error}\n"),
    }
}

impl Tables {
    /// `transaction` with the sets that mostly lose elements flushed first and refilled
    /// with what they keep (from `after`), rather than emptied element by element: those
    /// the last read skipped, and those the transaction takes at least [`FLUSH_AT`]
    /// elements from, and more than twice as many as they keep. Sets the transaction
    /// makes again or deletes are left to it.
    fn flushing(&self, mut transaction: Transaction, after: &Committed) -> Transaction {
        let mut losses: BTreeMap<(Family, MapName), usize> = BTreeMap::new();
        for (id, _) in &transaction.deletes {
            *losses.entry((id.family, id.map)).or_default() += 1;
        }
        losses.retain(|_, lost| *lost >= FLUSH_AT);
        if self.unread.is_empty() && losses.is_empty() {
            return transaction;
        }
        let mut kept: BTreeMap<(Family, MapName), Vec<(ElementId, crate::objects::Value)>> =
            BTreeMap::new();
        for (key, value) in after.iter() {
            let (Some(id), Some(value)) = (key.as_element(), value.as_element()) else { continue };
            if losses.contains_key(&(id.family, id.map))
                || self.unread.contains(&(id.family, id.map))
            {
                kept.entry((id.family, id.map)).or_default().push((id, value));
            }
        }
        let remade: BTreeSet<(Family, String)> = (transaction.before.iter())
            .filter_map(|(f, c)| match c {
                Command::AddSet(decl) => Some((*f, decl.spec.name.clone())),
                _ => None,
            })
            .chain(transaction.after.iter().filter_map(|(f, c)| match c {
                Command::DeleteSet(name) => Some((*f, name.clone())),
                _ => None,
            }))
            .collect();
        let heavy =
            losses.iter().filter(|(set, lost)| **lost > 2 * kept.get(*set).map_or(0, Vec::len));
        let flushed: BTreeSet<(Family, MapName)> = (heavy.map(|(set, _)| *set))
            .chain(self.unread.iter().copied())
            .filter(|(f, map)| !remade.contains(&(*f, map.name().into_owned())))
            .collect();
        if flushed.is_empty() {
            return transaction;
        }
        transaction.deletes.retain(|(id, _)| !flushed.contains(&(id.family, id.map)));
        let added: BTreeSet<ElementId> = transaction.adds.iter().map(|(id, _)| *id).collect();
        for set in &flushed {
            let refill = kept.remove(set).unwrap_or_default();
            transaction.adds.extend(refill.into_iter().filter(|(id, _)| !added.contains(id)));
            // After what creates or rewrites the layout, before any element.
            transaction.before.push((set.0, Command::FlushSet(set.1.name().into_owned())));
        }
        transaction.adds.sort_unstable();
        transaction
    }
}

impl kpng_backend::reconcile::Kernel for Tables {
    type Key = EntryKey;
    type Value = EntryValue;
    type Error = NftError;

    const UNIT: Unit = Unit::Plan;
    const WHAT: &'static str = "nftables transaction";

    fn resetting(&mut self, state: &dyn NodeState) {
        let families = |s: &LocalServiceState| {
            Family::ALL.iter().filter(|f| s.service.cluster_ip(**f).is_some()).count()
        };
        self.expect = Some(state.services().map(|s| families(&s)).sum());
    }

    /// At a reset, the cluster IPs first: a table that holds far more services than the
    /// reset wants (a restart after most of the cluster went) is not read element by
    /// element only to delete them; its other element sets are flushed and refilled by the
    /// commit that follows.
    fn read(&mut self) -> Result<Option<HashMap<EntryKey, EntryValue>>, NftError> {
        self.unread.clear();
        let Some(wanted) = self.expect.take() else {
            return Ok(self.kernel.read()?.map(held_of));
        };
        let stale = |held: usize| is_mostly_stale(held, wanted);
        let contents = self.kernel.read_unless_stale(&stale)?;
        self.unread = contents.as_ref().map(|c| c.unread.clone()).unwrap_or_default();
        Ok(contents.map(held_of))
    }

    fn prepare(&mut self, plan: &ObjectPlan, after: &Committed, _: bool) -> Result<(), NftError> {
        if plan.is_empty() && !self.unread.is_empty() {
            // Nothing wanted in the sets not read: they only lose what is stale.
            let empty = Transaction {
                before: Vec::new(),
                deletes: Vec::new(),
                adds: Vec::new(),
                after: Vec::new(),
            };
            let flushed = self.flushing(empty, after);
            self.send(&flushed)?;
            self.unread.clear();
        }
        self.published = false;
        if !self.kernel.publishes_whole() {
            return Ok(());
        }
        self.send_whole(after)?;
        // The reset's plan, if any, went out with it; a reset with nothing to write
        // commits nothing, and the next change must not be taken for its plan.
        self.published = !plan.is_empty();
        Ok(())
    }

    fn commit(&mut self, plan: &ObjectPlan, after: &Committed) -> Result<(), NftError> {
        if std::mem::take(&mut self.published) {
            // The whole tables just went out, this plan with them.
            return Ok(());
        }
        let transaction = self.flushing(transaction(plan, after)?, after);
        self.send(&transaction)?;
        self.unread.clear();
        Ok(())
    }

    /// Cold starts commit in parts, except to a kernel that takes whole tables.
    fn stream(&self) -> Option<usize> {
        (!self.kernel.publishes_whole()).then_some(self.split)
    }

    /// A kernel that takes whole tables reads back only to keep endpoints' positions.
    fn reads_only_positions(&self) -> bool {
        self.kernel.publishes_whole()
    }

    fn commit_part(&mut self, plan: &ObjectPlan) -> Result<(), NftError> {
        self.send(&transaction(plan, &Committed::new())?)
    }

    fn sample(&mut self) -> Result<Sample<Self>, NftError> {
        let nothing = || Sample::Part { held: HashMap::new(), covers: Box::new(|_| false) };
        if self.kernel.publishes_whole() {
            // The aggregator owns the tables: nothing here to verify.
            return Ok(nothing());
        }
        // Everything, never the reset's shortcut over stale sets (a reset that started from
        // a verification's read-back did not read, and left its expectation here).
        self.expect = None;
        // A kernel that cannot say what it holds (a dry run) has nothing to verify either.
        Ok(self.read()?.map_or_else(nothing, |held| Sample::Whole(Some(held))))
    }

    fn generation(&mut self) -> Option<u64> {
        self.kernel.generation().ok().flatten().map(u64::from)
    }

    fn untouched(&mut self, known: u64, now: u64) -> bool {
        // The generation is the kernel's 32-bit counter.
        self.kernel.touched(known as u32, now as u32) == Touched::Nothing
    }

    /// The tables' layout (a few hundred objects) and the elements of the sets other
    /// processes touched, as the kernel announced them.
    fn sample_touched(&mut self, known: u64, now: u64) -> Result<Option<Sample<Self>>, NftError> {
        if self.kernel.publishes_whole() {
            return Ok(None);
        }
        let Touched::Parts(parts) = self.kernel.touched(known as u32, now as u32) else {
            return Ok(None);
        };
        let family = |number: u8| {
            Family::ALL.into_iter().find(|f| crate::objects::proto_family(*f).number() == number)
        };
        let sets: BTreeSet<(Family, MapName)> = parts
            .iter()
            .filter_map(|part| match part {
                Part::Set(number, name) => Some((family(*number)?, MapName::parse(name)?)),
                Part::Chain(..) => None,
            })
            .collect();
        self.expect = None;
        let Some(contents) = self.kernel.read_sets_of(&sets)? else { return Ok(None) };
        let held = held_of(contents);
        let covers = move |key: &EntryKey| match key.as_element() {
            Some(id) => sets.contains(&(id.family, id.map)),
            None => true,
        };
        Ok(Some(Sample::Part { held, covers: Box::new(covers) }))
    }
}
