//! EndpointSlices ↔ `EndpointInfo`s, one per endpoint, each carrying what the slice
//! needs to be rebuilt (address type, ports, trigger time, proxy name).

use std::collections::BTreeMap;
use std::net::IpAddr;

use kpng_model::global::{Endpoint, EndpointSlice, Hints, ProxyName, SlicePort};
use kpng_model::{Family, SliceKey};

use super::{GlobalItem, with_hash};
use crate::wire::{WireError, decode, ip_set, parse_ip, parse_ips, port, protocol, wire_protocol};
use crate::{globalv1, localv1};

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
            name: p.name.to_string(),
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
                namespace: slice.key.namespace.to_string(),
                source_name: slice.key.name.to_string(),
                service_name: slice.service_name.to_string(),
                endpoint: Some(localv1::Endpoint {
                    hostname: String::new(),
                    ips: Some(ip_set(std::slice::from_ref(&e.address))),
                    local: false,
                    port_overrides: slice
                        .ports
                        .iter()
                        .map(|p| localv1::PortName {
                            name: p.name.to_string(),
                            port: p.port.into(),
                        })
                        .collect(),
                    scopes: None,
                    ready: e.ready,
                    serving: e.serving,
                    terminating: e.terminating,
                    pod_name: e.pod_name.as_ref().map(ToString::to_string).unwrap_or_default(),
                    ports: Vec::new(),
                }),
                conditions: Some(globalv1::EndpointConditions {
                    ready: e.ready,
                    serving: e.serving,
                    terminating: e.terminating,
                }),
                pod_name: e.pod_name.as_ref().map(ToString::to_string).unwrap_or_default(),
                topology: Some(globalv1::TopologyInfo {
                    node: e.node_name().unwrap_or_default().to_owned(),
                    zone: e.zone().unwrap_or_default().to_owned(),
                }),
                hints: Some(globalv1::TopologyHints {
                    zones: e.zone_hints().to_vec(),
                    nodes: e.node_hints().to_vec(),
                }),
                address_type: address_type.to_string(),
                slice_ports: slice_ports.clone(),
                trigger_time: slice.trigger_time.as_deref().unwrap_or_default().to_string(),
                proxy_name: slice.proxy_name.as_deref().map(str::to_string),
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
                    name: p.name.as_str().into(),
                    protocol: protocol(p.protocol, path, &format!("slicePorts[{i}].protocol"))?,
                    port: port(p.port, path, &format!("slicePorts[{i}].port"))?,
                });
            }
            slice = Some(EndpointSlice {
                key: key.clone(),
                service_name: info.service_name.as_str().into(),
                family,
                ports: ports.into(),
                endpoints: Box::default(),
                trigger_time: (!info.trigger_time.is_empty())
                    .then(|| info.trigger_time.as_str().into()),
                proxy_name: info.proxy_name.as_deref().map(ProxyName::from),
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
                placement: kpng_model::global::Placement::with_hints(
                    Some(&topology.node),
                    Some(&topology.zone),
                    Hints::new(hints.zones, hints.nodes),
                ),
                pod_name: text(&info.pod_name).map(kpng_model::global::PodName::from),
            },
        );
    }
    Ok(slice.map(|mut slice| {
        slice.endpoints = endpoints.into_values().collect();
        slice
    }))
}
