//! From what is committed to what a producer wants: the nft commands that touch only what
//! changed, in an order that is valid inside one transaction.
//!
//! Phases, in order:
//! 1. `delete table` for tables no longer wanted; `flush chain` for every chain whose rules
//!    change or that goes away (so nothing references what later phases delete);
//! 2. `delete element` from sets that stay;
//! 3. `delete chain`, `delete set` (removed, or redeclared in a way nft cannot update);
//! 4. `add table` (with the comment naming the owner), `add set`, `add chain` (new, or a
//!    base chain's policy changed);
//! 5. `add element` (after chains exist: a verdict map may jump to one);
//! 6. `add rule`, in order, for every flushed or new chain (after every set and chain it
//!    may reference).

use std::collections::BTreeSet;
use std::fmt;

use crate::model::{Chain, Set, State, Table, TableKey};

/// Elements per `add element`/`delete element` command: a netlink message of many more
/// overflows a nested attribute's 16-bit length.
const ELEMENTS_PER_COMMAND: usize = 500;

/// The prefix of the comment that marks a table as the aggregator's; the producer's name
/// follows it.
pub const OWNER_COMMENT: &str = "kpng-aggregator producer=";

/// The comment that marks `producer`'s tables.
pub fn owner_comment(producer: &str) -> String {
    format!("{OWNER_COMMENT}{producer}")
}

/// The producer named by an owner comment, if it is one.
pub fn comment_owner(comment: &str) -> Option<&str> {
    comment.strip_prefix(OWNER_COMMENT).filter(|name| !name.is_empty())
}

/// nft commands, one per line, for `nft -f`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Script {
    /// The commands in order.
    pub commands: Vec<String>,
}

impl Script {
    /// Whether it changes nothing.
    pub fn is_empty(&self) -> bool {
        self.commands.is_empty()
    }

    /// Appends another script's commands.
    pub fn extend(&mut self, other: &Script) {
        self.commands.extend(other.commands.iter().cloned());
    }
}

impl fmt::Display for Script {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for command in &self.commands {
            writeln!(f, "{command}")?;
        }
        Ok(())
    }
}

/// Commands by phase (see the module docs).
pub type Phases = [Vec<String>; 6];

impl Script {
    /// The commands of `phases`, in phase order.
    pub fn from_phases(phases: Phases) -> Script {
        Script { commands: phases.into_iter().flatten().collect() }
    }
}

/// The commands that take `producer`'s tables from `committed` to `desired`, comparing
/// everything (see [`Changes`](crate::changes::Changes) for the touched objects only).
pub fn diff(producer: &str, committed: &State, desired: &State) -> Script {
    let keys: BTreeSet<&TableKey> = committed.tables.keys().chain(desired.tables.keys()).collect();
    let mut phases = Phases::default();
    for key in keys {
        let (have, want) = (committed.tables.get(key), desired.tables.get(key));
        diff_whole_table(producer, key, have, want, &mut phases);
    }
    Script::from_phases(phases)
}

/// The commands for table `key`, from `have` to `want` (`None`: it does not exist).
pub(crate) fn diff_whole_table(
    producer: &str,
    key: &TableKey,
    have: Option<&Table>,
    want: Option<&Table>,
    phases: &mut Phases,
) {
    match (have, want) {
        (Some(_), None) => phases[0].push(format!("delete table {key}")),
        (None, Some(want)) => {
            phases[3].push(table_command(key, producer));
            diff_table(key, &Table::default(), want, phases);
        }
        (Some(have), Some(want)) => diff_table(key, have, want, phases),
        (None, None) => {}
    }
}

/// `add table`, with the comment naming its owner.
fn table_command(key: &TableKey, producer: &str) -> String {
    format!("add table {key} {{ comment \"{}\"; }}", owner_comment(producer))
}

