//! The objects kpng manages inside its tables: named sets and maps with their key types,
//! element keys and values, and the names of the chains that are not static.
//!
//! Names that outlive the process (affinity groups, read back at a restart) come from an
//! explicit, versioned encoding ([`GroupKey::hash`]), never from `Debug` output.
//!
//! Kept in one file on purpose: every set and map of the table, with its key and value
//! types, is declared here, so the names a restart reads back are defined in one place.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Family, Protocol, ServiceKey};

/// kpng's table name (the same in both families).
pub const TABLE: &str = "kpng";

/// Endpoint counts the pick tree serves (`numgen random mod n` for n up to this); services
/// with more endpoints get a count set and pick rule of their own.
pub const TREE_COUNTS: u32 = 1 << TREE_BITS;

/// Levels of the pick tree: bits of `count - 1`.
pub const TREE_BITS: u8 = 8;

/// A named set or map of kpng's tables. Each exists once per family table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MapName {
    /// Addresses on which NodePorts are accepted.
    NodePortAddrs,
    /// Every cluster IP: traffic to a port the service does not define is rejected.
    ClusterIps,
    /// Destinations (ClusterIP, external IP, LB IP) served from the Cluster set.
    ClusterDests,
    /// ClusterIP destinations served from the Local set (internalTrafficPolicy Local).
    LocalDests,
    /// External destinations with externalTrafficPolicy Local: pods and the node use the
    /// Cluster set, everyone else the Local set.
    ExternalLocalDests,
    /// NodePorts served from the Cluster set.
    NodePortClusterDests,
    /// NodePorts with externalTrafficPolicy Local.
    NodePortLocalDests,
    /// Destinations without any usable endpoint: rejected.
    RejectDests,
    /// Destinations whose traffic policy leaves no endpoint here: dropped.
    DropDests,
    /// NodePorts without any usable endpoint: rejected.
    RejectNodePorts,
    /// NodePorts whose traffic policy leaves no endpoint here: dropped.
    DropNodePorts,
    /// External destinations whose traffic is always masqueraded (policy Cluster).
    MasqDests,
    /// NodePorts whose traffic is always masqueraded (policy Cluster).
    MasqNodePorts,
    /// Load-balancer destinations that filter their sources.
    FirewallDests,
    /// Allowed (destination, source range) pairs. Interval set.
    FirewallAllow,
    /// `(endpoint, endpoint)` pairs: a pod reaching itself through a service is masqueraded.
    Hairpin,
    /// Destinations of ClientIP-affinity services → their affinity chain, Cluster sets.
    AffinityCluster,
    /// The same for Local sets.
    AffinityLocal,
    /// NodePorts of ClientIP-affinity services → their affinity chain, Cluster sets.
    AffinityNodePortCluster,
    /// The same for Local sets.
    AffinityNodePortLocal,
    /// The keys of `PickKind` whose endpoint count `n` has bit `b` set in `n - 1`: the pick
    /// tree branches on them.
    Bit(PickKind, u8),
    /// The keys of `PickKind` with exactly `n` endpoints, for counts beyond the tree
    /// ([`TREE_COUNTS`]); created the first time such a count is used.
    Count(PickKind, u32),
    /// Key of `PickKind` and slot → endpoint, for the keys whose endpoint count is in
    /// bucket `b` ([`bucket`]).
    ///
    /// One map per bucket rather than one per kind: the kernel checks a map element it
    /// adds against every rule that reads the map, and a pick rule per count reads it (256
    /// of them in the tree), which made adding a backends element cost about 3.4 µs more
    /// than adding it to a map one rule reads. The pick rules of the counts in a bucket
    /// read its map: 2^(b-1) rules for bucket b, and a service with four endpoints is
    /// checked against two. A service whose count leaves its bucket moves its backends
    /// elements to the next one.
    Backends(PickKind, u8),
}

