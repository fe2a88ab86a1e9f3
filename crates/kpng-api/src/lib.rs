//! kpng's gRPC wire API: the `localv1` (one node's ENLS) and `globalv1` (the whole model)
//! packages, wire-compatible with the original kpng and extended from field 100 on, and
//! the conversions between them and kpng's model. It depends on the model only: the server
//! is `kpng-server`, and the api source that mirrors a global stream into a store is in
//! `kpng-sources`.
//!
//! # Layout
//! - [`localv1`], [`globalv1`], [`aggregatorv1`]: the generated messages and services (`proto/`, compiled
//!   with protox at build time, no `protoc` needed).
//! - [`local`]: ENLS ops ↔ `localv1` op items.
//! - [`global`]: global model objects ↔ `globalv1` infos, and the global stream's items.
//! - [`load_balancing`]: the kube-nftlb load-balancing settings ↔ their wire extension.
//! - [`wire`]: decoding helpers and [`WireError`], which names the object and field.
//! - [`addr`]: server addresses (Unix socket or TCP), what protects them, TLS material.
//! - [`peer`]: a Unix socket peer's credentials, who is admitted or trusted, and where a
//!   socket may live.
//! - [`client`]: connecting, pulling either stream, and following a node's stream with
//!   reconnection and backoff.

/// The node-local stream's messages and service (`localv1`).
#[allow(missing_docs, clippy::all)]
pub mod localv1 {
    tonic::include_proto!("localv1");
}

/// The global stream's messages and service (`globalv1`).
#[allow(missing_docs, clippy::all)]
pub mod globalv1 {
    tonic::include_proto!("globalv1");
}

/// The nftables aggregator's messages and service (`aggregatorv1`): producers publish the
/// tables they own (conversions to the aggregator's model are in `kpng-aggregator`).
#[allow(missing_docs, clippy::all)]
pub mod aggregatorv1 {
    tonic::include_proto!("aggregatorv1");
}

pub mod addr;
pub mod client;
pub mod global;
pub mod load_balancing;
pub mod local;
pub mod peer;
pub mod wire;

pub use addr::{Address, Security, SecurityError, TlsFiles};

pub use wire::WireError;
