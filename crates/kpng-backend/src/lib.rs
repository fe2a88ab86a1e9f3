//! What a kpng dataplane backend implements, and nothing else.
//!
//! A [`Backend`] enforces one node's Expected Node-Local State (ENLS). It receives
//! [`ChangeSet`]s: the ops since its previous change set, closed by `Sync`, with the whole
//! state after them for lookups. The first change set, and the first after a failure,
//! starts with `Reset` and describes everything. A backend that cannot apply a change set
//! returns a [`BackendError`] and must leave what was in force before.
//!
//! This crate depends only on the model (`kpng-model`) and tokio's timers, so a backend
//! crate never pulls in the store, the projection or the runner that drives it
//! (`kpng-runner`).
//!
//! # Layout
//! - [`backend`]: the [`Backend`] trait, [`ChangeSet`], [`BackendError`],
//!   [`error_chain`], and [`Target`] (the kernel, or `--dry-run`'s output), which every
//!   kernel backend's constructor takes.
//! - [`metrics`]: backends' counters written as Prometheus counters.
//! - [`pace`]: [`pace::Pace`], when the next batch of kernel work may start (a burst, then
//!   one per period, and a rest after a long one): the runner's and the aggregator's.
//! - [`proxy`]: proxy facts every dataplane shares, decided once above the backends
//!   (local-traffic detection).
//! - [`endpoints`]: which endpoints of a service port this node picks from (the Cluster
//!   and Local sets), read from the node state the same way for every dataplane.
//! - [`problems`]: what a backend found wrong with its dataplane and is repairing, for
//!   `/readyz`.
//! - [`slots`]: stable slots of endpoints in a group (one endpoint change moves one or
//!   two), for the dataplanes that pick `random mod n`.
//! - [`unsupported`]: load-balancing annotations a dataplane cannot enforce, logged once
//!   per backend and service above the backends.
//! - [`reconcile`]: the template a kernel backend is an instance of: a
//!   [`reconcile::Render`] and a [`reconcile::Kernel`] are the backend's own; the
//!   [`reconcile::Reconciler`] (change loop, owner-keyed table, ordered plans, resets,
//!   verification, counters) is where the template ends and the backend begins.

pub mod backend;
pub mod endpoints;
pub mod metrics;
pub mod pace;
pub mod problems;
pub mod proxy;
pub mod reconcile;
pub mod slots;
pub mod unsupported;

/// A bare ClusterIP service for the tests to fill in.
#[cfg(test)]
pub(crate) fn bare_service(namespace: &str, name: &str) -> kpng_model::local::LocalService {
    kpng_model::local::LocalService {
        key: kpng_model::ServiceKey::new(namespace, name),
        service_type: kpng_model::global::ServiceType::ClusterIP,
        cluster_ips: Box::default(),
        outside: None,
        ports: vec![].into(),
        affinity_timeout_seconds: None,
        internal_local: false,
        external_local: false,
        health_check_node_port: None,
        load_balancing: Default::default(),
    }
}

pub use backend::{Backend, BackendError, ChangeSet, Target, error_chain};
pub use problems::Problems;
