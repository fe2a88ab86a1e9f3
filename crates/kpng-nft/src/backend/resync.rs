//! The resync: the tables read back and reconciled with the whole node state in one
//! transaction (at start-up, after a failed transaction, after drift); over empty tables
//! with many elements, in several transactions of whole services.

use std::collections::HashMap;

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
use crate::reconcile::{Reconciled, reconcile};
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
        let mut contents = contents.unwrap_or_default();
        let adopted = TableState::adopt(contents.elements.clone());
        self.owners = ServiceOwners::default();
        self.slots.clear();
        self.group_hashes.clear();
        let facts = self.facts(state.node.as_ref());
        let seed = |service: &LocalServiceState| seed_from_kernel(service, &adopted, &contents);
        let mut layout =
            Layout { options: self.skeleton_options(state.node.as_ref()), ..Layout::default() };
        let keyed: Vec<(Owner, &ServiceKey, &LocalServiceState)> = (state.services.iter())
            .map(|(key, service)| (self.owners.owner(key), key, service))
            .collect();
        let mut services = render_all(&keyed, &facts, &seed);
        let mut updates = vec![(Owner::Node, node_elements(state.node.as_ref()))];
        for update in &mut services {
            for group in &update.groups {
                layout.groups.insert(group.hash, group.clone());
            }
            updates.push((update.owner, std::mem::take(&mut update.elements)));
        }
        updates.push((Owner::Kernel, Vec::new()));
        layout.large = large_counts(updates.iter().flat_map(|(_, e)| e));
        if whole {
            contents = KernelContents::default();
        }
        let reconciled = reconcile(&layout.wanted(), &contents.present);
        // Elements of sets that go, or come back empty, are not the kernel's any more.
        let wanted = layout.wanted();
        let keep = |family: Family, map: &MapName| {
            let name = (family, map.name().into_owned());
            wanted.sets.contains_key(&name) && !reconciled.emptied.contains(&name)
        };
        let kept: Vec<(ElementId, Value)> =
            contents.elements.into_iter().filter(|(id, _)| keep(id.family, &id.map)).collect();
        // Sets whose elements were not read hold only what goes: emptied first, then refilled
        // with what the state wants (none of them was among those read).
        let unread: Vec<(Family, MapName)> =
            contents.unread.into_iter().filter(|(family, map)| keep(*family, map)).collect();
        drop(adopted);
        let table = TableState::adopt(kept);
        let elements: usize = updates.iter().map(|(_, e)| e.len()).sum();
        let cold = table.is_empty() && !whole && unread.is_empty();
        let (table, transactions) = match cold && elements > self.options.cold_start_transaction {
            true => self.commit_in_runs(table, updates, &reconciled)?,
            false => self.commit_whole(table, updates, unread, &reconciled, whole)?,
        };
        let changed = transactions > 0;
        if !changed {
            tracing::info!(elements = table.len(), "nftables: the kernel already holds this state");
        }
        log_reconciled(&reconciled);
        self.state = table;
        self.layout = layout;
        for update in services {
            self.remember(update);
        }
        if changed {
            let elements = self.state.len();
            tracing::info!(elements, transactions, "nftables: the node state is committed");
        }
        self.sync = TableSync::InSync;
        Ok(changed)
    }

    /// Commits `updates` over `table` (what the kernel holds of them) in one transaction
    /// that also reconciles the rest of the tables; returns the state and the number of
    /// transactions (none when nothing differs).
    fn commit_whole(
        &mut self,
        mut table: TableState,
        updates: Updates,
        unread: Vec<(Family, MapName)>,
        reconciled: &Reconciled,
        whole: bool,
    ) -> Result<(TableState, usize), NftError> {
        // Over tables without an element (a cold start), everything is an addition: the
        // plan takes the elements from the state itself rather than from a list as large.
        let fresh = table.is_empty();
        let (mut flushed, diff) = match fresh {
            true => {
                table.fill(updates);
                (Vec::new(), TableDiff::default())
            }
            false => table.update(updates).flushing_stale_sets(&table),
        };
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
        if plan.is_empty() {
            return Ok((table, 0));
        }
        self.commit(&plan, whole)?;
        drop(plan);
        Ok((table, 1))
    }

    /// A cold start of many elements: whole services in transactions of about
    /// [`super::NftOptions::cold_start_transaction`] elements, the first with the rest of
    /// the tables. A thread commits each transaction while the next is prepared. A refused
    /// transaction leaves the services before it in place (the next resync reads them back
    /// and completes the table).
    fn commit_in_runs(
        &mut self,
        mut table: TableState,
        updates: Updates,
        reconciled: &Reconciled,
    ) -> Result<(TableState, usize), NftError> {
        table.reserve_for(updates.iter().flat_map(|(_, e)| e));
        let runs = runs_of_owners(updates, self.options.cold_start_transaction);
        let (sender, receiver) = std::sync::mpsc::sync_channel::<Vec<(ElementId, Value)>>(1);
        let span = tracing::Span::current();
        let committed = std::thread::scope(|scope| {
            let committer = scope.spawn(move || -> Result<usize, NftError> {
                let _span = span.enter();
                let mut transactions = 0;
                for elements in receiver {
                    let mut plan = Plan::new();
                    if transactions == 0 {
                        plan.commands.extend(reconciled.before.iter().cloned());
                    }
                    plan.elements(true, &elements);
                    if transactions == 0 {
                        plan.commands.extend(reconciled.after.iter().cloned());
                    }
                    self.commit(&plan, false)?;
                    transactions += 1;
                }
                Ok(transactions)
            });
            for run in runs {
                let owners: Vec<Owner> = run.iter().map(|(owner, _)| *owner).collect();
                table.add_owners(run);
                // A closed channel: the committer stopped on an error, which it returns.
                if sender.send(held(&table, &owners)).is_err() {
                    break;
                }
            }
            drop(sender);
            committer.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic))
        })?;
        Ok((table, committed))
    }
}

