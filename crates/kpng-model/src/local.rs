//! The Expected Node-Local State (ENLS): what one node must enforce.
//!
//! The ENLS is computed from the global model for one node by `kpng-local`. It names every
//! service the node proxies and, per service, the endpoints that this node may send
//! traffic to, with the set (Cluster or Local) each belongs to for each service port. An
//! endpoint that no set of this node contains is absent, so changes to it cost this node
//! nothing; the one exception is a UDP port's serving endpoints, listed in neither set,
//! because conntrack entries towards them must be kept.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::global::{LoadBalancing, PodName, ServiceKey, ServiceType};
use crate::net::{Family, PerFamily, Protocol};

mod view;

pub use view::NodeState;

/// What the node knows about itself.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalNode {
    /// The node name.
    pub name: String,
    /// The node's zone label, used by topology-aware routing.
    pub zone: Option<String>,
    /// The node's primary IPs (at most one per family): the default NodePort addresses.
    pub primary_ips: Vec<IpAddr>,
    /// The node's pod CIDRs, a possible local-traffic detector.
    pub pod_cidrs: Vec<IpNet>,
    /// The node is being deleted or is tainted for removal: `/healthz` reports it.
    pub draining: bool,
    /// Where this node accepts NodePorts (`--nodeport-addresses`): the Node object's primary
    /// IPs by default. Node-local: each node fills it from its own options and addresses.
    pub nodeport_addresses: NodePortAddresses,
    /// The cluster's service CIDRs (ServiceCIDR objects and `--service-cidr`), sorted: new
    /// connections to an address in them that no service holds are dropped.
    pub service_cidrs: Vec<IpNet>,
}

/// Where a node accepts NodePorts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct NodePortAddresses {
    /// Per family: on every local address but loopback, including addresses added later
    /// (a match-all `--nodeport-addresses` CIDR).
    pub all_local: PerFamily<bool>,
    /// The addresses, sorted (IPv4 first), of the families not accepted everywhere.
    pub addresses: Vec<IpAddr>,
}

impl LocalNode {
    /// The primary IP of `family`.
    pub fn primary_ip(&self, family: Family) -> Option<IpAddr> {
        self.primary_ips.iter().copied().find(|ip| Family::of(ip) == family)
    }
}

/// One port of a service, as this node proxies it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalServicePort {
    /// The port name (shared with the global model's port, and with the endpoints' ports).
    pub name: Arc<str>,
    /// The transport protocol.
    pub protocol: Protocol,
    /// The port on cluster, external and load-balancer IPs.
    pub port: u16,
    /// The NodePort, if any.
    pub node_port: Option<u16>,
    /// Per family: some endpoint anywhere is Ready, or Serving and Terminating. When false
    /// the port rejects traffic; when true but the set its traffic uses is empty, the
    /// traffic is dropped.
    pub has_endpoints: PerFamily<bool>,
    /// Addresses of the service (cluster, external, load-balancer) whose destination on
    /// this port an older service holds: traffic to them is not this service's. (A NodePort
    /// an older service holds is not listed: `node_port` is then `None`.)
    pub yielded: Box<[IpAddr]>,
}

impl LocalServicePort {
    /// Whether the service holds the destination `ip` on this port (an older service holds
    /// none of those in [`yielded`](Self::yielded)).
    pub fn holds(&self, ip: &IpAddr) -> bool {
        !self.yielded.contains(ip)
    }
}

