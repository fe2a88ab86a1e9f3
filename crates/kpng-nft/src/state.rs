//! [`TableState`]: the elements kpng has committed, who wants each, and the difference an
//! update makes.
//!
//! Kept in one file on purpose: who owns an element and the update that follows from it
//! are one algorithm.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap as HashMap;

use kpng_model::Family;

use crate::objects::{ElementId, MapName, Value};

mod table;

use crate::packed::{PackedId, PackedValue};
use table::Table;

/// Who asked for an element. When owners disagree on a value, the lowest wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// The node's own elements.
    Node,
    /// A service, by the number the backend gave it.
    Service(u32),
    /// Elements found in the kernel at start-up, until an owner claims them.
    Kernel,
}

/// The element changes of one transaction.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TableDiff {
    /// Elements to delete (including the old value of replaced ones), grouped by set.
    pub deletes: Vec<(ElementId, Value)>,
    /// Elements to add (including the new value of replaced ones), grouped by set.
    pub adds: Vec<(ElementId, Value)>,
}

impl TableDiff {
    /// Whether the transaction would change no element.
    pub fn is_empty(&self) -> bool {
        self.deletes.is_empty() && self.adds.is_empty()
    }
}

/// An owner as a number, in the owners' order: the node 0, services their number,
/// kernel elements [`KERNEL`]; [`CONTESTED`] marks an element two or more owners want.
/// (Service numbers are never reused within a run; past four billion they would share
/// the last one.)
fn owner_code(owner: Owner) -> u32 {
    match owner {
        Owner::Node => 0,
        Owner::Service(n) => n.min(KERNEL - 1),
        Owner::Kernel => KERNEL,
    }
}

fn owner_of(code: u32) -> Owner {
    match code {
        0 => Owner::Node,
        KERNEL => Owner::Kernel,
        n => Owner::Service(n),
    }
}

const KERNEL: u32 = u32::MAX - 1;
const CONTESTED: u32 = u32::MAX;

/// One element: its only owner (or [`CONTESTED`]) and its effective value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Holder {
    owner: u32,
    value: PackedValue,
}

/// Every element kpng wants, with the owners wanting it. When owners disagree on a value
/// (two services claiming one external IP and port), the lowest owner wins, so the result
/// does not depend on the order of updates.
///
/// Nearly every element has one owner, kept in the element's entry beside its value; the
/// few that several owners want list them in `contested`. Ids are packed (an IPv4 element's
/// in 16 bytes inline) and each set has a hash table of its own: an IPv4 element's entry
/// takes 20 bytes in a set and 40 in a map, and its place in its owner's list 16, where an
/// [`ElementId`] with its owners took 84 and 52 (at 30,000 services the table holds half a
/// million elements, three in five of them in sets).
#[derive(Debug, Clone, Default)]
pub struct TableState {
    sets: BTreeMap<(Family, MapName), Table>,
    /// Elements wanted by two or more owners: each owner's value, lowest owner first.
    contested: HashMap<PackedId, Vec<(Owner, Value)>>,
    /// Each owner's elements; their values are in `sets`.
    owned: HashMap<Owner, Box<[PackedId]>>,
    len: usize,
}

impl TableState {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// The state the kernel holds: its elements, owned by [`Owner::Kernel`] until owners
    /// claim them.
    pub fn adopt(mut elements: Vec<(ElementId, Value)>) -> Self {
        elements.sort();
        elements.dedup_by(|a, b| a.0 == b.0);
        let mut state = TableState::default();
        let mut ids = Vec::with_capacity(elements.len());
        state.reserve(elements.iter());
        for (id, value) in &elements {
            let packed = PackedId::new(id);
            let holder = Holder { owner: KERNEL, value: (*value).into() };
            state.sets.entry((id.family, id.map)).or_default().put(packed.clone(), holder);
            ids.push(packed);
        }
        state.len = elements.len();
        if !ids.is_empty() {
            state.owned.insert(Owner::Kernel, ids.into_boxed_slice());
        }
        state
    }

