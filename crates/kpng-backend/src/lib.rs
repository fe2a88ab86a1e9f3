//! The backend framework: how one node's ENLS reaches the things that enforce it.
//!
//! A [`Backend`] receives change sets: the ops since its previous change set, closed by
//! `Sync`, with the full state after them for lookups. The [`runner`] projects the store
//! onto the node, diffs, and hands every backend only real changes; a failed backend is
//! retried with backoff and then given the full state again.
//!
//! # Layout
//! - [`backend`]: the [`Backend`] trait and [`ChangeSet`].
//! - [`conntrack`]: which UDP conntrack entries are stale, and [`conntrack::ConntrackCleaner`],
//!   the backend that deletes them after the dataplanes applied a state, on a thread of its
//!   own through a [`conntrack::ConntrackTable`] (ctnetlink); conntrack tuning at start-up.
//! - [`runner`]: [`run_node`], the loop from store revisions to backend change sets, its
//!   counters ([`NodeStats`]), and [`runner::Stop`], which a process that is shutting down
//!   sets so that no change set is applied after it.
//! - [`lock`]: one kpng per node and dataplane (an abstract Unix socket).
//! - [`proxy`]: proxy facts every dataplane shares (local-traffic detection).
//! - [`json`]: [`JsonBackend`], which writes each op as one JSON line: the debugging
//!   backend, and a readable proof of what the diff emits.

pub mod backend;
pub mod conntrack;
pub mod json;
pub mod lock;
pub mod proxy;
pub mod runner;

pub use backend::{Backend, BackendError, ChangeSet, error_chain};
pub use json::JsonBackend;
pub use runner::{Health, NodeStats, RunnerError, RunnerOptions, run_node, run_remote};
