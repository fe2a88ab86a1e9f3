//! The kernel objects kpng manages inside its tables: named sets and maps, their elements,
//! and the chains elements may jump to.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Family, Protocol};

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
    /// Destination and slot → endpoint, Cluster sets.
    ClusterBackends,
    /// Destination and slot → endpoint, Local sets.
    LocalBackends,
    /// NodePort and slot → endpoint, Cluster sets.
    NodePortClusterBackends,
    /// NodePort and slot → endpoint, Local sets.
    NodePortLocalBackends,
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
    /// `(endpoint, endpoint)` pairs of local endpoints: a pod reaching itself is masqueraded.
    Hairpin,
    /// Destinations of ClientIP-affinity services → their affinity chain, Cluster sets.
    AffinityCluster,
    /// The same for Local sets.
    AffinityLocal,
    /// NodePorts of ClientIP-affinity services → their affinity chain, Cluster sets.
    AffinityNodePortCluster,
    /// The same for Local sets.
    AffinityNodePortLocal,
    /// The destinations (or NodePorts) whose set of kind `PickKind` has exactly `n`
    /// endpoints: the rule that picks among `n` slots matches them. Created the first
    /// time a count is used.
    Count(PickKind, u32),
}

impl MapName {
    /// Every set and map of the static skeleton, in declaration order.
    pub const ALL: [MapName; 24] = [
        MapName::NodePortAddrs,
        MapName::ClusterIps,
        MapName::ClusterDests,
        MapName::LocalDests,
        MapName::ExternalLocalDests,
        MapName::NodePortClusterDests,
        MapName::NodePortLocalDests,
        MapName::ClusterBackends,
        MapName::LocalBackends,
        MapName::NodePortClusterBackends,
        MapName::NodePortLocalBackends,
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
            MapName::ClusterBackends => "cluster_backends",
            MapName::LocalBackends => "local_backends",
            MapName::NodePortClusterBackends => "nodeport_cluster_backends",
            MapName::NodePortLocalBackends => "nodeport_local_backends",
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
            MapName::Count(kind, n) => return format!("{}_count_{n}", kind.prefix()).into(),
        };
        fixed.into()
    }

    /// The set a name stands for (the inverse of [`MapName::name`]).
    pub fn parse(name: &str) -> Option<MapName> {
        if let Some(map) = MapName::ALL.into_iter().find(|m| m.name() == name) {
            return Some(map);
        }
        let (prefix, n) = name.rsplit_once("_count_")?;
        let n: u32 = n.parse().ok()?;
        PickKind::ALL.into_iter().find(|k| k.prefix() == prefix).map(|k| MapName::Count(k, n))
    }
}

impl fmt::Display for MapName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
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

    /// The backends map the pick reads.
    pub fn backends(self) -> MapName {
        match self {
            PickKind::Cluster => MapName::ClusterBackends,
            PickKind::Local => MapName::LocalBackends,
            PickKind::NodePortCluster => MapName::NodePortClusterBackends,
            PickKind::NodePortLocal => MapName::NodePortLocalBackends,
        }
    }

    /// Whether the key starts with the destination address (else it is a NodePort).
    pub fn by_destination(self) -> bool {
        matches!(self, PickKind::Cluster | PickKind::Local)
    }

    /// The name stem of the kind's chain and count sets.
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

    /// The chain holding the kind's pick rules, one per endpoint count in use.
    pub fn counts_chain(self) -> String {
        format!("pick_{}_counts", self.prefix())
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

/// kpng's table name (the same in both families).
pub const TABLE: &str = "kpng";