    fn holder(&self, id: &ElementId, packed: &PackedId) -> Option<Holder> {
        self.sets.get(&(id.family, id.map)).and_then(|set| set.get(packed))
    }

    /// Makes room in each set for `elements` more.
    fn reserve<'e>(&mut self, elements: impl Iterator<Item = &'e (ElementId, Value)>) {
        let mut counts: BTreeMap<(Family, MapName), usize> = BTreeMap::new();
        for (id, _) in elements {
            *counts.entry((id.family, id.map)).or_default() += 1;
        }
        for (set, count) in counts {
            self.sets.entry(set).or_default().reserve(count);
        }
    }

    /// The effective value of an element.
    pub fn get(&self, id: &ElementId) -> Option<Value> {
        self.holder(id, &PackedId::new(id)).map(|h| h.value.into())
    }

    /// Every effective element, grouped by set.
    pub fn iter(&self) -> impl Iterator<Item = (ElementId, Value)> + Clone + '_ {
        self.sets.values().flat_map(|set| set.iter().map(|(id, h)| (id.id(), h.value.into())))
    }

    /// Every non-empty set, with its effective elements.
    pub fn sets(&self) -> impl Iterator<Item = SetElements<'_>> {
        let sets = self.sets.iter().filter(|(_, set)| !set.is_empty());
        sets.map(|(name, set)| SetElements { name: *name, set })
    }

    /// The number of effective elements.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no element is wanted.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The value `owner` wants for `id`, if it wants it.
    pub fn wanted(&self, owner: Owner, id: &ElementId) -> Option<Value> {
        self.value_of(owner, id, &PackedId::new(id))
    }

    /// The value `owner` wants for an element, if it wants it.
    fn value_of(&self, owner: Owner, id: &ElementId, packed: &PackedId) -> Option<Value> {
        let holder = self.holder(id, packed)?;
        match holder.owner {
            CONTESTED => {
                let owners = self.contested.get(packed)?;
                owners.iter().find(|(o, _)| *o == owner).map(|(_, v)| *v)
            }
            code => (code == owner_code(owner)).then(|| holder.value.into()),
        }
    }

    /// The elements `owner` wants now, with the values it wants.
    pub fn owned(&self, owner: Owner) -> impl Iterator<Item = (ElementId, Value)> + '_ {
        let ids = self.owned.get(&owner).map(|ids| &ids[..]).unwrap_or_default();
        ids.iter().filter_map(move |packed| {
            let id = packed.id();
            self.value_of(owner, &id, packed).map(|v| (id, v))
        })
    }

    /// Records that `owner` no longer wants `id`.
    fn remove(&mut self, owner: Owner, id: &ElementId, packed: &PackedId) {
        let Some(set) = self.sets.get_mut(&(id.family, id.map)) else { return };
        let Some(present) = set.get(packed) else { return };
        match present.owner {
            CONTESTED => {
                let Some(owners) = self.contested.get_mut(packed) else { return };
                owners.retain(|(o, _)| *o != owner);
                match owners.as_slice() {
                    [] => {
                        self.contested.remove(packed);
                        set.remove(packed);
                        self.len -= 1;
                    }
                    [(only, value)] => {
                        let holder = Holder { owner: owner_code(*only), value: (*value).into() };
                        set.put(packed.clone(), holder);
                        self.contested.remove(packed);
                    }
                    [(_, value), ..] => {
                        set.put(packed.clone(), Holder { owner: CONTESTED, value: (*value).into() })
                    }
                }
            }
            code if code == owner_code(owner) => {
                set.remove(packed);
                self.len -= 1;
            }
            _ => {}
        }
    }

    /// Replaces the elements of several owners at once and returns what changed in the
    /// effective state, grouped by set (elements of one set are adjacent). `updates` maps an
    /// owner to its new elements (empty: the owner is gone).
    pub fn update(&mut self, updates: Vec<(Owner, Vec<(ElementId, Value)>)>) -> TableDiff {
        if self.is_empty() && distinct_owners(&updates) {
            return self.load(updates);
        }
        let size: usize = updates.iter().map(|(_, new)| new.len()).sum();
        let mut touched: HashMap<ElementId, Option<Value>> =
            HashMap::with_capacity_and_hasher(size, Default::default());
        for (owner, new) in updates {
            let old = self.owned.remove(&owner).unwrap_or_default();
            for packed in &old {
                let id = packed.id();
                touched.entry(id).or_insert_with(|| self.get(&id));
                self.remove(owner, &id, packed);
            }
            for (id, _) in &new {
                touched.entry(*id).or_insert_with(|| self.get(id));
            }
            self.insert(owner, &new, None);
        }
        let mut diff = TableDiff::default();
        for (id, before) in touched {
            let after = self.get(&id);
            if before == after {
                continue;
            }
            if let Some(v) = before {
                diff.deletes.push((id, v));
            }
            if let Some(v) = after {
                diff.adds.push((id, v));
            }
        }
        diff.group_by_set();
        diff
    }

    /// Records that `owner` (holding nothing now) wants `new` (rendered elements come sorted,
    /// so each set is looked up once per run of its elements); what no owner held before
    /// goes to `gained`.
    fn insert(
        &mut self,
        owner: Owner,
        new: &[(ElementId, Value)],
        mut gained: Option<&mut Vec<(ElementId, Value)>>,
    ) {
        let mut ids = Vec::with_capacity(new.len());
        let code = owner_code(owner);
        for run in new.chunk_by(|a, b| (a.0.family, a.0.map) == (b.0.family, b.0.map)) {
            let set = self.sets.entry((run[0].0.family, run[0].0.map)).or_default();
            for (id, value) in run {
                let packed = PackedId::new(id);
                match set.add(packed.clone(), Holder { owner: code, value: (*value).into() }) {
                    Ok(()) => {
                        self.len += 1;
                        if let Some(gained) = gained.as_deref_mut() {
                            gained.push((*id, *value));
                        }
                    }
                    Err(present) => {
                        let owners = match present.owner {
                            CONTESTED => self.contested.entry(packed.clone()).or_default(),
                            only => {
                                let only = (owner_of(only), Value::from(present.value));
                                self.contested.entry(packed.clone()).or_insert_with(|| vec![only])
                            }
                        };
                        let at = owners.partition_point(|(o, _)| *o < owner);
                        owners.insert(at, (owner, *value));
                        set.put(
                            packed.clone(),
                            Holder { owner: CONTESTED, value: owners[0].1.into() },
                        );
                    }
                }
                ids.push(packed);
            }
        }
        if !ids.is_empty() {
            self.owned.insert(owner, ids.into_boxed_slice());
        }
    }

    /// [`TableState::update`] from nothing, each owner updated once: every effective element
    /// is an addition, so no record of what each update touched is needed (at a cold start,
    /// that record would be as large as the table).
    fn load(&mut self, updates: Vec<(Owner, Vec<(ElementId, Value)>)>) -> TableDiff {
        self.fill(updates);
        let mut adds = Vec::with_capacity(self.len);
        adds.extend(self.iter());
        TableDiff { adds, ..TableDiff::default() }
    }

    /// Fills an empty state with what `updates` want (each owner once), without listing
    /// the difference: every element is an addition ([`crate::plan::Plan::whole_state`]
    /// commits them from here).
    pub fn fill(&mut self, updates: Vec<(Owner, Vec<(ElementId, Value)>)>) {
        debug_assert!(self.is_empty() && distinct_owners(&updates));
        self.reserve(updates.iter().flat_map(|(_, new)| new));
        for (owner, new) in updates {
            self.insert(owner, &new, None);
        }
    }

    /// The change that turns tables holding `before`'s effective elements, in the sets
    /// `counts` accepts (the others go, or come back empty), into tables holding this
    /// state's; grouped by set. At a restart this compares what the services want with
    /// what the kernel holds without moving every element from one owner to another (and
    /// recording each move) as [`TableState::update`] would.
    pub fn changes_from(
        &self,
        before: &TableState,
        counts: impl Fn(Family, &MapName) -> bool,
    ) -> TableDiff {
        let mut diff = TableDiff::default();
        let before: BTreeMap<_, _> =
            before.sets.iter().filter(|((family, map), _)| counts(*family, map)).collect();
        for (name, set) in &before {
            let now = self.sets.get(*name);
            for (packed, then) in set.iter() {
                let id = || packed.id();
                match now.and_then(|now| now.get(packed)) {
                    Some(holder) if holder.value == then.value => {}
                    Some(holder) => {
                        diff.deletes.push((id(), then.value.into()));
                        diff.adds.push((id(), holder.value.into()));
                    }
                    None => diff.deletes.push((id(), then.value.into())),
                }
            }
        }
        for (name, set) in &self.sets {
            let then = before.get(name);
            for (packed, holder) in set.iter() {
                if then.is_none_or(|then| !then.contains_key(packed)) {
                    diff.adds.push((packed.id(), holder.value.into()));
                }
            }
        }
        diff.group_by_set();
        diff
    }

    /// Records what `updates` want, from owners in ascending order and each after every
    /// owner the state holds, and returns the elements the table gains, grouped by set.
    /// Later owners never take an element from an earlier one (the lowest owner wins), so
    /// what the table gains is exactly what no owner held before, with the value of the
    /// first owner that wants it; nothing changes value and nothing goes.
    pub fn add_later_owners(
        &mut self,
        updates: Vec<(Owner, Vec<(ElementId, Value)>)>,
    ) -> Vec<(ElementId, Value)> {
        let last = self.owned.keys().max().copied();
        debug_assert!(updates.windows(2).all(|w| w[0].0 < w[1].0));
        debug_assert!(updates.first().is_none_or(|(first, _)| Some(*first) > last));
        let mut gained = Vec::with_capacity(updates.iter().map(|(_, new)| new.len()).sum());
        for (owner, new) in updates {
            self.insert(owner, &new, Some(&mut gained));
        }
        gained.sort_unstable_by_key(|(id, _)| (id.family, id.map));
        gained
    }
}

