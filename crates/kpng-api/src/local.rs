//! ENLS ops ↔ `localv1.OpItem`.
//!
//! Services travel as `localv1.Service`, endpoints as `localv1.Endpoint` (one per IP: the
//! ENLS identifies an endpoint by its address within the service), the node (only when the
//! client asks for it) as `localv1.Node`. The original fields are filled so that an old
//! client proxies correctly; kpng's own fields (from 100) carry the rest, and decoding
//! rebuilds the exact ENLS from them.

use std::net::IpAddr;

use kpng_model::global::InvalidKey;
use kpng_model::local::{EndpointPort, LocalServicePort};
use kpng_model::{
    Family, Item, ItemRef, LocalEndpoint, LocalNode, LocalOutside, LocalService, NodePortAddresses,
    Op, PerFamily, ServiceKey,
};
use prost::Message;

use crate::load_balancing::{decode_load_balancing, encode_load_balancing};
use crate::localv1::{self, op_item};
use crate::wire::{
    WireError, affinity_timeout, client_ip, decode, ip_filters, ip_set, optional_port, parse_ip,
    parse_ips, parse_nets, port_at, protocol_at, service_type, source_ranges, wire_protocol,
};

/// The path of service `key`: `namespace/name`.
pub fn service_path(key: &ServiceKey) -> String {
    format!("{}/{}", key.namespace(), key.name())
}

/// The path of the endpoint `ip` of service `key`: `namespace/name/ip`.
pub fn endpoint_path(key: &ServiceKey, ip: &IpAddr) -> String {
    format!("{}/{}/{ip}", key.namespace(), key.name())
}

fn item(op: op_item::Op) -> localv1::OpItem {
    localv1::OpItem { op: Some(op) }
}