/// Buckets of endpoint counts with a backends map each ([`MapName::Backends`]): bucket 0
/// holds the count 1, bucket `b` up to [`TREE_BITS`] the counts `2^(b-1) + 1 ..= 2^b`, and
/// the last one the counts beyond the tree.
pub const BUCKETS: u8 = TREE_BITS + 2;

/// The bucket of `n` endpoints: the bit length of `n - 1`, the counts beyond the tree in
/// the last.
pub fn bucket(n: u32) -> u8 {
    match n {
        0..=1 => 0,
        n if n > TREE_COUNTS => BUCKETS - 1,
        n => (u32::BITS - (n - 1).leading_zeros()) as u8,
    }
}

impl MapName {
    /// Every static set and map, in declaration order (bit sets follow, per kind).
    pub const FIXED: [MapName; 20] = [
        MapName::NodePortAddrs,
        MapName::ClusterIps,
        MapName::ClusterDests,
        MapName::LocalDests,
        MapName::ExternalLocalDests,
        MapName::NodePortClusterDests,
        MapName::NodePortLocalDests,
        MapName::RejectDests,
        MapName::DropDests,
        MapName::RejectNodePorts,
        MapName::DropNodePorts,
        MapName::MasqDests,
        MapName::MasqNodePorts,
        MapName::FirewallDests,
        MapName::FirewallAllow,
        MapName::Hairpin,
        MapName::AffinityCluster,
        MapName::AffinityLocal,
        MapName::AffinityNodePortCluster,
        MapName::AffinityNodePortLocal,
    ];

    /// Every set and map of the static skeleton: the fixed ones, then the bit sets, then
    /// the backends maps, per kind.
    pub fn all_static() -> impl Iterator<Item = MapName> {
        let bits = PickKind::ALL
            .into_iter()
            .flat_map(|kind| (0..TREE_BITS).map(move |b| MapName::Bit(kind, b)));
        let backends = PickKind::ALL
            .into_iter()
            .flat_map(|kind| (0..BUCKETS).map(move |b| MapName::Backends(kind, b)));
        MapName::FIXED.into_iter().chain(bits).chain(backends)
    }