/// A service as this node proxies it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalService {
    /// `namespace/name`.
    pub key: ServiceKey,
    /// The service type.
    pub service_type: ServiceType,
    /// Cluster IPs, at most one per family, sorted (IPv4 first).
    pub cluster_ips: Box<[IpAddr]>,
    /// Its addresses outside the cluster, `None` when it has none
    /// ([`LocalOutside::boxed`]). Serialized as the fields of [`LocalOutside`], empty lists
    /// included.
    #[serde(
        flatten,
        serialize_with = "crate::rare::flat",
        deserialize_with = "crate::rare::unflat"
    )]
    pub outside: Option<Box<LocalOutside>>,
    /// The ports.
    pub ports: Box<[LocalServicePort]>,
    /// ClientIP affinity timeout in seconds; `None` without affinity.
    pub affinity_timeout_seconds: Option<u32>,
    /// ClusterIP traffic uses the Local set (internalTrafficPolicy Local).
    pub internal_local: bool,
    /// Traffic from outside to NodePorts, external and load-balancer IPs uses the Local set
    /// (externalTrafficPolicy Local on an externally reachable service). Traffic from local
    /// pods and from the node itself still uses the Cluster set.
    pub external_local: bool,
    /// The health-check NodePort (LoadBalancer with externalTrafficPolicy Local).
    pub health_check_node_port: Option<u16>,
    /// The kube-nftlb load-balancing settings. A backend that cannot enforce one says so
    /// (see `kpng-backend`); its persistence wins over `affinity_timeout_seconds` where
    /// enforced.
    #[serde(default, skip_serializing_if = "LoadBalancing::is_default")]
    pub load_balancing: LoadBalancing,
}

/// Where a service is reached on this node from outside the cluster. Few services have
/// any such address, so a service keeps them behind one pointer ([`LocalService::outside`]),
/// which is `None` for the many that have none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalOutside {
    /// External IPs, sorted.
    pub external_ips: Box<[IpAddr]>,
    /// Load-balancer ingress IPs the proxy handles (ipMode VIP), sorted.
    pub load_balancer_ips: Box<[IpAddr]>,
    /// `loadBalancerSourceRanges`, sorted; when non-empty, new connections to the
    /// load-balancer IPs from elsewhere are dropped.
    pub load_balancer_source_ranges: Box<[IpNet]>,
}

impl LocalOutside {
    /// These addresses as a service keeps them: boxed, or `None` when every list is empty
    /// (so two services that have none compare equal however they were built).
    pub fn boxed(self) -> Option<Box<LocalOutside>> {
        crate::rare::boxed(self)
    }
}

impl crate::rare::Rare for LocalOutside {
    fn is_empty(&self) -> bool {
        self.external_ips.is_empty()
            && self.load_balancer_ips.is_empty()
            && self.load_balancer_source_ranges.is_empty()
    }
}

impl LocalService {
    /// External IPs, sorted.
    pub fn external_ips(&self) -> &[IpAddr] {
        self.outside.as_ref().map_or(&[], |o| &o.external_ips)
    }

    /// Load-balancer ingress IPs the proxy handles (ipMode VIP), sorted.
    pub fn load_balancer_ips(&self) -> &[IpAddr] {
        self.outside.as_ref().map_or(&[], |o| &o.load_balancer_ips)
    }

    /// `loadBalancerSourceRanges`, sorted; when non-empty, new connections to the
    /// load-balancer IPs from elsewhere are dropped.
    pub fn load_balancer_source_ranges(&self) -> &[IpNet] {
        self.outside.as_ref().map_or(&[], |o| &o.load_balancer_source_ranges)
    }

    /// The cluster IP of `family`.
    pub fn cluster_ip(&self, family: Family) -> Option<IpAddr> {
        self.cluster_ips.iter().copied().find(|ip| Family::of(ip) == family)
    }

    /// The addresses of `family` where traffic to `port` is this service's: the cluster
    /// IP, then external and load-balancer IPs, without those an older service holds on
    /// that port. None without a cluster IP of `family`.
    pub fn destinations<'a>(
        &'a self,
        port: &'a LocalServicePort,
        family: Family,
    ) -> impl Iterator<Item = IpAddr> + 'a {
        let cluster_ip = self.cluster_ip(family);
        let outside = self.external_ips().iter().chain(self.load_balancer_ips()).copied();
        let outside = outside.filter(move |_| cluster_ip.is_some());
        cluster_ip
            .into_iter()
            .chain(outside)
            .filter(move |ip| Family::of(ip) == family && port.holds(ip))
    }
}

