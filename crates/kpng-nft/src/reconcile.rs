//! Reconciliation: the commands that turn the objects a table has (sets, chains and their
//! rules) into the objects it should have, touching only what differs.
//!
//! One mechanism serves every case: a reset compares what kpng wants with what the kernel
//! holds (a restart adopts a table that is already right, a repair rewrites only what was
//! tampered with); an incremental change compares the old layout with the new one within
//! the part that changed (an affinity group, the counts chains, the skeleton's options).
//! The commands come in two halves around the element updates of the same transaction:
//! `before` creates and rewrites (so new elements can refer to them), `after` deletes what
//! is no longer wanted (once no element refers to it).

use std::collections::{BTreeMap, BTreeSet};

use kpng_model::Family;
use kpng_netlink::nftables::objects::{CtHelperSpec, Hook, SetData};
use kpng_netlink::nftables::{ChainSpec, Expr};

use crate::plan::Command;
use crate::rules::Rule;
use crate::sets::SetDecl;

/// A set or chain, by family and name.
pub type Name = (Family, String);

/// What makes two sets the same set for the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SetShape {
    /// `NFT_SET_*` flags that matter (interval, map, timeout, eval, concat).
    pub flags: u32,
    /// Key type id.
    pub key_type: u32,
    /// Key bytes.
    pub key_len: u32,
    /// Map data: type id and bytes.
    pub data: Option<(u32, u32)>,
    /// Default timeout in milliseconds.
    pub timeout_ms: Option<u64>,
}

/// The flags [`SetShape`] compares.
pub const SHAPE_FLAGS: u32 = 0x4 | 0x8 | 0x10 | 0x20 | 0x80;

impl SetShape {
    /// The shape a declaration gives.
    pub fn of(decl: &SetDecl) -> SetShape {
        let spec = &decl.spec;
        let map = if spec.data.is_some() { 0x8 } else { 0 };
        SetShape {
            flags: (spec.flags | map) & SHAPE_FLAGS,
            key_type: spec.key_type,
            key_len: spec.key_len,
            data: spec.data.map(|d| match d {
                SetData::Verdict => (kpng_netlink::nftables::objects::DATA_VERDICT, 0),
                SetData::Value { type_id, len } => (type_id, len),
            }),
            timeout_ms: spec.timeout_ms,
        }
    }
}

/// A base chain's hook as the kernel reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookShape {
    /// The chain type (`nat`, `filter`).
    pub kind: String,
    /// The hook number.
    pub hook: u32,
    /// The priority.
    pub priority: i32,
}

/// A rule as the kernel reports it: its expressions (`None` for one kpng does not know).
pub type PresentRule = Vec<Option<Expr>>;

/// A chain as the kernel reports it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PresentChain {
    /// Its hook, for a base chain.
    pub hook: Option<HookShape>,
    /// Its rules, in order.
    pub rules: Vec<PresentRule>,
}

/// The shape the kernel reports for a chain declared with `hook`.
pub fn hook_shape(hook: &Option<Hook>) -> Option<HookShape> {
    hook.as_ref().map(|h| HookShape {
        kind: h.chain_type.to_string(),
        hook: h.num,
        priority: h.priority,
    })
}

/// A set kpng wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WantedSet {
    /// Its declaration.
    pub decl: SetDecl,
    /// The chain whose rules, when they change, make this set forget its elements (an
    /// affinity slot's clients when the slot gets another endpoint).
    pub forget_with: Option<String>,
}

/// Objects kpng wants in its tables.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Wanted {
    /// Families whose table must exist.
    pub tables: BTreeSet<Family>,
    /// Sets and maps.
    pub sets: BTreeMap<Name, WantedSet>,
    /// Chains and their rules.
    pub chains: BTreeMap<Name, (ChainSpec, Vec<Rule>)>,
    /// `ct helper` objects.
    pub helpers: BTreeMap<Name, CtHelperSpec>,
}

/// Objects a table has.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Present {
    /// Families whose table exists.
    pub tables: BTreeSet<Family>,
    /// Sets and maps.
    pub sets: BTreeMap<Name, SetShape>,
    /// Chains: hook, and rules (`None` for an expression kpng does not know).
    pub chains: BTreeMap<Name, PresentChain>,
    /// `ct helper` objects.
    pub helpers: BTreeMap<Name, CtHelperSpec>,
}