    /// The name in the kernel.
    pub fn name(self) -> std::borrow::Cow<'static, str> {
        let fixed = match self {
            MapName::NodePortAddrs => "nodeport_addrs",
            MapName::ClusterIps => "cluster_ips",
            MapName::ClusterDests => "cluster_dests",
            MapName::LocalDests => "local_dests",
            MapName::ExternalLocalDests => "external_local_dests",
            MapName::NodePortClusterDests => "nodeport_cluster_dests",
            MapName::NodePortLocalDests => "nodeport_local_dests",
            MapName::RejectDests => "reject_dests",
            MapName::DropDests => "drop_dests",
            MapName::RejectNodePorts => "reject_nodeports",
            MapName::DropNodePorts => "drop_nodeports",
            MapName::MasqDests => "masq_dests",
            MapName::MasqNodePorts => "masq_nodeports",
            MapName::FirewallDests => "firewall_dests",
            MapName::FirewallAllow => "firewall_allow",
            MapName::Hairpin => "hairpin",
            MapName::AffinityCluster => "affinity_cluster",
            MapName::AffinityLocal => "affinity_local",
            MapName::AffinityNodePortCluster => "affinity_nodeport_cluster",
            MapName::AffinityNodePortLocal => "affinity_nodeport_local",
            MapName::Bit(kind, b) => return format!("{}_bit_{b}", kind.prefix()).into(),
            MapName::Count(kind, n) => return format!("{}_count_{n}", kind.prefix()).into(),
            // Named by the largest count the bucket holds.
            MapName::Backends(kind, b) if b <= TREE_BITS => {
                return format!("{}_backends_{}", kind.prefix(), 1u32 << b).into();
            }
            MapName::Backends(kind, _) => {
                return format!("{}_backends_more", kind.prefix()).into();
            }
        };
        fixed.into()
    }

    /// The set a name stands for (the inverse of [`MapName::name`]).
    pub fn parse(name: &str) -> Option<MapName> {
        if let Some(map) = MapName::all_static().find(|m| m.name() == name) {
            return Some(map);
        }
        let (prefix, n) = name.rsplit_once("_count_")?;
        let n: u32 = n.parse().ok()?;
        let kind = PickKind::ALL.into_iter().find(|k| k.prefix() == prefix)?;
        (n > TREE_COUNTS).then_some(MapName::Count(kind, n))
    }

    /// What the set's keys are.
    pub fn key_kind(self) -> KeyKind {
        match self {
            MapName::NodePortAddrs | MapName::ClusterIps => KeyKind::Addr,
            MapName::ClusterDests
            | MapName::LocalDests
            | MapName::ExternalLocalDests
            | MapName::RejectDests
            | MapName::DropDests
            | MapName::MasqDests
            | MapName::FirewallDests
            | MapName::AffinityCluster
            | MapName::AffinityLocal => KeyKind::Dest,
            MapName::NodePortClusterDests
            | MapName::NodePortLocalDests
            | MapName::RejectNodePorts
            | MapName::DropNodePorts
            | MapName::MasqNodePorts
            | MapName::AffinityNodePortCluster
            | MapName::AffinityNodePortLocal => KeyKind::NodePort,
            MapName::Backends(kind, _) => match kind.by_destination() {
                true => KeyKind::DestSlot,
                false => KeyKind::NodePortSlot,
            },
            MapName::FirewallAllow => KeyKind::DestSource,
            MapName::Hairpin => KeyKind::AddrPair,
            MapName::Bit(kind, _) | MapName::Count(kind, _) => match kind.by_destination() {
                true => KeyKind::Dest,
                false => KeyKind::NodePort,
            },
        }
    }

    /// What the map's values are (`None` for a set).
    pub fn value_kind(self) -> Option<ValueKind> {
        match self {
            MapName::Backends(..) => Some(ValueKind::Endpoint),
            MapName::AffinityCluster
            | MapName::AffinityLocal
            | MapName::AffinityNodePortCluster
            | MapName::AffinityNodePortLocal => Some(ValueKind::Verdict),
            _ => None,
        }
    }
}

impl fmt::Display for MapName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// The shape of a set's keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeyKind {
    /// An address.
    Addr,
    /// Address, protocol, port.
    Dest,
    /// Protocol, port (on a NodePort address).
    NodePort,
    /// A destination and a slot.
    DestSlot,
    /// A NodePort and a slot.
    NodePortSlot,
    /// Source and destination addresses.
    AddrPair,
    /// A destination and a source range (interval on the last field).
    DestSource,
}

/// The shape of a map's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueKind {
    /// Address and port.
    Endpoint,
    /// A verdict (`goto` a chain).
    Verdict,
}

/// Which endpoint set a pick chooses from, and how it is keyed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PickKind {
    /// Cluster set, keyed by destination.
    Cluster,
    /// Local set, keyed by destination.
    Local,
    /// Cluster set, keyed by NodePort.
    NodePortCluster,
    /// Local set, keyed by NodePort.
    NodePortLocal,
}

impl PickKind {
    /// Every kind.
    pub const ALL: [PickKind; 4] =
        [PickKind::Cluster, PickKind::Local, PickKind::NodePortCluster, PickKind::NodePortLocal];

    /// The backends map the pick among `n` slots reads.
    pub fn backends(self, n: u32) -> MapName {
        MapName::Backends(self, bucket(n))
    }

    /// Whether the key starts with the destination address (else it is a NodePort).
    pub fn by_destination(self) -> bool {
        matches!(self, PickKind::Cluster | PickKind::Local)
    }

