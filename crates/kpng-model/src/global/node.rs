//! Nodes, reduced to what a proxy enforces.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::net::Family;

/// The label naming a node's zone.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";

/// The taint the cluster autoscaler puts on a node it is about to remove.
pub const TO_BE_DELETED_TAINT: &str = "ToBeDeletedByClusterAutoscaler";

/// The kind of a node address. Only the kinds that can be a node's primary IP are kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum NodeAddressKind {
    /// `InternalIP`: preferred as the primary IP.
    InternalIP,
    /// `ExternalIP`: used when a family has no internal IP.
    ExternalIP,
}

/// One of `status.addresses`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodeAddress {
    /// The address kind.
    pub kind: NodeAddressKind,
    /// The address.
    pub ip: IpAddr,
}

/// A Node, reduced to what a proxy enforces.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Node {
    /// The node name.
    pub name: String,
    /// The labels that matter to a proxy: `topology.kubernetes.io/*` and `kubernetes.io/hostname`.
    pub labels: BTreeMap<String, String>,
    /// InternalIP and ExternalIP addresses, in status order.
    pub addresses: Vec<NodeAddress>,
    /// `spec.podCIDRs`: a local-traffic detector may treat them as this node's pods.
    pub pod_cidrs: Vec<IpNet>,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// Tainted `ToBeDeletedByClusterAutoscaler`.
    pub to_be_deleted: bool,
}

impl Node {
    /// The node's zone (`topology.kubernetes.io/zone`).
    pub fn zone(&self) -> Option<&str> {
        self.labels.get(ZONE_LABEL).map(String::as_str)
    }

    /// The node's primary IP of `family`: its first InternalIP of that family, else its
    /// first ExternalIP of that family.
    pub fn primary_ip(&self, family: Family) -> Option<IpAddr> {
        [NodeAddressKind::InternalIP, NodeAddressKind::ExternalIP].into_iter().find_map(|kind| {
            self.addresses
                .iter()
                .find(|a| a.kind == kind && Family::of(&a.ip) == family)
                .map(|a| a.ip)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(kind: NodeAddressKind, ip: &str) -> NodeAddress {
        NodeAddress { kind, ip: ip.parse().unwrap() }
    }

    #[test]
    fn primary_ip_prefers_internal_per_family() {
        let node = Node {
            name: "n".into(),
            labels: BTreeMap::new(),
            addresses: vec![
                addr(NodeAddressKind::ExternalIP, "203.0.113.1"),
                addr(NodeAddressKind::InternalIP, "10.0.0.1"),
                addr(NodeAddressKind::InternalIP, "10.0.0.2"),
                addr(NodeAddressKind::ExternalIP, "2001:db8::1"),
            ],
            pod_cidrs: vec![],
            deleting: false,
            to_be_deleted: false,
        };
        assert_eq!(node.primary_ip(Family::V4), Some("10.0.0.1".parse().unwrap()));
        assert_eq!(node.primary_ip(Family::V6), Some("2001:db8::1".parse().unwrap()));
    }
}
