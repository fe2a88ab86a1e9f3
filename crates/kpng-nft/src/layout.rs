//! [`Layout`]: the objects kpng's tables hold besides elements — the skeleton for the
//! current options, the count sets and pick rules of endpoint counts beyond the pick tree,
//! and the affinity groups — as [`Wanted`] objects for reconciliation, whole or in part.

use std::collections::{BTreeMap, BTreeSet};

use kpng_model::Family;
use kpng_netlink::nftables::ChainSpec;

use crate::affinity::AffinityGroup;
use crate::objects::{MapName, PickKind, affinity_slot};
use crate::reconcile::{Wanted, WantedSet};
use crate::sets::{affinity_declaration, declaration};
use crate::skeleton::{SkeletonOptions, count_rule, skeleton};

/// An endpoint count beyond the pick tree, in use for one pick kind and family: it has a
/// count set and a rule in the kind's counts chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LargeCount {
    /// The family.
    pub family: Family,
    /// The pick kind.
    pub kind: PickKind,
    /// The endpoint count.
    pub count: u32,
}

/// What kpng's tables hold besides elements.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Layout {
    /// The skeleton's options.
    pub options: SkeletonOptions,
    /// Counts beyond the tree, with their sets and rules.
    pub large: BTreeSet<LargeCount>,
    /// Affinity groups by hash.
    pub groups: BTreeMap<u64, AffinityGroup>,
}

impl Layout {
    /// Every object of the layout.
    pub fn wanted(&self) -> Wanted {
        let mut wanted = Wanted::default();
        for family in Family::ALL {
            self.add_skeleton(&mut wanted, family);
        }
        self.add_counts(&mut wanted, PickKind::ALL.iter().copied(), &Family::ALL);
        for group in self.groups.values() {
            add_group(&mut wanted, group);
        }
        wanted
    }

    /// The static objects of `family` (its counts chains left empty).
    pub fn add_skeleton(&self, wanted: &mut Wanted, family: Family) {
        wanted.tables.insert(family);
        let skeleton = skeleton(family, &self.options);
        for set in skeleton.sets {
            let name = (family, set.spec.name.clone());
            wanted.sets.insert(name, WantedSet { decl: set, forget_with: None });
        }
        for chain in skeleton.chains {
            wanted.chains.insert((family, chain.spec.name.clone()), (chain.spec, chain.rules));
        }
    }

    /// The counts chains of `kinds` in `families` with their rules, and their count sets.
    pub fn add_counts(
        &self,
        wanted: &mut Wanted,
        kinds: impl Iterator<Item = PickKind> + Clone,
        families: &[Family],
    ) {
        for family in families.iter().copied() {
            for kind in kinds.clone() {
                let counts: Vec<u32> = self
                    .large
                    .iter()
                    .filter(|l| l.family == family && l.kind == kind)
                    .map(|l| l.count)
                    .collect();
                let rules = counts.iter().map(|n| count_rule(family, kind, *n)).collect();
                let spec = ChainSpec { name: kind.counts_chain(), hook: None };
                wanted.chains.insert((family, kind.counts_chain()), (spec, rules));
                for n in counts {
                    let decl = declaration(MapName::Count(kind, n), family);
                    let set = WantedSet { decl, forget_with: None };
                    wanted.sets.insert((family, MapName::Count(kind, n).name().into_owned()), set);
                }
            }
        }
    }
}

/// The chains and sets of one affinity group.
pub fn add_group(wanted: &mut Wanted, group: &AffinityGroup) {
    let family = group.family;
    for (spec, rules) in group.chains() {
        wanted.chains.insert((family, spec.name.clone()), (spec, rules));
    }
    if let Some(object) = group.helper_object() {
        wanted.helpers.insert((family, object.name.clone()), object);
    }
    let Some(key) = group.policy.sticky else { return };
    for (i, slot) in group.slots.iter().enumerate() {
        if slot.is_none() {
            continue;
        }
        let name = affinity_slot(group.hash, i);
        let decl = affinity_declaration(&name, family, key, group.timeout);
        let set = WantedSet { decl, forget_with: Some(name.clone()) };
        wanted.sets.insert((family, name), set);
    }
}

/// The objects of some affinity groups (what an incremental change compares).
pub fn groups_wanted<'g>(groups: impl IntoIterator<Item = &'g AffinityGroup>) -> Wanted {
    let mut wanted = Wanted::default();
    for group in groups {
        add_group(&mut wanted, group);
    }
    wanted
}
