//! EndpointSlices, reduced to what a proxy enforces.

use std::fmt;
use std::net::IpAddr;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::global::{ProxyName, ServiceKey};
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
    /// `nodeName` and `zone`, where the endpoint runs, and `hints`, the zones and nodes
    /// that should use it (serialized as the `node_name` and `zone` fields and the
    /// `zone_hints` and `node_hints` lists).
    #[serde(flatten)]
    pub placement: Placement,
    /// The pod behind the endpoint (`targetRef` of kind Pod).
    pub pod_name: Option<PodName>,
}

/// Where an endpoint runs, its node and that node's zone, and its topology hints. A
/// cluster's endpoints name a few hundred nodes a hundred thousand times, each always with
/// the same zone, and where hints are given the endpoints of a node nearly always have the
/// same ones (their own zone): the three are held behind one pointer (null for none), and
/// in a [`crate::GlobalModel`] each combination once.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Placement(Option<Arc<Where>>);

/// A node name, a zone and hints, any of them given.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub(crate) struct Where {
    #[serde(default)]
    node_name: Option<Box<str>>,
    #[serde(default)]
    zone: Option<Box<str>>,
    #[serde(flatten)]
    hints: Hints,
}

/// No hint, for endpoints placed nowhere.
static NO_HINTS: Hints = Hints(None);

impl Placement {
    /// On node `node_name` in zone `zone` (empty names count as none), without hints.
    pub fn new(node_name: Option<&str>, zone: Option<&str>) -> Placement {
        Placement::with_hints(node_name, zone, Hints::default())
    }

    /// On node `node_name` in zone `zone` (empty names count as none), with `hints`.
    pub fn with_hints(node_name: Option<&str>, zone: Option<&str>, hints: Hints) -> Placement {
        let name = |n: Option<&str>| n.filter(|n| !n.is_empty()).map(Box::from);
        let place = Where { node_name: name(node_name), zone: name(zone), hints };
        let some = place.node_name.is_some() || place.zone.is_some() || place.hints.0.is_some();
        Placement(some.then(|| Arc::new(place)))
    }

    /// The topology hints.
    pub fn hints(&self) -> &Hints {
        self.0.as_ref().map_or(&NO_HINTS, |w| &w.hints)
    }

    /// The node's name.
    pub fn node_name(&self) -> Option<&str> {
        self.0.as_ref().and_then(|w| w.node_name.as_deref())
    }

    /// The zone.
    pub fn zone(&self) -> Option<&str> {
        self.0.as_ref().and_then(|w| w.zone.as_deref())
    }

    /// The shared pair, if any.
    pub(crate) fn shared(&mut self) -> Option<&mut Arc<Where>> {
        self.0.as_mut()
    }
}

impl Serialize for Placement {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.0 {
            Some(place) => place.serialize(serializer),
            None => Where::default().serialize(serializer),
        }
    }
}

impl<'de> Deserialize<'de> for Placement {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Placement, D::Error> {
        let place = Where::deserialize(deserializer)?;
        Ok(Placement::with_hints(place.node_name.as_deref(), place.zone.as_deref(), place.hints))
    }
}

/// The longest last part of a pod's name kept inline in a [`PodName`].
const TAIL: usize = 7;

/// A pod's name, kept as a stem that the pods of one owner share and the short part after
/// its last `-`: `coredns-5d78c9869d-` and `x7k2p`, `web-` and `12`. A cluster has
/// hundreds of thousands of endpoints, each naming its pod; the pods of a ReplicaSet,
/// StatefulSet or DaemonSet differ only in that last part, so in a [`crate::GlobalModel`]
/// (one copy of each stem) a name costs no allocation of its own. A name without such a
/// part is all stem. Compares, orders, prints and serializes as the name.
///
/// Sixteen bytes, two words: the stem is one thin pointer to a shared box holding its
/// text, and the last part is inline.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct PodName {
    stem: Stem,
    /// The last part's bytes, then zeros; its length in the last byte.
    tail: [u8; TAIL + 1],
}

/// A pod name's stem: a thin pointer to the shared text.
pub(crate) type Stem = Arc<Box<str>>;

impl PodName {
    /// The name `name`.
    pub fn new(name: &str) -> PodName {
        let mut tail = [0; TAIL + 1];
        let cut = name
            .rfind('-')
            .map(|dash| dash + 1)
            .filter(|cut| (1..=TAIL).contains(&(name.len() - cut)));
        let Some(cut) = cut else { return PodName { stem: Arc::new(Box::from(name)), tail } };
        let last = &name.as_bytes()[cut..];
        tail[..last.len()].copy_from_slice(last);
        tail[TAIL] = last.len() as u8;
        PodName { stem: Arc::new(Box::from(&name[..cut])), tail }
    }

