//! [`Table`]: one set's elements with their holders. Most of kpng's sets are sets (their
//! elements have no value: the pick tree's bits, destinations, hairpin pairs); only the
//! backend and affinity maps carry one. A set's table keeps only each element's owner,
//! 20 bytes an entry instead of 40.

use std::collections::hash_map::Entry;

use rustc_hash::FxHashMap as HashMap;

use super::Holder;
use crate::packed::{PackedId, PackedValue};

/// The elements of one set or map, each with its holder.
#[derive(Debug, Clone)]
pub(super) enum Table {
    /// No element has a value: only owners are kept.
    Set(HashMap<PackedId, u32>),
    /// Some element has a value (a table becomes a map at the first one).
    Map(HashMap<PackedId, Holder>),
}

impl Default for Table {
    fn default() -> Self {
        Table::Set(HashMap::default())
    }
}

fn owner_only(owner: u32) -> Holder {
    Holder { owner, value: PackedValue::None }
}

impl Table {
    pub(super) fn len(&self) -> usize {
        match self {
            Table::Set(set) => set.len(),
            Table::Map(map) => map.len(),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub(super) fn reserve(&mut self, more: usize) {
        match self {
            Table::Set(set) => set.reserve(more),
            Table::Map(map) => map.reserve(more),
        }
    }

    pub(super) fn get(&self, id: &PackedId) -> Option<Holder> {
        match self {
            Table::Set(set) => set.get(id).copied().map(owner_only),
            Table::Map(map) => map.get(id).copied(),
        }
    }

    pub(super) fn contains_key(&self, id: &PackedId) -> bool {
        match self {
            Table::Set(set) => set.contains_key(id),
            Table::Map(map) => map.contains_key(id),
        }
    }

    pub(super) fn remove(&mut self, id: &PackedId) {
        match self {
            Table::Set(set) => {
                set.remove(id);
            }
            Table::Map(map) => {
                map.remove(id);
            }
        }
    }

    /// Sets the holder of `id`, present or not.
    pub(super) fn put(&mut self, id: PackedId, holder: Holder) {
        match self.for_value(holder.value) {
            Table::Set(set) => {
                set.insert(id, holder.owner);
            }
            Table::Map(map) => {
                map.insert(id, holder);
            }
        }
    }

    /// Adds `id` with `holder` if the table does not hold it (true); otherwise leaves the
    /// table as it is and returns the present holder. One lookup either way.
    pub(super) fn add(&mut self, id: PackedId, holder: Holder) -> Result<(), Holder> {
        match self.for_value(holder.value) {
            Table::Set(set) => match set.entry(id) {
                Entry::Vacant(entry) => {
                    entry.insert(holder.owner);
                    Ok(())
                }
                Entry::Occupied(entry) => Err(owner_only(*entry.get())),
            },
            Table::Map(map) => match map.entry(id) {
                Entry::Vacant(entry) => {
                    entry.insert(holder);
                    Ok(())
                }
                Entry::Occupied(entry) => Err(*entry.get()),
            },
        }
    }

    /// Each element with its holder.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&PackedId, Holder)> + Clone + '_ {
        let (set, map) = match self {
            Table::Set(set) => (Some(set), None),
            Table::Map(map) => (None, Some(map)),
        };
        let owners = set.into_iter().flat_map(|set| set.iter().map(|(id, o)| (id, owner_only(*o))));
        owners.chain(map.into_iter().flat_map(|map| map.iter().map(|(id, h)| (id, *h))))
    }

    /// The table, made a map first if `value` is one a set cannot keep.
    fn for_value(&mut self, value: PackedValue) -> &mut Table {
        if let (Table::Set(set), false) = (&mut *self, value == PackedValue::None) {
            let set = std::mem::take(set);
            let room = set.capacity();
            let mut map = HashMap::with_capacity_and_hasher(room, Default::default());
            map.extend(set.into_iter().map(|(id, owner)| (id, owner_only(owner))));
            *self = Table::Map(map);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::objects::{ElementId, Key, MapName};
    use kpng_model::Family;

    fn id(n: u8) -> PackedId {
        let key = Key::Addr(Ipv4Addr::new(10, 0, 0, n).into());
        PackedId::new(&ElementId { family: Family::V4, map: MapName::ClusterIps, key })
    }

    #[test]
    fn a_set_keeps_owners_until_a_value_makes_it_a_map() {
        let mut table = Table::default();
        assert_eq!(table.add(id(1), owner_only(3)), Ok(()));
        assert_eq!(table.add(id(1), owner_only(4)), Err(owner_only(3)));
        assert!(matches!(table, Table::Set(_)));
        let valued = Holder { owner: 5, value: PackedValue::V4(Ipv4Addr::new(10, 1, 0, 1), 80) };
        assert_eq!(table.add(id(2), valued), Ok(()));
        assert!(matches!(table, Table::Map(_)));
        assert_eq!(table.get(&id(1)), Some(owner_only(3)));
        assert_eq!(table.get(&id(2)), Some(valued));
        table.put(id(1), owner_only(2));
        table.remove(&id(2));
        let mut left: Vec<_> = table.iter().map(|(id, holder)| (id.clone(), holder)).collect();
        left.sort_by_key(|(_, holder)| holder.owner);
        assert_eq!(left, vec![(id(1), owner_only(2))]);
        assert_eq!(table.len(), 1);
        assert!(table.contains_key(&id(1)) && !table.contains_key(&id(2)));
    }
}
