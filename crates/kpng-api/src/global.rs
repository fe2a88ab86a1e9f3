//! Global model objects ↔ `globalv1` infos.
//!
//! A Service is one `ServiceInfo` (path `namespace/name`); an EndpointSlice is one
//! `EndpointInfo` per endpoint (path `namespace/slice/ip`, see [`endpoint_path`]), each carrying the slice's ports
//! and address type so that the slice can be rebuilt from its endpoints; a Node is one
//! `NodeInfo` (path `name`). A slice without endpoints has no item: it carries nothing a
//! proxy uses. Each info's `hash` is a hash of its encoding, for clients that compare.

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpng_model::global::{
    Endpoint, EndpointSlice, IpMode, LoadBalancerIngress, NodeAddress, NodeAddressKind,
    ServicePort, SessionAffinity, SlicePort, TargetPort, TrafficPolicy,
};
use kpng_model::{
    Family, GlobalModel, Kind, Node, Object, ObjectRef, Service, ServiceKey, SliceKey,
};
use kpng_store::SourceEvent;
use prost::Message;

use crate::globalv1;
use crate::localv1;
use crate::wire::{
    WireError, affinity_timeout, client_ip, decode, ip_filters, ip_set, optional_port, parse_ip,
    parse_ips, parse_nets, port, protocol, service_type, source_ranges, wire_protocol,
};

/// The 64-bit FNV-1a hash of `bytes`: stable across versions and platforms.
pub fn hash(bytes: &[u8]) -> u64 {
    bytes
        .iter()
        .fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x100_0000_01b3))
}

/// One item of the global stream: its set, path and encoded info.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GlobalItem {
    /// `GlobalServiceInfos`, `GlobalEndpointInfos` or `GlobalNodeInfos`.
    pub set: localv1::Set,
    /// The object's path.
    pub path: String,
    /// The encoded `ServiceInfo`, `EndpointInfo` or `NodeInfo`.
    pub bytes: Vec<u8>,
}

impl GlobalItem {
    /// The `Set` op for this item.
    pub fn set_op(&self) -> localv1::OpItem {
        let reference = localv1::Ref { set: self.set as i32, path: self.path.clone() };
        localv1::OpItem {
            op: Some(localv1::op_item::Op::Set(localv1::Value {
                r#ref: Some(reference),
                bytes: self.bytes.clone(),
            })),
        }
    }
}

/// The `Delete` op for the item at (`set`, `path`).
pub fn delete_op(set: localv1::Set, path: &str) -> localv1::OpItem {
    let reference = localv1::Ref { set: set as i32, path: path.to_string() };
    localv1::OpItem { op: Some(localv1::op_item::Op::Delete(reference)) }
}

fn with_hash<M: Message>(mut message: M, set_hash: impl Fn(&mut M, u64)) -> Vec<u8> {
    let h = hash(&message.encode_to_vec());
    set_hash(&mut message, h);
    message.encode_to_vec()
}

/// The item of a service.
pub fn service_item(service: &Service) -> GlobalItem {
    let all_lb: Vec<IpAddr> = service.load_balancer_ingress.iter().map(|i| i.ip).collect();
    let wire = localv1::Service {
        namespace: service.key.namespace.clone(),
        name: service.key.name.clone(),
        r#type: service.service_type.as_str().to_string(),
        ips: Some(localv1::ServiceIPs {
            cluster_ips: Some(ip_set(&service.cluster_ips)),
            external_ips: Some(ip_set(&service.external_ips)),
            headless: false,
            load_balancer_ips: Some(ip_set(&all_lb)),
        }),
        map_ip: false,
        ports: service
            .ports
            .iter()
            .map(|p| localv1::PortMapping {
                name: p.name.clone(),
                protocol: wire_protocol(p.protocol) as i32,
                port: p.port.into(),
                node_port: p.node_port.map_or(0, i32::from),
                target_port: match &p.target_port {
                    TargetPort::Number(n) => (*n).into(),
                    TargetPort::Name(_) => 0,
                },
                target_port_name: match &p.target_port {
                    TargetPort::Number(_) => String::new(),
                    TargetPort::Name(name) => name.clone(),
                },
            })
            .collect(),
        external_traffic_to_local: service.external_traffic_policy == TrafficPolicy::Local,
        labels: Default::default(),
        annotations: Default::default(),
        ip_filters: ip_filters(&service.load_balancer_source_ranges, &ip_set(&all_lb)),
        session_affinity: client_ip(match service.session_affinity {
            SessionAffinity::None => None,
            SessionAffinity::ClientIP { timeout_seconds } => Some(timeout_seconds),
        }),
        internal_traffic_to_local: service.internal_traffic_policy == TrafficPolicy::Local,
        health_check_node_port: service.health_check_node_port.map_or(0, i32::from),
        port_endpoints: Vec::new(),
    };
    let info = globalv1::ServiceInfo {
        hash: 0,
        service: Some(wire),
        ingress: service
            .load_balancer_ingress
            .iter()
            .map(|i| globalv1::LoadBalancerIngress {
                ip: i.ip.to_string(),
                ip_mode: match i.ip_mode {
                    IpMode::VIP => "VIP".into(),
                    IpMode::Proxy => "Proxy".into(),
                },
            })
            .collect(),
    };
    GlobalItem {
        set: localv1::Set::GlobalServiceInfos,
        path: crate::local::service_path(&service.key),
        bytes: with_hash(info, |m, h| m.hash = h),
    }
}

