//! EndpointSlices, reduced to what a proxy enforces.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::global::ServiceKey;
use crate::net::{Family, Protocol};

/// Identifies an EndpointSlice: `namespace/name`. Its parts are shared like a
/// [`ServiceKey`]'s: a copy allocates nothing.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SliceKey {
    /// The namespace.
    pub namespace: Arc<str>,
    /// The slice's own name (not the service's).
    pub name: Arc<str>,
}

impl SliceKey {
    /// A key from its parts.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        SliceKey { namespace: namespace.into(), name: name.into() }
    }
}

impl fmt::Display for SliceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A port of an EndpointSlice. It serves the service port with the same name and protocol.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct SlicePort {
    /// The port name (empty for an unnamed port).
    pub name: String,
    /// The transport protocol.
    pub protocol: Protocol,
    /// The port number on the endpoints. Slice ports without a number are dropped at ingest.
    pub port: u16,
}

/// One endpoint of a slice: the first of its addresses and its conditions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Endpoint {
    /// The endpoint's address (only the first address counts).
    pub address: IpAddr,
    /// `conditions.ready`, true when absent.
    pub ready: bool,
    /// `conditions.serving`, true when absent.
    pub serving: bool,
    /// `conditions.terminating`, false when absent.
    pub terminating: bool,
    /// The node hosting the endpoint (in a [`crate::GlobalModel`], one copy per name).
    pub node_name: Option<Arc<str>>,
    /// The zone of that node (in a [`crate::GlobalModel`], one copy per name).
    pub zone: Option<Arc<str>>,
    /// `hints.forZones[].name`: the zones that should use this endpoint. Empty: no hint.
    pub zone_hints: Vec<String>,
    /// `hints.forNodes[].name`: the nodes that should use this endpoint. Empty: no hint.
    pub node_hints: Vec<String>,
    /// The pod behind the endpoint (`targetRef` of kind Pod).
    pub pod_name: Option<Arc<str>>,
}

impl Endpoint {
    /// Ready: receives new connections.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// Serving and terminating: a fallback when nothing is ready.
    pub fn is_serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
}

/// An EndpointSlice of a proxied service.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EndpointSlice {
    /// `namespace/name` of the slice.
    pub key: SliceKey,
    /// The service named by the `kubernetes.io/service-name` label, in the slice's namespace.
    pub service_name: Arc<str>,
    /// The address family (FQDN slices are dropped at ingest).
    pub family: Family,
    /// The ports every endpoint of the slice serves.
    pub ports: Vec<SlicePort>,
    /// The endpoints, in slice order.
    pub endpoints: Vec<Endpoint>,
    /// The `endpoints.kubernetes.io/last-change-trigger-time` annotation, verbatim (RFC 3339):
    /// when the change this slice reflects was triggered.
    pub trigger_time: Option<String>,
    /// The `service.kubernetes.io/service-proxy-name` label: the proxy that handles the
    /// slice (`None`: the default proxy). See [`is_for_proxy`](crate::global::is_for_proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_name: Option<String>,
}

impl EndpointSlice {
    /// The service this slice belongs to.
    pub fn service_key(&self) -> ServiceKey {
        ServiceKey::new(self.key.namespace.clone(), self.service_name.clone())
    }
}
