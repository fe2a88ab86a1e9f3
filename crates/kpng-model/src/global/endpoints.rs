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
    /// The port name (empty for an unnamed port); in a [`crate::GlobalModel`], one copy
    /// per name.
    pub name: Arc<str>,
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
    /// `hints`: the zones and nodes that should use this endpoint (serialized as the
    /// `zone_hints` and `node_hints` lists).
    #[serde(flatten)]
    pub hints: Hints,
    /// The pod behind the endpoint (`targetRef` of kind Pod).
    pub pod_name: Option<Arc<str>>,
}

impl Endpoint {
    /// Ready: receives new connections.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// `hints.forZones[].name`: the zones that should use this endpoint. Empty: no hint.
    pub fn zone_hints(&self) -> &[String] {
        self.hints.zones()
    }

    /// `hints.forNodes[].name`: the nodes that should use this endpoint. Empty: no hint.
    pub fn node_hints(&self) -> &[String] {
        self.hints.nodes()
    }

    /// Serving and terminating: a fallback when nothing is ready.
    pub fn is_serving_terminating(&self) -> bool {
        self.serving && self.terminating
    }
}

/// An endpoint's topology hints. Nearly every endpoint has none, and a cluster has
/// hundreds of thousands of endpoints: the lists are held out of line, behind one pointer
/// that is null when both are empty (so equal hints are equal values).
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Hints(Option<Box<HintLists>>);

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
struct HintLists {
    #[serde(default)]
    zone_hints: Vec<String>,
    #[serde(default)]
    node_hints: Vec<String>,
}

impl Hints {
    /// Hints for the zones `zones` and the nodes `nodes` (both empty: no hint).
    pub fn new(zones: Vec<String>, nodes: Vec<String>) -> Hints {
        let some = !zones.is_empty() || !nodes.is_empty();
        Hints(some.then(|| Box::new(HintLists { zone_hints: zones, node_hints: nodes })))
    }

    /// The zones that should use the endpoint.
    pub fn zones(&self) -> &[String] {
        self.0.as_ref().map(|h| &h.zone_hints[..]).unwrap_or_default()
    }

    /// The nodes that should use the endpoint.
    pub fn nodes(&self) -> &[String] {
        self.0.as_ref().map(|h| &h.node_hints[..]).unwrap_or_default()
    }
}

/// No hint, as serialized: two empty lists.
const NO_HINTS: HintLists = HintLists { zone_hints: Vec::new(), node_hints: Vec::new() };

impl Serialize for Hints {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.0.as_deref().unwrap_or(&NO_HINTS).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Hints {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Hints, D::Error> {
        let lists = HintLists::deserialize(deserializer)?;
        Ok(Hints::new(lists.zone_hints, lists.node_hints))
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

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(hints: Hints) -> Endpoint {
        Endpoint {
            address: [10, 0, 0, 1].into(),
            ready: true,
            serving: true,
            terminating: false,
            node_name: None,
            zone: None,
            hints,
            pod_name: None,
        }
    }

    #[test]
    fn hints_keep_their_lists_in_json_and_empty_hints_are_no_hints() {
        let hinted = endpoint(Hints::new(vec!["z1".into()], vec!["n1".into(), "n2".into()]));
        let json = serde_json::to_value(&hinted).unwrap();
        assert_eq!(json["zone_hints"], serde_json::json!(["z1"]));
        assert_eq!(json["node_hints"], serde_json::json!(["n1", "n2"]));
        assert_eq!(serde_json::from_value::<Endpoint>(json).unwrap(), hinted);
        assert_eq!((hinted.zone_hints(), hinted.node_hints().len()), (&["z1".to_string()][..], 2));

        let plain = endpoint(Hints::new(vec![], vec![]));
        assert_eq!(plain, endpoint(Hints::default()));
        let mut json = serde_json::to_value(&plain).unwrap();
        assert_eq!(json["zone_hints"], serde_json::json!([]));
        json.as_object_mut().unwrap().remove("node_hints");
        assert_eq!(serde_json::from_value::<Endpoint>(json).unwrap(), plain);
    }
}
