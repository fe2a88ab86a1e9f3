//! The resync: the tables read back and reconciled with the whole node state in one
//! transaction (at start-up, after a failed transaction, after drift); over tables without
//! an element, the skeleton first, then whole services in transactions of a bounded size.

use std::collections::HashMap;
use std::mem::take;

use kpng_model::local::LocalServiceState;
use kpng_model::{Family, LocalState, ServiceKey};

use super::{
    NftBackend, ServiceOwners, ServiceUpdate, TableSync, large_counts, node_elements, render_update,
};
use crate::error::NftError;
use crate::kernel::KernelContents;
use crate::layout::Layout;
use crate::objects::{ElementId, GroupKey, MapName, SetKind, Value};
use crate::plan::{Command, Plan};
use crate::reconcile::{Present, Reconciled, reconcile};
use crate::render::{NodeFacts, Slots, seed_slots};
use crate::state::{Owner, TableDiff, TableState};

impl NftBackend {
    /// Reads the tables back and reconciles them with the whole of `state`.
    pub(super) fn resync(&mut self, state: &LocalState) -> Result<bool, NftError> {
        // A table holding far more services than the state asks for (a restart after most
        // of the cluster went) is not read element by element only to delete them: its
        // element sets are flushed and refilled in the same transaction.
        let wanted_cluster_ips: usize = state
            .services
            .values()
            .map(|s| Family::ALL.iter().filter(|f| s.service.cluster_ip(**f).is_some()).count())
            .sum();
        let stale = |held: usize| is_mostly_stale(held, wanted_cluster_ips);
        let contents = self.kernel.read_unless_stale(&stale)?;
        // A kernel that cannot say, or that takes whole tables (an aggregator), gets the
        // whole tables planned from nothing; what it said still seeds the slots, so that
        // endpoints keep their positions (and affinity clients their endpoints).
        let whole = contents.is_none() || self.kernel.publishes_whole();
        let contents = contents.unwrap_or_default();
        self.owners = ServiceOwners::default();
        self.slots.clear();
        self.group_hashes.clear();
        let to_render = ToRender {
            services: (state.services.iter())
                .map(|(key, service)| (self.owners.owner(key), key, service))
                .collect(),
            node: node_elements(state.node.as_ref()),
            facts: self.facts(state.node.as_ref()),
            layout: Layout {
                options: self.skeleton_options(state.node.as_ref()),
                ..Layout::default()
            },
        };
        // Tables without an element (a cold start): there is nothing to compare.
        let cold = !whole && contents.elements.is_empty() && contents.unread.is_empty();
        let synced = match cold {
            true => self.cold_start(to_render, &contents.present)?,
            false => self.reconcile_whole(to_render, contents, whole)?,
        };
        let Synced { table, layout, services, transactions } = synced;
        let changed = transactions > 0;
        if !changed {
            tracing::info!(elements = table.len(), "nftables: the kernel already holds this state");
        }
        self.state = table;
        self.layout = layout;
        for update in services {
            self.remember(update);
        }
        if changed {
            let elements = self.state.len();
            tracing::info!(elements, transactions, "nftables: the node state is {}", self.done());
        }
        self.sync = TableSync::InSync;
        Ok(changed)
    }

