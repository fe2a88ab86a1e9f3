//! [`Few`]: a sorted set that nearly always holds one item.

/// A sorted set of items without duplicates, for the model's indexes whose entries nearly
/// all hold one item (a destination's claimants, a service's slices): a large cluster has
/// tens of thousands of entries, and one item is kept inline, with no allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Few<T> {
    One(T),
    Many(Vec<T>),
}

impl<T: Ord + Clone> Few<T> {
    /// The items, in order.
    pub(crate) fn as_slice(&self) -> &[T] {
        match self {
            Few::One(item) => std::slice::from_ref(item),
            Few::Many(items) => items,
        }
    }

    /// Adds `item` unless it is there.
    pub(crate) fn add(&mut self, item: &T) {
        let Err(at) = self.as_slice().binary_search(item) else { return };
        let mut items = match std::mem::replace(self, Few::Many(Vec::new())) {
            Few::One(only) => vec![only],
            Few::Many(items) => items,
        };
        items.insert(at, item.clone());
        *self = Few::Many(items);
    }

    /// Removes `item`; false when no item is left.
    pub(crate) fn remove(&mut self, item: &T) -> bool {
        match self {
            Few::One(only) => only != item,
            Few::Many(items) => {
                items.retain(|i| i != item);
                if let [only] = items.as_slice() {
                    *self = Few::One(only.clone());
                }
                !self.as_slice().is_empty()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn items_stay_sorted_and_one_goes_back_inline() {
        let mut few = Few::One(5);
        few.add(&5);
        assert_eq!(few, Few::One(5));
        few.add(&9);
        few.add(&1);
        assert_eq!(few.as_slice(), [1, 5, 9]);
        assert!(few.remove(&5) && few.remove(&7));
        assert_eq!(few, Few::Many(vec![1, 9]));
        assert!(few.remove(&1));
        assert_eq!(few, Few::One(9));
        assert!(!few.remove(&9));
        let keys = Few::One(crate::global::SliceKey::new("ns", "web-1"));
        assert_eq!(std::mem::size_of_val(&keys), std::mem::size_of::<crate::global::SliceKey>());
    }
}