impl Wanted {
    /// What the table has once these objects are in it.
    pub fn as_present(&self) -> Present {
        Present {
            tables: self.tables.clone(),
            sets: self.sets.iter().map(|(n, s)| (n.clone(), SetShape::of(&s.decl))).collect(),
            chains: self
                .chains
                .iter()
                .map(|(n, (spec, rules))| {
                    let rules = rules.iter().map(|r| r.exprs.iter().cloned().map(Some).collect());
                    let chain =
                        PresentChain { hook: hook_shape(&spec.hook), rules: rules.collect() };
                    (n.clone(), chain)
                })
                .collect(),
            helpers: self.helpers.clone(),
        }
    }
}

/// The commands that reconcile a table, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Creations and rewrites, before the element updates.
    pub before: Vec<(Family, Command<'static>)>,
    /// Deletions, after the element updates.
    pub after: Vec<(Family, Command<'static>)>,
    /// Sets recreated (or created) empty: whatever elements the table had in them are gone.
    pub emptied: BTreeSet<Name>,
    /// What differed, one line each, for the logs.
    pub reasons: Vec<String>,
}

impl Reconciled {
    /// Whether nothing differed.
    pub fn is_empty(&self) -> bool {
        self.before.is_empty() && self.after.is_empty()
    }
}

pub(crate) fn same_rules(wanted: &[Rule], present: &[PresentRule]) -> bool {
    wanted.len() == present.len()
        && wanted.iter().zip(present).all(|(w, p)| {
            w.exprs.len() == p.len()
                && w.exprs
                    .iter()
                    .zip(p)
                    .all(|(a, b)| b.as_ref().map(Expr::canonical) == Some(a.canonical()))
        })
}

/// The sets a rule refers to (lookups and dynamic updates).
fn referenced_sets(rule: &Rule) -> impl Iterator<Item = &str> {
    rule.exprs.iter().filter_map(|e| match e {
        Expr::Lookup { set, .. } | Expr::DynsetUpdate { set, .. } => Some(set.as_str()),
        _ => None,
    })
}

/// The `ct helper` objects a rule assigns.
fn referenced_helpers(rule: &Rule) -> impl Iterator<Item = &str> {
    rule.exprs.iter().filter_map(|e| match e {
        Expr::CtHelperSet { name } => Some(name.as_str()),
        _ => None,
    })
}

/// The commands that bring `present` to `wanted`. Objects in `present` that `wanted` does
/// not name are deleted.
pub fn reconcile(wanted: &Wanted, present: &Present) -> Reconciled {
    let mut out = Reconciled::default();
    let label =
        |(family, name): &Name| format!("{} {}", crate::objects::table_family(*family), name);
    // In a table that is not there yet, every object is missing: one reason says it all.
    let fresh = |name: &Name| !present.tables.contains(&name.0);

    for family in wanted.tables.difference(&present.tables) {
        out.before.push((*family, Command::AddTable));
        out.reasons.push(format!("table {} kpng missing", crate::objects::table_family(*family)));
    }
    // Helper objects are created before the rules that assign them, and deleted after the
    // rules that did (their chains are emptied first). Another definition under the same
    // name is replaced after the chains referring to it are emptied.
    let rehelped: BTreeSet<&Name> = wanted
        .helpers
        .iter()
        .filter(|(name, spec)| present.helpers.get(*name).is_some_and(|p| p != *spec))
        .map(|(name, _)| name)
        .collect();
    // Sets that exist with another definition must be deleted and created again.
    let reshaped: BTreeSet<&Name> = wanted
        .sets
        .iter()
        .filter(|(name, set)| {
            present.sets.get(*name).is_some_and(|s| *s != SetShape::of(&set.decl))
        })
        .map(|(name, _)| name)
        .collect();
    // Chains to rewrite: different rules or hook, or rules referring to a reshaped set.
    let mut rewrite: BTreeSet<&Name> = BTreeSet::new();
    let mut rehook: BTreeSet<&Name> = BTreeSet::new();
    for (name, (spec, rules)) in &wanted.chains {
        let Some(PresentChain { hook, rules: present_rules }) = present.chains.get(name) else {
            continue;
        };
        if *hook != hook_shape(&spec.hook) {
            rehook.insert(name);
            out.reasons.push(format!("chain {}: hook changed", label(name)));
        } else if !same_rules(rules, present_rules) {
            rewrite.insert(name);
            out.reasons.push(format!(
                "chain {}: {} rules held, {} wanted, content differs",
                label(name),
                present_rules.len(),
                rules.len()
            ));
        } else if rules
            .iter()
            .flat_map(referenced_sets)
            .any(|s| reshaped.contains(&(name.0, s.to_string())))
            || rules
                .iter()
                .flat_map(referenced_helpers)
                .any(|h| rehelped.contains(&(name.0, h.to_string())))
        {
            rewrite.insert(name);
        }
    }
    let unwanted_chains: Vec<&Name> =
        present.chains.keys().filter(|n| !wanted.chains.contains_key(*n)).collect();
    for name in &unwanted_chains {
        out.reasons.push(format!("chain {} not wanted", label(name)));
    }
    // Empty the chains to rewrite and those to delete, so nothing refers to what goes.
    for name in rewrite.iter().chain(&rehook).chain(&unwanted_chains) {
        if present.chains.get(*name).is_some_and(|c| !c.rules.is_empty()) {
            out.before.push((name.0, Command::FlushChain(name.1.clone())));
        }
    }
    for name in &rehook {
        out.before.push((name.0, Command::DeleteChain(name.1.clone())));
    }
    for name in &rehelped {
        out.before.push((name.0, Command::DeleteCtHelper(name.1.clone())));
        out.reasons.push(format!("ct helper {}: definition changed", label(name)));
    }
    for (name, spec) in &wanted.helpers {
        if !present.helpers.contains_key(name) || rehelped.contains(name) {
            if !present.helpers.contains_key(name) && !fresh(name) {
                out.reasons.push(format!("ct helper {} missing", label(name)));
            }
            out.before.push((name.0, Command::AddCtHelper(spec.clone())));
        }
    }
    for name in &reshaped {
        out.before.push((name.0, Command::DeleteSet(name.1.clone())));
        out.reasons.push(format!("set {}: definition changed", label(name)));
    }
    for (name, set) in &wanted.sets {
        let missing = !present.sets.contains_key(name);
        if missing || reshaped.contains(name) {
            if missing && !fresh(name) {
                out.reasons.push(format!("set {} missing", label(name)));
            }
            out.before.push((name.0, Command::AddSet(set.decl.clone())));
            out.emptied.insert(name.clone());
        } else if set.forget_with.as_ref().is_some_and(|c| rewrite.contains(&(name.0, c.clone()))) {
            out.before.push((name.0, Command::FlushSet(name.1.clone())));
        }
    }
    for (name, (spec, _)) in &wanted.chains {
        if !present.chains.contains_key(name) || rehook.contains(name) {
            if !present.chains.contains_key(name) && !fresh(name) {
                out.reasons.push(format!("chain {} missing", label(name)));
            }
            out.before.push((name.0, Command::AddChain(spec.clone())));
        }
    }
    for (name, (_, rules)) in &wanted.chains {
        if present.chains.contains_key(name) && !rewrite.contains(name) && !rehook.contains(name) {
            continue;
        }
        for rule in rules {
            out.before
                .push((name.0, Command::AddRule { chain: name.1.clone(), rule: rule.clone() }));
        }
    }
    for name in unwanted_chains {
        out.after.push((name.0, Command::DeleteChain(name.1.clone())));
    }
    for name in present.sets.keys().filter(|n| !wanted.sets.contains_key(*n)) {
        out.reasons.push(format!("set {} not wanted", label(name)));
        out.after.push((name.0, Command::DeleteSet(name.1.clone())));
    }
    for name in present.helpers.keys().filter(|n| !wanted.helpers.contains_key(*n)) {
        out.reasons.push(format!("ct helper {} not wanted", label(name)));
        out.after.push((name.0, Command::DeleteCtHelper(name.1.clone())));
    }
    out
}

#[cfg(test)]
mod tests;
