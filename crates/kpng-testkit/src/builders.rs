//! Short constructors for model values. Every value starts from the most common case
//! (ready TCP endpoints, ClusterIP services, policies Cluster); tests change what they test.

use std::collections::BTreeMap;

use kpng_model::global::{
    Endpoint, EndpointSlice, Node, NodeAddress, NodeAddressKind, Placement, Service, ServiceCidr,
    ServiceKey, ServicePort, ServiceType, SessionAffinity, SliceKey, SlicePort, TargetPort,
    TrafficPolicy, ZONE_LABEL,
};
use kpng_model::net::parse_ip;
use kpng_model::{Family, Protocol};

/// A ClusterIP service `ns/name` with the given cluster IPs and `(name, protocol, port)` ports.
pub fn service(
    ns: &str,
    name: &str,
    cluster_ips: &[&str],
    ports: &[(&str, Protocol, u16)],
) -> Service {
    Service {
        key: ServiceKey::new(ns, name),
        service_type: ServiceType::ClusterIP,
        cluster_ips: cluster_ips.iter().map(|ip| parse_ip(ip).expect("test IP")).collect(),
        ports: ports
            .iter()
            .map(|(name, protocol, port)| ServicePort {
                name: (*name).into(),
                protocol: *protocol,
                port: *port,
                node_port: None,
                target_port: TargetPort::Number(*port),
            })
            .collect(),
        outside: None,
        session_affinity: SessionAffinity::None,
        internal_traffic_policy: TrafficPolicy::Cluster,
        external_traffic_policy: TrafficPolicy::Cluster,
        health_check_node_port: None,
        proxy_name: None,
        created_at: None,
        load_balancing: Default::default(),
    }
}

/// A ready endpoint at `ip` on node `node`.
pub fn endpoint(ip: &str, node: &str) -> Endpoint {
    Endpoint {
        address: parse_ip(ip).expect("test IP"),
        ready: true,
        serving: true,
        terminating: false,
        placement: Placement::new(Some(node), None),
        pod_name: None,
    }
}

/// A slice `ns/slice` of service `service`, family taken from the first endpoint (IPv4 when
/// empty), with `(name, protocol, port)` ports.
pub fn slice(
    ns: &str,
    slice: &str,
    service: &str,
    ports: &[(&str, Protocol, u16)],
    endpoints: Vec<Endpoint>,
) -> EndpointSlice {
    EndpointSlice {
        key: SliceKey::new(ns, slice),
        service_name: service.into(),
        family: endpoints.first().map(|e| Family::of(&e.address)).unwrap_or(Family::V4),
        ports: ports
            .iter()
            .map(|(name, protocol, port)| SlicePort {
                name: (*name).into(),
                protocol: *protocol,
                port: *port,
            })
            .collect(),
        endpoints: endpoints.into(),
        trigger_time: None,
        proxy_name: None,
    }
}

/// A ServiceCIDR `name` over `cidrs` (normalised).
pub fn service_cidr(name: &str, cidrs: &[&str]) -> ServiceCidr {
    ServiceCidr::new(name, cidrs.iter().map(|c| c.parse().expect("test CIDR")))
}

/// A node `name` in `zone` with InternalIP addresses `ips`.
pub fn node(name: &str, zone: Option<&str>, ips: &[&str]) -> Node {
    let mut labels = BTreeMap::new();
    if let Some(zone) = zone {
        labels.insert(ZONE_LABEL.to_string(), zone.to_string());
    }
    Node {
        name: name.to_string(),
        labels,
        addresses: ips
            .iter()
            .map(|ip| NodeAddress {
                kind: NodeAddressKind::InternalIP,
                ip: parse_ip(ip).expect("test IP"),
            })
            .collect(),
        pod_cidrs: vec![],
        deleting: false,
        to_be_deleted: false,
    }
}
