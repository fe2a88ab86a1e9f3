//! [`Few`]: a sorted set that nearly always holds one item.

/// A sorted set of items without duplicates, for the model's indexes whose entries nearly
/// all hold one item (a destination's claimants, a service's slices): a large cluster has
/// tens of thousands of entries, and one item is kept inline, with no allocation. Two or
/// more are a boxed slice without spare room: the set is then two words, so a one-word
/// item (a service key) makes it sixteen bytes, not the twenty-four of a `Vec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Few<T> {
    One(T),
    Many(Box<[T]>),
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
        let items = self.as_slice();
        let added = items[..at].iter().chain([item]).chain(&items[at..]).cloned().collect();
        *self = Few::Many(added);
    }

    /// Removes `item`; false when no item is left.
    pub(crate) fn remove(&mut self, item: &T) -> bool {
        match self {
            Few::One(only) => only != item,
            Few::Many(items) => {
                let Ok(at) = items.binary_search(item) else { return true };
                *self = match items.len() {
                    2 => Few::One(items[1 - at].clone()),
                    _ => Few::Many(items[..at].iter().chain(&items[at + 1..]).cloned().collect()),
                };
                true
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
        assert_eq!(few, Few::Many(Box::from([1, 9])));
        assert!(few.remove(&1));
        assert_eq!(few, Few::One(9));
        assert!(!few.remove(&9));
        let keys = Few::One(crate::global::SliceKey::new("ns", "web-1"));
        assert_eq!(std::mem::size_of_val(&keys), std::mem::size_of::<crate::global::SliceKey>());
        // A service key is one pointer: the set is the boxed slice's two words.
        assert_eq!(std::mem::size_of::<Few<crate::global::ServiceKey>>(), 16);
    }
}
