//! The maps the programs read, as typed keys and values, and their byte layouts.
//!
//! Every layout here mirrors a struct of `bpf/kpng_sock.c`; the tests pin the sizes and
//! byte positions. Addresses and ports are in network byte order, other numbers in the
//! host's.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use kpng_backend::reconcile::{Pack, Packed};
use kpng_model::{Family, Protocol};

/// A map kpng writes. Each is a hash map sized from the cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MapName {
    /// Service addresses → endpoint group.
    Frontends,
    /// Endpoint groups → count and affinity timeout.
    Groups,
    /// (group, slot) → endpoint.
    Backends,
    /// (group, endpoint) of affinity groups: whether a remembered endpoint is still there;
    /// and under [`GroupId::serving`], the endpoints that still serve a UDP group's port,
    /// which an unconnected socket's flow keeps.
    Members,
    /// Cluster IPs: a port they do not define is refused.
    ClusterIps,
}

impl MapName {
    /// Every map kpng writes, in the order updates fill them (what a map points into comes
    /// first).
    pub const ALL: [MapName; 5] = [
        MapName::Backends,
        MapName::Members,
        MapName::Groups,
        MapName::ClusterIps,
        MapName::Frontends,
    ];

    /// The map's name in the object file (and its pin's file name).
    pub fn object_name(self) -> &'static str {
        match self {
            MapName::Frontends => "kpng_frontends",
            MapName::Groups => "kpng_groups",
            MapName::Backends => "kpng_backends",
            MapName::Members => "kpng_members",
            MapName::ClusterIps => "kpng_cluster_ips",
        }
    }
}

/// The LRU maps the programs fill themselves; kpng only creates, keeps and removes them.
pub const LRU_MAPS: [&str; 3] = ["kpng_affinity", "kpng_revnat", "kpng_udp_flows"];

/// Identifies the endpoint list of one service port, family and set (Cluster or Local):
/// a stable hash of those, so a restart finds the same ids in the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupId(pub u64);

impl GroupId {
    /// The id under which the group's serving endpoints are listed in `kpng_members` (the
    /// program computes it the same way: `group ^ SERVING`).
    pub fn serving(self) -> GroupId {
        GroupId(self.0 ^ 0x5345_5256_494e_4731)
    }
}

impl fmt::Display for GroupId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}", self.0)
    }
}

/// An endpoint address and port.
pub type Target = (IpAddr, u16);

/// A service address a socket may name: address, protocol, port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frontend {
    /// The address (cluster IP, external IP, load-balancer IP, NodePort address).
    pub ip: IpAddr,
    /// TCP or UDP.
    pub protocol: Protocol,
    /// The port.
    pub port: u16,
}

/// What a frontend does when its group is empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Empty {
    /// `connect()` and `sendmsg()` fail with ECONNREFUSED.
    Reject,
    /// The socket is left alone: the packet path (nftables) drops it, as upstream does.
    Drop,
}

/// The key of one map element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// A service address.
    Frontend(Frontend),
    /// An endpoint group.
    Group(GroupId),
    /// A slot of a group.
    Backend(GroupId, u32),
    /// An endpoint of an affinity group.
    Member(GroupId, Target),
    /// A cluster IP.
    ClusterIp(IpAddr),
}

/// The value of one map element. By default set membership, the value most elements have
/// (the backend template keeps them as bare keys).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    /// A frontend's group and what to do when it is empty.
    Frontend {
        /// The group.
        group: GroupId,
        /// When the group is empty.
        empty: Empty,
        /// UDP: seconds an unconnected socket's flow keeps its endpoint without sending
        /// (conntrack's UDP stream timeout); 0 for TCP.
        flow_seconds: u32,
    },
    /// A group's endpoint count and ClientIP affinity timeout (0: none).
    Group {
        /// Endpoints, in slots `0..count`.
        count: u32,
        /// Affinity timeout in seconds; 0 without affinity.
        affinity_seconds: u32,
    },
    /// The endpoint in a slot.
    Backend(Target),
    /// Set membership (members, cluster IPs).
    #[default]
    Present,
}

/// Writes the fields of a key or value for the backend template ([`Pack`]): addresses
/// with their family byte first, numbers big-endian.
struct Fields(Packed, bool);