    /// The name stem of the kind's chains and sets.
    pub fn prefix(self) -> &'static str {
        match self {
            PickKind::Cluster => "cluster",
            PickKind::Local => "local",
            PickKind::NodePortCluster => "nodeport_cluster",
            PickKind::NodePortLocal => "nodeport_local",
        }
    }

    /// The static chain every pick of this kind enters: affinity first, then counts.
    pub fn chain(self) -> String {
        format!("pick_{}", self.prefix())
    }

    /// The chain holding the pick rules of counts beyond the tree, then the way into the
    /// tree.
    pub fn counts_chain(self) -> String {
        format!("pick_{}_counts", self.prefix())
    }

    /// The pick tree's node after `depth` bits decided with value `prefix` (the root is
    /// depth 0): it branches on bit `TREE_BITS - 1 - depth` of `count - 1`.
    pub fn tree_chain(self, depth: u8, prefix: u32) -> String {
        format!("pick_{}_t{depth}_{prefix}", self.prefix())
    }

    /// The verdict map sending destinations of affinity services to their chain.
    pub fn affinity_map(self) -> MapName {
        match self {
            PickKind::Cluster => MapName::AffinityCluster,
            PickKind::Local => MapName::AffinityLocal,
            PickKind::NodePortCluster => MapName::AffinityNodePortCluster,
            PickKind::NodePortLocal => MapName::AffinityNodePortLocal,
        }
    }

    /// The endpoint set this kind picks from.
    pub fn set_kind(self) -> SetKind {
        match self {
            PickKind::Cluster | PickKind::NodePortCluster => SetKind::Cluster,
            PickKind::Local | PickKind::NodePortLocal => SetKind::Local,
        }
    }
}

/// Which endpoint set a group of slots holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum SetKind {
    /// The Cluster set.
    Cluster,
    /// The Local set.
    Local,
}

/// Identifies the slot list of one service port, family and set.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    /// The family.
    pub family: Family,
    /// The service port's name.
    pub port: std::sync::Arc<str>,
    /// The service port's protocol.
    pub protocol: Protocol,
    /// The set.
    pub kind: SetKind,
}

impl GroupKey {
    /// A stable 64-bit name for this group of `service`: FNV-1a of an explicit encoding
    /// (`v1|namespace/name|4 or 6|port|TCP|cluster or local`). The kernel's affinity chains
    /// are named after it and a restart finds them by it, so the encoding never changes
    /// without a new version prefix.
    pub fn hash(&self, service: &ServiceKey) -> u64 {
        let family = match self.family {
            Family::V4 => "4",
            Family::V6 => "6",
        };
        let kind = match self.kind {
            SetKind::Cluster => "cluster",
            SetKind::Local => "local",
        };
        let text = format!("v1|{service}|{family}|{}|{}|{kind}", self.port, self.protocol.as_str());
        kpng_model::hash::fnv1a64(text.as_bytes())
    }
}

/// A value of an element: nothing for sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    /// A set element.
    None,
    /// An endpoint address and port (DNAT target).
    Endpoint(IpAddr, u16),
    /// `goto` the affinity chain of the group with this hash.
    Affinity(u64),
}

/// The name of an affinity group's entry chain; its slot `i` has set and chain
/// `<name>_<i>`.
pub fn affinity_chain(hash: u64) -> String {
    format!("aff_{hash:016x}")
}

/// The name of slot `i`'s set and chain of the affinity group `hash`.
pub fn affinity_slot(hash: u64, i: usize) -> String {
    format!("{}_{i}", affinity_chain(hash))
}

/// An affinity group's slot name (`aff_<hash>_<slot>`) as `(hash, slot)`.
pub fn parse_affinity_slot(name: &str) -> Option<(u64, u32)> {
    let rest = name.strip_prefix("aff_")?;
    let (hash, slot) = rest.split_once('_')?;
    Some((u64::from_str_radix(hash, 16).ok()?, slot.parse().ok()?))
}