/// A service from its item.
pub fn decode_service(bytes: &[u8], path: &str) -> Result<Service, WireError> {
    let info: globalv1::ServiceInfo = decode(bytes, path)?;
    let wire = info.service.ok_or_else(|| WireError::new(path, "service", "missing"))?;
    let key: ServiceKey = path
        .parse()
        .map_err(|e: kpng_model::global::InvalidKey| WireError::new(path, "path", e.0))?;
    let service_type = service_type(&wire.r#type, path)?;
    let ips = wire.ips.clone().unwrap_or_default();
    let mut ports = Vec::with_capacity(wire.ports.len());
    for (i, p) in wire.ports.iter().enumerate() {
        let at = |f: &str| format!("ports[{i}].{f}");
        ports.push(ServicePort {
            name: p.name.clone(),
            protocol: protocol(p.protocol, path, &at("protocol"))?,
            port: port(p.port, path, &at("port"))?,
            node_port: optional_port(p.node_port, path, &at("nodePort"))?,
            target_port: if p.target_port_name.is_empty() {
                TargetPort::Number(port(p.target_port, path, &at("targetPort"))?)
            } else {
                TargetPort::Name(p.target_port_name.clone())
            },
        });
    }
    let mut load_balancer_ingress = Vec::with_capacity(info.ingress.len());
    for (i, entry) in info.ingress.iter().enumerate() {
        let field = format!("ingress[{i}]");
        load_balancer_ingress.push(LoadBalancerIngress {
            ip: parse_ip(&entry.ip, path, &field)?,
            ip_mode: match entry.ip_mode.as_str() {
                "VIP" | "" => IpMode::VIP,
                "Proxy" => IpMode::Proxy,
                other => {
                    return Err(WireError::new(path, &field, format!("unknown ipMode {other:?}")));
                }
            },
        });
    }
    let policy = |local| if local { TrafficPolicy::Local } else { TrafficPolicy::Cluster };
    Ok(Service {
        key,
        service_type,
        cluster_ips: parse_ips(ips.cluster_ips.as_ref(), path, "ips.clusterIPs")?,
        ports,
        external_ips: parse_ips(ips.external_ips.as_ref(), path, "ips.externalIPs")?,
        load_balancer_ingress,
        load_balancer_source_ranges: source_ranges(&wire.ip_filters, path)?,
        session_affinity: match affinity_timeout(&wire.session_affinity, path)? {
            Some(timeout_seconds) => SessionAffinity::ClientIP { timeout_seconds },
            None => SessionAffinity::None,
        },
        internal_traffic_policy: policy(wire.internal_traffic_to_local),
        external_traffic_policy: policy(wire.external_traffic_to_local),
        health_check_node_port: optional_port(
            wire.health_check_node_port,
            path,
            "healthCheckNodePort",
        )?,
        created_at: None,
    })
}

/// The path of endpoint `ip` of slice `key`: `namespace/slice/ip`, and for the rare later
/// copies of one address in a slice (whose order decides which copy counts)
/// `namespace/slice/ip/2`, `/3`...
pub fn endpoint_path(key: &SliceKey, ip: &IpAddr, copy: usize) -> String {
    match copy {
        0 | 1 => format!("{}/{}/{ip}", key.namespace, key.name),
        n => format!("{}/{}/{ip}/{n}", key.namespace, key.name),
    }
}

/// The items of a slice: one per endpoint.
pub fn slice_items(slice: &EndpointSlice) -> Vec<GlobalItem> {
    let address_type = match slice.family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    };
    let slice_ports: Vec<globalv1::SlicePort> = slice
        .ports
        .iter()
        .map(|p| globalv1::SlicePort {
            name: p.name.clone(),
            protocol: wire_protocol(p.protocol) as i32,
            port: p.port.into(),
        })
        .collect();
    let mut copies: BTreeMap<IpAddr, usize> = BTreeMap::new();
    slice
        .endpoints
        .iter()
        .map(|e| {
            let copy = copies.entry(e.address).or_default();
            *copy += 1;
            let copy = *copy;
            let info = globalv1::EndpointInfo {
                hash: 0,
                namespace: slice.key.namespace.clone(),
                source_name: slice.key.name.clone(),
                service_name: slice.service_name.clone(),
                endpoint: Some(localv1::Endpoint {
                    hostname: String::new(),
                    ips: Some(ip_set(std::slice::from_ref(&e.address))),
                    local: false,
                    port_overrides: slice
                        .ports
                        .iter()
                        .map(|p| localv1::PortName { name: p.name.clone(), port: p.port.into() })
                        .collect(),
                    scopes: None,
                    ready: e.ready,
                    serving: e.serving,
                    terminating: e.terminating,
                    pod_name: e.pod_name.clone().unwrap_or_default(),
                    ports: Vec::new(),
                }),
                conditions: Some(globalv1::EndpointConditions {
                    ready: e.ready,
                    serving: e.serving,
                    terminating: e.terminating,
                }),
                pod_name: e.pod_name.clone().unwrap_or_default(),
                topology: Some(globalv1::TopologyInfo {
                    node: e.node_name.clone().unwrap_or_default(),
                    zone: e.zone.clone().unwrap_or_default(),
                }),
                hints: Some(globalv1::TopologyHints {
                    zones: e.zone_hints.clone(),
                    nodes: e.node_hints.clone(),
                }),
                address_type: address_type.to_string(),
                slice_ports: slice_ports.clone(),
                trigger_time: slice.trigger_time.clone().unwrap_or_default(),
            };
            GlobalItem {
                set: localv1::Set::GlobalEndpointInfos,
                path: endpoint_path(&slice.key, &e.address, copy),
                bytes: with_hash(info, |m, h| m.hash = h),
            }
        })
        .collect()
}

