//! discovery.k8s.io/v1 `EndpointSlice`, reduced.

use serde::Deserialize;

use super::ObjectMeta;

/// A discovery.k8s.io/v1 EndpointSlice.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct EndpointSlice {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `addressType`.
    pub address_type: Option<String>,
    /// `ports`.
    pub ports: Option<Vec<EndpointPort>>,
    /// `endpoints`.
    pub endpoints: Option<Vec<Endpoint>>,
}

/// One of `ports`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct EndpointPort {
    /// `name`.
    pub name: Option<String>,
    /// `protocol`.
    pub protocol: Option<String>,
    /// `port`.
    pub port: Option<i64>,
}

/// One of `endpoints`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Endpoint {
    /// `addresses` (only the first is used).
    pub addresses: Option<Vec<String>>,
    /// `conditions`.
    pub conditions: Option<Conditions>,
    /// `nodeName`.
    pub node_name: Option<String>,
    /// `zone`.
    pub zone: Option<String>,
    /// `hints`.
    pub hints: Option<Hints>,
    /// `targetRef`.
    pub target_ref: Option<TargetRef>,
}

/// `endpoints[].conditions`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Conditions {
    /// `ready`.
    pub ready: Option<bool>,
    /// `serving`.
    pub serving: Option<bool>,
    /// `terminating`.
    pub terminating: Option<bool>,
}

/// `endpoints[].hints`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Hints {
    /// `forZones`.
    pub for_zones: Option<Vec<Named>>,
    /// `forNodes`.
    pub for_nodes: Option<Vec<Named>>,
}

/// An entry of `forZones` or `forNodes`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Named {
    /// `name`.
    pub name: Option<String>,
}

/// `endpoints[].targetRef`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct TargetRef {
    /// `kind`.
    pub kind: Option<String>,
    /// `name`.
    pub name: Option<String>,
}