/// The effective elements of one set of a [`TableState`].
#[derive(Debug, Clone, Copy)]
pub struct SetElements<'a> {
    name: (Family, MapName),
    set: &'a Table,
}

impl<'a> SetElements<'a> {
    /// The set's family and name.
    pub fn name(&self) -> (Family, MapName) {
        self.name
    }

    /// How many elements it holds.
    pub fn len(&self) -> usize {
        self.set.len()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.set.is_empty()
    }

    /// Each element with its effective value.
    pub fn iter(self) -> impl Iterator<Item = (ElementId, Value)> + 'a {
        self.set.iter().map(|(id, holder)| (id.id(), holder.value.into()))
    }
}

/// Whether no owner appears twice in `updates`.
fn distinct_owners(updates: &[(Owner, Vec<(ElementId, Value)>)]) -> bool {
    let mut owners: Vec<Owner> = updates.iter().map(|(owner, _)| *owner).collect();
    owners.sort_unstable();
    owners.windows(2).all(|pair| pair[0] != pair[1])
}

/// A set that loses at least this many elements, and more than twice as many as it keeps,
/// is flushed and refilled rather than emptied element by element.
pub const FLUSH_AT: usize = 256;

impl TableDiff {
    /// The same change, with every set that loses most of its elements flushed instead
    /// (`table`: the state once the change is made). The sets to flush are returned; their
    /// elements' deletes are dropped and every element they keep is added back, in the same
    /// transaction, so no packet sees them empty. At a restart over a table far larger than
    /// the cluster, this is one command per set instead of a delete per stale element.
    pub fn flushing_stale_sets(self, table: &TableState) -> (Vec<(Family, MapName)>, TableDiff) {
        let mut losses: HashMap<(Family, MapName), usize> = HashMap::default();
        for (id, _) in &self.deletes {
            *losses.entry((id.family, id.map)).or_default() += 1;
        }
        losses.retain(|_, lost| *lost >= FLUSH_AT);
        if losses.is_empty() {
            return (Vec::new(), self);
        }
        let kept = |set: &(Family, MapName)| table.sets.get(set).map_or(0, Table::len);
        let mut flushed: Vec<(Family, MapName)> = losses
            .into_iter()
            .filter(|(set, lost)| *lost > 2 * kept(set))
            .map(|(set, _)| set)
            .collect();
        if flushed.is_empty() {
            return (Vec::new(), self);
        }
        flushed.sort_unstable();
        let is_flushed = |id: &ElementId| flushed.binary_search(&(id.family, id.map)).is_ok();
        let mut diff = TableDiff {
            deletes: self.deletes.into_iter().filter(|(id, _)| !is_flushed(id)).collect(),
            adds: self.adds.into_iter().filter(|(id, _)| !is_flushed(id)).collect(),
        };
        for name in &flushed {
            if let Some(set) = table.sets.get(name) {
                diff.adds.extend(SetElements { name: *name, set }.iter());
            }
        }
        diff.group_by_set();
        (flushed, diff)
    }