    /// The part after the stem.
    fn tail(&self) -> &str {
        let len = usize::from(self.tail[TAIL]).min(TAIL);
        // Cut after a '-' of a `str`, from the end of one: always a whole `str`.
        std::str::from_utf8(&self.tail[..len]).unwrap_or_default()
    }

    /// The stem, when others may share it (the name has a last part of its own).
    pub(crate) fn shared_stem(&mut self) -> Option<&mut Stem> {
        (self.tail[TAIL] > 0).then_some(&mut self.stem)
    }

    fn bytes(&self) -> impl Iterator<Item = u8> + '_ {
        self.stem.bytes().chain(self.tail().bytes())
    }
}

impl From<&str> for PodName {
    fn from(name: &str) -> PodName {
        PodName::new(name)
    }
}

impl From<String> for PodName {
    fn from(name: String) -> PodName {
        PodName::new(&name)
    }
}

impl fmt::Display for PodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.stem, self.tail())
    }
}

impl fmt::Debug for PodName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.to_string())
    }
}

impl PartialOrd for PodName {
    fn partial_cmp(&self, other: &PodName) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// As the names.
impl Ord for PodName {
    fn cmp(&self, other: &PodName) -> std::cmp::Ordering {
        self.bytes().cmp(other.bytes())
    }
}

impl Serialize for PodName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for PodName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<PodName, D::Error> {
        let name = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        Ok(PodName::new(&name))
    }
}

impl Endpoint {
    /// The node hosting the endpoint.
    pub fn node_name(&self) -> Option<&str> {
        self.placement.node_name()
    }

    /// The zone of that node.
    pub fn zone(&self) -> Option<&str> {
        self.placement.zone()
    }

    /// Ready: receives new connections.
    pub fn is_ready(&self) -> bool {
        self.ready
    }

    /// `hints.forZones[].name`: the zones that should use this endpoint. Empty: no hint.
    pub fn zone_hints(&self) -> &[String] {
        self.placement.hints().zones()
    }

    /// `hints.forNodes[].name`: the nodes that should use this endpoint. Empty: no hint.
    pub fn node_hints(&self) -> &[String] {
        self.placement.hints().nodes()
    }

