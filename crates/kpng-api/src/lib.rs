//! kpng's gRPC wire API: the `localv1` (one node's ENLS) and `globalv1` (the whole model)
//! packages, wire-compatible with the original kpng and extended from field 100 on;
//! conversions between them and kpng's model ([`local`], [`global`]); addresses and TLS
//! ([`addr`]); and the client end of both streams ([`client`]).

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

pub mod addr;
pub mod client;
pub mod global;
pub mod local;
pub mod wire;

pub use addr::{Address, Security, SecurityError, TlsFiles};

pub use wire::WireError;