    /// Puts the elements of one set next to each other (one netlink message per set);
    /// their order within a set does not matter.
    fn group_by_set(&mut self) {
        self.deletes.sort_unstable_by_key(|(id, _)| (id.family, id.map));
        self.adds.sort_unstable_by_key(|(id, _)| (id.family, id.map));
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};
    use std::net::IpAddr;

    use proptest::prelude::*;

    use kpng_model::Family;

    use super::*;
    use crate::objects::{Key, MapName};

    /// A small space of elements, so owners often want the same ones with other values.
    /// Hosts 6 and 7 are IPv6 and the count set is not among those packed inline, so both
    /// ways of keeping an element are exercised.
    fn element() -> impl Strategy<Value = (ElementId, Value)> {
        (0u8..8, 0u8..4, 0u16..3).prop_map(|(host, map, port)| {
            let map = [
                MapName::ClusterIps,
                MapName::ClusterDests,
                MapName::LocalDests,
                MapName::Count(crate::objects::PickKind::Cluster, 300),
            ][map as usize];
            let (family, ip) = match host {
                0..6 => (Family::V4, IpAddr::from([10, 0, 0, host])),
                _ => (Family::V6, IpAddr::from([0xfd00, 0, 0, 0, 0, 0, 0, u16::from(host)])),
            };
            let id = ElementId { family, map, key: Key::Addr(ip) };
            let value = if map == MapName::ClusterIps {
                Value::None
            } else {
                Value::Endpoint(IpAddr::from([10, 1, 0, host]), 8000 + port)
            };
            (id, value)
        })
    }