/// The slice, address and copy number (1 for the first) an endpoint path names.
pub fn slice_key_of(path: &str) -> Result<(SliceKey, IpAddr, usize), WireError> {
    let mut parts = path.splitn(4, '/');
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(ns), Some(name), Some(ip), copy) if !ns.is_empty() && !name.is_empty() => {
            let copy = match copy {
                None => 1,
                Some(n) => n
                    .parse()
                    .ok()
                    .filter(|n| *n >= 2)
                    .ok_or_else(|| WireError::new(path, "path", "invalid copy number"))?,
            };
            Ok((SliceKey::new(ns, name), parse_ip(ip, path, "path")?, copy))
        }
        _ => Err(WireError::new(path, "path", "expected namespace/slice/ip")),
    }
}

/// Rebuilds a slice from the infos of its endpoints, in any order: endpoints come back in
/// address order, copies of one address in their original order.
pub fn decode_slice<'a>(
    key: &SliceKey,
    infos: impl IntoIterator<Item = (&'a str, &'a [u8])>,
) -> Result<Option<EndpointSlice>, WireError> {
    let mut slice: Option<EndpointSlice> = None;
    let mut endpoints = BTreeMap::new();
    for (path, bytes) in infos {
        let info: globalv1::EndpointInfo = decode(bytes, path)?;
        let wire = info.endpoint.clone().unwrap_or_default();
        let all = parse_ips(wire.ips.as_ref(), path, "endpoint.ips")?;
        let [address] = all[..] else {
            return Err(WireError::new(path, "endpoint.ips", "expected one address"));
        };
        let (_, _, copy) = slice_key_of(path)?;
        if slice.is_none() {
            let family = match info.address_type.as_str() {
                "IPv4" => Family::V4,
                "IPv6" => Family::V6,
                other => {
                    return Err(WireError::new(path, "addressType", format!("unknown {other:?}")));
                }
            };
            let mut ports = Vec::with_capacity(info.slice_ports.len());
            for (i, p) in info.slice_ports.iter().enumerate() {
                ports.push(SlicePort {
                    name: p.name.clone(),
                    protocol: protocol(p.protocol, path, &format!("slicePorts[{i}].protocol"))?,
                    port: port(p.port, path, &format!("slicePorts[{i}].port"))?,
                });
            }
            slice = Some(EndpointSlice {
                key: key.clone(),
                service_name: info.service_name.clone(),
                family,
                ports,
                endpoints: Vec::new(),
                trigger_time: (!info.trigger_time.is_empty()).then(|| info.trigger_time.clone()),
            });
        }
        let conditions = info.conditions.unwrap_or_default();
        let topology = info.topology.clone().unwrap_or_default();
        let hints = info.hints.clone().unwrap_or_default();
        let text = |s: &String| (!s.is_empty()).then(|| s.clone());
        endpoints.insert(
            (address, copy),
            Endpoint {
                address,
                ready: conditions.ready,
                serving: conditions.serving,
                terminating: conditions.terminating,
                node_name: text(&topology.node),
                zone: text(&topology.zone),
                zone_hints: hints.zones,
                node_hints: hints.nodes,
                pod_name: text(&info.pod_name),
            },
        );
    }
    Ok(slice.map(|mut slice| {
        slice.endpoints = endpoints.into_values().collect();
        slice
    }))
}

