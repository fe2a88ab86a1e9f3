//! kpng's servers: the `to-api` gRPC server (`/localv1.Sets/Watch`, one node's ENLS, and
//! `/globalv1.Sets/Watch`, the global model) on a Unix socket that admits clients by their
//! credentials, or TCP with mutual TLS (plaintext only when asked for); and the HTTP servers every long-running kpng runs (health, readiness, metrics,
//! state, health-check NodePorts), bounded so that slow or greedy clients cannot take the
//! process's descriptors or memory.
//!
//! Each watch stream is pull-based: a client asks for the next change set when it is
//! ready; it gets `Reset`, everything and `Sync` first, then only differences, and changes
//! made while it is busy reach it together in its next change set. What a stream carries
//! is computed once per store revision for all its clients and encoded once: each
//! connected node costs the server a pointer per service, not a copy of its state, and a
//! client that stops reading holds a cursor, not a buffer.
//!
//! # Layout
//! - [`listen`](serve): [`serve`], the gRPC server on its listener, with the client cap,
//!   the credentials check of Unix clients (a refused one is told why) and the identity of
//!   each request's client ([`kpng_api::peer::PeerIdentity`] in its extensions);
//!   [`serve_routes`], the same for other gRPC services (the nftables aggregator).
//! - `connection`: admission of connections up to `--max-clients`, and the watchdog that
//!   cuts those whose client stopped reading.
//! - `service`: the hand-written gRPC services and the [`Hub`] they share.
//! - `answer`: one stream's pull protocol, frame by frame.
//! - `counters`: [`ServerStats`], and the guard that counts a connected client.
//! - [`feed`]: a stream's content shared by its clients, with a bounded log of change sets.
//! - `nodes`: every node's ENLS, brought up to each revision by one fan-out task.
//! - `variants`: a service's projection, encoded once per class of nodes that get the same.
//! - `global`: the global stream's content.
//! - [`frame`]: items encoded once, and the codec that writes them as they are.
//! - [`http`]: the bounded HTTP server (header timeout, shared connection budget) and
//!   binding with retries, reported to `/readyz`.
//! - [`admin`]: `/healthz`, `/livez`, `/readyz`, `/metrics`, `/state`.
//! - [`healthcheck`]: the health-check NodePort servers, run as a backend.
//! - [`throttle`]: warnings said at most once per period, with a count.

pub mod admin;
mod answer;
mod connection;
mod counters;
pub mod feed;
pub mod frame;
mod global;
pub mod healthcheck;
pub mod http;
mod listen;
mod nodes;
mod service;
pub mod throttle;
mod variants;

pub use counters::ServerStats;
pub use listen::{ServeError, ServeOptions, Served, serve, serve_routes};
pub use service::{GlobalSets, Hub, LocalSets};