    /// Replaces the endpoint's hints, keeping its node and zone.
    pub fn set_hints(&mut self, hints: Hints) {
        self.placement = Placement::with_hints(self.node_name(), self.zone(), hints);
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

#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
struct HintLists {
    #[serde(default)]
    zone_hints: Vec<String>,
    #[serde(default)]
    node_hints: Vec<String>,
}

impl Hints {
    /// Hints for the zones `zones` and the nodes `nodes` (both empty: no hint).
    pub fn new(zones: Vec<String>, nodes: Vec<String>) -> Hints {
        Hints(crate::rare::boxed(HintLists { zone_hints: zones, node_hints: nodes }))
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

impl crate::rare::Rare for HintLists {
    fn is_empty(&self) -> bool {
        self.zone_hints.is_empty() && self.node_hints.is_empty()
    }
}

/// No hint is serialized as two empty lists.
impl Serialize for Hints {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        crate::rare::flat(&self.0, serializer)
    }
}

impl<'de> Deserialize<'de> for Hints {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Hints, D::Error> {
        crate::rare::unflat(deserializer).map(Hints)
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
    /// The ports every endpoint of the slice serves. The slices of a cluster name a few
    /// lists of ports many times: a [`crate::GlobalModel`] keeps each list once.
    pub ports: Arc<[SlicePort]>,
    /// The endpoints, in slice order: a boxed slice, with no spare room (objects stay in
    /// the model for their lifetime), and a slice is eight bytes smaller than with a `Vec`.
    pub endpoints: Box<[Endpoint]>,
    /// The `endpoints.kubernetes.io/last-change-trigger-time` annotation, verbatim (RFC 3339):
    /// when the change this slice reflects was triggered.
    pub trigger_time: Option<Box<str>>,
    /// The `service.kubernetes.io/service-proxy-name` label: the proxy that handles the
    /// slice (`None`: the default proxy). See [`is_for_proxy`](crate::global::is_for_proxy).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_name: Option<ProxyName>,
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
            placement: Placement::with_hints(None, None, hints),
            pod_name: None,
        }
    }

    #[test]
    fn pod_names_keep_a_short_last_part_inline() {
        let parts = |name: &str| {
            let pod = PodName::new(name);
            assert_eq!(pod.to_string(), name);
            assert_eq!(format!("{pod:?}"), format!("{name:?}"));
            (pod.stem.to_string(), pod.tail().to_string())
        };
        let split = |stem: &str, tail: &str| (stem.to_string(), tail.to_string());
        assert_eq!(parts("coredns-5d78c9869d-x7k2p"), split("coredns-5d78c9869d-", "x7k2p"));
        assert_eq!(parts("web-12"), split("web-", "12"));
        assert_eq!(parts("web-1234567"), split("web-", "1234567"));
        assert_eq!(parts("pod-é"), split("pod-", "é"));
        // No last part of one to seven bytes: all stem.
        for whole in ["web", "web-", "web-12345678", "", "-"] {
            assert_eq!(parts(whole), split(whole, ""), "{whole:?}");
        }
        // Two words; an endpoint holding one takes six (its hints are in its placement).
        assert_eq!(std::mem::size_of::<Option<PodName>>(), 16);
        assert_eq!(std::mem::size_of::<Endpoint>(), 48);
        assert_eq!(std::mem::size_of::<crate::LocalEndpoint>(), 56);
        // Within a 112-byte size class of the allocator (a rare proxy name takes a word).
        assert!(std::mem::size_of::<EndpointSlice>() <= 112);
    }

    #[test]
    fn placements_serialize_as_the_node_name_and_zone_fields() {
        let mut placed = endpoint(Hints::default());
        placed.placement = Placement::new(Some("node-1"), Some("zone-a"));
        assert_eq!((placed.node_name(), placed.zone()), (Some("node-1"), Some("zone-a")));
        let json = serde_json::to_value(&placed).unwrap();
        assert_eq!((&json["node_name"], &json["zone"]), (&"node-1".into(), &"zone-a".into()));
        assert_eq!(serde_json::from_value::<Endpoint>(json).unwrap(), placed);

        let nowhere = endpoint(Hints::default());
        let mut json = serde_json::to_value(&nowhere).unwrap();
        assert!(json["node_name"].is_null() && json["zone"].is_null(), "{json}");
        json.as_object_mut().unwrap().remove("zone");
        assert_eq!(serde_json::from_value::<Endpoint>(json).unwrap(), nowhere);
        // Empty names are no names, and nothing is held for neither.
        assert_eq!(Placement::new(Some(""), Some("")), Placement::default());
        assert_eq!(std::mem::size_of::<Placement>(), 8);
    }

    #[test]
    fn pod_names_compare_and_order_as_their_text() {
        let mut texts = vec!["web-2", "web-10", "web-", "web", "web-1a", "webz-1", "a-zz", "a-z-1"];
        let mut pods: Vec<PodName> = texts.iter().map(|t| PodName::new(t)).collect();
        texts.sort();
        pods.sort();
        assert_eq!(pods.iter().map(ToString::to_string).collect::<Vec<_>>(), texts);
        assert_eq!(PodName::new("web-2"), PodName::from(String::from("web-2")));
        assert_ne!(PodName::new("web-2"), PodName::new("web-20"));
    }

    #[test]
    fn hints_keep_their_lists_in_json_and_empty_hints_are_no_hints() {
        let hinted = endpoint(Hints::new(vec!["z1".into()], vec!["n1".into(), "n2".into()]));
        let json = serde_json::to_value(&hinted).unwrap();
        assert_eq!(json["zone_hints"], serde_json::json!(["z1"]));
        assert_eq!(json["node_hints"], serde_json::json!(["n1", "n2"]));
        assert_eq!(serde_json::from_value::<Endpoint>(json).unwrap(), hinted);
        assert_eq!((hinted.zone_hints(), hinted.node_hints().len()), (&["z1".to_string()][..], 2));
        // Hints are kept with the node and zone, and replacing them keeps those.
        let mut placed = hinted.clone();
        placed.placement = Placement::with_hints(Some("node-1"), Some("zone-a"), Hints::default());
        placed.set_hints(Hints::new(vec!["zone-a".into()], vec![]));
        assert_eq!((placed.node_name(), placed.zone()), (Some("node-1"), Some("zone-a")));
        assert_eq!(
            (placed.zone_hints(), placed.node_hints()),
            (&["zone-a".to_string()][..], &[][..])
        );
        let json = serde_json::to_value(&placed).unwrap();
        assert_eq!(
            (&json["node_name"], &json["zone_hints"]),
            (&"node-1".into(), &serde_json::json!(["zone-a"]))
        );
        assert_eq!(serde_json::from_value::<Endpoint>(json).unwrap(), placed);
        placed.set_hints(Hints::default());
        assert_eq!(placed.placement, Placement::new(Some("node-1"), Some("zone-a")));

        let mut named = endpoint(Hints::default());
        named.pod_name = Some(PodName::new("web-6f7c-x2x4q"));
        let json = serde_json::to_value(&named).unwrap();
        assert_eq!(json["pod_name"], "web-6f7c-x2x4q");
        assert_eq!(serde_json::from_value::<Endpoint>(json).unwrap(), named);

        let plain = endpoint(Hints::new(vec![], vec![]));
        assert_eq!(plain, endpoint(Hints::default()));
        let mut json = serde_json::to_value(&plain).unwrap();
        assert_eq!(json["zone_hints"], serde_json::json!([]));
        json.as_object_mut().unwrap().remove("node_hints");
        assert_eq!(serde_json::from_value::<Endpoint>(json).unwrap(), plain);
    }
}