/// One service port an endpoint serves, and the sets of this node it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EndpointPort {
    /// The service port's name (shared by every endpoint of the port).
    pub name: Arc<str>,
    /// The service port's protocol.
    pub protocol: Protocol,
    /// The port number on the endpoint.
    pub port: u16,
    /// In the Cluster set of the service port (topology and terminating fallback applied).
    pub cluster: bool,
    /// In the Local set of the service port.
    pub local: bool,
}

impl EndpointPort {
    /// In a set this node picks from. An entry in neither set is a serving endpoint of a
    /// UDP port, listed only so that conntrack entries towards it are kept.
    pub fn picked(&self) -> bool {
        self.cluster || self.local
    }
}

/// An endpoint of a service, as this node uses it. Identified within the service by its IP.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalEndpoint {
    /// The endpoint's address.
    pub ip: IpAddr,
    /// The endpoint runs on this node.
    pub local: bool,
    /// Ready (from the preferred copy when slices disagree: non-terminating first).
    pub ready: bool,
    /// Serving.
    pub serving: bool,
    /// Terminating.
    pub terminating: bool,
    /// The pod behind the endpoint (its stem shared with the global model's endpoint).
    pub pod_name: Option<PodName>,
    /// The service ports it serves on this node, sorted; never empty. Endpoints of a
    /// service that serve the same ports in the same sets share one list.
    pub ports: Arc<[EndpointPort]>,
}

/// A service and the endpoints this node may use for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LocalServiceState {
    /// The service.
    pub service: LocalService,
    /// Its endpoints by IP.
    pub endpoints: Endpoints,
}

/// A service's endpoints, keyed by IP, in IP order. Services have few endpoints and there
/// are many services: a sorted vector costs a fraction of a tree node per service.
/// Serialized as a map from IP to endpoint.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct Endpoints(Vec<LocalEndpoint>);

impl Endpoints {
    fn position(&self, ip: &IpAddr) -> Result<usize, usize> {
        self.0.binary_search_by(|e| e.ip.cmp(ip))
    }

    /// The endpoint with address `ip`.
    pub fn get(&self, ip: &IpAddr) -> Option<&LocalEndpoint> {
        self.position(ip).ok().map(|i| &self.0[i])
    }

    /// Whether an endpoint has address `ip`.
    pub fn contains_key(&self, ip: &IpAddr) -> bool {
        self.position(ip).is_ok()
    }

    /// Adds `endpoint`, returning the one it replaces (same IP).
    pub fn insert(&mut self, endpoint: LocalEndpoint) -> Option<LocalEndpoint> {
        match self.position(&endpoint.ip) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i], endpoint)),
            Err(i) => {
                self.0.insert(i, endpoint);
                None
            }
        }
    }

    /// The endpoints next to where `ip` is or would be in IP order (`ip`'s own included).
    pub fn beside(&self, ip: IpAddr) -> impl Iterator<Item = &LocalEndpoint> {
        let at = self.position(&ip).unwrap_or_else(|at| at);
        self.0[at.saturating_sub(1)..(at + 2).min(self.0.len())].iter()
    }

    /// Removes the endpoint with address `ip`.
    pub fn remove(&mut self, ip: &IpAddr) -> Option<LocalEndpoint> {
        self.position(ip).ok().map(|i| self.0.remove(i))
    }

    /// The addresses, in order.
    pub fn keys(&self) -> impl Iterator<Item = &IpAddr> {
        self.0.iter().map(|e| &e.ip)
    }

    /// The endpoints, in IP order.
    pub fn values(&self) -> std::slice::Iter<'_, LocalEndpoint> {
        self.0.iter()
    }

    /// The number of endpoints.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether there is no endpoint.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl std::ops::Index<&IpAddr> for Endpoints {
    type Output = LocalEndpoint;

    fn index(&self, ip: &IpAddr) -> &LocalEndpoint {
        self.get(ip).unwrap_or_else(|| panic!("no endpoint {ip}"))
    }
}

