//! Services, reduced to what a proxy enforces.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::global::LoadBalancing;
use crate::net::{Family, Protocol};

/// Identifies a Service: `namespace/name`. The model, the node state and the backends
/// each index services by it, some more than once, so a key is one pointer to its parts,
/// which are shared: a copy of a key allocates nothing, and costs 8 bytes wherever it is
/// kept. Keys compare, order and hash by their parts (namespace, then name).
#[derive(Clone)]
pub struct ServiceKey(Arc<KeyParts>);

#[derive(PartialEq, Eq, Hash, PartialOrd, Ord)]
struct KeyParts {
    namespace: Arc<str>,
    name: Arc<str>,
}

impl ServiceKey {
    /// A key from its parts.
    pub fn new(namespace: impl Into<Arc<str>>, name: impl Into<Arc<str>>) -> Self {
        ServiceKey(Arc::new(KeyParts { namespace: namespace.into(), name: name.into() }))
    }

    /// The namespace.
    pub fn namespace(&self) -> &Arc<str> {
        &self.0.namespace
    }

    /// The name.
    pub fn name(&self) -> &Arc<str> {
        &self.0.name
    }
}

impl PartialEq for ServiceKey {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0) || self.0 == other.0
    }
}

impl Eq for ServiceKey {}

impl PartialOrd for ServiceKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ServiceKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        if Arc::ptr_eq(&self.0, &other.0) {
            return std::cmp::Ordering::Equal;
        }
        self.0.cmp(&other.0)
    }
}

impl std::hash::Hash for ServiceKey {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl fmt::Debug for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ServiceKey")
            .field("namespace", &self.0.namespace)
            .field("name", &self.0.name)
            .finish()
    }
}

impl fmt::Display for ServiceKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.0.namespace, self.0.name)
    }
}

/// Text that is not `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid key {0:?}: expected namespace/name")]
pub struct InvalidKey(pub String);

impl FromStr for ServiceKey {
    type Err = InvalidKey;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(ServiceKey::new(ns, name))
            }
            _ => Err(InvalidKey(s.to_string())),
        }
    }
}

impl Serialize for ServiceKey {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ServiceKey {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The Service types a proxy implements (ExternalName services are not proxied).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ServiceType {
    /// Reachable on its cluster IPs.
    ClusterIP,
    /// Also reachable on every node's NodePort addresses.
    NodePort,
    /// Also reachable on load-balancer ingress IPs.
    LoadBalancer,
}

impl ServiceType {
    /// The Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ServiceType::ClusterIP => "ClusterIP",
            ServiceType::NodePort => "NodePort",
            ServiceType::LoadBalancer => "LoadBalancer",
        }
    }
}

/// `internalTrafficPolicy` or `externalTrafficPolicy`.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum TrafficPolicy {
    /// Any ready endpoint in the cluster.
    #[default]
    Cluster,
    /// Only endpoints on the node that received the traffic.
    Local,
}

/// Session affinity of a service.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum SessionAffinity {
    /// Each new connection picks an endpoint at random.
    #[default]
    None,
    /// Connections from one client IP stick to one endpoint until `timeout_seconds` pass
    /// without a new connection.
    ClientIP {
        /// Idle time after which the affinity is forgotten (Kubernetes' default is 10800).
        timeout_seconds: u32,
    },
}

/// The label that hands a Service (and its EndpointSlices, which carry its labels) to a
/// named proxy.
pub const SERVICE_PROXY_NAME_LABEL: &str = "service.kubernetes.io/service-proxy-name";

/// A `service.kubernetes.io/service-proxy-name` label's value. Few objects carry one, so it
/// is kept behind one thin pointer: an object without it pays one word, not two. Reads as
/// the text it is (`Deref<Target = str>`), and compares, orders, hashes and serializes as
/// that text.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ProxyName(Box<Box<str>>);

