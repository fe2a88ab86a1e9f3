//! kpng's sources: where the global model comes from (the kube, file and api sources).
//!
//! Every source converts what it observes into the same [`SourceEvent`]s and writes them to
//! the store in batches. Kubernetes objects are parsed into kpng's own types ([`schema`]),
//! which hold only the fields a proxy reads, and converted in one place, [`convert`], which
//! names the object and the field when an object is invalid.
//!
//! # Layout
//! - [`schema`]: the Kubernetes objects kpng reads, as deserialization types (API pages,
//!   watch events and manifests all parse into them).
//! - [`convert`]: `Service`, `EndpointSlice`, `Node` and `ServiceCIDR` → model values, with
//!   the rules of what is proxied (proxy-name and headless labels, ExternalName, headless
//!   services, FQDN slices, slices without a service), and the kube-nftlb load-balancing
//!   annotations read into typed settings.
//! - [`object`]: one object from JSON text or a JSON value, parsed and converted: the
//!   path every source reads objects through.
//! - [`api`]: the api source: another kpng's global stream, mirrored into the store.
//! - [`kube`]: the kube source: watchers on the API server, reduced at ingest.
//! - [`mod@file`]: the file source: manifests (multi-document YAML, JSON, `kind: List`) read once
//!   or watched, each read applied to the store as one relist, so only differences count.
//!
//! [`SourceEvent`]: kpng_store::SourceEvent

pub mod api;
pub mod convert;
pub mod file;
pub mod kube;
pub mod object;
pub mod schema;

pub use convert::{ConvertError, ConvertOptions, Converted};
