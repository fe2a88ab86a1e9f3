//! Test support for kpng.
//!
//! # Layout
//! - [`apiserver`]: a fake Kubernetes API server (list/watch over HTTP) with a scenario API.
//! - [`builders`]: short constructors for model values with sensible defaults, for tests
//!   that care about one field at a time.
//! - [`strategies`]: proptest strategies over a small universe of keys and addresses, so
//!   random objects collide, update and delete each other often.
//! - [`netns`]: network namespaces and veth links, cleaned up on drop.
//! - [`topology`]: a node, its pods, a remote node and a client, wired for service tests.
//! - [`echo`], [`probe`]: the server in pods and the client of dataplane tests
//!   (`kpng-dev echo`, `kpng-dev probe`).
//! - [`sctp`]: SCTP probes and responders over raw sockets.
//! - [`privileged`]: gatekeeping for tests that need root and kernel tools (fail under `CI=true`).
//! - [`generate`]: synthetic clusters (N services × M endpoints over K nodes) as Kubernetes
//!   manifests, for end-to-end tests, stats and benchmarks (`kpng-dev generate`).

pub mod apiserver;
pub mod builders;
pub mod echo;
pub mod ftp;
pub mod generate;
pub mod netns;
pub mod privileged;
pub mod probe;
pub mod sctp;
pub mod strategies;
pub mod topology;
