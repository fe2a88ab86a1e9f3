//! The Expected Node-Local State (ENLS): what one node must enforce.
//!
//! The ENLS is computed from the global model for one node by `kpng-local`. It names every
//! service the node proxies and, per service, only the endpoints that this node may send
//! traffic to, with the set (Cluster or Local) each belongs to for each service port. An
//! endpoint that no set of this node contains is absent, so changes to it cost this node
//! nothing.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::global::{ServiceKey, ServiceType};
use crate::net::{Family, PerFamily, Protocol};

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
    /// The port name.
    pub name: String,
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
}

/// A service as this node proxies it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct LocalService {
    /// `namespace/name`.
    pub key: ServiceKey,
    /// The service type.
    pub service_type: ServiceType,
    /// Cluster IPs, at most one per family.
    pub cluster_ips: Vec<IpAddr>,
    /// External IPs, sorted.
    pub external_ips: Vec<IpAddr>,
    /// Load-balancer ingress IPs the proxy handles (ipMode VIP), sorted.
    pub load_balancer_ips: Vec<IpAddr>,
    /// `loadBalancerSourceRanges`, sorted; when non-empty, new connections to the
    /// load-balancer IPs from elsewhere are dropped.
    pub load_balancer_source_ranges: Vec<IpNet>,
    /// The ports.
    pub ports: Vec<LocalServicePort>,
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
}

impl LocalService {
    /// The cluster IP of `family`.
    pub fn cluster_ip(&self, family: Family) -> Option<IpAddr> {
        self.cluster_ips.iter().copied().find(|ip| Family::of(ip) == family)
    }
}

/// One service port an endpoint serves, and the sets of this node it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct EndpointPort {
    /// The service port's name.
    pub name: String,
    /// The service port's protocol.
    pub protocol: Protocol,
    /// The port number on the endpoint.
    pub port: u16,
    /// In the Cluster set of the service port (topology and terminating fallback applied).
    pub cluster: bool,
    /// In the Local set of the service port.
    pub local: bool,
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
    /// The pod behind the endpoint.
    pub pod_name: Option<String>,
    /// The service ports it serves on this node, sorted; never empty.
    pub ports: Vec<EndpointPort>,
}

/// A service and the endpoints this node may use for it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LocalServiceState {
    /// The service.
    pub service: LocalService,
    /// Its endpoints by IP.
    pub endpoints: BTreeMap<IpAddr, LocalEndpoint>,
}

/// The Expected Node-Local State of one node.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LocalState {
    /// The node itself, once the model knows it.
    pub node: Option<LocalNode>,
    /// Every proxied service and its endpoints.
    pub services: BTreeMap<ServiceKey, LocalServiceState>,
}
