//! [`Rare`]: a part of an object that few objects have, kept behind one pointer.
//!
//! The object holds an `Option<Box<_>>`, `None` when the part is empty, so the many objects
//! without it pay one word for it. Serialized flat, as the fields it gathers (empty ones
//! included), and read back into `None` when empty: the serialized form does not show the
//! pointer.

use serde::de::DeserializeOwned;
use serde::{Deserializer, Serialize, Serializer};

/// A part that few objects have: its empty value is its default.
pub(crate) trait Rare: Default + Serialize + DeserializeOwned {
    /// Whether it holds nothing.
    fn is_empty(&self) -> bool;
}

/// `part` as an object keeps it: boxed, or `None` when empty (so two objects without it
/// compare equal however they were built).
pub(crate) fn boxed<T: Rare>(part: T) -> Option<Box<T>> {
    (!part.is_empty()).then(|| Box::new(part))
}

/// Serializes a kept part as its fields (`serialize_with`, beside `flatten`).
pub(crate) fn flat<T: Rare, S: Serializer>(
    part: &Option<Box<T>>,
    to: S,
) -> Result<S::Ok, S::Error> {
    match part {
        Some(part) => part.serialize(to),
        None => T::default().serialize(to),
    }
}

/// Reads a part from its fields, `None` when empty (`deserialize_with`, beside `flatten`).
pub(crate) fn unflat<'de, T: Rare, D: Deserializer<'de>>(
    from: D,
) -> Result<Option<Box<T>>, D::Error> {
    T::deserialize(from).map(boxed)
}