/// The item of a node.
pub fn node_item(node: &Node) -> GlobalItem {
    let info = globalv1::NodeInfo {
        hash: 0,
        node: Some(globalv1::Node {
            name: node.name.clone(),
            labels: node.labels.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            annotations: Default::default(),
            topology: Some(globalv1::TopologyInfo {
                node: node.name.clone(),
                zone: node.zone().unwrap_or_default().to_string(),
            }),
            addresses: node
                .addresses
                .iter()
                .map(|a| globalv1::NodeAddress {
                    kind: match a.kind {
                        NodeAddressKind::InternalIP => "InternalIP".into(),
                        NodeAddressKind::ExternalIP => "ExternalIP".into(),
                    },
                    ip: a.ip.to_string(),
                })
                .collect(),
            pod_cidrs: node.pod_cidrs.iter().map(ToString::to_string).collect(),
            deleting: node.deleting,
            to_be_deleted: node.to_be_deleted,
        }),
    };
    GlobalItem {
        set: localv1::Set::GlobalNodeInfos,
        path: node.name.clone(),
        bytes: with_hash(info, |m, h| m.hash = h),
    }
}

/// A node from its item.
pub fn decode_node(bytes: &[u8], path: &str) -> Result<Node, WireError> {
    let info: globalv1::NodeInfo = decode(bytes, path)?;
    let wire = info.node.ok_or_else(|| WireError::new(path, "node", "missing"))?;
    let mut addresses = Vec::with_capacity(wire.addresses.len());
    for (i, a) in wire.addresses.iter().enumerate() {
        let field = format!("addresses[{i}]");
        addresses.push(NodeAddress {
            kind: match a.kind.as_str() {
                "InternalIP" => NodeAddressKind::InternalIP,
                "ExternalIP" => NodeAddressKind::ExternalIP,
                other => {
                    return Err(WireError::new(path, &field, format!("unknown kind {other:?}")));
                }
            },
            ip: parse_ip(&a.ip, path, &field)?,
        });
    }
    Ok(Node {
        name: wire.name,
        labels: wire.labels.into_iter().collect(),
        addresses,
        pod_cidrs: parse_nets(&wire.pod_cidrs, path, "podCIDRs")?,
        deleting: wire.deleting,
        to_be_deleted: wire.to_be_deleted,
    })
}

/// Every item of `model`, sorted by set and path.
pub fn model_items(model: &GlobalModel) -> Vec<GlobalItem> {
    let mut items: Vec<GlobalItem> = model.nodes().map(node_item).collect();
    items.extend(model.services().map(service_item));
    items.extend(model.slices().flat_map(slice_items));
    items.sort_by(|a, b| (a.set, &a.path).cmp(&(b.set, &b.path)));
    items
}

/// The items of service `key` and of its slices (none if the model lacks both).
pub fn service_items(model: &GlobalModel, key: &ServiceKey) -> Vec<GlobalItem> {
    let mut items: Vec<GlobalItem> = model.service(key).map(service_item).into_iter().collect();
    items.extend(model.slices_of(key).flat_map(slice_items));
    items
}

/// A client's copy of a global stream, turned back into store events.
#[derive(Debug, Default)]
pub struct Mirror {
    services: BTreeMap<String, Vec<u8>>,
    nodes: BTreeMap<String, Vec<u8>>,
    endpoints: BTreeMap<SliceKey, BTreeMap<String, Vec<u8>>>,
}

enum Touched {
    Service(String),
    Node(String),
    Slice(SliceKey),
}

