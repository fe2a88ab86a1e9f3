//! Elements as [`crate::entry`] keeps them: half a million at 30,000 services, so each
//! byte counts. An IPv4 element's id (every key of an IPv4 table but the rare sets of
//! counts beyond the pick tree) packs into 15 bytes inline (`pack_v4`); an IPv6 one into
//! at most `PACKED_V6` bytes that an [`crate::entry::EntryKey`] keeps behind a pointer
//! (`pack_v6`: 48 bytes of the allocator's instead of 80 for the id itself, a tenth of the
//! elements at 100,000 services); [`crate::entry::EntryKey`] allocates the id of any other.
//! Values keep the endpoint's address as the family needs it: an IPv4 one inline, an IPv6
//! one (a few in a hundred) behind a pointer, so that a value takes 16 bytes.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

use ipnet::{IpNet, Ipv4Net};
use kpng_model::{Family, Protocol};

use crate::objects::{BUCKETS, Dest, ElementId, Key, MapName, PickKind, TREE_BITS, Value};

/// An element's value, packed (16 bytes instead of 24).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PackedValue {
    /// A set element: no value.
    None,
    /// An IPv4 endpoint and port.
    V4(Ipv4Addr, u16),
    /// An IPv6 endpoint and port, out of line.
    V6(Arc<(Ipv6Addr, u16)>),
    /// An affinity group's hash, in two halves (so the value aligns on 4 bytes).
    Affinity([u32; 2]),
}

impl From<Value> for PackedValue {
    fn from(value: Value) -> Self {
        match value {
            Value::None => PackedValue::None,
            Value::Endpoint(IpAddr::V4(ip), port) => PackedValue::V4(ip, port),
            Value::Endpoint(IpAddr::V6(ip), port) => PackedValue::V6(Arc::new((ip, port))),
            Value::Affinity(hash) => PackedValue::Affinity([(hash >> 32) as u32, hash as u32]),
        }
    }
}

impl From<&PackedValue> for Value {
    fn from(value: &PackedValue) -> Self {
        match value {
            PackedValue::None => Value::None,
            PackedValue::V4(ip, port) => Value::Endpoint(IpAddr::V4(*ip), *port),
            PackedValue::V6(v6) => Value::Endpoint(IpAddr::V6(v6.0), v6.1),
            PackedValue::Affinity([high, low]) => {
                Value::Affinity((u64::from(*high) << 32) | u64::from(*low))
            }
        }
    }
}

const SHAPE_ADDR: u8 = 0;
const SHAPE_DEST: u8 = 1;
const SHAPE_NODEPORT: u8 = 2;
const SHAPE_DEST_SLOT: u8 = 3;
const SHAPE_NODEPORT_SLOT: u8 = 4;
const SHAPE_ADDR_PAIR: u8 = 5;
const SHAPE_DEST_SOURCE: u8 = 6;

/// The bytes an IPv6 element's id packs into: enough for its longest key, a destination
/// and a source network (the set's code, the key's shape, two addresses, protocol, port
/// and prefix length). Unused bytes are zero, so that equal ids pack alike.
pub(crate) const PACKED_V6: usize = 38;

/// The 15 bytes an IPv4 element's id packs into, when it does (every id of an IPv4 table
/// but those of count sets beyond the pick tree).
pub(crate) fn pack_v4(id: &ElementId) -> Option<[u8; 15]> {
    pack(id, Family::V4)
}

/// The id [`pack_v4`] packed.
pub(crate) fn unpack_v4(bytes: &[u8; 15]) -> ElementId {
    unpack(bytes, Family::V4)
}

/// The [`PACKED_V6`] bytes an IPv6 element's id packs into, when it does (as for
/// [`pack_v4`]: every id of an IPv6 table but those of count sets beyond the pick tree).
pub(crate) fn pack_v6(id: &ElementId) -> Option<[u8; PACKED_V6]> {
    pack(id, Family::V6)
}

/// The id [`pack_v6`] packed.
pub(crate) fn unpack_v6(bytes: &[u8; PACKED_V6]) -> ElementId {
    unpack(bytes, Family::V6)
}

/// What the claims of the element packed as `bytes` (of `family`'s table) are filed under
/// (see [`kpng_backend::reconcile::Filed`]): the kind of part, and its bytes. The
/// destination of a destination's elements, whatever their set, slot or source; the
/// NodePort of a NodePort's; the address or the two of the others.
pub(crate) fn filed_under(bytes: &[u8], family: Family) -> (u8, &[u8]) {
    let shape = bytes.get(1).copied().unwrap_or(u8::MAX);
    match part_of(shape, family) {
        (u8::MAX, _) => (u8::MAX, bytes),
        (part, len) => (part, bytes.get(2..2 + len).unwrap_or(bytes)),
    }
}