impl Fields {
    fn new(kind: u8) -> Fields {
        let mut packed = Packed::new();
        let fits = packed.put(&[kind]);
        Fields(packed, fits)
    }

    fn put(mut self, bytes: &[u8]) -> Fields {
        self.1 = self.1 && self.0.put(bytes);
        self
    }

    fn ip(self, ip: &IpAddr) -> Fields {
        match ip {
            IpAddr::V4(v4) => self.put(&[4]).put(&v4.octets()),
            IpAddr::V6(v6) => self.put(&[6]).put(&v6.octets()),
        }
    }

    fn done(self) -> Option<Packed> {
        self.1.then_some(self.0)
    }
}

/// Reads what [`Fields`] wrote.
struct Read<'a>(&'a [u8]);

impl Read<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (bytes, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*bytes)
    }

    fn u8(&mut self) -> Option<u8> {
        Some(self.take::<1>()?[0])
    }

    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_be_bytes(self.take()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_be_bytes(self.take()?))
    }

    fn group(&mut self) -> Option<GroupId> {
        Some(GroupId(u64::from_be_bytes(self.take()?)))
    }

    fn ip(&mut self) -> Option<IpAddr> {
        match self.u8()? {
            4 => Some(IpAddr::V4(self.take::<4>()?.into())),
            6 => Some(IpAddr::V6(self.take::<16>()?.into())),
            _ => None,
        }
    }

    /// What was read, when nothing is left over.
    fn end<T>(self, value: T) -> Option<T> {
        self.0.is_empty().then_some(value)
    }
}

/// A key packs into its kind and its fields (9 bytes for an IPv4 frontend; a key is 32),
/// so the template keeps a service's entries in one allocation.
impl Pack for Key {
    fn pack(&self) -> Option<Packed> {
        match self {
            Key::Frontend(f) => Fields::new(0)
                .ip(&f.ip)
                .put(&[protocol_number(f.protocol)])
                .put(&f.port.to_be_bytes()),
            Key::Group(g) => Fields::new(1).put(&g.0.to_be_bytes()),
            Key::Backend(g, slot) => {
                Fields::new(2).put(&g.0.to_be_bytes()).put(&slot.to_be_bytes())
            }
            Key::Member(g, (ip, port)) => {
                Fields::new(3).put(&g.0.to_be_bytes()).ip(ip).put(&port.to_be_bytes())
            }
            Key::ClusterIp(ip) => Fields::new(4).ip(ip),
        }
        .done()
    }

    fn unpack(bytes: &[u8]) -> Option<Self> {
        let mut read = Read(bytes);
        let key = match read.u8()? {
            0 => {
                let ip = read.ip()?;
                let protocol = protocol_of(read.u8()?)?;
                Key::Frontend(Frontend { ip, protocol, port: read.u16()? })
            }
            1 => Key::Group(read.group()?),
            2 => Key::Backend(read.group()?, read.u32()?),
            3 => Key::Member(read.group()?, (read.ip()?, read.u16()?)),
            4 => Key::ClusterIp(read.ip()?),
            _ => return None,
        };
        read.end(key)
    }
}

/// A value packs into its kind and its fields.
impl Pack for Value {
    fn pack(&self) -> Option<Packed> {
        match self {
            Value::Frontend { group, empty, flow_seconds } => Fields::new(0)
                .put(&group.0.to_be_bytes())
                .put(&[matches!(empty, Empty::Drop) as u8])
                .put(&flow_seconds.to_be_bytes()),
            Value::Group { count, affinity_seconds } => {
                Fields::new(1).put(&count.to_be_bytes()).put(&affinity_seconds.to_be_bytes())
            }
            Value::Backend((ip, port)) => Fields::new(2).ip(ip).put(&port.to_be_bytes()),
            Value::Present => Fields::new(3),
        }
        .done()
    }

    fn unpack(bytes: &[u8]) -> Option<Self> {
        let mut read = Read(bytes);
        let value = match read.u8()? {
            0 => {
                let group = read.group()?;
                let empty = match read.u8()? {
                    0 => Empty::Reject,
                    1 => Empty::Drop,
                    _ => return None,
                };
                Value::Frontend { group, empty, flow_seconds: read.u32()? }
            }
            1 => Value::Group { count: read.u32()?, affinity_seconds: read.u32()? },
            2 => Value::Backend((read.ip()?, read.u16()?)),
            3 => Value::Present,
            _ => return None,
        };
        read.end(value)
    }
}