impl Mirror {
    /// Applies one change set's items (without `Sync`) and returns the store events that
    /// bring a store to the mirrored model: after a `Reset`, one relist of every kind.
    /// Nothing is applied when an item is invalid.
    pub fn apply(&mut self, items: &[localv1::OpItem]) -> Result<Vec<SourceEvent>, WireError> {
        let mut next = Mirror {
            services: self.services.clone(),
            nodes: self.nodes.clone(),
            endpoints: self.endpoints.clone(),
        };
        let mut reset = false;
        let mut touched = Vec::new();
        for item in items {
            use localv1::op_item::Op as WireOp;
            let (reference, bytes) = match &item.op {
                Some(WireOp::Reset(_)) => {
                    next = Mirror::default();
                    reset = true;
                    continue;
                }
                Some(WireOp::Sync(_)) => continue,
                Some(WireOp::Set(value)) => {
                    let reference = value
                        .r#ref
                        .as_ref()
                        .ok_or_else(|| WireError::new("", "ref", "Set without Ref"))?;
                    (reference, Some(value.bytes.clone()))
                }
                Some(WireOp::Delete(reference)) => (reference, None),
                None => return Err(WireError::new("", "op", "no op in OpItem")),
            };
            let path = reference.path.clone();
            let set = localv1::Set::try_from(reference.set).map_err(|_| {
                WireError::new(&path, "ref.set", format!("unknown set {}", reference.set))
            })?;
            let put = |map: &mut BTreeMap<String, Vec<u8>>, path: String| match bytes {
                Some(bytes) => map.insert(path, bytes),
                None => map.remove(&path),
            };
            match set {
                localv1::Set::GlobalServiceInfos => {
                    put(&mut next.services, path.clone());
                    touched.push(Touched::Service(path));
                }
                localv1::Set::GlobalNodeInfos => {
                    put(&mut next.nodes, path.clone());
                    touched.push(Touched::Node(path));
                }
                localv1::Set::GlobalEndpointInfos => {
                    let (key, _, _) = slice_key_of(&path)?;
                    put(next.endpoints.entry(key.clone()).or_default(), path);
                    if next.endpoints.get(&key).is_some_and(BTreeMap::is_empty) {
                        next.endpoints.remove(&key);
                    }
                    touched.push(Touched::Slice(key));
                }
                other => {
                    return Err(WireError::new(
                        &path,
                        "ref.set",
                        format!("{} in a global stream", other.as_str_name()),
                    ));
                }
            }
        }
        let events = if reset {
            SourceEvent::relist(&Kind::ALL, next.objects()?)
        } else {
            let mut events = Vec::with_capacity(touched.len());
            for t in touched {
                events.push(match t {
                    Touched::Service(path) => match next.services.get(&path) {
                        Some(bytes) => {
                            SourceEvent::Applied(Object::Service(decode_service(bytes, &path)?))
                        }
                        None => SourceEvent::Deleted(ObjectRef::Service(path.parse().map_err(
                            |e: kpng_model::global::InvalidKey| WireError::new(&path, "path", e.0),
                        )?)),
                    },
                    Touched::Node(path) => match next.nodes.get(&path) {
                        Some(bytes) => {
                            SourceEvent::Applied(Object::Node(decode_node(bytes, &path)?))
                        }
                        None => SourceEvent::Deleted(ObjectRef::Node(path)),
                    },
                    Touched::Slice(key) => match next.slice(&key)? {
                        Some(slice) => SourceEvent::Applied(Object::EndpointSlice(slice)),
                        None => SourceEvent::Deleted(ObjectRef::EndpointSlice(key)),
                    },
                });
            }
            events
        };
        *self = next;
        Ok(events)
    }

    fn slice(&self, key: &SliceKey) -> Result<Option<EndpointSlice>, WireError> {
        let Some(items) = self.endpoints.get(key) else { return Ok(None) };
        decode_slice(key, items.iter().map(|(p, b)| (p.as_str(), b.as_slice())))
    }

    /// Every mirrored object.
    fn objects(&self) -> Result<Vec<Object>, WireError> {
        let mut objects = Vec::new();
        for (path, bytes) in &self.nodes {
            objects.push(Object::Node(decode_node(bytes, path)?));
        }
        for (path, bytes) in &self.services {
            objects.push(Object::Service(decode_service(bytes, path)?));
        }
        for key in self.endpoints.keys() {
            objects.extend(self.slice(key)?.map(Object::EndpointSlice));
        }
        Ok(objects)
    }
}

#[cfg(test)]
mod tests;
