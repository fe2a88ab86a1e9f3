//! The Kubernetes objects kpng reads, as its own deserialization types.
//!
//! Each type names only the fields a proxy uses; everything else in an object (managed
//! fields, most labels and annotations, status a proxy does not use) is skipped while
//! parsing, never stored. Every field is optional here, as JSON `null` or absence, so that a
//! missing field is reported by the conversion ([`crate::convert`]) with its path rather
//! than refused by the parser. Field names are the API's (`clusterIPs`, `podCIDRs`), so a
//! parse error's path ([`serde_path_to_error`]) is the path a user sees in the manifest.
//!
//! The same types serve the kube source (API list pages and watch events, parsed straight
//! from the bytes) and the file source (manifests), so both convert the same way.
//!
//! # Layout
//! - [`meta`]: `metadata` with the few labels and annotations that matter, and the lenient
//!   head that names an object that cannot be parsed.
//! - [`service`], [`mod@slice`], [`node`], [`service_cidr`]: one kind each.

pub mod meta;
pub mod node;
pub mod service;
pub mod service_cidr;
pub mod slice;

pub use meta::{ObjectHead, ObjectMeta};
pub use node::Node;
pub use service::Service;
pub use service_cidr::ServiceCidr;
pub use slice::EndpointSlice;