/// The last endpoint of each IP wins.
impl FromIterator<LocalEndpoint> for Endpoints {
    fn from_iter<I: IntoIterator<Item = LocalEndpoint>>(iter: I) -> Self {
        let mut endpoints: Vec<LocalEndpoint> = iter.into_iter().collect();
        endpoints.reverse();
        endpoints.sort_by_key(|e| e.ip);
        endpoints.dedup_by(|a, b| a.ip == b.ip);
        endpoints.shrink_to_fit();
        Endpoints(endpoints)
    }
}

impl<'a> IntoIterator for &'a Endpoints {
    type Item = &'a LocalEndpoint;
    type IntoIter = std::slice::Iter<'a, LocalEndpoint>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

impl IntoIterator for Endpoints {
    type Item = LocalEndpoint;
    type IntoIter = std::vec::IntoIter<LocalEndpoint>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl Serialize for Endpoints {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.0.iter().map(|e| (e.ip, e)))
    }
}

impl<'de> Deserialize<'de> for Endpoints {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<IpAddr, LocalEndpoint>::deserialize(deserializer)?;
        if let Some((key, e)) = map.iter().find(|(ip, e)| **ip != e.ip) {
            return Err(serde::de::Error::custom(format!(
                "endpoint {} is listed under {key}",
                e.ip
            )));
        }
        Ok(Endpoints(map.into_values().collect()))
    }
}