/// Below this many services, rendering them all stays on one thread.
const PARALLEL_RENDER: usize = 2_000;

/// Renders every service from nothing (no slots remembered yet), on a thread per core: at
/// start-up, tens of thousands of services are rendered on the way to the first commit.
fn render_all(
    services: &[(Owner, &ServiceKey, &LocalServiceState)],
    facts: &NodeFacts,
    seed: &(dyn Fn(&LocalServiceState) -> Slots + Sync),
) -> Vec<ServiceUpdate> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
    match services.len() < PARALLEL_RENDER {
        true => render_on(services, facts, seed, 1),
        false => render_on(services, facts, seed, threads),
    }
}

/// [`render_all`] on `threads` threads, each rendering a contiguous part; the updates
/// come in the order of `services`.
fn render_on(
    services: &[(Owner, &ServiceKey, &LocalServiceState)],
    facts: &NodeFacts,
    seed: &(dyn Fn(&LocalServiceState) -> Slots + Sync),
    threads: usize,
) -> Vec<ServiceUpdate> {
    let remembered = HashMap::new();
    let render = |part: &[(Owner, &ServiceKey, &LocalServiceState)]| {
        let each = |(owner, key, service): &(Owner, &ServiceKey, &LocalServiceState)| {
            render_update(&remembered, *owner, key, Some(*service), facts, seed)
        };
        part.iter().map(each).collect::<Vec<_>>()
    };
    if threads < 2 || services.is_empty() {
        return render(services);
    }
    std::thread::scope(|scope| {
        let parts: Vec<_> = (services.chunks(services.len().div_ceil(threads)))
            .map(|part| scope.spawn(move || render(part)))
            .collect();
        let parts = parts.into_iter().map(|part| part.join());
        parts
            .flat_map(|part| part.unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect()
    })
}

/// Each owner's wanted elements.
type Updates = Vec<(Owner, Vec<(ElementId, Value)>)>;

/// `updates` in order, cut into runs of about `limit` elements (an owner is never cut); the
/// node's and the kernel's go with the first run.
fn runs_of_owners(updates: Updates, limit: usize) -> Vec<Updates> {
    let mut runs: Vec<Updates> = vec![Vec::new()];
    let mut count = 0;
    for (owner, elements) in updates {
        if !matches!(owner, Owner::Service(_)) {
            count += elements.len();
            runs[0].push((owner, elements));
            continue;
        }
        if count > 0 && count + elements.len() > limit {
            runs.push(Vec::new());
            count = 0;
        }
        count += elements.len();
        if let Some(run) = runs.last_mut() {
            run.push((owner, elements));
        }
    }
    runs
}

/// The elements `owners` hold in `state`, grouped by set.
fn held(state: &TableState, owners: &[Owner]) -> Vec<(ElementId, Value)> {
    let mut elements: Vec<_> = owners.iter().flat_map(|owner| state.held(*owner)).collect();
    elements.sort_unstable_by_key(|(id, _)| (id.family, id.map));
    elements
}

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
