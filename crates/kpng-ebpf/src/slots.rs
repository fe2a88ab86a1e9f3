//! Stable slots: which endpoint sits at which index of a group.
//!
//! The programs pick `random % count` among slots `0..count`. When a group changes,
//! endpoints that stay keep their slot, new ones fill the holes of removed ones, and when
//! the group shrank the last ones move into the remaining holes: one endpoint change
//! rewrites one or two slots (and the count), whatever the group's size.

use std::collections::BTreeSet;

use crate::maps::Target;

/// The slots for `current`, keeping the positions of `previous` where possible.
pub fn assign_slots(previous: &[Target], current: &BTreeSet<Target>) -> Vec<Target> {
    let mut slots: Vec<Option<Target>> =
        previous.iter().map(|t| current.contains(t).then_some(*t)).collect();
    let kept: BTreeSet<Target> = slots.iter().flatten().copied().collect();
    let mut new = current.iter().filter(|t| !kept.contains(*t)).copied();
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        match new.next() {
            Some(t) => *slot = Some(t),
            None => break,
        }
    }
    slots.extend(new.map(Some));
    // Holes are left only when the group shrank: fill each from the end.
    let mut i = 0;
    while i < slots.len() {
        if slots[i].is_none() {
            while slots.last().is_some_and(Option::is_none) {
                slots.pop();
            }
            if i < slots.len() {
                slots.swap_remove(i);
            }
        }
        i += 1;
    }
    slots.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use proptest::prelude::*;

    use super::*;

    fn t(n: u8) -> Target {
        (IpAddr::from([10, 0, 0, n]), 80)
    }

    fn set(ns: &[u8]) -> BTreeSet<Target> {
        ns.iter().map(|n| t(*n)).collect()
    }

    #[test]
    fn one_change_moves_at_most_one_slot() {
        assert_eq!(assign_slots(&[], &set(&[3, 1, 2])), vec![t(1), t(2), t(3)]);
        assert_eq!(assign_slots(&[t(1), t(2), t(3)], &set(&[1, 3, 9])), vec![t(1), t(9), t(3)]);
        assert_eq!(
            assign_slots(&[t(1), t(2), t(3), t(4)], &set(&[1, 3, 4])),
            vec![t(1), t(4), t(3)]
        );
        assert_eq!(assign_slots(&[t(1), t(2)], &set(&[])), vec![]);
    }

    proptest! {
        #[test]
        fn slots_hold_the_set_and_survivors_stay(
            previous in proptest::collection::btree_set(0u8..16, 0..10),
            current in proptest::collection::btree_set(0u8..16, 0..10),
        ) {
            let previous: Vec<Target> = previous.into_iter().map(t).collect();
            let current: BTreeSet<Target> = current.into_iter().map(t).collect();
            let slots = assign_slots(&previous, &current);
            prop_assert_eq!(slots.iter().copied().collect::<BTreeSet<_>>(), current.clone());
            prop_assert_eq!(slots.len(), current.len());
            for (i, p) in previous.iter().enumerate() {
                if current.contains(p) && i < current.len() {
                    prop_assert_eq!(slots[i], *p);
                }
            }
        }
    }
}
