//! [`Pack`]: keys and values the template may keep as a few bytes each.
//!
//! Most objects of a set-based dataplane are set and map elements whose keys and values are
//! addresses, protocols and ports: a few bytes of data in a type sized for its largest
//! kind. The template keeps a service's objects as their bytes, one record after another
//! in one allocation, when every one of them packs ([`Objects`](super::Objects)).

/// The most bytes a key or a value packs into.
pub const PACKED: usize = 47;

/// The bytes a key or a value packed into: at most [`PACKED`], inline.
#[derive(Clone, Copy)]
pub struct Packed {
    len: u8,
    bytes: [u8; PACKED],
}

impl Default for Packed {
    fn default() -> Self {
        Packed { len: 0, bytes: [0; PACKED] }
    }
}

impl Packed {
    /// No bytes yet.
    pub fn new() -> Packed {
        Packed::default()
    }

    /// Appends `bytes`; false, appending nothing, when they do not fit.
    #[must_use]
    pub fn put(&mut self, bytes: &[u8]) -> bool {
        let at = usize::from(self.len);
        let Some(to) = self.bytes.get_mut(at..at + bytes.len()) else { return false };
        to.copy_from_slice(bytes);
        self.len += bytes.len() as u8;
        true
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Packed({:02x?})", self.as_bytes())
    }
}

/// A key or value that may be kept as bytes. Neither packs by default.
///
/// `unpack(pack(x))` must be `x`, and two keys (two values) may pack into the same bytes
/// only when they are equal, since the template finds a key by its bytes.
pub trait Pack: Sized {
    /// The bytes, or `None` when it is kept whole.
    fn pack(&self) -> Option<Packed> {
        None
    }

    /// The key or value [`pack`](Self::pack) made `bytes` of.
    fn unpack(bytes: &[u8]) -> Option<Self> {
        let _ = bytes;
        None
    }
}

impl Pack for u32 {
    fn pack(&self) -> Option<Packed> {
        let mut packed = Packed::new();
        packed.put(&self.to_be_bytes()).then_some(packed)
    }

    fn unpack(bytes: &[u8]) -> Option<Self> {
        Some(u32::from_be_bytes(bytes.try_into().ok()?))
    }
}

impl Pack for u64 {
    fn pack(&self) -> Option<Packed> {
        let mut packed = Packed::new();
        packed.put(&self.to_be_bytes()).then_some(packed)
    }

    fn unpack(bytes: &[u8]) -> Option<Self> {
        Some(u64::from_be_bytes(bytes.try_into().ok()?))
    }
}

/// Kept whole, as are the other types below: a backend whose keys or values are these
/// (a name, a list of endpoints) declares nothing.
impl Pack for String {}

impl<T> Pack for Vec<T> {}

impl<T: ?Sized> Pack for Box<T> {}

impl<T: ?Sized> Pack for std::sync::Arc<T> {}

/// Records of packed keys and values, one after the other, sorted by key bytes: a key's
/// length, its bytes, its value's length and its bytes (none for the default value).
pub(crate) struct Records;

impl Records {
    /// The records of `objects` (sorted by their keys' bytes here), whose value is `None`
    /// when it is the default one.
    pub(crate) fn of(mut objects: Vec<(Packed, Option<Packed>)>) -> Box<[u8]> {
        objects.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let size = |(k, v): &(Packed, Option<Packed>)| {
            2 + k.as_bytes().len() + v.map_or(0, |v| v.as_bytes().len())
        };
        let mut out = Vec::with_capacity(objects.iter().map(size).sum());
        for (key, value) in &objects {
            out.push(key.len);
            out.extend_from_slice(key.as_bytes());
            let value = value.as_ref().map_or(&[][..], Packed::as_bytes);
            out.push(value.len() as u8);
            out.extend_from_slice(value);
        }
        out.into_boxed_slice()
    }

    /// Every record's key bytes and value bytes (empty for the default value), in order.
    pub(crate) fn iter(mut bytes: &[u8]) -> impl Iterator<Item = (&[u8], &[u8])> {
        std::iter::from_fn(move || {
            let (key, rest) = Self::field(bytes)?;
            let (value, rest) = Self::field(rest)?;
            bytes = rest;
            Some((key, value))
        })
    }

    /// The value bytes of the record of `key`, if there is one.
    pub(crate) fn get<'a>(bytes: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
        for (k, v) in Self::iter(bytes) {
            match k.cmp(key) {
                std::cmp::Ordering::Less => {}
                std::cmp::Ordering::Equal => return Some(v),
                std::cmp::Ordering::Greater => return None,
            }
        }
        None
    }

    fn field(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
        let (len, rest) = bytes.split_first()?;
        let len = usize::from(*len);
        (rest.len() >= len).then(|| rest.split_at(len))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packed(bytes: &[u8]) -> Packed {
        let mut p = Packed::new();
        assert!(p.put(bytes));
        p
    }

    #[test]
    fn bytes_fit_or_are_refused_whole() {
        let mut p = Packed::new();
        assert!(p.put(&[1; PACKED - 1]));
        assert!(!p.put(&[2, 2]), "one byte too many");
        assert_eq!(p.as_bytes(), &[1; PACKED - 1][..]);
        assert!(p.put(&[3]));
        assert_eq!(p.as_bytes().len(), PACKED);
    }

    #[test]
    fn records_are_found_by_their_key_bytes_in_any_order_given() {
        let objects = vec![
            (packed(&[2, 0]), Some(packed(&[9]))),
            (packed(&[1]), None),
            (packed(&[2]), Some(packed(&[7, 7]))),
            (packed(&[]), Some(packed(&[5]))),
        ];
        let records = Records::of(objects);
        let keys: Vec<&[u8]> = Records::iter(&records).map(|(k, _)| k).collect();
        assert_eq!(keys, vec![&[][..], &[1], &[2], &[2, 0]]);
        assert_eq!(Records::get(&records, &[2, 0]), Some(&[9][..]));
        assert_eq!(Records::get(&records, &[2]), Some(&[7, 7][..]));
        assert_eq!(Records::get(&records, &[1]), Some(&[][..]));
        assert_eq!(Records::get(&records, &[]), Some(&[5][..]));
        assert_eq!(Records::get(&records, &[1, 0]), None);
        assert_eq!(Records::get(&records, &[3]), None);
    }

    #[test]
    fn numbers_pack_and_come_back() {
        for n in [0, 1, 80, u32::MAX] {
            assert_eq!(u32::unpack(n.pack().unwrap().as_bytes()), Some(n));
        }
        assert!(String::from("a").pack().is_none());
    }
}
