//! kpng's sources: where the global model comes from.
//!
//! Every source converts what it observes into the same [`SourceEvent`]s and writes them to
//! the store in batches. Conversion from Kubernetes objects happens in one place,
//! [`convert`], which keeps only what a proxy needs and names the object and the field when
//! an object is invalid.
//!
//! # Layout
//! - [`convert`]: Kubernetes `Service`, `EndpointSlice` and `Node` → model values, with the
//!   rules of what is proxied (proxy-name and headless labels, ExternalName, headless
//!   services, FQDN slices, slices without a service).
//! - [`kube`]: the kube source: watchers on the API server, reduced at ingest.
//! - [`mod@file`]: the file source: manifests (multi-document YAML, JSON, `kind: List`) read once
//!   or watched, each read applied to the store as one relist, so only differences count.
//!
//! [`SourceEvent`]: kpng_store::SourceEvent

pub mod convert;
pub mod file;
pub mod kube;

pub use convert::{ConvertError, ConvertOptions, Converted};