impl Key {
    /// The map holding this key.
    pub fn map(&self) -> MapName {
        match self {
            Key::Frontend(_) => MapName::Frontends,
            Key::Group(_) => MapName::Groups,
            Key::Backend(..) => MapName::Backends,
            Key::Member(..) => MapName::Members,
            Key::ClusterIp(_) => MapName::ClusterIps,
        }
    }
}

fn family_byte(ip: &IpAddr) -> u8 {
    match Family::of(ip) {
        Family::V4 => 4,
        Family::V6 => 6,
    }
}

fn put_addr(out: &mut [u8], ip: &IpAddr) {
    match ip {
        IpAddr::V4(v4) => out[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => out[..16].copy_from_slice(&v6.octets()),
    }
}

fn get_addr(bytes: &[u8], family: u8) -> Option<IpAddr> {
    match family {
        4 => Some(IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))),
        6 => {
            let octets: [u8; 16] = bytes[..16].try_into().ok()?;
            Some(IpAddr::V6(Ipv6Addr::from(octets)))
        }
        _ => None,
    }
}

fn protocol_number(protocol: Protocol) -> u8 {
    match protocol {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn protocol_of(number: u8) -> Option<Protocol> {
    match number {
        6 => Some(Protocol::Tcp),
        17 => Some(Protocol::Udp),
        132 => Some(Protocol::Sctp),
        _ => None,
    }
}

/// `struct backend`: 20 bytes.
fn target_bytes((ip, port): &Target) -> [u8; 20] {
    let mut b = [0u8; 20];
    put_addr(&mut b[..16], ip);
    b[16..18].copy_from_slice(&port.to_be_bytes());
    b[18] = family_byte(ip);
    b
}

/// The key under which the programs remember what socket `cookie`, pointed at `endpoint`,
/// asked for (`struct revnat_key`: the cookie, the endpoint as the socket names it, padding).
pub fn revnat_key(cookie: u64, endpoint: std::net::SocketAddr) -> [u8; 32] {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&cookie.to_ne_bytes());
    key[8..28].copy_from_slice(&target_bytes(&(endpoint.ip(), endpoint.port())));
    key
}

/// The service address in a `kpng_revnat` value, as the socket named it.
pub fn revnat_service(value: &[u8; 20]) -> Option<std::net::SocketAddr> {
    target_of(value).map(|(ip, port)| std::net::SocketAddr::new(ip, port))
}

fn target_of(b: &[u8]) -> Option<Target> {
    let ip = get_addr(&b[..16], b[18])?;
    Some((ip, u16::from_be_bytes([b[16], b[17]])))
}

fn group_of(b: &[u8]) -> Option<GroupId> {
    Some(GroupId(u64::from_ne_bytes(b.get(..8)?.try_into().ok()?)))
}

/// An element as the bytes of its map's key and value.
pub type RawElement = (Vec<u8>, Vec<u8>);

/// The key's bytes.
pub fn key_bytes(key: &Key) -> Vec<u8> {
    match key {
        Key::Frontend(f) => {
            let mut b = vec![0u8; 20];
            put_addr(&mut b[..16], &f.ip);
            b[16..18].copy_from_slice(&f.port.to_be_bytes());
            b[18] = protocol_number(f.protocol);
            b[19] = family_byte(&f.ip);
            b
        }
        Key::Group(id) => id.0.to_ne_bytes().to_vec(),
        Key::Backend(id, slot) => {
            let mut b = vec![0u8; 16];
            b[..8].copy_from_slice(&id.0.to_ne_bytes());
            b[8..12].copy_from_slice(&slot.to_ne_bytes());
            b
        }
        Key::Member(id, target) => {
            let mut b = vec![0u8; 32];
            b[..8].copy_from_slice(&id.0.to_ne_bytes());
            b[8..28].copy_from_slice(&target_bytes(target));
            b
        }
        Key::ClusterIp(ip) => {
            let mut b = vec![0u8; 20];
            put_addr(&mut b[..16], ip);
            b[16] = family_byte(ip);
            b
        }
    }
}

/// The value's bytes.
pub fn value_bytes(value: &Value) -> Vec<u8> {
    match value {
        Value::Frontend { group, empty, flow_seconds } => {
            let mut b = vec![0u8; 16];
            b[..8].copy_from_slice(&group.0.to_ne_bytes());
            b[8] = match empty {
                Empty::Reject => 1,
                Empty::Drop => 2,
            };
            b[12..16].copy_from_slice(&flow_seconds.to_ne_bytes());
            b
        }
        Value::Group { count, affinity_seconds } => {
            let mut b = vec![0u8; 8];
            b[..4].copy_from_slice(&count.to_ne_bytes());
            b[4..].copy_from_slice(&affinity_seconds.to_ne_bytes());
            b
        }
        Value::Backend(target) => target_bytes(target).to_vec(),
        Value::Present => vec![1],
    }
}

/// The element stored as `key` and `value` bytes in `map`, or `None` when the bytes are
/// not something kpng writes.
pub fn decode(map: MapName, key: &[u8], value: &[u8]) -> Option<(Key, Value)> {
    let decoded = match map {
        MapName::Frontends => {
            let ip = get_addr(&key[..16], key[19])?;
            let frontend = Frontend {
                ip,
                protocol: protocol_of(key[18])?,
                port: u16::from_be_bytes([key[16], key[17]]),
            };
            let empty = match value.get(8)? {
                1 => Empty::Reject,
                2 => Empty::Drop,
                _ => return None,
            };
            let flow_seconds = u32::from_ne_bytes(value.get(12..16)?.try_into().ok()?);
            let value = Value::Frontend { group: group_of(value)?, empty, flow_seconds };
            (Key::Frontend(frontend), value)
        }
        MapName::Groups => {
            let count = u32::from_ne_bytes(value.get(..4)?.try_into().ok()?);
            let affinity_seconds = u32::from_ne_bytes(value.get(4..8)?.try_into().ok()?);
            (Key::Group(group_of(key)?), Value::Group { count, affinity_seconds })
        }
        MapName::Backends => {
            let slot = u32::from_ne_bytes(key.get(8..12)?.try_into().ok()?);
            (Key::Backend(group_of(key)?, slot), Value::Backend(target_of(value)?))
        }
        MapName::Members => {
            (Key::Member(group_of(key)?, target_of(key.get(8..28)?)?), Value::Present)
        }
        MapName::ClusterIps => (Key::ClusterIp(get_addr(&key[..16], key[16])?), Value::Present),
    };
    Some(decoded)
}

/// Sizes of keys and values per map, as the object declares them.
pub fn layout(map: MapName) -> (usize, usize) {
    match map {
        MapName::Frontends => (20, 16),
        MapName::Groups => (8, 8),
        MapName::Backends => (16, 20),
        MapName::Members => (32, 1),
        MapName::ClusterIps => (20, 1),
    }
}

impl fmt::Display for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let addr = |ip: &IpAddr, port: u16| match ip {
            IpAddr::V4(v4) => format!("{v4}:{port}"),
            IpAddr::V6(v6) => format!("[{v6}]:{port}"),
        };
        match self {
            Key::Frontend(fe) => write!(f, "{} {}", fe.protocol, addr(&fe.ip, fe.port)),
            Key::Group(id) => write!(f, "group {id}"),
            Key::Backend(id, slot) => write!(f, "group {id} slot {slot}"),
            Key::Member(id, (ip, port)) => write!(f, "group {id} {}", addr(ip, *port)),
            Key::ClusterIp(ip) => write!(f, "{ip}"),
        }
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Frontend { group, empty, flow_seconds } => {
                let empty = match empty {
                    Empty::Reject => "reject",
                    Empty::Drop => "drop",
                };
                write!(f, "group {group}, empty: {empty}")?;
                match flow_seconds {
                    0 => Ok(()),
                    seconds => write!(f, ", flows kept {seconds}s"),
                }
            }
            Value::Group { count, affinity_seconds: 0 } => write!(f, "{count} endpoints"),
            Value::Group { count, affinity_seconds } => {
                write!(f, "{count} endpoints, affinity {affinity_seconds}s")
            }
            Value::Backend((IpAddr::V6(ip), port)) => write!(f, "[{ip}]:{port}"),
            Value::Backend((ip, port)) => write!(f, "{ip}:{port}"),
            Value::Present => f.write_str("1"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn elements() -> Vec<(Key, Value)> {
        let g = GroupId(0x0102_0304_0506_0708);
        let v4: IpAddr = "10.96.0.10".parse().unwrap();
        let v6: IpAddr = "fd00:96::10".parse().unwrap();
        vec![
            (
                Key::Frontend(Frontend { ip: v4, protocol: Protocol::Tcp, port: 80 }),
                Value::Frontend { group: g, empty: Empty::Reject, flow_seconds: 0 },
            ),
            (
                Key::Frontend(Frontend { ip: v6, protocol: Protocol::Udp, port: 53 }),
                Value::Frontend { group: g, empty: Empty::Drop, flow_seconds: 120 },
            ),
            (Key::Group(g), Value::Group { count: 3, affinity_seconds: 10800 }),
            (Key::Backend(g, 2), Value::Backend(("10.244.0.5".parse().unwrap(), 8080))),
            (Key::Member(g, (v6, 8080)), Value::Present),
            (Key::ClusterIp(v6), Value::Present),
        ]
    }

    #[test]
    fn layouts_match_the_object() {
        for (key, value) in elements() {
            let (k, v) = layout(key.map());
            assert_eq!(key_bytes(&key).len(), k, "{key}");
            assert_eq!(value_bytes(&value).len(), v, "{value}");
        }
    }

    #[test]
    fn elements_pack_for_the_template_and_come_back() {
        let all = elements();
        for (key, value) in &all {
            let (k, v) = (key.pack().unwrap(), value.pack().unwrap());
            assert_eq!(Key::unpack(k.as_bytes()).as_ref(), Some(key));
            assert_eq!(Value::unpack(v.as_bytes()).as_ref(), Some(value));
            // One byte more or less is refused.
            assert!(Key::unpack(&k.as_bytes()[..k.as_bytes().len() - 1]).is_none());
            assert!(Key::unpack(&[k.as_bytes(), &[0]].concat()).is_none());
        }
        // Distinct keys and values pack apart.
        for (a, b) in all.iter().zip(all.iter().skip(1)) {
            assert_ne!(a.0.pack().unwrap().as_bytes(), b.0.pack().unwrap().as_bytes());
            if a.1 != b.1 {
                assert_ne!(a.1.pack().unwrap().as_bytes(), b.1.pack().unwrap().as_bytes());
            }
        }
        let frontend = Key::Frontend(Frontend {
            ip: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 80,
        });
        assert_eq!(frontend.pack().unwrap().as_bytes().len(), 1 + 1 + 4 + 1 + 2);
        assert_eq!(size_of::<Key>(), 32);
    }

    #[test]
    fn elements_round_trip_through_bytes() {
        for (key, value) in elements() {
            let decoded = decode(key.map(), &key_bytes(&key), &value_bytes(&value));
            assert_eq!(decoded, Some((key, value)));
        }
    }

    #[test]
    fn addresses_and_ports_are_in_network_order() {
        let key = Key::Frontend(Frontend {
            ip: "10.96.0.10".parse().unwrap(),
            protocol: Protocol::Tcp,
            port: 0x1f90,
        });
        let bytes = key_bytes(&key);
        assert_eq!(&bytes[..4], &[10, 96, 0, 10]);
        assert_eq!(&bytes[4..16], &[0; 12]);
        assert_eq!(&bytes[16..], &[0x1f, 0x90, 6, 4]);
        // The flow timeout is the frontend value's last four bytes.
        let value = Value::Frontend { group: GroupId(7), empty: Empty::Drop, flow_seconds: 120 };
        assert_eq!(&value_bytes(&value)[12..], &120u32.to_ne_bytes());
        // The serving set's id is the program's `group ^ SERVING`.
        assert_eq!(GroupId(0).serving().0, 0x5345_5256_494e_4731);
        assert_eq!(GroupId(7).serving().serving(), GroupId(7));
    }
}
