//! kpng's `to-api` server: `/localv1.Sets/Watch` (one node's ENLS) and
//! `/globalv1.Sets/Watch` (the global model) over gRPC, on a Unix socket or TCP with
//! optional mutual TLS.
//!
//! Each stream is pull-based: a client asks for the next change set when it is ready; it
//! gets `Reset`, everything and `Sync` first, then only differences. The content of a
//! stream (a node's ENLS, the global model) is computed once per store revision in a
//! [`feed`] shared by all its clients, which keeps a bounded log of recent change sets: a
//! client that falls further behind gets the whole state again, so memory per client stays
//! bounded.
//!
//! [`admin`] holds the admin HTTP servers (health, readiness, metrics, state) that every
//! long-running kpng process runs. Changes made while a client is busy reach it together in its next change set.

pub mod admin;
pub mod feed;
pub mod healthcheck;
mod listen;
mod service;

pub use listen::{ServeError, serve};
pub use service::{Hub, ServerStats};