    /// Reconciles the tables with the services in one transaction that touches only what
    /// differs from `contents` (a kernel that publishes `whole` tables gets them whole).
    fn reconcile_whole(
        &mut self,
        to_render: ToRender<'_>,
        mut contents: KernelContents,
        whole: bool,
    ) -> Result<Synced, NftError> {
        let adopted = TableState::adopt(take(&mut contents.elements));
        let seed = |service: &LocalServiceState| seed_from_kernel(service, &adopted, &contents);
        let (services, updates, layout) = to_render.render(&seed);
        let mut table = TableState::new();
        table.fill(updates);
        if whole {
            contents = KernelContents::default();
        }
        let reconciled = reconcile(&layout.wanted(), &contents.present);
        // Elements of sets that go, or come back empty, are not the kernel's any more.
        let wanted = layout.wanted();
        let keep = |family: Family, map: &MapName| {
            let name = (family, map.name().into_owned());
            !whole && wanted.sets.contains_key(&name) && !reconciled.emptied.contains(&name)
        };
        // Sets whose elements were not read hold only what goes: emptied first, then refilled
        // with what the state wants (none of them was among those read).
        let unread: Vec<(Family, MapName)> =
            contents.unread.into_iter().filter(|(family, map)| keep(*family, map)).collect();
        // Over tables without an element, everything is an addition: the plan takes the
        // elements from the state itself rather than from a list as large.
        let fresh = adopted.sets().all(|set| !keep(set.name().0, &set.name().1));
        let (mut flushed, diff) = match fresh {
            true => (Vec::new(), TableDiff::default()),
            false => table.changes_from(&adopted, keep).flushing_stale_sets(&table),
        };
        drop(adopted);
        flushed.extend(unread);
        let mut plan = Plan::new();
        plan.commands.extend(reconciled.before.iter().cloned());
        for (family, map) in &flushed {
            plan.push(*family, Command::FlushSet(map.name().into_owned()));
        }
        plan.elements(false, &diff.deletes);
        match fresh {
            true => plan.whole_state(&table),
            false => plan.elements(true, &diff.adds),
        }
        plan.commands.extend(reconciled.after.iter().cloned());
        let transactions = usize::from(!plan.is_empty());
        if transactions > 0 {
            self.commit(&plan, whole)?;
        }
        drop(plan);
        log_reconciled(&reconciled);
        Ok(Synced { table, layout, services, transactions })
    }

    /// A cold start: a thread commits the tables' skeleton while the services are rendered,
    /// then their elements, whole services in transactions of about
    /// [`super::NftOptions::cold_start_transaction`] elements, each with what its services add
    /// to the skeleton (affinity groups, large counts). Services are rendered a part at a
    /// time and each transaction is prepared while the one before commits, so the whole
    /// table's elements are never listed at once. A refused transaction leaves what was
    /// committed before it in place: the next resync reads it back and completes the tables.
    fn cold_start(
        &mut self,
        to_render: ToRender<'_>,
        present: &Present,
    ) -> Result<Synced, NftError> {
        let ToRender { services, node, facts, mut layout } = to_render;
        let skeleton = reconcile(&layout.wanted(), present);
        let limit = self.options.cold_start_transaction;
        // No transaction waits in the channel: one commits while the next is prepared.
        let (sender, receiver) = std::sync::mpsc::sync_channel::<Part>(0);
        let span = tracing::Span::current();
        let mut table = TableState::new();
        let mut rendered = Vec::with_capacity(services.len());
        let committed = std::thread::scope(|scope| {
            let committer = scope.spawn(move || -> Result<usize, NftError> {
                let _span = span.enter();
                let mut transactions = 0;
                for part in receiver {
                    let mut plan = Plan::new();
                    plan.commands.extend(part.before);
                    plan.elements(true, &part.elements);
                    plan.commands.extend(part.after);
                    if !plan.is_empty() {
                        self.commit(&plan, false)?;
                        transactions += 1;
                    }
                }
                Ok(transactions)
            });
            log_reconciled(&skeleton);
            let skeleton_part =
                Part { before: skeleton.before, elements: Vec::new(), after: skeleton.after };
            let mut runs = Runs {
                sender,
                open: true,
                present: layout.wanted().as_present(),
                sent: (layout.large.len(), layout.groups.len()),
                table: &mut table,
            };
            // A closed channel: the committer stopped on an error, which it returns.
            runs.open = runs.sender.send(skeleton_part).is_ok();
            let seed = |service: &LocalServiceState| seed_slots(service, |_| None);
            let mut run: Updates = vec![(Owner::Node, node)];
            let mut count = run[0].1.len();
            for part in services.chunks(RENDER_PART) {
                let mut updates = render_all(part, &facts, &seed);
                for update in &mut updates {
                    let elements = take(&mut update.elements);
                    if count > 0 && count + elements.len() > limit {
                        runs.send(take(&mut run), &layout);
                        count = 0;
                    }
                    absorb(&mut layout, update, &elements);
                    count += elements.len();
                    run.push((update.owner, elements));
                }
                rendered.extend(updates);
                if !runs.open {
                    break;
                }
            }
            runs.send(run, &layout);
            drop(runs);
            committer.join().unwrap_or_else(|p| std::panic::resume_unwind(p))
        });
        Ok(Synced { table, layout, services: rendered, transactions: committed? })
    }
}