fn value(set: localv1::Set, path: String, bytes: Vec<u8>) -> localv1::OpItem {
    let reference = localv1::Ref { set: set as i32, path };
    item(op_item::Op::Set(localv1::Value { r#ref: Some(reference), bytes }))
}

/// `op` on the wire. The node's ops are `NodeSet` items, which only clients that asked for
/// the node should receive (see [`is_node_op`]).
pub fn encode_op(op: &Op) -> localv1::OpItem {
    match op {
        Op::Reset => item(op_item::Op::Reset(localv1::EmptyOp {})),
        Op::Sync => item(op_item::Op::Sync(localv1::EmptyOp {})),
        Op::Set(Item::Node(node)) => {
            value(localv1::Set::NodeSet, node.name.clone(), encode_node(node).encode_to_vec())
        }
        Op::Set(Item::Service(service)) => value(
            localv1::Set::ServicesSet,
            service_path(&service.key),
            encode_service(service).encode_to_vec(),
        ),
        Op::Set(Item::Endpoint { service, endpoint }) => value(
            localv1::Set::EndpointsSet,
            endpoint_path(service, &endpoint.ip),
            encode_endpoint(endpoint).encode_to_vec(),
        ),
        Op::Delete(reference) => {
            let (set, path) = match reference {
                ItemRef::Node => (localv1::Set::NodeSet, String::new()),
                ItemRef::Service(key) => (localv1::Set::ServicesSet, service_path(key)),
                ItemRef::Endpoint { service, ip } => {
                    (localv1::Set::EndpointsSet, endpoint_path(service, ip))
                }
            };
            item(op_item::Op::Delete(localv1::Ref { set: set as i32, path }))
        }
    }
}

/// Makes `op`, decoded right after `previous`, share what the two have in common: an
/// endpoint of the same service as the endpoint before it takes that one's service key and,
/// when equal, its port list. A node stream sends a service's endpoints one after the
/// other, nearly all serving the same ports: the ops of a whole state then hold one list
/// per service, not one per endpoint, and their copies are freed as they are decoded.
pub fn share_with_previous(previous: Option<&Op>, op: &mut Op) {
    let (
        Some(Op::Set(Item::Endpoint { service: before, endpoint: was })),
        Op::Set(Item::Endpoint { service, endpoint }),
    ) = (previous, op)
    else {
        return;
    };
    if service != before {
        return;
    }
    *service = before.clone();
    if endpoint.ports == was.ports {
        endpoint.ports = was.ports.clone();
    }
}

/// Whether `op` concerns the node (sent only to clients that asked for it).
pub fn is_node_op(op: &Op) -> bool {
    matches!(op, Op::Set(Item::Node(_)) | Op::Delete(ItemRef::Node))
}

/// The ENLS op that `item` carries.
pub fn decode_op(item: &localv1::OpItem) -> Result<Op, WireError> {
    let op = item.op.as_ref().ok_or_else(|| WireError::new("", "op", "no op in OpItem"))?;
    Ok(match op {
        op_item::Op::Reset(_) => Op::Reset,
        op_item::Op::Sync(_) => Op::Sync,
        op_item::Op::Set(value) => {
            let reference =
                value.r#ref.as_ref().ok_or_else(|| WireError::new("", "ref", "Set without Ref"))?;
            let path = reference.path.as_str();
            match set_of(reference, path)? {
                localv1::Set::ServicesSet => {
                    let wire: localv1::Service = decode(&value.bytes, path)?;
                    Op::Set(Item::Service(decode_service(&wire, path)?))
                }
                localv1::Set::EndpointsSet => {
                    let (service, _) = split_endpoint_path(path)?;
                    let wire: localv1::Endpoint = decode(&value.bytes, path)?;
                    Op::Set(Item::Endpoint { service, endpoint: decode_endpoint(&wire, path)? })
                }
                localv1::Set::NodeSet => {
                    let wire: localv1::Node = decode(&value.bytes, path)?;
                    Op::Set(Item::Node(decode_node(&wire, path)?))
                }
                other => return Err(unexpected_set(other, path)),
            }
        }
        op_item::Op::Delete(reference) => {
            let path = reference.path.as_str();
            Op::Delete(match set_of(reference, path)? {
                localv1::Set::ServicesSet => ItemRef::Service(service_key(path)?),
                localv1::Set::EndpointsSet => {
                    let (service, ip) = split_endpoint_path(path)?;
                    ItemRef::Endpoint { service, ip }
                }
                localv1::Set::NodeSet => ItemRef::Node,
                other => return Err(unexpected_set(other, path)),
            })
        }
    })
}

fn set_of(reference: &localv1::Ref, path: &str) -> Result<localv1::Set, WireError> {
    localv1::Set::try_from(reference.set)
        .map_err(|_| WireError::new(path, "ref.set", format!("unknown set {}", reference.set)))
}

fn unexpected_set(set: localv1::Set, path: &str) -> WireError {
    WireError::new(path, "ref.set", format!("{} in a node-local stream", set.as_str_name()))
}

fn service_key(path: &str) -> Result<ServiceKey, WireError> {
    path.parse().map_err(|e: InvalidKey| WireError::new(path, "path", e.0))
}

fn split_endpoint_path(path: &str) -> Result<(ServiceKey, IpAddr), WireError> {
    let (service, ip) = path
        .rsplit_once('/')
        .ok_or_else(|| WireError::new(path, "path", "expected namespace/service/ip"))?;
    Ok((service_key(service)?, parse_ip(ip, path, "path")?))
}

/// The wire form of a service.
pub fn encode_service(service: &LocalService) -> localv1::Service {
    let lb_ips = ip_set(service.load_balancer_ips());
    localv1::Service {
        namespace: service.key.namespace().to_string(),
        name: service.key.name().to_string(),
        r#type: service.service_type.as_str().to_string(),
        ips: Some(localv1::ServiceIPs {
            cluster_ips: Some(ip_set(&service.cluster_ips)),
            external_ips: Some(ip_set(service.external_ips())),
            headless: false,
            load_balancer_ips: Some(lb_ips.clone()),
        }),
        map_ip: false,
        ports: service
            .ports
            .iter()
            .map(|p| localv1::PortMapping {
                name: p.name.to_string(),
                protocol: wire_protocol(p.protocol) as i32,
                port: p.port.into(),
                node_port: p.node_port.map_or(0, i32::from),
                // Each endpoint lists the ports it serves (PortOverrides): a port it does
                // not list must not fall back to a target port.
                target_port: 0,
                target_port_name: String::new(),
            })
            .collect(),
        external_traffic_to_local: service.external_local,
        labels: Default::default(),
        annotations: Default::default(),
        ip_filters: ip_filters(service.load_balancer_source_ranges(), &lb_ips),
        session_affinity: client_ip(service.affinity_timeout_seconds),
        internal_traffic_to_local: service.internal_local,
        health_check_node_port: service.health_check_node_port.map_or(0, i32::from),
        port_endpoints: service
            .ports
            .iter()
            .map(|p| localv1::PortEndpoints {
                name: p.name.to_string(),
                protocol: wire_protocol(p.protocol) as i32,
                v4: p.has_endpoints.v4,
                v6: p.has_endpoints.v6,
                yielded: (!p.yielded.is_empty()).then(|| ip_set(&p.yielded)),
            })
            .collect(),
        load_balancing: encode_load_balancing(&service.load_balancing),
    }
}

/// A service from its wire form.
pub fn decode_service(wire: &localv1::Service, path: &str) -> Result<LocalService, WireError> {
    let service_type = service_type(&wire.r#type, path)?;
    let ips = wire.ips.as_ref();
    let mut ports = Vec::with_capacity(wire.ports.len());
    for (i, p) in wire.ports.iter().enumerate() {
        let proto = protocol_at(p.protocol, path, || format!("ports[{i}].protocol"))?;
        let extra =
            wire.port_endpoints.iter().find(|e| e.name == p.name && e.protocol == p.protocol);
        let has_endpoints =
            extra.map_or(PerFamily { v4: true, v6: true }, |e| PerFamily { v4: e.v4, v6: e.v6 });
        let mut yielded = match extra {
            Some(e) => parse_ips(e.yielded.as_ref(), path, &format!("portEndpoints[{i}].yielded"))?,
            None => Vec::new(),
        };
        yielded.sort();
        ports.push(LocalServicePort {
            name: p.name.as_str().into(),
            protocol: proto,
            port: port_at(p.port, path, || format!("ports[{i}].port"))?,
            node_port: match p.node_port {
                0 => None,
                n => Some(port_at(n, path, || format!("ports[{i}].nodePort"))?),
            },
            has_endpoints,
            yielded: yielded.into(),
        });
    }
    let set = |f: fn(&localv1::ServiceIPs) -> Option<&localv1::IpSet>| ips.and_then(f);
    Ok(LocalService {
        key: service_key(path)?,
        service_type,
        cluster_ips: parse_ips(set(|i| i.cluster_ips.as_ref()), path, "ips.clusterIPs")?.into(),
        outside: LocalOutside {
            external_ips: parse_ips(set(|i| i.external_ips.as_ref()), path, "ips.externalIPs")?
                .into(),
            load_balancer_ips: parse_ips(
                set(|i| i.load_balancer_ips.as_ref()),
                path,
                "ips.loadBalancerIPs",
            )?
            .into(),
            load_balancer_source_ranges: source_ranges(&wire.ip_filters, path)?.into(),
        }
        .boxed(),
        ports: ports.into(),
        affinity_timeout_seconds: affinity_timeout(&wire.session_affinity, path)?,
        internal_local: wire.internal_traffic_to_local,
        external_local: wire.external_traffic_to_local,
        health_check_node_port: optional_port(
            wire.health_check_node_port,
            path,
            "healthCheckNodePort",
        )?,
        load_balancing: decode_load_balancing(wire.load_balancing.as_ref(), path)?,
    })
}

/// The wire form of an endpoint.
pub fn encode_endpoint(endpoint: &LocalEndpoint) -> localv1::Endpoint {
    localv1::Endpoint {
        hostname: String::new(),
        ips: Some(ip_set(std::slice::from_ref(&endpoint.ip))),
        local: endpoint.local,
        port_overrides: endpoint
            .ports
            .iter()
            .map(|p| localv1::PortName { name: p.name.to_string(), port: p.port.into() })
            .collect(),
        scopes: Some(localv1::EndpointScopes {
            internal: endpoint.ports.iter().any(|p| p.cluster),
            external: endpoint.ports.iter().any(|p| p.cluster || p.local),
        }),
        ready: endpoint.ready,
        serving: endpoint.serving,
        terminating: endpoint.terminating,
        pod_name: endpoint.pod_name.as_ref().map(ToString::to_string).unwrap_or_default(),
        ports: endpoint
            .ports
            .iter()
            .map(|p| localv1::EndpointPort {
                name: p.name.to_string(),
                protocol: wire_protocol(p.protocol) as i32,
                port: p.port.into(),
                cluster: p.cluster,
                local: p.local,
            })
            .collect(),
    }
}

/// An endpoint from its wire form (kpng's fields required: they say which sets it is in).
pub fn decode_endpoint(wire: &localv1::Endpoint, path: &str) -> Result<LocalEndpoint, WireError> {
    let all = parse_ips(wire.ips.as_ref(), path, "ips")?;
    let [ip] = all[..] else {
        return Err(WireError::new(
            path,
            "ips",
            format!("expected one address, got {}", all.len()),
        ));
    };
    let mut ports = Vec::with_capacity(wire.ports.len());
    for (i, p) in wire.ports.iter().enumerate() {
        ports.push(EndpointPort {
            name: p.name.as_str().into(),
            protocol: protocol_at(p.protocol, path, || format!("ports[{i}].protocol"))?,
            port: port_at(p.port, path, || format!("ports[{i}].port"))?,
            cluster: p.cluster,
            local: p.local,
        });
    }
    if ports.is_empty() {
        return Err(WireError::new(
            path,
            "ports",
            "no kpng port list (field 104): the server is not a kpng with extensions",
        ));
    }
    ports.sort();
    Ok(LocalEndpoint {
        ip,
        local: wire.local,
        ready: wire.ready,
        serving: wire.serving,
        terminating: wire.terminating,
        pod_name: (!wire.pod_name.is_empty())
            .then(|| kpng_model::global::PodName::new(&wire.pod_name)),
        ports: ports.into(),
    })
}

/// The wire form of the node.
pub fn encode_node(node: &LocalNode) -> localv1::Node {
    localv1::Node {
        name: node.name.clone(),
        zone: node.zone.clone().unwrap_or_default(),
        primary_ips: Some(ip_set(&node.primary_ips)),
        pod_cidrs: node.pod_cidrs.iter().map(ToString::to_string).collect(),
        draining: node.draining,
        nodeport_addresses: Some(ip_set(&node.nodeport_addresses.addresses)),
        nodeports_on_all_local_v4: node.nodeport_addresses.all_local.v4,
        nodeports_on_all_local_v6: node.nodeport_addresses.all_local.v6,
        service_cidrs: node.service_cidrs.iter().map(ToString::to_string).collect(),
    }
}

/// The node from its wire form.
pub fn decode_node(wire: &localv1::Node, path: &str) -> Result<LocalNode, WireError> {
    let mut primary_ips = parse_ips(wire.primary_ips.as_ref(), path, "primaryIPs")?;
    // The ENLS lists the primary IPs by family, IPv4 first.
    primary_ips.sort_by_key(|ip| Family::of(ip) == Family::V6);
    Ok(LocalNode {
        name: wire.name.clone(),
        zone: (!wire.zone.is_empty()).then(|| wire.zone.clone()),
        primary_ips,
        pod_cidrs: parse_nets(&wire.pod_cidrs, path, "podCIDRs")?,
        draining: wire.draining,
        nodeport_addresses: {
            let mut addresses =
                parse_ips(wire.nodeport_addresses.as_ref(), path, "nodeportAddresses")?;
            addresses.sort();
            let all_local = PerFamily {
                v4: wire.nodeports_on_all_local_v4,
                v6: wire.nodeports_on_all_local_v6,
            };
            NodePortAddresses { all_local, addresses }
        },
        service_cidrs: parse_nets(&wire.service_cidrs, path, "serviceCIDRs")?,
    })
}

#[cfg(test)]
mod tests;