/// The kind of part an element of `shape` is filed under, and the length of its bytes,
/// which follow the set's code and the shape in a packed id (0 for a shape of none).
pub(crate) fn part_of(shape: u8, family: Family) -> (u8, usize) {
    let address = match family {
        Family::V4 => 4,
        Family::V6 => 16,
    };
    match shape {
        SHAPE_DEST | SHAPE_DEST_SLOT | SHAPE_DEST_SOURCE => (SHAPE_DEST, address + 3),
        SHAPE_NODEPORT | SHAPE_NODEPORT_SLOT => (SHAPE_NODEPORT, 3),
        SHAPE_ADDR => (SHAPE_ADDR, address),
        SHAPE_ADDR_PAIR => (SHAPE_ADDR_PAIR, 2 * address),
        _ => (u8::MAX, 0),
    }
}

/// `id` packed into `N` bytes, when it is of `family`'s table, its set has a code and
/// every address of its key is of `family` (`N` is enough for the family's longest key).
fn pack<const N: usize>(id: &ElementId, family: Family) -> Option<[u8; N]> {
    if id.family != family {
        return None;
    }
    let code = map_code(id.map)?;
    let mut out = Writer { bytes: [0; N], at: 0, family };
    out.byte(code);
    out.key(&id.key).then_some(out.bytes)
}

fn unpack<const N: usize>(bytes: &[u8; N], family: Family) -> ElementId {
    let mut input = Reader { bytes, at: 0, family };
    let map = map_of(input.byte());
    let key = input.key();
    ElementId { family, map, key }
}

/// The set's code in a packed id: the fixed sets, then the pick tree's bit sets, then the
/// backends maps.
fn map_code(map: MapName) -> Option<u8> {
    let kind_of = |kind| PickKind::ALL.iter().position(|k| *k == kind).map(|at| at as u8);
    match map {
        MapName::Bit(kind, bit) => Some(FIXED + kind_of(kind)? * TREE_BITS + bit),
        MapName::Backends(kind, bucket) => Some(BACKENDS + kind_of(kind)? * BUCKETS + bucket),
        MapName::Count(..) => None,
        fixed => MapName::FIXED.iter().position(|m| *m == fixed).map(|at| at as u8),
    }
}

/// The first code of the bit sets, then of the backends maps.
const FIXED: u8 = MapName::FIXED.len() as u8;
const BACKENDS: u8 = FIXED + PickKind::ALL.len() as u8 * TREE_BITS;

/// The set of a code [`map_code`] gave (codes come only from it: past the last one, the
/// kinds wrap around rather than fail).
fn map_of(code: u8) -> MapName {
    let kind = |n: u8| PickKind::ALL[usize::from(n) % PickKind::ALL.len()];
    match code {
        code if code < FIXED => MapName::FIXED[usize::from(code)],
        code if code < BACKENDS => {
            let bits = code - FIXED;
            MapName::Bit(kind(bits / TREE_BITS), bits % TREE_BITS)
        }
        code => {
            let at = code - BACKENDS;
            MapName::Backends(kind(at / BUCKETS), at % BUCKETS)
        }
    }
}

/// Writes an id of `family`'s table: its addresses must all be of that family, and nothing
/// is written of one that is not (so an IPv4 writer never overflows on an IPv6 address).
struct Writer<const N: usize> {
    bytes: [u8; N],
    at: usize,
    family: Family,
}

impl<const N: usize> Writer<N> {
    fn byte(&mut self, b: u8) {
        self.bytes[self.at] = b;
        self.at += 1;
    }

    fn put(&mut self, bytes: &[u8]) {
        self.bytes[self.at..self.at + bytes.len()].copy_from_slice(bytes);
        self.at += bytes.len();
    }

    /// Writes an address of the writer's family; false for one of the other.
    fn ip(&mut self, ip: &IpAddr) -> bool {
        match (self.family, ip) {
            (Family::V4, IpAddr::V4(ip)) => self.put(&ip.octets()),
            (Family::V6, IpAddr::V6(ip)) => self.put(&ip.octets()),
            _ => return false,
        }
        true
    }

    fn port(&mut self, protocol: Protocol, port: u16) {
        self.byte(protocol_code(protocol));
        self.put(&port.to_be_bytes());
    }

