//! Global model objects ↔ `globalv1` infos.
//!
//! A Service is one `ServiceInfo` (path `namespace/name`); an EndpointSlice is one
//! `EndpointInfo` per endpoint (path `namespace/slice/ip`, see [`endpoint_path`]), each
//! carrying the slice's ports and address type so that the slice can be rebuilt from its
//! endpoints; a Node is one `NodeInfo` (path `name`); a ServiceCIDR is one
//! `ServiceCidrInfo` (set `GlobalServiceCidrInfos`, path `name`). A slice without endpoints
//! has no item: it carries nothing a proxy uses. Each info's `hash` is a hash of its
//! encoding, for clients that compare.
//!
//! # Layout
//! - `service`: `ServiceInfo` (creation time and proxy name included).
//! - `slice`: `EndpointInfo`s, endpoint paths, slices rebuilt from their endpoints.
//! - `node`: `NodeInfo` and `ServiceCidrInfo`.

mod node;
mod service;
mod slice;

pub use node::{decode_node, decode_service_cidr, node_item, service_cidr_item};
pub use service::{decode_service, service_item};
pub use slice::{decode_slice, endpoint_path, slice_items, slice_key_of};

use kpng_model::hash::fnv1a64;
use kpng_model::{GlobalModel, ServiceKey};
use prost::Message;

use crate::localv1;

/// One item of the global stream: its set, path and encoded info.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GlobalItem {
    /// `GlobalServiceInfos`, `GlobalEndpointInfos`, `GlobalNodeInfos` or
    /// `GlobalServiceCidrInfos`.
    pub set: localv1::Set,
    /// The object's path.
    pub path: String,
    /// The encoded `ServiceInfo`, `EndpointInfo`, `NodeInfo` or `ServiceCidrInfo`.
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

/// The encoding of `message` with its hash field set (by `set_hash`) to the FNV-1a hash of
/// its encoding without it: stable across versions and platforms.
fn with_hash<M: Message>(mut message: M, set_hash: impl Fn(&mut M, u64)) -> Vec<u8> {
    let h = fnv1a64(&message.encode_to_vec());
    set_hash(&mut message, h);
    message.encode_to_vec()
}

/// Every item of `model`, sorted by set and path.
pub fn model_items(model: &GlobalModel) -> Vec<GlobalItem> {
    let mut items: Vec<GlobalItem> = model.nodes().map(node_item).collect();
    items.extend(model.service_cidrs().map(service_cidr_item));
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

#[cfg(test)]
mod tests;
