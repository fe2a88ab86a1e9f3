//! kpng's domain model: plain values compared by value.
//!
//! Everything here is pure data with no I/O. Sources convert Kubernetes objects into the
//! [`global`] types; the projection (crate `kpng-local`) turns the global model into one
//! node's [`local`] state (the *Expected Node-Local State*, ENLS); sinks and backends consume
//! the [`ops`] that describe how one ENLS becomes the next.
//!
//! # Layout
//! - [`hash`]: FNV-1a, for names and hashes that must be stable across processes and versions.
//! - [`net`]: IP families, protocols and lenient parsing of IPs and CIDRs as Kubernetes writes them.
//! - [`global`]: the reduced global model: [`global::Service`], [`global::EndpointSlice`],
//!   [`global::Node`], [`global::ServiceCidr`], and [`global::GlobalModel`] which holds them
//!   and reports what a change touched; [`global::is_for_proxy`], the service-proxy-name rule;
//!   [`global::LoadBalancing`], the kube-nftlb load-balancing annotations, typed.
//! - [`local`]: the ENLS of one node: [`local::LocalState`] with its services, endpoints and
//!   node, and [`local::NodeState`], how consumers read an ENLS held whole or made on demand.
//! - [`ops`]: [`ops::Op`], the vocabulary every sink consumes (reset, set, delete, sync), and
//!   [`local::LocalState::apply`] which replays ops onto a state.
//! - [`parts`]: whole-cluster work (a projection, a rendering) split over the machine's cores.
//! - `rare`: parts of an object that few objects have (a service's outside addresses, an
//!   endpoint's hints, the latter within its shared placement), kept behind one pointer.

pub mod global;
pub mod hash;
pub mod local;
pub mod net;
pub mod ops;
pub mod parts;
mod rare;

pub use global::{
    Changes, EndpointSlice, GlobalModel, Kind, Node, Object, ObjectRef, Service, ServiceCidr,
    ServiceKey, SliceKey, Touched,
};
pub use local::{
    Endpoints, LocalEndpoint, LocalNode, LocalOutside, LocalService, LocalState, NodePortAddresses,
    NodeState,
};
pub use net::{Family, PerFamily, Protocol};
pub use ops::{Item, ItemRef, Op, full_state_ops};
