//! Projection of the global model onto one node, and the diff between two node states.
//!
//! `project` answers "what must this node enforce?" as a [`LocalState`]: for each service
//! port and family, the Cluster set and the Local set of endpoints, exactly as upstream
//! kube-proxy chooses them (topology hints, terminating fallback, traffic policies). `diff`
//! turns two states into the [`Op`]s that lead from one to the other, and
//! [`NodeProjector`] keeps one node's state current, recomputing only the services a store
//! revision touched, so a change that does not alter this node's state yields no ops.
//!
//! # Layout
//! - [`select`]: endpoint selection for one service port and family (the Cluster set, the
//!   Local set, and whether the port has endpoints at all).
//! - [`project`]: [`project_node_state`], [`project_service`], [`project_node`]: global
//!   model → ENLS; [`NodeLocal`], what only the node knows (`--nodeport-addresses`, its
//!   addresses, `--service-cidr`), merged into the node's part.
//! - [`mod@diff`]: [`diff()`] and [`diff_services`]: two ENLS → ops, services before their
//!   endpoints, endpoints deleted before their service.
//! - [`nodeports`]: where the node accepts NodePorts (`--nodeport-addresses`), per family.
//! - [`on_demand`]: [`OnDemand`], a node's ENLS read from the model a service at a time,
//!   for readers that need not hold it whole.
//! - [`projector`]: [`NodeProjector`], the incremental driver a sink runs per node. It
//!   keeps the state it last computed whole, or only its fingerprints ([`prints`]), which
//!   give the same ops; then the state is read from the model ([`OnDemand`]).
//! - [`prints`]: [`Fingerprints`], a 64-bit hash per service and per endpoint, with what
//!   a diff and the conflict log need besides.
//!
//! [`LocalState`]: kpng_model::LocalState
//! [`Op`]: kpng_model::Op

pub mod diff;
pub mod nodeports;
pub mod on_demand;
pub mod prints;
pub mod project;
pub mod projector;
pub mod select;

pub use diff::{diff, diff_services};
pub use kpng_model::full_state_ops;
pub use nodeports::{NodePortSelection, nodeport_addresses};
pub use on_demand::OnDemand;
pub use prints::Fingerprints;
pub use project::{
    NodeLocal, project_node, project_node_state, project_node_state_with, project_node_with,
    project_service,
};
pub use projector::{Held, NodeProjector};
