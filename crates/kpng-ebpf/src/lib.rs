//! kpng's eBPF backend: socket-level service translation.
//!
//! BPF programs on a cgroup v2 hierarchy choose a service's endpoint when a socket of the
//! cgroup calls `connect()` (or, for unconnected UDP, `sendmsg()`), so packets carry the
//! endpoint's address from the first one on: no per-packet rewriting and no NAT conntrack
//! entry. `recvmsg()` and `getpeername()` show the service address again. The programs
//! (`bpf/kpng_sock.c`, C compiled with clang against libbpf's headers) read hash maps that
//! kpng fills from the node's ENLS; a change set is a handful of map element writes,
//! whatever the cluster's size.
//!
//! What the programs translate, for sockets in the cgroup: cluster IPs (TCP and UDP, both
//! families), and external IPs, load-balancer IPs and NodePorts on the node's NodePort
//! addresses as its ENLS lists them (as upstream does for pods and the node itself, to the
//! Cluster set). Everything else (traffic from other hosts, SCTP, packets not started from
//! a local socket, and what [`render`] leaves to nftables) stays on the packet path: run
//! `to-nft` in the same pipeline.
//!
//! # Maps
//!
//! ```text
//! kpng_frontends   (address, port, protocol) -> endpoint group, action when the group is empty
//! kpng_groups      group -> endpoint count, ClientIP affinity timeout
//! kpng_backends    (group, slot) -> endpoint address and port, slots 0..count
//! kpng_members     (group, endpoint) of affinity groups: is a remembered endpoint still there;
//!                  under the group's serving id, the endpoints still serving a UDP port
//! kpng_cluster_ips cluster IPs: a port their service does not define is refused
//! kpng_affinity    (client network namespace, group) -> endpoint, last use   (LRU, programs)
//! kpng_revnat      (socket, endpoint) -> service address, for replies        (LRU, programs)
//! kpng_udp_flows   (socket, service address) -> endpoint, last send           (LRU, programs)
//! ```
//!
//! A group is a service port's Cluster or Local set in one family; its id is a stable hash,
//! so a restart finds it in the maps. The cluster IP's frontend points at the set its
//! traffic uses; external, load-balancer and NodePort frontends at the Cluster set. The
//! first five maps are hash maps without preallocation, sized to twice what the cluster
//! needs and replaced by larger ones when it outgrows them ([`kernel`]); the two LRU maps
//! have fixed sizes and survive that replacement.
//!
//! # Layout
//! - [`maps`]: the maps' keys and values, and their byte layouts (mirroring the C structs).
//! - [`render`]: pure ENLS → map elements, per service.
//! - [`backend`]: where kpng's backend template ends and this backend begins:
//!   [`EbpfBackend`] is the template's reconciler with [`backend::EbpfRender`] (a service
//!   into map elements, NodePort frontends yielding) and [`backend::EbpfKernel`] (writes in
//!   map order, one element at a time, maps grown when full). The owner-keyed table, the
//!   change loop, resets, verification and counters are the template's.
//! - [`dataplane`]: the [`Dataplane`] trait, its write [`dataplane::Batch`], and
//!   [`MemoryDataplane`] (tests, `--dry-run`).
//! - [`metrics`]: [`EbpfMetrics`], the counters for Prometheus.
//! - [`kernel`]: [`KernelDataplane`], the real kernel through aya: load, attach, grow.
//! - [`batch`]: batched map writes (one `bpf()` call per map and change set).
//! - [`pins`]: the layout of pins under bpffs, and cleanup.
//! - [`query`]: which programs the kernel runs on a cgroup (`BPF_PROG_QUERY`).
//! - [`sockets`]: [`ConnectedUdp`], connected UDP sockets whose endpoint no longer serves,
//!   destroyed (what conntrack cleanup is on the packet path).
//! - [`support`]: the checks made at start (object, `bpf()`, cgroup v2, bpffs).
//! - [`error`]: the error type, [`EbpfError`].

pub mod backend;
pub mod batch;
pub mod dataplane;
pub mod error;
pub mod kernel;
pub mod maps;
pub mod metrics;
pub mod pins;
pub mod query;
pub mod render;
pub mod sockets;
pub mod support;

pub use backend::{EbpfBackend, EbpfOptions, EbpfStats};
pub use dataplane::{Dataplane, MemoryDataplane};
pub use error::EbpfError;
pub use kernel::{KernelDataplane, KernelOptions};
pub use metrics::EbpfMetrics;
pub use pins::cleanup;
pub use sockets::ConnectedUdp;

/// The backend's name on the command line.
pub const NAME: &str = "to-ebpf";