/// How many services a cold start renders at a time (on a thread per core): few enough
/// that a part's rendered elements (about 18,000 at four endpoints a service) weigh little
/// beside a transaction's, many enough that the threads are worth starting.
const RENDER_PART: usize = 1024;

/// A cold start's transactions after the skeleton, as they are handed to the committer.
struct Runs<'t> {
    sender: std::sync::mpsc::SyncSender<Part>,
    /// Whether the committer still takes transactions.
    open: bool,
    /// The layout as the transactions sent so far leave it, and its size (it only grows).
    present: Present,
    sent: (usize, usize),
    table: &'t mut TableState,
}

impl Runs<'_> {
    /// Records the services of `run` in the table and hands their elements to the
    /// committer, after what `layout` adds to the layout committed so far.
    fn send(&mut self, run: Updates, layout: &Layout) {
        if !self.open || run.is_empty() {
            return;
        }
        let (mut before, mut after) = (Vec::new(), Vec::new());
        let size = (layout.large.len(), layout.groups.len());
        if size != self.sent {
            let wanted = layout.wanted();
            let added = reconcile(&wanted, &self.present);
            log_reconciled(&added);
            (before, after) = (added.before, added.after);
            self.present = wanted.as_present();
            self.sent = size;
        }
        let elements = self.table.add_later_owners(run);
        let part = Part { before, elements, after };
        self.open = self.sender.send(part).is_ok();
    }
}

/// What a resync leaves: the state, the layout and the services as committed, and the
/// number of transactions it took.
struct Synced {
    table: TableState,
    layout: Layout,
    services: Vec<ServiceUpdate>,
    transactions: usize,
}

/// One transaction of a cold start.
struct Part {
    before: Vec<(Family, Command<'static>)>,
    elements: Vec<(ElementId, Value)>,
    after: Vec<(Family, Command<'static>)>,
}

/// What a resync renders: every service with its owner, the node's elements, the facts
/// rendering reads, and the layout before the services add to it.
struct ToRender<'s> {
    services: Vec<(Owner, &'s ServiceKey, &'s LocalServiceState)>,
    node: Vec<(ElementId, Value)>,
    facts: NodeFacts,
    layout: Layout,
}

impl ToRender<'_> {
    /// Renders the services (see [`render_all`]) and lists each owner's elements, the
    /// node's first; the layout comes back with the groups and large counts they use.
    fn render(
        self,
        seed: &(dyn Fn(&LocalServiceState) -> Slots + Sync),
    ) -> (Vec<ServiceUpdate>, Updates, Layout) {
        let ToRender { services, node, facts, mut layout } = self;
        let mut rendered = render_all(&services, &facts, seed);
        let mut updates = Vec::with_capacity(rendered.len() + 2);
        updates.push((Owner::Node, node));
        for update in &mut rendered {
            let elements = take(&mut update.elements);
            absorb(&mut layout, update, &elements);
            updates.push((update.owner, elements));
        }
        updates.push((Owner::Kernel, Vec::new()));
        (rendered, updates, layout)
    }
}

/// Adds to `layout` the affinity groups of a rendered service and the large counts its
/// `elements` use.
fn absorb(layout: &mut Layout, update: &ServiceUpdate, elements: &[(ElementId, Value)]) {
    for group in &update.groups {
        layout.groups.insert(group.hash, group.clone());
    }
    layout.large.extend(large_counts(elements.iter()));
}

/// Renders every service from nothing (no slots remembered yet), on a thread per core (see
/// [`kpng_model::parts`]).
fn render_all(
    services: &[(Owner, &ServiceKey, &LocalServiceState)],
    facts: &NodeFacts,
    seed: &(dyn Fn(&LocalServiceState) -> Slots + Sync),
) -> Vec<ServiceUpdate> {
    render_on(services, facts, seed, kpng_model::parts::threads_for(services.len()))
}

/// [`render_all`] on `threads` threads; the updates come in the order of `services`.
fn render_on(
    services: &[(Owner, &ServiceKey, &LocalServiceState)],
    facts: &NodeFacts,
    seed: &(dyn Fn(&LocalServiceState) -> Slots + Sync),
    threads: usize,
) -> Vec<ServiceUpdate> {
    let remembered = HashMap::new();
    kpng_model::parts::filter_map_in_parts(services, threads, |(owner, key, service)| {
        Some(render_update(&remembered, *owner, key, Some(*service), facts, seed))
    })
}