    /// Owner updates; an owner wants each element once, with one value (as rendered).
    fn update() -> impl Strategy<Value = Vec<(Owner, Vec<(ElementId, Value)>)>> {
        let wanted = prop::collection::btree_map(
            element().prop_map(|(id, _)| id),
            element().prop_map(|(_, v)| v),
            0..6,
        );
        prop::collection::vec((1u32..5, wanted.prop_map(|m| m.into_iter().collect())), 1..4)
            .prop_map(|v| v.into_iter().map(|(o, w)| (Owner::Service(o), w)).collect())
    }

    /// Replays a diff on a simulated kernel, as a transaction would.
    fn replay(kernel: &mut BTreeMap<ElementId, Value>, diff: &TableDiff) {
        for (id, value) in &diff.deletes {
            assert_eq!(kernel.remove(id), Some(*value), "deleted what the kernel did not hold");
        }
        for (id, value) in &diff.adds {
            assert!(kernel.insert(*id, *value).is_none(), "added an element twice");
        }
    }

    fn effective(state: &TableState) -> BTreeMap<ElementId, Value> {
        state.iter().collect()
    }

    proptest! {
        #[test]
        fn diffs_keep_the_kernel_equal_to_the_effective_state(
            updates in prop::collection::vec(update(), 1..8)
        ) {
            let mut state = TableState::new();
            let mut kernel = BTreeMap::new();
            // Each owner's latest wish, to check who wins.
            let mut wishes: BTreeMap<Owner, Vec<(ElementId, Value)>> = BTreeMap::new();
            for update in updates {
                for (owner, new) in &update {
                    wishes.insert(*owner, new.clone());
                }
                let diff = state.update(update);
                replay(&mut kernel, &diff);
                prop_assert_eq!(&kernel, &effective(&state));
                // The lowest owner wanting an element sets its value.
                let mut expected = BTreeMap::new();
                for (_, wanted) in wishes.iter().rev() {
                    for (id, value) in wanted {
                        expected.insert(*id, *value);
                    }
                }
                prop_assert_eq!(&kernel, &expected);
                for (owner, wanted) in &wishes {
                    let mut owned: Vec<_> = state.owned(*owner).collect();
                    owned.sort();
                    prop_assert_eq!(&owned, wanted);
                }
            }
        }

        #[test]
        fn a_restart_compares_the_wanted_state_with_the_kernel_as_an_update_would(
            kernel in prop::collection::vec(element(), 0..24),
            wanted in update(),
            refused in 0usize..5,
        ) {
            prop_assume!(distinct_owners(&wanted));
            // The general path: the kernel's elements adopted, then claimed by the owners.
            let mut claimed = TableState::adopt(kernel.clone());
            let mut updates = wanted.clone();
            updates.push((Owner::Kernel, Vec::new()));
            let mut expected = claimed.update(updates);
            let mut table = TableState::new();
            table.fill(wanted);
            prop_assert_eq!(effective(&table), effective(&claimed));
            let adopted = TableState::adopt(kernel);
            let sorted = |d: &mut TableDiff| {
                d.adds.sort();
                d.deletes.sort();
            };
            let mut diff = table.changes_from(&adopted, |_, _| true);
            prop_assert!(diff.adds.is_sorted_by_key(|(id, _)| (id.family, id.map)));
            prop_assert!(diff.deletes.is_sorted_by_key(|(id, _)| (id.family, id.map)));
            sorted(&mut diff);
            sorted(&mut expected);
            prop_assert_eq!(&diff, &expected);
            // A set refused (it goes, or comes back empty) loses nothing and gets all it wants.
            let sets: Vec<_> = table.sets.keys().chain(adopted.sets.keys()).copied().collect();
            let Some(gone) = sets.get(refused).copied() else { return Ok(()) };
            let mut diff = table.changes_from(&adopted, |family, map| (family, *map) != gone);
            sorted(&mut diff);
            let other = |(id, _): &&(ElementId, Value)| (id.family, id.map) != gone;
            let mine = |(id, _): &&(ElementId, Value)| (id.family, id.map) == gone;
            let mut wanted_there: Vec<_> = table.iter().filter(|e| mine(&e)).collect();
            wanted_there.sort();
            prop_assert!(diff.deletes.iter().all(|e| other(&e)));
            prop_assert_eq!(diff.adds.iter().filter(mine).copied().collect::<Vec<_>>(), wanted_there);
            prop_assert_eq!(
                diff.adds.iter().filter(other).collect::<Vec<_>>(),
                expected.adds.iter().filter(other).collect::<Vec<_>>()
            );
        }

        #[test]
        fn later_owners_gain_exactly_what_was_not_held(
            updates in prop::collection::vec(update(), 1..5)
        ) {
            // Owners in ascending order over the updates, as a cold start adds them.
            let mut runs = Vec::new();
            let mut seen = BTreeSet::new();
            for mut update in updates {
                update.sort_by_key(|(owner, _)| *owner);
                update.dedup_by_key(|(owner, _)| *owner);
                update.retain(|(owner, _)| seen.last().is_none_or(|last| owner > last));
                seen.extend(update.iter().map(|(owner, _)| *owner));
                runs.push(update);
            }
            let mut state = TableState::new();
            let mut kernel = BTreeMap::new();
            for run in runs {
                let mut reference = state.clone();
                let diff = reference.update(run.clone());
                prop_assert!(diff.deletes.is_empty());
                let gained = state.add_later_owners(run);
                prop_assert!(gained.is_sorted_by_key(|(id, _)| (id.family, id.map)));
                for (id, value) in &gained {
                    prop_assert!(kernel.insert(*id, *value).is_none(), "{:?} gained twice", id);
                }
                let mut adds = diff.adds.clone();
                adds.sort();
                let mut sorted = gained.clone();
                sorted.sort();
                prop_assert_eq!(sorted, adds);
                prop_assert_eq!(&kernel, &effective(&state));
                prop_assert_eq!(effective(&state), effective(&reference));
            }
        }

        #[test]
        fn loading_from_nothing_equals_updating(update in update()) {
            prop_assume!(distinct_owners(&update));
            let mut loaded = TableState::new();
            let diff = loaded.update(update.clone());
            // The general path: a state holding one element nothing else touches.
            let mut general = TableState::new();
            general.update(vec![(Owner::Service(9), vec![element_at(0)])]);
            let general_diff = general.update(update.clone());
            let sorted = |d: &TableDiff| {
                let mut adds = d.adds.clone();
                adds.sort();
                (adds, d.deletes.clone())
            };
            prop_assert_eq!(sorted(&diff), sorted(&general_diff));
            let mut rest = effective(&general);
            rest.remove(&element_at(0).0);
            prop_assert_eq!(effective(&loaded), rest.clone());
            // Filled without a difference, the state's sets hold exactly those elements.
            let mut filled = TableState::new();
            filled.fill(update);
            let mut by_set = BTreeMap::new();
            for set in filled.sets() {
                prop_assert!(!set.is_empty());
                for (id, value) in set.iter() {
                    prop_assert_eq!((id.family, id.map), set.name());
                    prop_assert!(by_set.insert(id, value).is_none());
                }
            }
            prop_assert_eq!(by_set, rest);
        }
    }