pub(crate) fn diff_table(key: &TableKey, have: &Table, want: &Table, phases: &mut Phases) {
    // Sets redeclared: deleted and added again, after flushing every chain that uses them.
    let mut recreated_sets = BTreeSet::new();
    for (name, set) in &want.sets {
        match have.sets.get(name) {
            Some(old) if old.declaration == set.declaration && old.kind == set.kind => {
                let gone: Vec<&String> = old.elements.difference(&set.elements).collect();
                let new: Vec<&String> = set.elements.difference(&old.elements).collect();
                element_commands(&mut phases[1], "delete", key, name, &gone);
                element_commands(&mut phases[4], "add", key, name, &new);
            }
            Some(old) => {
                recreated_sets.insert(name.as_str());
                phases[2].push(format!("delete {} {key} {name}", old.kind.as_str()));
                add_set(key, name, set, phases);
            }
            None => add_set(key, name, set, phases),
        }
    }
    for (name, old) in &have.sets {
        if !want.sets.contains_key(name) {
            phases[2].push(format!("delete {} {key} {name}", old.kind.as_str()));
        }
    }
    for (name, chain) in &want.chains {
        let uses_recreated =
            |c: &Chain| c.rules.iter().any(|r| recreated_sets.iter().any(|s| references(r, s)));
        match have.chains.get(name) {
            Some(old) if old.declaration == chain.declaration => {
                if old.rules != chain.rules || uses_recreated(old) {
                    phases[0].push(format!("flush chain {key} {name}"));
                    add_rules(key, name, chain, phases);
                }
            }
            Some(old) if policy_only(old, chain) => {
                phases[3].push(add_chain(key, name, chain));
                if old.rules != chain.rules || uses_recreated(old) {
                    phases[0].push(format!("flush chain {key} {name}"));
                    add_rules(key, name, chain, phases);
                }
            }
            Some(_) => {
                phases[0].push(format!("flush chain {key} {name}"));
                phases[2].push(format!("delete chain {key} {name}"));
                phases[3].push(add_chain(key, name, chain));
                add_rules(key, name, chain, phases);
            }
            None => {
                phases[3].push(add_chain(key, name, chain));
                add_rules(key, name, chain, phases);
            }
        }
    }
    for name in have.chains.keys() {
        if !want.chains.contains_key(name) {
            phases[0].push(format!("flush chain {key} {name}"));
            phases[2].push(format!("delete chain {key} {name}"));
        }
    }
}

/// Whether `rule` names the set `set` (`@set` not followed by more of a name).
pub(crate) fn references(rule: &str, set: &str) -> bool {
    let needle = format!("@{set}");
    rule.match_indices(&needle).any(|(at, _)| {
        let after = rule[at + needle.len()..].chars().next();
        !after.is_some_and(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
    })
}

/// Whether two base chains differ in their policy only (nft updates that in place).
fn policy_only(old: &Chain, new: &Chain) -> bool {
    let without_policy = |chain: &Chain| {
        chain.declaration.as_ref().map(|d| {
            d.split(';')
                .map(str::trim)
                .filter(|s| !s.starts_with("policy"))
                .collect::<Vec<_>>()
                .join(";")
        })
    };
    old.declaration.is_some()
        && new.declaration.is_some()
        && without_policy(old) == without_policy(new)
}

fn add_chain(key: &TableKey, name: &str, chain: &Chain) -> String {
    match &chain.declaration {
        Some(declaration) => format!("add chain {key} {name} {{ {declaration} }}"),
        None => format!("add chain {key} {name}"),
    }
}

fn add_rules(key: &TableKey, name: &str, chain: &Chain, phases: &mut Phases) {
    phases[5].extend(chain.rules.iter().map(|rule| format!("add rule {key} {name} {rule}")));
}

fn add_set(key: &TableKey, name: &str, set: &Set, phases: &mut Phases) {
    let kind = set.kind.as_str();
    phases[3].push(format!("add {kind} {key} {name} {{ {} }}", set.declaration));
    let all: Vec<&String> = set.elements.iter().collect();
    element_commands(&mut phases[4], "add", key, name, &all);
}

pub(crate) fn element_commands(
    out: &mut Vec<String>,
    verb: &str,
    key: &TableKey,
    set: &str,
    elements: &[&String],
) {
    for chunk in elements.chunks(ELEMENTS_PER_COMMAND) {
        let list = chunk.iter().map(|e| e.as_str()).collect::<Vec<_>>().join(", ");
        out.push(format!("{verb} element {key} {set} {{ {list} }}"));
    }
}

#[cfg(test)]
mod tests;
