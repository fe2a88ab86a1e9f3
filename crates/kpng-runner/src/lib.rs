//! The runner: how one node's ENLS reaches the backends that enforce it.
//!
//! A [`Backend`] (crate `kpng-backend`) receives change sets: the ops since its previous
//! change set, closed by `Sync`, with the full state after them for lookups. The
//! [`runner`] projects the store onto the node, diffs, and hands every backend only real
//! changes; a failed backend is retried with backoff and then given the full state again.
//!
//! # Layout
//! - [`runner`]: [`run_node`], the loop from store revisions to backend change sets, its
//!   counters ([`NodeStats`]), and [`runner::Stop`], which a process that is shutting down
//!   sets so that no change set is applied after it.
//! - [`readiness`]: [`readiness::Latch`], a start-up milestone that stays reached (every
//!   backend synced once), which `/readyz` reports.
//! - [`lock`]: one kpng per node and dataplane (an abstract Unix socket).
//! - [`json`]: [`JsonBackend`], which writes each op as one JSON line: the debugging
//!   backend, and a readable proof of what the diff emits.
//! - `heap`: the allocator kpng runs with ([`Allocator`], jemalloc with one arena and
//!   small thread caches, [`MALLOC_CONF`]), and, before and after each full sync, its free memory given back to
//!   the system (a full sync builds and frees the whole table at once;
//!   [`release_free_memory`], which the nftables aggregator also calls after a large
//!   batch); the crate's only unsafe code.

mod heap;
pub mod json;
pub mod lock;
pub mod readiness;
pub mod runner;

pub use heap::{Allocator, MALLOC_CONF, arenas, release_free_memory, size_class, thread_cache_max};
pub use json::JsonBackend;
pub use kpng_backend::{Backend, BackendError, ChangeSet, Target, error_chain, proxy};
pub use runner::{Health, NodeStats, Pace, RunnerError, RunnerOptions, run_node, run_remote};