/// The Expected Node-Local State of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LocalState {
    /// The node itself, once the model knows it.
    pub node: Option<LocalNode>,
    /// Every proxied service and its endpoints.
    pub services: BTreeMap<ServiceKey, LocalServiceState>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(ip: &str, ready: bool) -> LocalEndpoint {
        LocalEndpoint {
            ip: ip.parse().unwrap(),
            local: false,
            ready,
            serving: ready,
            terminating: false,
            pod_name: None,
            ports: Arc::new([]),
        }
    }

    /// A LoadBalancer service `ns/web` on cluster IP 10.96.0.1, reached from `outside`.
    fn load_balancer(outside: LocalOutside) -> LocalService {
        LocalService {
            key: ServiceKey::new("ns", "web"),
            service_type: ServiceType::LoadBalancer,
            cluster_ips: Box::new(["10.96.0.1".parse().unwrap()]),
            outside: outside.boxed(),
            ports: Box::default(),
            affinity_timeout_seconds: None,
            internal_local: false,
            external_local: false,
            health_check_node_port: None,
            load_balancing: LoadBalancing::default(),
        }
    }

    #[test]
    fn outside_addresses_are_held_only_when_there_are_some_and_serialize_flat() {
        let inside = load_balancer(LocalOutside::default());
        assert_eq!(inside.outside, None);
        assert!(
            std::mem::size_of::<LocalService>() <= 112,
            "{}",
            std::mem::size_of::<LocalService>()
        );
        let json = serde_json::to_value(&inside).unwrap();
        assert_eq!(json["load_balancer_ips"], serde_json::json!([]));
        assert!(json.get("outside").is_none(), "{json}");
        assert_eq!(serde_json::from_value::<LocalService>(json).unwrap(), inside);

        let exposed = load_balancer(LocalOutside {
            load_balancer_ips: Box::new(["198.51.100.1".parse().unwrap()]),
            load_balancer_source_ranges: Box::new(["203.0.113.0/24".parse().unwrap()]),
            ..LocalOutside::default()
        });
        assert_eq!(exposed.load_balancer_ips().len(), 1);
        assert!(exposed.external_ips().is_empty());
        let json = serde_json::to_value(&exposed).unwrap();
        assert_eq!(json["load_balancer_source_ranges"], serde_json::json!(["203.0.113.0/24"]));
        assert_eq!(serde_json::from_value::<LocalService>(json).unwrap(), exposed);
    }

    #[test]
    fn destinations_are_those_the_service_holds_and_need_a_cluster_ip() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let port = |yielded: &[&str]| LocalServicePort {
            name: Arc::from("http"),
            protocol: Protocol::Tcp,
            port: 80,
            node_port: None,
            has_endpoints: PerFamily::default(),
            yielded: yielded.iter().map(|s| ip(s)).collect(),
        };
        let service = load_balancer(LocalOutside {
            external_ips: Box::new([ip("192.0.2.1"), ip("192.0.2.2")]),
            load_balancer_ips: Box::new([ip("198.51.100.1"), ip("2001:db8::1")]),
            load_balancer_source_ranges: Box::default(),
        });
        let of = |port: &LocalServicePort, family| -> Vec<IpAddr> {
            service.destinations(port, family).collect()
        };
        let all = port(&[]);
        assert_eq!(
            of(&all, Family::V4),
            [ip("10.96.0.1"), ip("192.0.2.1"), ip("192.0.2.2"), ip("198.51.100.1")]
        );
        assert!(of(&all, Family::V6).is_empty(), "no IPv6 cluster IP");
        let some = port(&["10.96.0.1", "192.0.2.2"]);
        assert!(!some.holds(&ip("192.0.2.2")) && some.holds(&ip("192.0.2.1")));
        assert_eq!(of(&some, Family::V4), [ip("192.0.2.1"), ip("198.51.100.1")]);
    }

    fn ips(endpoints: &Endpoints) -> Vec<String> {
        endpoints.keys().map(ToString::to_string).collect()
    }

    #[test]
    fn endpoints_stay_sorted_by_ip() {
        let mut endpoints = Endpoints::default();
        for ip in ["10.0.0.3", "fd00::1", "10.0.0.1", "10.0.0.2"] {
            assert_eq!(endpoints.insert(endpoint(ip, true)), None);
        }
        assert_eq!(ips(&endpoints), ["10.0.0.1", "10.0.0.2", "10.0.0.3", "fd00::1"]);
        let old = endpoints.insert(endpoint("10.0.0.2", false)).unwrap();
        assert!(old.ready);
        assert!(!endpoints[&"10.0.0.2".parse().unwrap()].ready);
        assert_eq!(
            endpoints.remove(&"10.0.0.1".parse().unwrap()).unwrap().ip.to_string(),
            "10.0.0.1"
        );
        assert_eq!(endpoints.remove(&"10.0.0.1".parse().unwrap()), None);
        assert!(!endpoints.contains_key(&"10.0.0.1".parse().unwrap()));
        assert_eq!(ips(&endpoints), ["10.0.0.2", "10.0.0.3", "fd00::1"]);
    }

    #[test]
    fn collecting_endpoints_keeps_the_last_of_each_ip() {
        let endpoints: Endpoints =
            [endpoint("10.0.0.9", true), endpoint("10.0.0.1", true), endpoint("10.0.0.9", false)]
                .into_iter()
                .collect();
        assert_eq!(ips(&endpoints), ["10.0.0.1", "10.0.0.9"]);
        assert!(!endpoints[&"10.0.0.9".parse().unwrap()].ready);
    }

    #[test]
    fn endpoints_serialize_as_a_map_by_ip() {
        let endpoints: Endpoints =
            [endpoint("10.0.0.2", true), endpoint("10.0.0.1", false)].into_iter().collect();
        let json = serde_json::to_value(&endpoints).unwrap();
        let keys: Vec<&String> = json.as_object().unwrap().keys().collect();
        assert_eq!(keys, ["10.0.0.1", "10.0.0.2"]);
        assert_eq!(json["10.0.0.1"]["ready"], false);
        let back: Endpoints = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, endpoints);

        let mut wrong = json;
        let moved = wrong.as_object_mut().unwrap().remove("10.0.0.1").unwrap();
        wrong["10.0.0.7"] = moved;
        let error = serde_json::from_value::<Endpoints>(wrong).unwrap_err().to_string();
        assert!(error.contains("endpoint 10.0.0.1 is listed under 10.0.0.7"), "{error}");
    }
}