    fn dest(&mut self, dest: &Dest) -> bool {
        let fits = self.ip(&dest.ip);
        self.port(dest.protocol, dest.port);
        fits
    }

    /// Writes a key of the writer's family's addresses; false when one is of the other.
    fn key(&mut self, key: &Key) -> bool {
        match key {
            Key::Addr(ip) => {
                self.byte(SHAPE_ADDR);
                self.ip(ip)
            }
            Key::Dest(dest) => {
                self.byte(SHAPE_DEST);
                self.dest(dest)
            }
            Key::NodePort(protocol, port) => {
                self.byte(SHAPE_NODEPORT);
                self.port(*protocol, *port);
                true
            }
            Key::DestSlot(dest, slot) => {
                self.byte(SHAPE_DEST_SLOT);
                let fits = self.dest(dest);
                self.put(&slot.to_be_bytes());
                fits
            }
            Key::NodePortSlot(protocol, port, slot) => {
                self.byte(SHAPE_NODEPORT_SLOT);
                self.port(*protocol, *port);
                self.put(&slot.to_be_bytes());
                true
            }
            Key::AddrPair(a, b) => {
                self.byte(SHAPE_ADDR_PAIR);
                self.ip(a) && self.ip(b)
            }
            Key::DestSource(dest, net) => {
                self.byte(SHAPE_DEST_SOURCE);
                let fits = self.dest(dest) && self.ip(&net.addr());
                self.byte(net.prefix_len());
                fits
            }
        }
    }
}

struct Reader<'b, const N: usize> {
    bytes: &'b [u8; N],
    at: usize,
    family: Family,
}

impl<const N: usize> Reader<'_, N> {
    fn byte(&mut self) -> u8 {
        self.at += 1;
        self.bytes[self.at - 1]
    }

    fn array<const M: usize>(&mut self) -> [u8; M] {
        let mut out = [0; M];
        out.copy_from_slice(&self.bytes[self.at..self.at + M]);
        self.at += M;
        out
    }

    fn ip(&mut self) -> IpAddr {
        match self.family {
            Family::V4 => IpAddr::V4(Ipv4Addr::from(self.array::<4>())),
            Family::V6 => IpAddr::V6(Ipv6Addr::from(self.array::<16>())),
        }
    }

    fn port(&mut self) -> (Protocol, u16) {
        let protocol = protocol_of(self.byte());
        (protocol, u16::from_be_bytes(self.array()))
    }

    fn dest(&mut self) -> Dest {
        let ip = self.ip();
        let (protocol, port) = self.port();
        Dest { ip, protocol, port }
    }

    fn slot(&mut self) -> u32 {
        u32::from_be_bytes(self.array())
    }

    fn key(&mut self) -> Key {
        match self.byte() {
            SHAPE_ADDR => Key::Addr(self.ip()),
            SHAPE_DEST => Key::Dest(self.dest()),
            SHAPE_NODEPORT => {
                let (protocol, port) = self.port();
                Key::NodePort(protocol, port)
            }
            SHAPE_DEST_SLOT => {
                let dest = self.dest();
                Key::DestSlot(dest, self.slot())
            }
            SHAPE_NODEPORT_SLOT => {
                let (protocol, port) = self.port();
                Key::NodePortSlot(protocol, port, self.slot())
            }
            SHAPE_ADDR_PAIR => {
                let a = self.ip();
                Key::AddrPair(a, self.ip())
            }
            _ => {
                let dest = self.dest();
                let addr = self.ip();
                let prefix = self.byte();
                // Written from a valid network, so its prefix is valid.
                let net = IpNet::new(addr, prefix).unwrap_or(IpNet::V4(Ipv4Net::default()));
                Key::DestSource(dest, net)
            }
        }
    }
}

fn protocol_code(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 0,
        Protocol::Udp => 1,
        Protocol::Sctp => 2,
    }
}

