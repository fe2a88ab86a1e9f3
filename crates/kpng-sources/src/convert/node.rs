//! v1 Node → [`Node`].

use kpng_model::global::{Node, NodeAddress, NodeAddressKind, TO_BE_DELETED_TAINT};
use kpng_model::net::{parse_cidr, parse_ip};

use super::{ConvertError, Converted, FieldError};
use crate::schema::Node as NodeObject;
use crate::schema::node::NodeSpec;

/// Whether a node label can matter to a proxy.
fn label_matters(key: &str) -> bool {
    key.starts_with("topology.kubernetes.io/") || key == "kubernetes.io/hostname"
}

/// Converts a Node. Nodes are never ignored.
pub fn convert_node(node: &NodeObject) -> Result<Converted<Node>, ConvertError> {
    let name = node.metadata.name.clone().unwrap_or_default();
    let error = |error: FieldError| ConvertError {
        kind: "Node",
        namespace: None,
        name: name.clone(),
        error,
    };
    if name.is_empty() {
        return Err(error(FieldError::new("metadata.name", "missing")));
    }
    let labels = node
        .metadata
        .labels
        .0
        .iter()
        .filter(|(k, _)| label_matters(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let mut addresses = Vec::new();
    let entries = node.status.as_ref().and_then(|s| s.addresses.as_ref());
    for (i, a) in entries.into_iter().flatten().enumerate() {
        let kind = match a.type_.as_deref() {
            Some("InternalIP") => NodeAddressKind::InternalIP,
            Some("ExternalIP") => NodeAddressKind::ExternalIP,
            _ => continue,
        };
        let field = format!("status.addresses[{i}].address");
        let text = a.address.as_deref().ok_or_else(|| error(FieldError::new(&field, "missing")))?;
        let ip = parse_ip(text).map_err(|e| error(FieldError::new(field, e)))?;
        addresses.push(NodeAddress { kind, ip });
    }
    let spec = node.spec.as_ref();
    let pod_cidrs = pod_cidrs(spec).map_err(error)?;
    let to_be_deleted = spec
        .and_then(|s| s.taints.as_ref())
        .into_iter()
        .flatten()
        .any(|t| t.key.as_deref() == Some(TO_BE_DELETED_TAINT));
    addresses.shrink_to_fit();
    Ok(Converted::Proxied(Node {
        name,
        labels,
        addresses,
        pod_cidrs,
        deleting: node.metadata.deletion_timestamp,
        to_be_deleted,
    }))
}

/// `spec.podCIDRs`, or `spec.podCIDR` when that is all there is.
fn pod_cidrs(spec: Option<&NodeSpec>) -> Result<Vec<ipnet::IpNet>, FieldError> {
    let (field, cidrs): (&str, Vec<&String>) = match spec.and_then(|s| s.pod_cidrs.as_ref()) {
        Some(cidrs) if !cidrs.is_empty() => ("spec.podCIDRs", cidrs.iter().collect()),
        _ => ("spec.podCIDR", spec.and_then(|s| s.pod_cidr.as_ref()).into_iter().collect()),
    };
    cidrs
        .into_iter()
        .enumerate()
        .map(|(i, c)| parse_cidr(c).map_err(|e| FieldError::new(format!("{field}[{i}]"), e)))
        .collect()
}
