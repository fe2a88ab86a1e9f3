//! v1 `Node`, reduced.

use serde::Deserialize;

use super::ObjectMeta;

/// A v1 Node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Node {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`.
    pub spec: Option<NodeSpec>,
    /// `status`.
    pub status: Option<NodeStatus>,
}

/// `spec` of a Node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NodeSpec {
    /// `podCIDR`.
    #[serde(rename = "podCIDR")]
    pub pod_cidr: Option<String>,
    /// `podCIDRs`.
    #[serde(rename = "podCIDRs")]
    pub pod_cidrs: Option<Vec<String>>,
    /// `taints`.
    pub taints: Option<Vec<Taint>>,
}

/// One of `spec.taints`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Taint {
    /// `key`.
    pub key: Option<String>,
}

/// `status` of a Node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NodeStatus {
    /// `addresses`.
    pub addresses: Option<Vec<NodeAddress>>,
}

/// One of `status.addresses`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct NodeAddress {
    /// `type`.
    #[serde(rename = "type")]
    pub type_: Option<String>,
    /// `address`.
    pub address: Option<String>,
}