impl std::ops::Deref for ProxyName {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ProxyName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

impl From<&str> for ProxyName {
    fn from(name: &str) -> Self {
        ProxyName(Box::new(name.into()))
    }
}

impl From<String> for ProxyName {
    fn from(name: String) -> Self {
        ProxyName(Box::new(name.into()))
    }
}

impl From<&String> for ProxyName {
    fn from(name: &String) -> Self {
        ProxyName::from(name.as_str())
    }
}

/// Whether a proxy named `proxy` (`None`: the default proxy) handles an object whose
/// `service.kubernetes.io/service-proxy-name` label is `label` (`None`: unlabelled).
///
/// The default proxy handles exactly the unlabelled objects (an empty value is a label
/// too); a named proxy handles exactly the objects labelled with its name. This is the
/// label selector upstream kube-proxy watches with, and the one rule every source applies.
pub fn is_for_proxy(label: Option<&str>, proxy: Option<&str>) -> bool {
    label == proxy
}

/// The affinity timeout Kubernetes applies when `timeoutSeconds` is absent.
pub const DEFAULT_AFFINITY_TIMEOUT_SECONDS: u32 = 10_800;

/// The port a service port forwards to on its endpoints, as written in the Service.
///
/// Proxies take the endpoint port number from the EndpointSlice; this is kept for the wire
/// API, whose clients may resolve ports themselves.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum TargetPort {
    /// A port number.
    Number(u16),
    /// A named container port (its name shared in a [`crate::GlobalModel`], as port
    /// names are: a cluster names a few ports many times).
    Name(Arc<str>),
}

/// One port of a Service. Identified within the service by `(name, protocol)`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServicePort {
    /// The port's name (empty when the service has a single unnamed port). In a
    /// [`crate::GlobalModel`], one copy per name: a cluster's ports have a few names.
    pub name: Arc<str>,
    /// The transport protocol.
    pub protocol: Protocol,
    /// The port on cluster IPs, external IPs and load-balancer IPs.
    pub port: u16,
    /// The port on the nodes' NodePort addresses; `None` when not allocated (or 0).
    pub node_port: Option<u16>,
    /// The endpoint port as written in the Service.
    pub target_port: TargetPort,
}

/// How a load-balancer ingress IP reaches the nodes (`status.loadBalancer.ingress[].ipMode`).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize,
)]
pub enum IpMode {
    /// Traffic arrives addressed to the IP itself: the proxy must handle the IP.
    #[default]
    VIP,
    /// The load balancer proxies traffic to the nodes: the proxy installs no rule for the IP.
    Proxy,
}

/// One load-balancer ingress entry with an IP (hostname-only entries are dropped at ingest).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LoadBalancerIngress {
    /// The ingress IP.
    pub ip: IpAddr,
    /// Whether the proxy handles it.
    pub ip_mode: IpMode,
}

/// A Service, reduced to what any proxy needs. Services that no proxy handles (ExternalName,
/// headless, claimed by another proxy) never enter the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Service {
    /// `namespace/name`.
    pub key: ServiceKey,
    /// The service type.
    pub service_type: ServiceType,
    /// Cluster IPs from `spec.clusterIPs`, at most one per family, in spec order.
    pub cluster_ips: ClusterIps,
    /// The service ports.
    pub ports: Box<[ServicePort]>,
    /// Its addresses outside the cluster, `None` when it has none ([`Outside::boxed`]).
    /// Serialized as the fields of [`Outside`], empty lists included.
    #[serde(
        flatten,
        serialize_with = "crate::rare::flat",
        deserialize_with = "crate::rare::unflat"
    )]
    pub outside: Option<Box<Outside>>,
    /// Session affinity.
    pub session_affinity: SessionAffinity,
    /// `spec.internalTrafficPolicy`.
    pub internal_traffic_policy: TrafficPolicy,
    /// `spec.externalTrafficPolicy`.
    pub external_traffic_policy: TrafficPolicy,
    /// `spec.healthCheckNodePort`, kept only where it matters: type LoadBalancer with
    /// externalTrafficPolicy Local.
    pub health_check_node_port: Option<u16>,
    /// The `service.kubernetes.io/service-proxy-name` label: the proxy that handles the
    /// service (`None`: the default proxy). See [`is_for_proxy`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proxy_name: Option<ProxyName>,
    /// `metadata.creationTimestamp` in seconds since the Unix epoch, when known: the oldest
    /// of two services claiming one destination holds it (see [`Service::seniority`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub created_at: Option<i64>,
    /// The kube-nftlb load-balancing annotations, typed (see [`LoadBalancing`]).
    #[serde(default, skip_serializing_if = "LoadBalancing::is_default")]
    pub load_balancing: LoadBalancing,
}

/// A service's cluster IPs: at most one per family, nearly always one, which is kept inline
/// (a list behind a pointer would cost every service an allocation); two behind a pointer.
/// Reads as a slice of addresses, and compares, orders, hashes and serializes as one.
#[derive(Clone, Default)]
pub struct ClusterIps(Ips);

