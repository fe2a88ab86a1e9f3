//! [`Plan`]: the writes that bring a kernel from what it holds to what is wanted, in the
//! order a reader may see them; [`Rank`], which gives that order (and the groups a kernel
//! commits apart); [`Unit`], what a kernel can commit at once.

/// Where an object's kind stands in the order of writes: objects of a lower rank are
/// created before those of a higher one and deleted after them, so a reader that sees an
/// object also sees what it refers to (endpoints before the count that reveals them,
/// groups before the frontends that point at them). By default every object has rank 0.
pub trait Rank {
    /// The object's rank.
    fn rank(&self) -> u8 {
        0
    }

    /// The group the object falls in, for a kernel that commits group by group
    /// ([`Unit::Group`]: one restore per IP family, say). By default every object is in
    /// group 0.
    fn group(&self) -> u8 {
        0
    }
}

/// What a kernel can apply at once, which says what a failure can leave behind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unit {
    /// The whole plan or nothing (one nf_tables transaction, one restore, one API call):
    /// a refused commit leaves the kernel as it was.
    Plan,
    /// One write at a time, in the plan's order: a refused commit leaves the writes before
    /// the refused one in, and a reader sees, at any moment, the kernel as before the plan
    /// with a prefix of its writes made; [`Rank`] keeps every such moment consistent.
    Write,
    /// Group by group ([`Rank::group`]): each group is applied whole or not at all, and
    /// every group is tried whatever befell another, so a refused commit leaves the groups
    /// it refused as they were and the others as planned.
    Group,
}

/// Writes that bring a kernel to what is wanted: upserts (with the value they replace, if
/// any) by ascending [`Rank`], then deletions (with the value they remove) by descending
/// rank; within a rank, in key order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan<K, V> {
    /// Objects to create or replace: the key, the value replaced, the new value.
    pub upserts: Vec<(K, Option<V>, V)>,
    /// Objects to delete, and the value they hold.
    pub deletes: Vec<(K, V)>,
}

impl<K, V> Default for Plan<K, V> {
    fn default() -> Self {
        Plan { upserts: Vec::new(), deletes: Vec::new() }
    }
}

impl<K: Rank, V> Plan<K, V> {
    /// Whether the plan writes nothing.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty()
    }

    /// The number of writes.
    pub fn len(&self) -> usize {
        self.upserts.len() + self.deletes.len()
    }

    /// Puts the writes in their order (each list must be in key order already).
    pub(crate) fn order(&mut self) {
        self.upserts.sort_by_key(|(k, _, _)| k.rank());
        self.deletes.sort_by_key(|(k, _)| std::cmp::Reverse(k.rank()));
    }

    /// Applies the plan to `objects` (what a kernel kept in memory holds), the first `count`
    /// writes only when given.
    pub fn apply_to(&self, objects: &mut std::collections::HashMap<K, V>, count: Option<usize>)
    where
        K: Clone + Eq + std::hash::Hash,
        V: Clone,
    {
        let count = count.unwrap_or(usize::MAX);
        for (key, _, value) in self.upserts.iter().take(count) {
            objects.insert(key.clone(), value.clone());
        }
        let left = count.saturating_sub(self.upserts.len());
        for (key, _) in self.deletes.iter().take(left) {
            objects.remove(key);
        }
    }
}
