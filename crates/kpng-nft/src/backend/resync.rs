//! The resync: the tables read back and reconciled with the whole node state in one
//! transaction (at start-up, after a failed transaction, after drift); over empty tables
//! with many elements, in several transactions of whole services.

use kpng_model::local::LocalServiceState;
use kpng_model::{Family, LocalState};

use super::{NftBackend, ServiceOwners, TableSync, large_counts, node_elements};
use crate::error::NftError;
use crate::kernel::KernelContents;
use crate::layout::Layout;
use crate::objects::{ElementId, GroupKey, SetKind, Value};
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
        let mut services = Vec::with_capacity(state.services.len());
        for (key, service) in &state.services {
            let owner = self.owners.owner(key);
            services.push(self.render(owner, key, Some(service), &facts, &seed));
        }
        let mut updates = vec![(Owner::Node, node_elements(state.node.as_ref()))];
        for update in &mut services {
            for group in &update.groups {
                layout.groups.insert(group.hash, group.clone());
            }
            updates.push((update.owner, std::mem::take(&mut update.elements)));
        }
        updates.push((Owner::Kernel, Vec::new()));
        let sizes: Vec<(Owner, usize)> = updates.iter().map(|(o, e)| (*o, e.len())).collect();
        layout.large = large_counts(updates.iter().flat_map(|(_, e)| e));
        if whole {
            contents = KernelContents::default();
        }
        let reconciled = reconcile(&layout.wanted(), &contents.present);
        // Elements of sets that go, or come back empty, are not the kernel's any more.
        let wanted = layout.wanted();
        let kept: Vec<(ElementId, Value)> = contents
            .elements
            .into_iter()
            .filter(|(id, _)| {
                let name = (id.family, id.map.name().into_owned());
                wanted.sets.contains_key(&name) && !reconciled.emptied.contains(&name)
            })
            .collect();
        drop(adopted);
        let mut table = TableState::adopt(kept);
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
        // Sets whose elements were not read hold only what goes: emptied first, then refilled
        // with what the state wants (none of them was among those read).
        for (family, map) in &contents.unread {
            let name = (*family, map.name().into_owned());
            if wanted.sets.contains_key(&name) && !reconciled.emptied.contains(&name) {
                flushed.push((*family, *map));
            }
        }
        // A cold start of a large table: whole services in transactions of a bounded size.
        let mut chunks = match fresh && !whole && flushed.is_empty() {
            true => owner_chunks(&sizes, self.options.cold_start_transaction),
            false => Vec::new(),
        }
        .into_iter();
        let first = chunks.next().filter(|_| chunks.len() > 0).map(|c| held(&table, &c));
        let mut plan = Plan::new();
        plan.commands.extend(reconciled.before.iter().cloned());
        for (family, map) in &flushed {
            plan.push(*family, Command::FlushSet(map.name().into_owned()));
        }
        plan.elements(false, &diff.deletes);
        match (fresh, &first) {
            (_, Some(first)) => plan.elements(true, first),
            (true, None) => plan.whole_state(&table),
            (false, None) => plan.elements(true, &diff.adds),
        }
        plan.commands.extend(reconciled.after.iter().cloned());
        let changed = !plan.is_empty();
        if changed {
            self.commit(&plan, whole)?;
        } else {
            tracing::info!(elements = table.len(), "nftables: the kernel already holds this state");
        }
        drop(plan);
        drop(first);
        log_reconciled(&reconciled);
        self.state = table;
        self.layout = layout;
        for update in services {
            self.remember(update);
        }
        let transactions = 1 + chunks.len();
        for chunk in chunks {
            let elements = held(&self.state, &chunk);
            let mut plan = Plan::new();
            plan.elements(true, &elements);
            // A failure leaves the services committed so far in place; the next change set
            // reads them back and completes the table.
            self.commit(&plan, false)?;
        }
        if changed {
            tracing::info!(
                elements = self.state.len(),
                transactions,
                "nftables: the node state is committed"
            );
        }
        self.sync = TableSync::InSync;
        Ok(changed)
    }
}

/// Owners in order, cut into runs of about `limit` elements (an owner is never cut). The
/// node's and the kernel's elements go with the first run.
fn owner_chunks(sizes: &[(Owner, usize)], limit: usize) -> Vec<Vec<Owner>> {
    let mut chunks: Vec<Vec<Owner>> = vec![Vec::new()];
    let mut count = 0;
    for (owner, size) in sizes {
        if matches!(owner, Owner::Service(_)) && count > 0 && count + size > limit {
            chunks.push(Vec::new());
            count = 0;
        }
        count += size;
        let last = chunks.len() - 1;
        let chunk = match owner {
            Owner::Service(_) => &mut chunks[last],
            Owner::Node | Owner::Kernel => &mut chunks[0],
        };
        chunk.push(*owner);
    }
    chunks
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
