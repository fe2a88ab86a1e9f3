//! Nodes ↔ `NodeInfo`, and ServiceCIDRs ↔ `ServiceCidrInfo`.

use kpng_model::global::{NodeAddress, NodeAddressKind};
use kpng_model::{Node, ServiceCidr};

use super::{GlobalItem, with_hash};
use crate::wire::{WireError, decode, parse_ip, parse_nets};
use crate::{globalv1, localv1};

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

/// The item of a ServiceCIDR.
pub fn service_cidr_item(cidr: &ServiceCidr) -> GlobalItem {
    let info = globalv1::ServiceCidrInfo {
        hash: 0,
        name: cidr.name.clone(),
        cidrs: cidr.cidrs.iter().map(ToString::to_string).collect(),
    };
    GlobalItem {
        set: localv1::Set::GlobalServiceCidrInfos,
        path: cidr.name.clone(),
        bytes: with_hash(info, |m, h| m.hash = h),
    }
}

/// A ServiceCIDR from its item (named by its path).
pub fn decode_service_cidr(bytes: &[u8], path: &str) -> Result<ServiceCidr, WireError> {
    let info: globalv1::ServiceCidrInfo = decode(bytes, path)?;
    Ok(ServiceCidr::new(path, parse_nets(&info.cidrs, path, "cidrs")?))
}