/// Each owner's wanted elements.
type Updates = Vec<(Owner, Vec<(ElementId, Value)>)>;

/// A service's slots as the kernel holds them: backends elements for ordinary groups,
/// the slot chains (with their holes) for services with groups of their own.
fn seed_from_kernel(
    service: &LocalServiceState,
    adopted: &TableState,
    contents: &KernelContents,
) -> Slots {
    let mut slots = seed_slots(service, |id| adopted.get(id));
    if crate::render::group_policy(&service.service, &NodeFacts::default()).is_some() {
        for group in group_keys(service) {
            let found = contents.affinity_slots(group.family, group.hash(&service.service.key));
            if found.is_empty() {
                slots.remove(&group);
            } else {
                slots.insert(group, found);
            }
        }
    }
    slots
}

/// Every group a service can have: per family with a cluster IP, port, and set.
fn group_keys(service: &LocalServiceState) -> Vec<GroupKey> {
    let svc = &service.service;
    let mut keys = Vec::new();
    for family in Family::ALL.into_iter().filter(|f| svc.cluster_ip(*f).is_some()) {
        for port in &svc.ports {
            for kind in [SetKind::Cluster, SetKind::Local] {
                keys.push(GroupKey {
                    family,
                    port: port.name.clone(),
                    protocol: port.protocol,
                    kind,
                });
            }
        }
    }
    keys
}

/// Whether a table holding `held` cluster IPs, when the state has `wanted`, is mostly stale:
/// at least [`crate::state::FLUSH_AT`] more, and more than twice as many more, as a set is
/// flushed rather than emptied element by element.
fn is_mostly_stale(held: usize, wanted: usize) -> bool {
    let stale = held.saturating_sub(wanted);
    stale >= crate::state::FLUSH_AT && stale > 2 * wanted
}

fn log_reconciled(reconciled: &Reconciled) {
    if reconciled.reasons.is_empty() {
        return;
    }
    let shown: Vec<&str> = reconciled.reasons.iter().take(8).map(String::as_str).collect();
    tracing::info!(
        differences = reconciled.reasons.len(),
        first = %shown.join("; "),
        "nftables: reconciled kpng's tables with the node state"
    );
}

#[cfg(test)]
mod tests {
    use kpng_local::{NodeLocal, project_node_state_with};
    use kpng_model::{GlobalModel, Object, Protocol};
    use kpng_testkit::builders::{endpoint, node, service, slice};

    use super::*;

    #[test]
    fn rendering_on_several_threads_gives_what_one_thread_gives() {
        let mut model = GlobalModel::new();
        model.apply(Object::Node(node("a", None, &["192.168.10.1"])));
        for i in 0..50u8 {
            let name = format!("s{i}");
            let ports = &[("http", Protocol::Tcp, 80)];
            model.apply(Object::Service(service("ns", &name, &[&format!("10.96.0.{i}")], ports)));
            let eps = (0..=i % 5).map(|e| endpoint(&format!("10.244.{e}.{i}"), "b")).collect();
            let ports = &[("http", Protocol::Tcp, 8080)];
            model.apply(Object::EndpointSlice(slice(
                "ns",
                &format!("{name}-1"),
                &name,
                ports,
                eps,
            )));
        }
        let state = project_node_state_with(&model, "a", &NodeLocal::default());
        let keyed: Vec<(Owner, &ServiceKey, &LocalServiceState)> =
            (state.services.iter().zip(1..)).map(|((k, s), n)| (Owner::Service(n), k, s)).collect();
        let facts = NodeFacts::default();
        let seed = |service: &LocalServiceState| seed_slots(service, |_| None);
        let shown = |updates: Vec<ServiceUpdate>| -> Vec<_> {
            updates.into_iter().map(|u| (u.owner, u.key, u.elements)).collect()
        };
        let one = shown(render_on(&keyed, &facts, &seed, 1));
        assert_eq!(one.len(), 50);
        assert!(one.iter().all(|(_, _, elements)| !elements.is_empty()));
        for threads in [2, 3, 7] {
            assert_eq!(shown(render_on(&keyed, &facts, &seed, threads)), one, "{threads} threads");
        }
    }
}