fn protocol_of(code: u8) -> Protocol {
    match code {
        0 => Protocol::Tcp,
        1 => Protocol::Udp,
        _ => Protocol::Sctp,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ip() -> impl Strategy<Value = IpAddr> {
        prop_oneof![
            any::<[u8; 4]>().prop_map(IpAddr::from),
            any::<[u8; 16]>().prop_map(IpAddr::from),
        ]
    }

    fn protocol() -> impl Strategy<Value = Protocol> {
        prop_oneof![Just(Protocol::Tcp), Just(Protocol::Udp), Just(Protocol::Sctp)]
    }

    fn dest() -> impl Strategy<Value = Dest> {
        (ip(), protocol(), any::<u16>()).prop_map(|(ip, protocol, port)| Dest {
            ip,
            protocol,
            port,
        })
    }

    fn key() -> impl Strategy<Value = Key> {
        prop_oneof![
            ip().prop_map(Key::Addr),
            dest().prop_map(Key::Dest),
            (protocol(), any::<u16>()).prop_map(|(p, port)| Key::NodePort(p, port)),
            (dest(), any::<u32>()).prop_map(|(d, s)| Key::DestSlot(d, s)),
            (protocol(), any::<u16>(), any::<u32>())
                .prop_map(|(p, port, s)| Key::NodePortSlot(p, port, s)),
            (ip(), ip()).prop_map(|(a, b)| Key::AddrPair(a, b)),
            (dest(), ip(), 0u8..=32).prop_map(|(d, ip, len)| {
                let net = match ip {
                    IpAddr::V4(v4) => IpNet::V4(Ipv4Net::new(v4, len).unwrap()),
                    IpAddr::V6(v6) => IpNet::new(IpAddr::V6(v6), len).unwrap(),
                };
                Key::DestSource(d, net)
            }),
        ]
    }

    fn map() -> impl Strategy<Value = MapName> {
        let kind = prop::sample::select(PickKind::ALL.to_vec());
        prop_oneof![
            prop::sample::select(MapName::FIXED.to_vec()),
            (kind.clone(), 0..TREE_BITS).prop_map(|(k, b)| MapName::Bit(k, b)),
            (kind.clone(), 0..BUCKETS).prop_map(|(k, b)| MapName::Backends(k, b)),
            (kind, any::<u32>()).prop_map(|(k, n)| MapName::Count(k, n)),
        ]
    }

    fn all_of(key: &Key, family: Family) -> bool {
        let of = |ip: &IpAddr| Family::of(ip) == family;
        match key {
            Key::Addr(ip) => of(ip),
            Key::Dest(dest) | Key::DestSlot(dest, _) => of(&dest.ip),
            Key::NodePort(..) | Key::NodePortSlot(..) => true,
            Key::AddrPair(a, b) => of(a) && of(b),
            Key::DestSource(dest, net) => of(&dest.ip) && of(&net.addr()),
        }
    }

    proptest! {
        #[test]
        fn every_id_comes_back_as_packed(
            family in prop_oneof![Just(Family::V4), Just(Family::V6)],
            map in map(),
            key in key(),
        ) {
            let id = ElementId { family, map, key };
            let v4 = pack_v4(&id);
            if let Some(bytes) = &v4 {
                prop_assert_eq!(unpack_v4(bytes), id);
            }
            let v6 = pack_v6(&id);
            if let Some(bytes) = &v6 {
                prop_assert_eq!(unpack_v6(bytes), id);
            }
            // Packed exactly when the set has a code and every address of the key is of
            // the table's family, and by the table's family.
            let packs = !matches!(map, MapName::Count(..)) && all_of(&key, family);
            prop_assert_eq!(v4.is_some(), packs && family == Family::V4);
            prop_assert_eq!(v6.is_some(), packs && family == Family::V6);
        }

        #[test]
        fn every_value_comes_back_as_packed(value in value()) {
            prop_assert_eq!(Value::from(&PackedValue::from(value)), value);
        }

        #[test]
        fn elements_keep_as_bytes_that_come_back_and_tell_them_apart(
            family in prop_oneof![Just(Family::V4), Just(Family::V6)],
            a in (map(), key()),
            b in (map(), key()),
            values in (value(), value()),
        ) {
            use kpng_backend::reconcile::Pack;
            use crate::entry::{EntryKey, EntryValue};

            let key = |(map, key)| EntryKey::element(&ElementId { family, map, key });
            let (a, b) = (key(a), key(b));
            for key in [&a, &b] {
                let packed = key.pack();
                prop_assert_eq!(packed.is_some(), !matches!(key, EntryKey::Element(_)));
                if let Some(packed) = packed {
                    prop_assert_eq!(EntryKey::unpack(packed.as_bytes()), Some(key.clone()));
                }
            }
            if let (Some(pa), Some(pb)) = (a.pack(), b.pack()) {
                prop_assert_eq!(pa.as_bytes() == pb.as_bytes(), a == b);
            }
            let (a, b) = (EntryValue::element(values.0), EntryValue::element(values.1));
            let (pa, pb) = (a.pack().unwrap(), b.pack().unwrap());
            prop_assert_eq!(EntryValue::unpack(pa.as_bytes()), Some(a.clone()));
            prop_assert_eq!(pa.as_bytes() == pb.as_bytes(), a == b);
        }
    }

    /// What an element is expected to be filed under: its destination, NodePort, address
    /// or pair of addresses.
    #[derive(Debug, PartialEq)]
    enum Part {
        Dest(Dest),
        NodePort(Protocol, u16),
        Addr(IpAddr),
        Pair(IpAddr, IpAddr),
    }

    fn part(key: &Key) -> Part {
        match *key {
            Key::Dest(d) | Key::DestSlot(d, _) | Key::DestSource(d, _) => Part::Dest(d),
            Key::NodePort(p, port) | Key::NodePortSlot(p, port, _) => Part::NodePort(p, port),
            Key::Addr(ip) => Part::Addr(ip),
            Key::AddrPair(a, b) => Part::Pair(a, b),
        }
    }

    proptest! {
        #[test]
        fn elements_are_filed_by_destination_whatever_their_set_and_slot(
            family in prop_oneof![Just(Family::V4), Just(Family::V6)],
            a in (map(), key()),
            b in (map(), key()),
            slot in any::<u32>(),
        ) {
            use std::hash::{DefaultHasher, Hasher};

            use kpng_backend::reconcile::Filed;
            use crate::entry::EntryKey;

            let filed = |(map, key): &(MapName, Key)| {
                let key = EntryKey::element(&ElementId { family, map: *map, key: *key });
                let mut hasher = DefaultHasher::new();
                key.file_under(&mut hasher);
                (matches!(key, EntryKey::V4(_) | EntryKey::V6(_)), hasher.finish())
            };
            let ((packs_a, a_under), (packs_b, b_under)) = (filed(&a), filed(&b));
            if packs_a && packs_b {
                prop_assert_eq!(a_under == b_under, part(&a.1) == part(&b.1), "{:?} {:?}", a, b);
            }
            // The same destination or NodePort in another set, with another slot.
            let moved = (b.0, a.1.with_slot(slot));
            if packs_a && filed(&moved).0 {
                prop_assert_eq!(filed(&moved).1, a_under);
            }
        }
    }

    fn value() -> impl Strategy<Value = Value> {
        prop_oneof![
            Just(Value::None),
            (ip(), any::<u16>()).prop_map(|(ip, port)| Value::Endpoint(ip, port)),
            any::<u64>().prop_map(Value::Affinity),
        ]
    }

    #[test]
    fn an_ipv4_element_keeps_in_a_few_bytes_and_the_slot_zero_apart() {
        use crate::entry::EntryKey;
        use kpng_backend::reconcile::Pack;

        let dest = Dest { ip: [10, 96, 0, 1].into(), protocol: Protocol::Tcp, port: 80 };
        let slot = |slot| {
            let id = ElementId {
                family: Family::V4,
                map: MapName::Backends(PickKind::Cluster, 2),
                key: Key::DestSlot(dest, slot),
            };
            EntryKey::element(&id).pack().unwrap()
        };
        // The family, the shape, the address, the protocol, the port, the set and the slot.
        assert_eq!(slot(1).as_bytes().len(), 1 + 1 + 4 + 1 + 2 + 1 + 4);
        // The elements of one destination share all but their set and slot, whatever the
        // set: a template's record of one holds little more than those.
        let in_set = |map| {
            let id = ElementId { family: Family::V4, map, key: Key::Dest(dest) };
            EntryKey::element(&id).pack().unwrap()
        };
        let shared = |a: &kpng_backend::reconcile::Packed, b: &kpng_backend::reconcile::Packed| {
            a.as_bytes().iter().zip(b.as_bytes()).take_while(|(a, b)| a == b).count()
        };
        assert_eq!(shared(&slot(1), &slot(2)), 1 + 1 + 7 + 1 + 3);
        let (dests, masq) = (in_set(MapName::FIXED[0]), in_set(MapName::FIXED[1]));
        assert_eq!(shared(&dests, &masq), 1 + 1 + 7);
        // Slot 0 ends in zeros, which are not kept: still not the key of slot 1 or 256.
        assert!(slot(0).as_bytes().len() < slot(1).as_bytes().len());
        assert_ne!(slot(0).as_bytes(), slot(256).as_bytes());
        assert_eq!(
            EntryKey::unpack(slot(0).as_bytes()).and_then(|k| k.as_element()).map(|id| id.key),
            Some(Key::DestSlot(dest, 0))
        );
    }

    #[test]
    fn packed_values_are_small() {
        assert_eq!(size_of::<PackedValue>(), 16);
    }
}
