//! The kernel objects kpng manages inside its tables: named sets and maps, their elements,
//! and the chains elements may jump to.

use std::fmt;
use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Family, Protocol};

/// A named set or map of kpng's table. Each exists once per family table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MapName {
    /// Addresses on which NodePorts are accepted.
    NodePortAddrs,
    /// Every cluster IP: traffic to a port the service does not define is rejected.
    ClusterIps,
    /// Service destination (ClusterIP, external IP, LB IP) → where to pick an endpoint.
    ServiceDispatch,
    /// NodePort → where to pick an endpoint.
    NodePortDispatch,
    /// Destination of an externalTrafficPolicy Local service → pick among the Cluster set
    /// (traffic from local pods and from the node).
    ClusterPick,
    /// Destination of an externalTrafficPolicy Local service → pick among the Local set.
    LocalPick,
    /// NodePort variant of [`MapName::ClusterPick`].
    NodePortClusterPick,
    /// NodePort variant of [`MapName::LocalPick`].
    NodePortLocalPick,
    /// Destination and slot → endpoint, Cluster sets.
    ClusterBackends,
    /// Destination and slot → endpoint, Local sets.
    LocalBackends,
    /// NodePort and slot → endpoint, Cluster sets.
    NodePortClusterBackends,
    /// NodePort and slot → endpoint, Local sets.
    NodePortLocalBackends,
    /// Destination without a usable endpoint → drop or reject.
    NoEndpointDests,
    /// NodePort without a usable endpoint → drop or reject.
    NoEndpointNodePorts,
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
}

impl MapName {
    /// Every set and map, in declaration order.
    pub const ALL: [MapName; 19] = [
        MapName::NodePortAddrs,
        MapName::ClusterIps,
        MapName::ServiceDispatch,
        MapName::NodePortDispatch,
        MapName::ClusterPick,
        MapName::LocalPick,
        MapName::NodePortClusterPick,
        MapName::NodePortLocalPick,
        MapName::ClusterBackends,
        MapName::LocalBackends,
        MapName::NodePortClusterBackends,
        MapName::NodePortLocalBackends,
        MapName::NoEndpointDests,
        MapName::NoEndpointNodePorts,
        MapName::MasqDests,
        MapName::MasqNodePorts,
        MapName::FirewallDests,
        MapName::FirewallAllow,
        MapName::Hairpin,
    ];

    /// The name in the kernel.
    pub fn as_str(self) -> &'static str {
        match self {
            MapName::NodePortAddrs => "nodeport_addrs",
            MapName::ClusterIps => "cluster_ips",
            MapName::ServiceDispatch => "service_dispatch",
            MapName::NodePortDispatch => "nodeport_dispatch",
            MapName::ClusterPick => "cluster_pick",
            MapName::LocalPick => "local_pick",
            MapName::NodePortClusterPick => "nodeport_cluster_pick",
            MapName::NodePortLocalPick => "nodeport_local_pick",
            MapName::ClusterBackends => "cluster_backends",
            MapName::LocalBackends => "local_backends",
            MapName::NodePortClusterBackends => "nodeport_cluster_backends",
            MapName::NodePortLocalBackends => "nodeport_local_backends",
            MapName::NoEndpointDests => "no_endpoint_dests",
            MapName::NoEndpointNodePorts => "no_endpoint_nodeports",
            MapName::MasqDests => "masq_dests",
            MapName::MasqNodePorts => "masq_nodeports",
            MapName::FirewallDests => "firewall_dests",
            MapName::FirewallAllow => "firewall_allow",
            MapName::Hairpin => "hairpin",
        }
    }

    /// Whether the set holds ranges (`flags interval`). Only the firewall allow-list does;
    /// it is consulted only for new connections to load-balancer IPs with source ranges.
    pub fn is_interval(self) -> bool {
        matches!(self, MapName::FirewallAllow)
    }
}

impl fmt::Display for MapName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which endpoint set a pick chain chooses from, and how it is keyed.
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

    /// The backends map the chain reads.
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

    fn prefix(self) -> &'static str {
        match self {
            PickKind::Cluster => "pick_cluster",
            PickKind::Local => "pick_local",
            PickKind::NodePortCluster => "pick_nodeport_cluster",
            PickKind::NodePortLocal => "pick_nodeport_local",
        }
    }
}

/// A chain an element can jump to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ChainRef {
    /// Picks one of `n` endpoints uniformly at random (`numgen random mod n`). One such
    /// chain exists per kind and distinct endpoint count in use.
    Pick(PickKind, u32),
    /// externalTrafficPolicy Local: short-circuit pods and the node, else the Local set.
    ExternalLocal,
    /// NodePort variant of [`ChainRef::ExternalLocal`].
    NodePortLocal,
    /// Rejects the packet (ICMP port unreachable).
    Reject,
}

impl fmt::Display for ChainRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChainRef::Pick(kind, n) => write!(f, "{}_{n}", kind.prefix()),
            ChainRef::ExternalLocal => f.write_str("external_local"),
            ChainRef::NodePortLocal => f.write_str("nodeport_local"),
            ChainRef::Reject => f.write_str("reject_packet"),
        }
    }
}

/// A verdict stored in a verdict map.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Verdict {
    /// Continue in a chain (no return).
    Goto(ChainRef),
    /// Drop the packet.
    Drop,
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
    /// A network (interval sets).
    Net(IpNet),
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

/// The value of an element: nothing for sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Value {
    /// A set element.
    None,
    /// A verdict.
    Verdict(Verdict),
    /// An endpoint address and port (DNAT target).
    Endpoint(IpAddr, u16),
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
