//! [`Changes`]: what a producer's publications touched since its last batch, so that a
//! batch diffs, commits and rolls back only those objects: an element update costs the same
//! whatever the producer's state holds.
//!
//! Three grains: whole tables (a whole state, a table put or deleted), single chains and
//! sets (put, deleted, rules replaced), and single elements (added or removed). A batch
//! compares the desired and committed state of each touched object only; elements are
//! compared one by one, so an element added and removed again before the batch costs
//! nothing.

use std::collections::{BTreeMap, BTreeSet};

use crate::diff::{Phases, diff_table, diff_whole_table, element_commands};
use crate::model::{State, Table, TableKey, Update};

/// A chain or set: its table and name.
type Object = (TableKey, String);

/// What publications touched since the last batch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    /// Tables compared whole.
    pub tables: BTreeSet<TableKey>,
    /// Chains compared whole (in tables not compared whole).
    pub chains: BTreeSet<Object>,
    /// Sets compared whole (in tables not compared whole).
    pub sets: BTreeSet<Object>,
    /// Elements compared one by one, per set (of sets not compared whole).
    pub elements: BTreeMap<Object, BTreeSet<String>>,
}

impl Changes {
    /// Records what `update` touches; `desired` is the state before it is applied.
    pub fn record(&mut self, update: &Update, desired: &State) {
        match update {
            Update::Whole(state) => {
                self.tables.extend(desired.tables.keys().cloned());
                self.tables.extend(state.tables.keys().cloned());
            }
            Update::PutTable { table, .. } | Update::DeleteTable { table } => {
                self.tables.insert(table.clone());
            }
            Update::PutChain { table, name, .. }
            | Update::DeleteChain { table, name }
            | Update::ReplaceRules { table, chain: name, .. } => {
                self.chains.insert((table.clone(), name.clone()));
            }
            Update::PutSet { table, name, .. } | Update::DeleteSet { table, name } => {
                self.sets.insert((table.clone(), name.clone()));
            }
            Update::AddElements { table, set, elements }
            | Update::RemoveElements { table, set, elements } => {
                let touched = self.elements.entry((table.clone(), set.clone())).or_default();
                touched.extend(elements.iter().map(|e| crate::model::collapse(e)));
            }
        }
    }

    /// Adds what `other` touched.
    pub fn merge(&mut self, other: Changes) {
        self.tables.extend(other.tables);
        self.chains.extend(other.chains);
        self.sets.extend(other.sets);
        for (set, elements) in other.elements {
            self.elements.entry(set).or_default().extend(elements);
        }
    }

    fn whole_table(&self, key: &TableKey) -> bool {
        self.tables.contains(key)
    }

    /// The touched objects' commands that take `committed` to `desired`, by phase.
    pub fn diff(&self, producer: &str, committed: &State, desired: &State, phases: &mut Phases) {
        for key in &self.tables {
            let (have, want) = (committed.tables.get(key), desired.tables.get(key));
            diff_whole_table(producer, key, have, want, phases);
        }
        let partial: BTreeSet<&TableKey> = self
            .chains
            .iter()
            .chain(&self.sets)
            .chain(self.elements.keys())
            .map(|(key, _)| key)
            .filter(|key| !self.whole_table(key))
            .collect();
        for key in partial {
            let (Some(have), Some(want)) = (committed.tables.get(key), desired.tables.get(key))
            else {
                continue;
            };
            let (have_part, want_part) = self.parts(key, have, want);
            diff_table(key, &have_part, &want_part, phases);
            let elements = self.elements.range(range_of(key)).take_while(|((k, _), _)| k == key);
            for ((_, set), touched) in elements {
                if self.sets.contains(&(key.clone(), set.clone())) {
                    continue;
                }
                let (Some(old), Some(new)) = (have.sets.get(set), want.sets.get(set)) else {
                    continue;
                };
                let gone: Vec<&String> = touched
                    .iter()
                    .filter(|e| old.elements.contains(*e) && !new.elements.contains(*e))
                    .collect();
                let added: Vec<&String> = touched
                    .iter()
                    .filter(|e| new.elements.contains(*e) && !old.elements.contains(*e))
                    .collect();
                element_commands(&mut phases[1], "delete", key, set, &gone);
                element_commands(&mut phases[4], "add", key, set, &added);
            }
        }
    }