#[derive(Clone, Default)]
enum Ips {
    #[default]
    None,
    One(IpAddr),
    Many(Box<[IpAddr]>),
}

impl std::ops::Deref for ClusterIps {
    type Target = [IpAddr];

    fn deref(&self) -> &[IpAddr] {
        match &self.0 {
            Ips::None => &[],
            Ips::One(ip) => std::slice::from_ref(ip),
            Ips::Many(ips) => ips,
        }
    }
}

impl From<Vec<IpAddr>> for ClusterIps {
    fn from(ips: Vec<IpAddr>) -> Self {
        match ips.as_slice() {
            [] => ClusterIps(Ips::None),
            [ip] => ClusterIps(Ips::One(*ip)),
            _ => ClusterIps(Ips::Many(ips.into_boxed_slice())),
        }
    }
}

impl<const N: usize> From<[IpAddr; N]> for ClusterIps {
    fn from(ips: [IpAddr; N]) -> Self {
        Vec::from(ips).into()
    }
}

impl FromIterator<IpAddr> for ClusterIps {
    fn from_iter<I: IntoIterator<Item = IpAddr>>(ips: I) -> Self {
        ips.into_iter().collect::<Vec<_>>().into()
    }
}

impl fmt::Debug for ClusterIps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq for ClusterIps {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl Eq for ClusterIps {}

impl PartialOrd for ClusterIps {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for ClusterIps {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (**self).cmp(&**other)
    }
}

impl std::hash::Hash for ClusterIps {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        (**self).hash(state);
    }
}

impl Serialize for ClusterIps {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        (**self).serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for ClusterIps {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Vec::<IpAddr>::deserialize(deserializer).map(ClusterIps::from)
    }
}

/// Where a service is reached from outside the cluster. Few services have any such
/// address, so a service keeps them behind one pointer ([`Service::outside`]), which is
/// `None` for the many that have none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Outside {
    /// `spec.externalIPs`, sorted, without duplicates.
    pub external_ips: Box<[IpAddr]>,
    /// `status.loadBalancer.ingress` entries that carry an IP, sorted, without duplicates.
    pub load_balancer_ingress: Box<[LoadBalancerIngress]>,
    /// `spec.loadBalancerSourceRanges`, trimmed, truncated to their network, sorted.
    pub load_balancer_source_ranges: Box<[IpNet]>,
}

impl Outside {
    /// These addresses as a service keeps them: boxed, or `None` when every list is empty
    /// (so two services that have none compare equal however they were built).
    pub fn boxed(self) -> Option<Box<Outside>> {
        crate::rare::boxed(self)
    }
}

impl crate::rare::Rare for Outside {
    fn is_empty(&self) -> bool {
        self.external_ips.is_empty()
            && self.load_balancer_ingress.is_empty()
            && self.load_balancer_source_ranges.is_empty()
    }
}

impl Service {
    /// `spec.externalIPs`, sorted, without duplicates.
    pub fn external_ips(&self) -> &[IpAddr] {
        self.outside.as_ref().map_or(&[], |o| &o.external_ips)
    }

    /// `status.loadBalancer.ingress` entries that carry an IP, sorted, without duplicates.
    pub fn load_balancer_ingress(&self) -> &[LoadBalancerIngress] {
        self.outside.as_ref().map_or(&[], |o| &o.load_balancer_ingress)
    }

    /// `spec.loadBalancerSourceRanges`, trimmed, truncated to their network, sorted.
    pub fn load_balancer_source_ranges(&self) -> &[IpNet] {
        self.outside.as_ref().map_or(&[], |o| &o.load_balancer_source_ranges)
    }

    /// The cluster IP of `family`; a service without one does not exist in that family.
    pub fn cluster_ip(&self, family: Family) -> Option<IpAddr> {
        self.cluster_ips.iter().copied().find(|ip| Family::of(ip) == family)
    }