/// A destination: address, protocol, port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Dest {
    /// The address.
    pub ip: IpAddr,
    /// The protocol.
    pub protocol: Protocol,
    /// The port.
    pub port: u16,
}

/// The key of an element.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Key {
    /// One address.
    Addr(IpAddr),
    /// A destination.
    Dest(Dest),
    /// A NodePort: protocol and port.
    NodePort(Protocol, u16),
    /// A destination and a slot.
    DestSlot(Dest, u32),
    /// A NodePort and a slot.
    NodePortSlot(Protocol, u16, u32),
    /// Two addresses.
    AddrPair(IpAddr, IpAddr),
    /// A destination and a source network (interval on the last field).
    DestSource(Dest, IpNet),
}

impl Key {
    /// The slot of a backends key.
    pub fn slot(&self) -> Option<u32> {
        match self {
            Key::DestSlot(_, slot) | Key::NodePortSlot(_, _, slot) => Some(*slot),
            _ => None,
        }
    }

    /// The same key with another slot (backends keys only).
    pub fn with_slot(&self, slot: u32) -> Key {
        match *self {
            Key::DestSlot(dest, _) => Key::DestSlot(dest, slot),
            Key::NodePortSlot(protocol, port, _) => Key::NodePortSlot(protocol, port, slot),
            other => other,
        }
    }

    /// A destination or NodePort key with `slot` (the key of its backends element).
    pub fn slotted(&self, slot: u32) -> Option<Key> {
        match *self {
            Key::Dest(dest) => Some(Key::DestSlot(dest, slot)),
            Key::NodePort(protocol, port) => Some(Key::NodePortSlot(protocol, port, slot)),
            _ => None,
        }
    }
}

/// Identifies one element of kpng's tables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ElementId {
    /// The family table.
    pub family: Family,
    /// The set or map.
    pub map: MapName,
    /// The key.
    pub key: Key,
}

/// The nftables family keyword of a family's table.
pub fn table_family(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

/// The netlink family of a family's table.
pub fn proto_family(family: Family) -> kpng_netlink::ProtoFamily {
    match family {
        Family::V4 => kpng_netlink::ProtoFamily::Ipv4,
        Family::V6 => kpng_netlink::ProtoFamily::Ipv6,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for map in MapName::all_static().chain([MapName::Count(PickKind::Local, 300)]) {
            assert_eq!(MapName::parse(&map.name()), Some(map), "{map}");
        }
        assert_eq!(MapName::parse("cluster_count_3"), None, "small counts live in the tree");
        assert_eq!(parse_affinity_slot(&affinity_slot(0xabc, 7)), Some((0xabc, 7)));
    }

    #[test]
    fn counts_fall_into_buckets_of_powers_of_two() {
        let buckets: Vec<u8> =
            [1, 2, 3, 4, 5, 8, 9, 128, 129, 256, 257, 5000].into_iter().map(bucket).collect();
        assert_eq!(buckets, [0, 1, 2, 2, 3, 3, 4, 7, 8, 8, 9, 9]);
        assert_eq!(bucket(TREE_COUNTS + 1), BUCKETS - 1);
        let names: Vec<String> = [1, 3, 256, 257]
            .into_iter()
            .map(|n| PickKind::NodePortLocal.backends(n).name().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "nodeport_local_backends_1",
                "nodeport_local_backends_4",
                "nodeport_local_backends_256",
                "nodeport_local_backends_more"
            ]
        );
    }

    #[test]
    fn group_names_are_pinned() {
        // Chains in kernels out there are named after these: a change orphans them.
        let group = GroupKey {
            family: Family::V6,
            port: "http".into(),
            protocol: Protocol::Tcp,
            kind: SetKind::Local,
        };
        let service = ServiceKey::new("shop", "web");
        assert_eq!(
            group.hash(&service),
            kpng_model::hash::fnv1a64(b"v1|shop/web|6|http|TCP|local")
        );
    }
}
