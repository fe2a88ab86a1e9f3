//! Stable slot assignment: which endpoint sits at which index of a group, for every
//! dataplane that picks `random mod n` among slots `0..n` (nftables' pick maps, the eBPF
//! programs' backend map).
//!
//! A set of `n` endpoints occupies slots `0..n` ([`assign_slots`]). When the set changes, endpoints that stay keep their slot, new
//! ones fill the holes left by removed ones, and only if the set shrank do the last ones
//! move into the remaining holes. An endpoint change thus rewrites one or two slots, not the
//! whole list.
//!
//! ClientIP affinity remembers clients per slot, so there an endpoint must never move:
//! [`assign_sticky_slots`] leaves holes instead of compacting, and fills them with new
//! endpoints first.

use std::collections::BTreeSet;

pub use crate::endpoints::Target;

/// The slots for `current`, keeping the positions of `previous` where possible.
pub fn assign_slots(previous: &[Target], current: &BTreeSet<Target>) -> Vec<Target> {
    let previous: Vec<Option<Target>> = previous.iter().copied().map(Some).collect();
    let mut slots = assign_sticky_slots(&previous, current);
    // Compact: move the last occupied slots into the remaining holes.
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

/// The slots for `current`, keeping every surviving endpoint at its slot: removed ones
/// leave holes (`None`), new ones fill the holes first, then go at the end; trailing holes
/// are dropped.
pub fn assign_sticky_slots(
    previous: &[Option<Target>],
    current: &BTreeSet<Target>,
) -> Vec<Option<Target>> {
    let mut slots: Vec<Option<Target>> =
        previous.iter().map(|t| t.filter(|t| current.contains(t))).collect();
    let kept: BTreeSet<Target> = slots.iter().flatten().copied().collect();
    let mut new = current.iter().filter(|t| !kept.contains(*t)).copied();
    for slot in slots.iter_mut().filter(|s| s.is_none()) {
        match new.next() {
            Some(t) => *slot = Some(t),
            None => break,
        }
    }
    slots.extend(new.map(Some));
    while slots.last().is_some_and(Option::is_none) {
        slots.pop();
    }
    slots
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;

    use super::*;

    fn t(n: u8) -> Target {
        (IpAddr::from([10, 0, 0, n]), 80)
    }

    fn set(ns: &[u8]) -> BTreeSet<Target> {
        ns.iter().map(|n| t(*n)).collect()
    }

    #[test]
    fn additions_append_and_fill_holes() {
        assert_eq!(assign_slots(&[], &set(&[3, 1, 2])), vec![t(1), t(2), t(3)]);
        assert_eq!(
            assign_slots(&[t(1), t(2), t(3)], &set(&[1, 2, 3, 4])),
            vec![t(1), t(2), t(3), t(4)]
        );
        assert_eq!(assign_slots(&[t(1), t(2), t(3)], &set(&[1, 3, 9])), vec![t(1), t(9), t(3)]);
    }

    #[test]
    fn removals_move_the_last_into_the_hole() {
        assert_eq!(
            assign_slots(&[t(1), t(2), t(3), t(4)], &set(&[1, 3, 4])),
            vec![t(1), t(4), t(3)]
        );
        assert_eq!(
            assign_slots(&[t(1), t(2), t(3), t(4)], &set(&[1, 2, 3])),
            vec![t(1), t(2), t(3)]
        );
        assert_eq!(assign_slots(&[t(1), t(2), t(3), t(4)], &set(&[4])), vec![t(4)]);
        assert_eq!(assign_slots(&[t(1), t(2)], &set(&[])), vec![]);
    }

    #[test]
    fn sticky_slots_never_move_a_survivor() {
        let previous = [Some(t(1)), Some(t(2)), Some(t(3))];
        assert_eq!(assign_sticky_slots(&previous, &set(&[2, 3])), [None, Some(t(2)), Some(t(3))]);
        assert_eq!(assign_sticky_slots(&previous, &set(&[1, 2])), [Some(t(1)), Some(t(2))]);
        let holed = [None, Some(t(2)), Some(t(3))];
        assert_eq!(
            assign_sticky_slots(&holed, &set(&[2, 3, 7, 8])),
            [Some(t(7)), Some(t(2)), Some(t(3)), Some(t(8))]
        );
        for mask in 0u32..1024 {
            let current: BTreeSet<Target> =
                (0..10).filter(|i| mask & (1 << i) != 0).map(|i| t(i as u8)).collect();
            let previous: Vec<Option<Target>> =
                [5, 1, 0, 7, 2, 9].iter().map(|n| (*n != 0).then(|| t(*n))).collect();
            let slots = assign_sticky_slots(&previous, &current);
            assert_eq!(slots.iter().flatten().copied().collect::<BTreeSet<_>>(), current);
            for (i, p) in previous.iter().enumerate() {
                if let Some(p) = p.filter(|p| current.contains(p)) {
                    assert_eq!(slots[i], Some(p), "mask {mask:b}: a survivor moved");
                }
            }
            assert!(slots.last().is_none_or(Option::is_some), "no trailing hole");
        }
    }

    #[test]
    fn result_is_always_the_current_set() {
        let previous = [t(5), t(1), t(7), t(2), t(9)];
        for mask in 0u32..1024 {
            let current: BTreeSet<Target> =
                (0..10).filter(|i| mask & (1 << i) != 0).map(|i| t(i as u8)).collect();
            let slots = assign_slots(&previous, &current);
            assert_eq!(slots.iter().copied().collect::<BTreeSet<_>>(), current);
            assert_eq!(slots.len(), current.len());
            // Survivors that fit keep their slot.
            for (i, p) in previous.iter().enumerate() {
                if current.contains(p) && i < current.len() {
                    assert_eq!(slots[i], *p, "mask {mask:b}");
                }
            }
        }
    }
}
