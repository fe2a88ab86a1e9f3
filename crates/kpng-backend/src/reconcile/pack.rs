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
///
/// After a byte that says whether they are indexed, and, when there are more than
/// [`SCANNED`], followed by each record's offset (two bytes) and their count (two bytes),
/// so that a key is found by halving rather than from the first record. Nothing at all
/// for no records.
pub(crate) struct Records;

/// The most records found by a scan from the first.
pub(crate) const SCANNED: usize = 16;

/// A record's key bytes and value bytes.
type Record<'a> = (&'a [u8], &'a [u8]);

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
        let size = |(k, v): &(Packed, Option<Packed>)| {
            2 + k.as_bytes().len() + v.map_or(0, |v| v.as_bytes().len())
        };
        let index = if indexed { 2 * objects.len() + 2 } else { 0 };
        let mut out = Vec::with_capacity(1 + objects.iter().map(size).sum::<usize>() + index);
        out.push(if indexed { INDEXED } else { PLAIN });
        let mut offsets = Vec::with_capacity(if indexed { objects.len() } else { 0 });
        for (key, value) in &objects {
            if indexed {
                offsets.push(u16::try_from(out.len()).ok()?);
            }
            out.push(key.len);
            out.extend_from_slice(key.as_bytes());
            let value = value.as_ref().map_or(&[][..], Packed::as_bytes);
            out.push(value.len() as u8);
            out.extend_from_slice(value);
        }
        if indexed {
            for offset in offsets {
                out.extend_from_slice(&offset.to_le_bytes());
            }
            out.extend_from_slice(&u16::try_from(objects.len()).ok()?.to_le_bytes());
        }
        Some(out.into_boxed_slice())
    }

    /// The records' bytes, and their offsets when indexed.
    fn parts(bytes: &[u8]) -> (&[u8], &[u8]) {
        match bytes.split_first() {
            Some((&INDEXED, _)) => {
                let count =
                    bytes.last_chunk::<2>().map_or(0, |n| usize::from(u16::from_le_bytes(*n)));
                let index = bytes.len().saturating_sub(2 + 2 * count).max(1);
                (&bytes[1..index], &bytes[index..bytes.len().saturating_sub(2).max(index)])
            }
            Some((_, records)) => (records, &[]),
            None => (&[], &[]),
        }
    }

    /// Every record's key bytes and value bytes (empty for the default value), in order.
    pub(crate) fn iter(bytes: &[u8]) -> impl Iterator<Item = Record<'_>> {
        let mut records = Self::parts(bytes).0;
        std::iter::from_fn(move || {
            let (record, rest) = Self::record(records)?;
            records = rest;
            Some(record)
        })
    }

    /// The value bytes of the record of `key`, if there is one.
    pub(crate) fn get<'a>(bytes: &'a [u8], key: &[u8]) -> Option<&'a [u8]> {
        let (records, offsets) = Self::parts(bytes);
        if offsets.is_empty() {
            for (k, v) in Self::iter(bytes) {
                match k.cmp(key) {
                    std::cmp::Ordering::Less => {}
                    std::cmp::Ordering::Equal => return Some(v),
                    std::cmp::Ordering::Greater => return None,
                }
            }
            return None;
        }
        // Offsets count from the first byte, the flag, which `records` starts after.
        let at = |i: usize| {
            let offset = u16::from_le_bytes([offsets[2 * i], offsets[2 * i + 1]]);
            Self::record(records.get(usize::from(offset).checked_sub(1)?..)?)
        };
        let (mut low, mut high) = (0, offsets.len() / 2);
        while low < high {
            let mid = low + (high - low) / 2;
            let ((k, v), _) = at(mid)?;
            match k.cmp(key) {
                std::cmp::Ordering::Less => low = mid + 1,
                std::cmp::Ordering::Equal => return Some(v),
                std::cmp::Ordering::Greater => high = mid,
            }
        }
        None
    }

    /// Whether there are no records.
    pub(crate) fn is_empty(bytes: &[u8]) -> bool {
        Self::parts(bytes).0.is_empty()
    }

    /// The first record of `records` and what follows it.
    fn record(records: &[u8]) -> Option<(Record<'_>, &[u8])> {
        let (key, rest) = Self::field(records)?;
        let (value, rest) = Self::field(rest)?;
        Some(((key, value), rest))
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

    #[test]
    fn numbers_pack_and_come_back() {
        for n in [0, 1, 80, u32::MAX] {
            assert_eq!(u32::unpack(n.pack().unwrap().as_bytes()), Some(n));
        }
        assert!(String::from("a").pack().is_none());
    }
}
