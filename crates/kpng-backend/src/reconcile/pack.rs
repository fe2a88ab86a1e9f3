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

    /// Keeps the first `len` bytes; false, keeping all, when there are fewer.
    fn truncate(&mut self, len: usize) -> bool {
        let fits = len <= usize::from(self.len);
        if fits {
            self.len = len as u8;
        }
        fits
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

/// Records of packed keys and values, sorted by key bytes. A record is the length of what
/// its key shares with the key before it, the length and bytes of the rest of its key, then
/// its value's length and bytes (none for the default value): keys of one service differ
/// in their last bytes (an endpoint's slot, a port), so most records hold only those.
///
/// Every [`SCANNED`]th record from the first shares nothing (it restarts), so a key is
/// found by a scan of at most that many records: from the first when there are no more,
/// else from the restart found by halving over their offsets. The records follow a byte
/// that says whether they are indexed; indexed, they are followed by the restarts'
/// offsets (two bytes each) and their count (two bytes). No records take no bytes.
pub(crate) struct Records;

/// The most records scanned to find a key.
pub(crate) const SCANNED: usize = 16;

const PLAIN: u8 = 0;
const INDEXED: u8 = 1;

impl Records {
    /// The records of `objects` (sorted by their keys' bytes here), whose value is `None`
    /// when it is the default one; `None` when they take more bytes than an offset reaches.
    pub(crate) fn of(mut objects: Vec<(Packed, Option<Packed>)>) -> Option<Box<[u8]>> {
        if objects.is_empty() {
            return Some(Box::default());
        }
        objects.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        let indexed = objects.len() > SCANNED;
        let mut out = Vec::with_capacity(16 * objects.len());
        out.push(if indexed { INDEXED } else { PLAIN });
        let mut restarts = Vec::new();
        let mut before: &[u8] = &[];
        for (i, (key, value)) in objects.iter().enumerate() {
            let key = key.as_bytes();
            let shared = match i % SCANNED {
                0 => {
                    restarts.push(u16::try_from(out.len()).ok()?);
                    0
                }
                _ => before.iter().zip(key).take_while(|(a, b)| a == b).count(),
            };
            out.push(shared as u8);
            out.push((key.len() - shared) as u8);
            out.extend_from_slice(&key[shared..]);
            let value = value.as_ref().map_or(&[][..], Packed::as_bytes);
            out.push(value.len() as u8);
            out.extend_from_slice(value);
            before = key;
        }
        if indexed {
            for offset in &restarts {
                out.extend_from_slice(&offset.to_le_bytes());
            }
            out.extend_from_slice(&u16::try_from(restarts.len()).ok()?.to_le_bytes());
        }
        Some(out.into_boxed_slice())
    }

    /// The records' bytes, and the restarts' offsets when indexed.
    fn parts(bytes: &[u8]) -> (&[u8], &[u8]) {
        match bytes.split_first() {
            Some((&INDEXED, _)) => {
                let count = bytes.last_chunk::<2>().map_or(0, |n| u16::from_le_bytes(*n));
                let end = bytes.len().saturating_sub(2).max(1);
                let index = end.saturating_sub(2 * usize::from(count)).max(1);
                (&bytes[1..index], &bytes[index..end])
            }
            Some((_, records)) => (records, &[]),
            None => (&[], &[]),
        }
    }

    /// Every record's key and value bytes (empty for the default value), in order.
    pub(crate) fn iter(bytes: &[u8]) -> impl Iterator<Item = (Packed, &[u8])> {
        let mut records = Self::parts(bytes).0;
        let mut key = Packed::new();
        std::iter::from_fn(move || {
            let (value, rest) = Self::next(records, &mut key)?;
            records = rest;
            Some((key, value))
        })
    }

    /// The value bytes of the record of `key`, if there is one.
    pub(crate) fn get<'a>(bytes: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
        let (records, restarts) = Self::parts(bytes);
        // Offsets count from the first byte, the flag, which `records` starts after.
        let restart = |i: usize| {
            let offset = u16::from_le_bytes([*restarts.get(2 * i)?, *restarts.get(2 * i + 1)?]);
            records.get(usize::from(offset).checked_sub(1)?..)
        };
        let mut records = match restarts.len() / 2 {
            0 => records,
            count => {
                // The last restart whose key is not after `key`: a restart's key is whole.
                let whole = |i: usize| Some(Self::field(restart(i)?.get(1..)?)?.0);
                let (mut low, mut high) = (0, count);
                while low < high {
                    let mid = low + (high - low) / 2;
                    match whole(mid)? <= key {
                        true => low = mid + 1,
                        false => high = mid,
                    }
                }
                restart(low.checked_sub(1)?)?
            }
        };
        let mut found = Packed::new();
        while let Some((value, rest)) = Self::next(records, &mut found) {
            match found.as_bytes().cmp(key) {
                std::cmp::Ordering::Less => records = rest,
                std::cmp::Ordering::Equal => return Some(value),
                std::cmp::Ordering::Greater => return None,
            }
        }
        None
    }

    /// Whether there are no records.
    pub(crate) fn is_empty(bytes: &[u8]) -> bool {
        Self::parts(bytes).0.is_empty()
    }

    /// Reads the first record of `records` over `key` (the key before it): its value bytes,
    /// and what follows it.
    fn next<'a>(records: &'a [u8], key: &mut Packed) -> Option<(&'a [u8], &'a [u8])> {
        let (shared, rest) = records.split_first()?;
        let (own, rest) = Self::field(rest)?;
        let (value, rest) = Self::field(rest)?;
        (key.truncate(usize::from(*shared)) && key.put(own)).then_some((value, rest))
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
        let records = Records::of(objects).unwrap();
        let keys: Vec<Vec<u8>> =
            Records::iter(&records).map(|(k, _)| k.as_bytes().to_vec()).collect();
        assert_eq!(keys, vec![vec![], vec![1], vec![2], vec![2, 0]]);
        assert_eq!(Records::get(&records, &[2, 0]), Some(&[9][..]));
        assert_eq!(Records::get(&records, &[2]), Some(&[7, 7][..]));
        assert_eq!(Records::get(&records, &[1]), Some(&[][..]));
        assert_eq!(Records::get(&records, &[]), Some(&[5][..]));
        assert_eq!(Records::get(&records, &[1, 0]), None);
        assert_eq!(Records::get(&records, &[3]), None);
    }

    #[test]
    fn many_records_are_indexed_and_found_by_halving() {
        for count in [0, 1, SCANNED, SCANNED + 1, 300] {
            // Keys of one, two and three bytes, every other one with a value.
            let key = |i: usize| packed(&i.to_be_bytes()[8 - (1 + i % 3)..]);
            let objects: Vec<_> =
                (0..count).map(|i| (key(i), (i % 2 == 0).then(|| packed(&[i as u8])))).collect();
            let records = Records::of(objects.clone()).unwrap();
            assert_eq!(Records::is_empty(&records), count == 0);
            assert_eq!(Records::iter(&records).count(), count);
            for (key, value) in &objects {
                let value = value.as_ref().map_or(&[][..], Packed::as_bytes);
                assert_eq!(Records::get(&records, key.as_bytes()), Some(value), "{key:?}");
            }
            assert_eq!(Records::get(&records, &[0xff; 4]), None);
            assert_eq!(Records::get(&records, &[]), None);
        }
        // Records an offset cannot reach are refused, to be kept whole.
        let big: Vec<_> =
            (0..2000u16).map(|i| (packed(&i.to_be_bytes()), Some(packed(&[7; 40])))).collect();
        assert!(Records::of(big).is_none());
    }

    proptest::proptest! {
        #[test]
        fn records_find_every_key_and_only_those(
            objects in proptest::collection::btree_map(
                proptest::collection::vec(0u8..4, 0..6),
                proptest::option::of(proptest::collection::vec(proptest::num::u8::ANY, 1..4)),
                0..80,
            ),
            absent in proptest::collection::vec(proptest::collection::vec(0u8..5, 0..7), 8),
        ) {
            let packed_objects =
                objects.iter().map(|(k, v)| (packed(k), v.as_deref().map(packed))).collect();
            let records = Records::of(packed_objects).unwrap();
            let listed: Vec<(Vec<u8>, Vec<u8>)> =
                Records::iter(&records).map(|(k, v)| (k.as_bytes().to_vec(), v.to_vec())).collect();
            let expected: Vec<(Vec<u8>, Vec<u8>)> =
                objects.iter().map(|(k, v)| (k.clone(), v.clone().unwrap_or_default())).collect();
            proptest::prop_assert_eq!(listed, expected);
            for key in objects.keys().chain(&absent) {
                let value = objects.get(key).map(|v| v.as_deref().unwrap_or_default());
                proptest::prop_assert_eq!(Records::get(&records, key), value);
            }
        }
    }

    #[test]
    fn numbers_pack_and_come_back() {
        for n in [0, 1, 80, u32::MAX] {
            assert_eq!(u32::unpack(n.pack().unwrap().as_bytes()), Some(n));
        }
        assert!(String::from("a").pack().is_none());
    }
}
