//! kpng's gRPC wire API.

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

pub mod local;
pub mod wire;

pub use wire::WireError;