    /// The touched chains and sets of table `key`, as committed and as desired, with the
    /// chains that use a set being declared anew (nft requires them rewritten).
    fn parts(&self, key: &TableKey, have: &Table, want: &Table) -> (Table, Table) {
        let (mut have_part, mut want_part) = (Table::default(), Table::default());
        for name in names_in(&self.sets, key) {
            copy_entry(&have.sets, &mut have_part.sets, name);
            copy_entry(&want.sets, &mut want_part.sets, name);
        }
        for name in names_in(&self.chains, key) {
            copy_entry(&have.chains, &mut have_part.chains, name);
            copy_entry(&want.chains, &mut want_part.chains, name);
        }
        let redeclared: Vec<&String> = want_part
            .sets
            .iter()
            .filter(|(name, set)| {
                have_part
                    .sets
                    .get(*name)
                    .is_some_and(|old| old.kind != set.kind || old.declaration != set.declaration)
            })
            .map(|(name, _)| name)
            .collect();
        if !redeclared.is_empty() {
            for (name, chain) in &want.chains {
                let uses = chain
                    .rules
                    .iter()
                    .any(|r| redeclared.iter().any(|s| crate::diff::references(r, s)));
                if uses && !want_part.chains.contains_key(name) {
                    want_part.chains.insert(name.clone(), chain.clone());
                    copy_entry(&have.chains, &mut have_part.chains, name);
                }
            }
        }
        (have_part, want_part)
    }

    /// Makes the touched objects of `to` what they are in `from`: after a commit, the
    /// committed state takes the desired one's; after a refusal, the desired state goes back
    /// to the committed one's.
    pub fn copy(&self, from: &State, to: &mut State) {
        for key in &self.tables {
            match from.tables.get(key) {
                Some(table) => to.tables.insert(key.clone(), table.clone()),
                None => to.tables.remove(key),
            };
        }
        for (key, name) in self.chains.iter().filter(|(key, _)| !self.whole_table(key)) {
            if let (Some(source), Some(target)) = (from.tables.get(key), to.tables.get_mut(key)) {
                copy_entry(&source.chains, &mut target.chains, name);
            }
        }
        for (key, name) in self.sets.iter().filter(|(key, _)| !self.whole_table(key)) {
            if let (Some(source), Some(target)) = (from.tables.get(key), to.tables.get_mut(key)) {
                copy_entry(&source.sets, &mut target.sets, name);
            }
        }
        for ((key, name), touched) in &self.elements {
            if self.whole_table(key) || self.sets.contains(&(key.clone(), name.clone())) {
                continue;
            }
            let source = from.tables.get(key).and_then(|t| t.sets.get(name));
            let target = to.tables.get_mut(key).and_then(|t| t.sets.get_mut(name));
            let (Some(source), Some(target)) = (source, target) else { continue };
            for element in touched {
                if source.elements.contains(element) {
                    target.elements.insert(element.clone());
                } else {
                    target.elements.remove(element);
                }
            }
        }
    }
}

/// Where the objects of table `key` start in a map or set keyed by `(table, name)`.
fn range_of(key: &TableKey) -> std::ops::RangeFrom<Object> {
    (key.clone(), String::new())..
}

/// The names of the objects of table `key` in `objects`.
fn names_in<'a>(
    objects: &'a BTreeSet<Object>,
    key: &'a TableKey,
) -> impl Iterator<Item = &'a String> {
    objects.range(range_of(key)).take_while(move |(k, _)| k == key).map(|(_, name)| name)
}

/// Makes entry `name` of `to` what it is in `from` (absent if absent).
fn copy_entry<T: Clone>(from: &BTreeMap<String, T>, to: &mut BTreeMap<String, T>, name: &str) {
    match from.get(name) {
        Some(value) => to.insert(name.to_string(), value.clone()),
        None => to.remove(name),
    };
}