    fn element_at(host: u8) -> (ElementId, Value) {
        let id = ElementId {
            family: Family::V4,
            map: MapName::ClusterIps,
            key: Key::Addr(IpAddr::from([10, 9, 9, host])),
        };
        (id, Value::None)
    }

    fn addr_element(map: MapName, n: u32) -> (ElementId, Value) {
        let id =
            ElementId { family: Family::V4, map, key: Key::Addr(IpAddr::from(n.to_be_bytes())) };
        let value = match map {
            MapName::ClusterIps => Value::None,
            _ => Value::Endpoint(IpAddr::from([10, 1, 0, 1]), 80),
        };
        (id, value)
    }

    #[test]
    fn sets_that_lose_most_elements_are_flushed_and_refilled() {
        // The kernel holds 1,000 destinations and 300 cluster IPs; 10 of each stay, and
        // 400 local destinations of which 300 stay.
        let held: Vec<_> = (0..1000)
            .map(|n| addr_element(MapName::ClusterDests, n))
            .chain((0..300).map(|n| addr_element(MapName::ClusterIps, n)))
            .chain((0..400).map(|n| addr_element(MapName::LocalDests, n)))
            .collect();
        let mut state = TableState::adopt(held.clone());
        let wanted: Vec<_> = (0..10)
            .map(|n| addr_element(MapName::ClusterDests, n))
            .chain((0..10).map(|n| addr_element(MapName::ClusterIps, n)))
            .chain((0..300).map(|n| addr_element(MapName::LocalDests, n)))
            .chain([addr_element(MapName::ClusterDests, 5000)])
            .collect();
        let diff = state.update(vec![(Owner::Service(1), wanted), (Owner::Kernel, Vec::new())]);
        let (flushed, diff) = diff.flushing_stale_sets(&state);
        // 990 of 1,000 and 290 of 300 go: flushed; 100 of 400 go: deleted one by one.
        assert_eq!(
            flushed,
            [(Family::V4, MapName::ClusterIps), (Family::V4, MapName::ClusterDests)]
        );
        assert_eq!(diff.deletes.len(), 100);
        assert!(diff.deletes.iter().all(|(id, _)| id.map == MapName::LocalDests));
        // Replayed as a transaction: flush, deletes, adds; the kernel ends as the state.
        let mut kernel: BTreeMap<ElementId, Value> = held.into_iter().collect();
        kernel.retain(|id, _| !flushed.contains(&(id.family, id.map)));
        replay(&mut kernel, &diff);
        assert_eq!(kernel, effective(&state));
        // 10 cluster IPs, 11 destinations, 300 local destinations.
        assert_eq!(kernel.len(), 321);
    }
}
