//! kpng's nftables backend.
//!
//! kpng owns one table per family (`ip kpng`, `ip6 kpng`) whose chains and rules never
//! depend on the cluster's size. Every service, port and endpoint is an element of a hash
//! set or map, so adding, changing or removing one is a handful of element updates in one
//! atomic transaction, and the kernel's commit cost does not grow with the cluster.
//!
//! # Table layout
//!
//! Packets to a service take this path (IPv4 shown; IPv6 is the same with `ip6`):
//!
//! ```text
//! nat prerouting/output ─> services
//!   ip daddr @cluster_ips ip saddr != @local_pods   jump mark_for_masquerade
//!   ip daddr . l4proto . dport @masq_dests          jump mark_for_masquerade   (external, policy Cluster)
//!   ip daddr . l4proto . dport vmap @service_dispatch        ─> goto pick_cluster_N | pick_local_N | external_local
//!   ip daddr @nodeport_addrs l4proto . dport vmap @nodeport_dispatch ─> goto pick_nodeport_*_N | nodeport_local
//! pick_cluster_N:
//!   dnat ip to ip daddr . l4proto . dport . numgen random mod N map @cluster_backends
//! external_local (externalTrafficPolicy Local):
//!   local pods and the node itself ─> external_short_circuit ─> vmap @cluster_pick
//!   anyone else                    ─> vmap @local_pick
//! nat postrouting ─> masquerading: hairpin pairs, then the masquerade mark bit
//! filter prerouting/output (before DNAT): firewall_check (loadBalancerSourceRanges)
//! filter input/forward/output (after DNAT), new connections: endpoint_check
//!   vmap @no_endpoint_dests / @no_endpoint_nodeports ─> drop | goto reject_packet
//!   ip daddr @cluster_ips goto reject_packet        (a port the service does not define)
//! ```
//!
//! One `pick_*_N` chain exists per endpoint count `N` in use, so the chain count is bounded
//! by the number of distinct endpoint counts, not by the number of services. A service's
//! endpoints occupy slots `0..N` of the backends map under each of its destinations; slots
//! are kept stable, so one endpoint change rewrites one or two slots and, when `N` changes,
//! one dispatch verdict.
//!
//! Only two sets hold intervals: `local_pods` (the local-traffic detector, a few CIDRs) and
//! `firewall_allow` (load-balancer source ranges, consulted only for new connections to
//! load-balancer IPs that have ranges).
//!
//! For example, `shop/web` (ClusterIP 10.96.1.10:80, endpoints 10.244.0.10:8080 and
//! 10.244.2.10:8080) is these elements:
//!
//! ```text
//! add element ip kpng cluster_ips { 10.96.1.10 }
//! add element ip kpng service_dispatch { 10.96.1.10 . tcp . 80 : goto pick_cluster_2 }
//! add element ip kpng cluster_backends { 10.96.1.10 . tcp . 80 . 0 : 10.244.0.10 . 8080 }
//! add element ip kpng cluster_backends { 10.96.1.10 . tcp . 80 . 1 : 10.244.2.10 . 8080 }
//! ```
//!
//! # Layout
//! - [`objects`]: names of sets, maps and chains; element keys and values.
//! - [`skeleton`]: the static part of each table, as `nft -f` input, and the pick chains.
//! - [`render`]: pure ENLS → elements, per service and for the node.
//! - [`slots`]: stable slot assignment for pick maps.
//! - [`state`]: the committed elements, their owners, and the difference of an update.
//! - [`text`]: elements and transactions in nft syntax.
//! - [`conntrack`]: which UDP conntrack entries a sync leaves stale.
//! - [`backend`]: [`NftBackend`] and the [`Kernel`] trait it commits through.
//! - [`dry_run`]: [`DryRunKernel`], which prints instead of applying.
//! - [`kernel`]: [`NetlinkKernel`], the real kernel: `nft -f` for the skeleton at start-up,
//!   one netlink batch per transaction after that.
//! - [`netlink`]: the nf_tables netlink encoding and socket.

pub mod backend;
pub mod conntrack;
pub mod dry_run;
pub mod kernel;
pub mod netlink;
pub mod objects;
pub mod render;
pub mod skeleton;
pub mod slots;
pub mod state;
pub mod text;

pub use backend::{Kernel, NftBackend, NftOptions};
pub use dry_run::DryRunKernel;
pub use kernel::NetlinkKernel;