    /// Load-balancer IPs of `family` that the proxy must handle (ipMode VIP).
    pub fn load_balancer_vips(&self, family: Family) -> impl Iterator<Item = IpAddr> + '_ {
        self.load_balancer_ingress()
            .iter()
            .filter(move |ing| ing.ip_mode == IpMode::VIP && Family::of(&ing.ip) == family)
            .map(|ing| ing.ip)
    }

    /// External IPs of `family`.
    pub fn external_ips_of(&self, family: Family) -> impl Iterator<Item = IpAddr> + '_ {
        self.external_ips().iter().copied().filter(move |ip| Family::of(ip) == family)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ips_read_compare_and_serialize_as_a_list() {
        use std::hash::Hash;

        let [a, b]: [IpAddr; 2] = ["10.96.0.1".parse().unwrap(), "fd00::1".parse().unwrap()];
        let lists: [Vec<IpAddr>; 5] = [vec![], vec![a], vec![b], vec![a, b], vec![b, a]];
        let hash = |ips: &dyn Fn(&mut std::hash::DefaultHasher)| {
            let mut hasher = std::hash::DefaultHasher::new();
            ips(&mut hasher);
            std::hash::Hasher::finish(&hasher)
        };
        for x in &lists {
            let ips = ClusterIps::from(x.clone());
            assert_eq!(&*ips, x.as_slice());
            assert_eq!(ips, x.iter().copied().collect::<ClusterIps>());
            assert_eq!(hash(&|h| ips.hash(h)), hash(&|h| x.as_slice().hash(h)));
            let json = serde_json::to_string(&ips).unwrap();
            assert_eq!(json, serde_json::to_string(x).unwrap());
            assert_eq!(serde_json::from_str::<ClusterIps>(&json).unwrap(), ips);
            for y in &lists {
                assert_eq!(ips.cmp(&ClusterIps::from(y.clone())), x.cmp(y), "{x:?} {y:?}");
            }
        }
        // One address takes no allocation, and the service no more room than a pointer to
        // a list would.
        assert_eq!(size_of::<ClusterIps>(), 24);
        // Within a 112-byte size class of the allocator.
        assert!(size_of::<Service>() <= 112, "{}", size_of::<Service>());
    }

    #[test]
    fn a_proxy_name_takes_one_word_and_reads_compares_and_serializes_as_its_text() {
        assert_eq!(std::mem::size_of::<Option<ProxyName>>(), 8);
        let name = ProxyName::from("edge");
        assert_eq!(&*name, "edge");
        assert_eq!(name, ProxyName::from(String::from("edge")));
        assert!(ProxyName::from("a-proxy") < name && name < ProxyName::from("edge2"));
        assert_eq!(format!("{name:?}"), "\"edge\"");
        assert_eq!(serde_json::to_string(&name).unwrap(), "\"edge\"");
        assert_eq!(serde_json::from_str::<ProxyName>("\"edge\"").unwrap(), name);
    }

    fn service(outside: Outside) -> Service {
        Service {
            key: ServiceKey::new("ns", "web"),
            service_type: ServiceType::LoadBalancer,
            cluster_ips: ["10.96.0.1".parse().unwrap()].into(),
            ports: Box::default(),
            outside: outside.boxed(),
            session_affinity: SessionAffinity::None,
            internal_traffic_policy: TrafficPolicy::Cluster,
            external_traffic_policy: TrafficPolicy::Cluster,
            health_check_node_port: None,
            proxy_name: None,
            created_at: None,
            load_balancing: LoadBalancing::default(),
        }
    }

    #[test]
    fn outside_addresses_are_held_only_when_there_are_some_and_serialize_flat() {
        // None held for none: a service without any costs one word for them.
        let inside = service(Outside::default());
        assert_eq!(inside.outside, None);
        assert!(inside.external_ips().is_empty() && inside.load_balancer_ingress().is_empty());
        assert!(std::mem::size_of::<Service>() <= 136, "{}", std::mem::size_of::<Service>());
        // Serialized as the lists they are, empty ones included, and read back the same.
        let json = serde_json::to_value(&inside).unwrap();
        assert_eq!(json["external_ips"], serde_json::json!([]));
        assert_eq!(json["load_balancer_source_ranges"], serde_json::json!([]));
        assert!(json.get("outside").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<Service>(json).unwrap(), inside);

        let exposed = service(Outside {
            external_ips: Box::new(["192.0.2.1".parse().unwrap()]),
            load_balancer_ingress: Box::new([LoadBalancerIngress {
                ip: "198.51.100.1".parse().unwrap(),
                ip_mode: IpMode::VIP,
            }]),
            load_balancer_source_ranges: Box::default(),
        });
        assert_eq!(exposed.external_ips_of(Family::V4).count(), 1);
        assert_eq!(exposed.load_balancer_vips(Family::V4).count(), 1);
        let json = serde_json::to_value(&exposed).unwrap();
        assert_eq!(json["external_ips"], serde_json::json!(["192.0.2.1"]));
        assert_eq!(serde_json::from_value::<Service>(json).unwrap(), exposed);
        assert_ne!(exposed, inside);
    }
}
