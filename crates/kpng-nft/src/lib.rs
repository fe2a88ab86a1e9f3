//! kpng's nftables backend.
//!
//! kpng owns one table per family (`ip kpng`, `ip6 kpng`) whose chains and rules never
//! depend on the cluster's size. Every service, port and endpoint is an element of a hash
//! set or map, so adding, changing or removing one is a handful of element updates in one
//! atomic transaction, and the kernel's commit cost does not grow with the cluster.
//!
//! # Table layout
//!
//! Packets to a service take this path (IPv4 shown; IPv6 is the same with `ip6`); `dest` is
//! `ip daddr . meta l4proto . th dport`, `nodeport` is `meta l4proto . th dport` on a
//! NodePort address:
//!
//! ```text
//! nat prerouting/output ─> services
//!   ip daddr @cluster_ips ip saddr != @local_pods   jump mark_for_masquerade
//!   dest @masq_dests / nodeport @masq_nodeports      jump mark_for_masquerade   (policy Cluster)
//!   dest @cluster_dests                              goto pick_cluster
//!   dest @local_dests                                goto pick_local           (internalTrafficPolicy Local)
//!   dest @external_local_dests                       goto external_local       (externalTrafficPolicy Local)
//!   nodeport @nodeport_cluster_dests / @nodeport_local_dests  goto pick_nodeport_cluster / nodeport_local
//! pick_cluster:
//!   dest vmap @affinity_cluster                      ─> goto aff_<group>   (ClientIP affinity services)
//!   goto pick_cluster_counts
//! pick_cluster_counts: one rule per endpoint count N in use
//!   dest @cluster_count_N dnat ip to dest . numgen random mod N map @cluster_backends
//! external_local: local pods and the node itself goto pick_cluster, anyone else goto pick_local
//! nat postrouting ─> masquerading: hairpin pairs, then the masquerade mark bit
//! filter prerouting/output (before DNAT): firewall_check (loadBalancerSourceRanges)
//! filter input/forward/output (after DNAT), new connections: endpoint_check
//!   dest @drop_dests drop, dest @reject_dests goto reject_packet (and NodePort variants)
//!   ip daddr @cluster_ips goto reject_packet        (a port the service does not define)
//! ```
//!
//! Every per-service and per-endpoint fact is an element of a hash set or of a data map:
//! no verdict map is on the change path of ordinary services, so no element update makes
//! the kernel re-validate the table, and a change costs the same at any cluster size.
//! Services that ask for ClientIP affinity are the exception: each of their port groups
//! has chains of its own (see [`affinity`]), entered through the `affinity_*` verdict maps
//! at the start of each pick chain. Apart from those, the chains are fixed; the only rules
//! that come and go are the pick rules, one per distinct endpoint count (with its count
//! set), created the first time a count is used and kept. A service's endpoints occupy
//! slots `0..N` of the backends map under each of its destinations; slots are kept stable,
//! so one endpoint change rewrites one or two slots and moves the destination between two
//! count sets.
//!
//! Only one set holds intervals besides the local-pod detector (`local_pods`, a few
//! CIDRs): `firewall_allow` (load-balancer source ranges), consulted only for new
//! connections to load-balancer IPs that have ranges.
//!
//! For example, `shop/web` (ClusterIP 10.96.1.10:80, endpoints 10.244.0.10:8080 and
//! 10.244.2.10:8080) is these elements:
//!
//! ```text
//! add element ip kpng cluster_ips { 10.96.1.10 }
//! add element ip kpng cluster_dests { 10.96.1.10 . tcp . 80 }
//! add element ip kpng cluster_count_2 { 10.96.1.10 . tcp . 80 }
//! add element ip kpng cluster_backends { 10.96.1.10 . tcp . 80 . 0 : 10.244.0.10 . 8080 }
//! add element ip kpng cluster_backends { 10.96.1.10 . tcp . 80 . 1 : 10.244.2.10 . 8080 }
//! ```
//!
//! # Layout
//! - [`affinity`]: ClientIP session affinity groups (the only per-service chains).
//! - [`objects`]: names of sets and maps; element keys and values.
//! - [`skeleton`]: the static part of each table, as `nft -f` input, and the pick rules.
//! - [`render`]: pure ENLS → elements, per service and for the node.
//! - [`slots`]: stable slot assignment for the backends maps.
//! - [`state`]: the committed elements, their owners, and the difference of an update.
//! - [`text`]: elements and transactions in nft syntax.
//! - [`conntrack`]: which UDP conntrack entries a sync leaves stale.
//! - [`backend`]: [`NftBackend`] and the [`Kernel`] trait it commits through.
//! - [`dry_run`]: [`DryRunKernel`], which prints instead of applying.
//! - [`kernel`]: [`NetlinkKernel`], the real kernel: `nft -f` for the skeleton at start-up,
//!   one netlink batch per transaction after that.
//! - [`netlink`]: the nf_tables netlink encoding and socket.

pub mod affinity;
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

pub use backend::{Kernel, NftBackend, NftMetrics, NftOptions, NftStats};
pub use dry_run::DryRunKernel;
pub use kernel::NetlinkKernel;
