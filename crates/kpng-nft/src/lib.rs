//! kpng's nftables backend.
//!
//! kpng owns one table per family (`ip kpng`, `ip6 kpng`) whose chains and rules never
//! depend on the cluster's size. Every service, port and endpoint is an element of a hash
//! set or map, so adding, changing or removing one is a handful of element updates in one
//! atomic netlink transaction, and the kernel's commit cost does not grow with the cluster.
//!
//! # Table layout
//!
//! Packets to a service take this path (IPv4 shown; IPv6 is the same with `ip6`); `dest` is
//! `ip daddr . meta l4proto . th dport`, `nodeport` is `meta l4proto . th dport` on a
//! NodePort address:
//!
//! ```text
//! nat prerouting/output ─> services
//!   ip daddr @cluster_ips                            jump masquerade_unless_pod (or mark_for_masquerade)
//!   dest @masq_dests / nodeport @masq_nodeports      jump mark_for_masquerade   (policy Cluster)
//!   dest @cluster_dests                              goto pick_cluster
//!   dest @local_dests                                goto pick_local           (internalTrafficPolicy Local)
//!   dest @external_local_dests                       goto external_local       (externalTrafficPolicy Local)
//!   nodeport @nodeport_cluster_dests / @nodeport_local_dests  goto pick_nodeport_cluster / nodeport_local
//! pick_cluster:
//!   dest vmap @affinity_cluster                      ─> goto aff_<group>   (ClientIP affinity services)
//!   jump pick_cluster_counts                         (counts beyond the tree: one rule each)
//!   goto pick_cluster_t0_0                           (the pick tree)
//! pick_cluster_t<d>_<v>: dest @cluster_bit_<7-d> goto ..._t<d+1>_<2v+1>; goto ..._t<d+1>_<2v>
//! pick_cluster_t7_<v>:   dest @cluster_bit_0 dnat ip to dest . numgen random mod <2v+2> map @cluster_backends_<b(2v+2)>
//!                        dnat ip to dest . numgen random mod <2v+1> map @cluster_backends_<b(2v+1)>
//! external_local: local pods and the node itself goto pick_cluster, anyone else goto pick_local
//! nat postrouting ─> masquerading: hairpin pairs, then the masquerade mark bit
//! filter prerouting/output (before DNAT): firewall_check (loadBalancerSourceRanges)
//! filter input/forward/output (after DNAT), new connections: endpoint_check
//!   dest @drop_dests drop, dest @reject_dests goto reject_packet (and NodePort variants)
//!   ip daddr @cluster_ips goto reject_packet        (a port the service does not define)
//!   ip daddr <service CIDR> drop                     (an address no service holds)
//! ```
//!
//! Every per-service and per-endpoint fact is an element of a hash set or of a data map:
//! no verdict map is on the change path of ordinary services, so no element update makes
//! the kernel re-validate the table, and a change costs the same at any cluster size.
//! Picking among `n` endpoints walks a fixed tree of chains, one level per bit of `n - 1`
//! (the `*_bit_<b>` sets hold the destinations with that bit), so a new connection costs
//! the same few lookups whatever the mix of endpoint counts, and a change of count is a
//! few element updates, never a rule change. Only counts beyond 256 get a count set and a
//! rule of their own, made when first used. Services that ask for ClientIP affinity have
//! chains of their own per port group (see [`affinity`]), entered through the `affinity_*`
//! verdict maps. A service's endpoints occupy slots `0..n` of a backends map under each
//! of its destinations; slots are kept stable, so one endpoint change rewrites one or two
//! slots.
//!
//! Each kind of pick has one backends map per bucket of endpoint counts, named by the
//! largest count it holds (`b(n)` above): `cluster_backends_1`, `_2`, `_4` (3 or 4
//! endpoints), `_8` and so on to `_256`, and `_more` beyond the tree. The kernel checks
//! every element added to a map against each rule that reads the map; with one map per
//! kind read by the 256 pick rules of the tree, that check was most of the kernel's cost of
//! a cold start. Now the pick rules of a bucket's counts read its map (one or two for the
//! usual few endpoints); a service whose count leaves its bucket moves its elements to the
//! next map in the same transaction. An upgrade over tables with one map per kind moves
//! every element once.
//!
//! A service with kube-nftlb load-balancing annotations (scheduler, persistence, mode,
//! helper, log) is balanced by group chains too, whose entry chain follows its settings; services
//! without annotations keep exactly the layout above. For example `test/rr` with
//! `scheduler: rr`, `mode: dnat` and `log: forward` (two endpoints; the mark bit 0x4000):
//!
//! ```text
//! add element ip kpng affinity_cluster { 10.96.0.120 . tcp . 80 : goto aff_<h> }
//! chain aff_<h> {
//!   fib saddr type != local limit rate 10/second burst 5 packets log prefix "kpng test/rr " level warn
//!   meta mark set meta mark & 0xffffbfff
//!   numgen inc mod 2 == 0 goto aff_<h>_0
//!   goto aff_<h>_1
//! }
//! chain aff_<h>_0 { meta l4proto tcp dnat ip to 10.244.0.10:8080 }
//! ```
//!
//! `mode: stlsdnat` (stateless DNAT) and `mode: dsr` (direct server return) add the only
//! base chains that depend on services: two per group (prerouting and output, priority
//! -300, before conntrack), which take the ClusterIP port's packets out of conntrack and
//! rewrite them in place (and the endpoints' replies back), or send an unchanged copy to
//! the endpoint's link-layer address ([`affinity`] shows them); such a service's other
//! destinations are rejected.
//!
//! Only one set holds intervals: `firewall_allow` (load-balancer source ranges),
//! consulted only for new connections to load-balancer IPs that have ranges.
//!
//! For example, `shop/web` (ClusterIP 10.96.1.10:80, endpoints 10.244.0.10:8080 and
//! 10.244.2.10:8080) is these elements:
//!
//! ```text
//! add element ip kpng cluster_ips { 10.96.1.10 }
//! add element ip kpng hairpin { 10.244.0.10 . 10.244.0.10 }
//! add element ip kpng hairpin { 10.244.2.10 . 10.244.2.10 }
//! add element ip kpng cluster_dests { 10.96.1.10 . tcp . 80 }
//! add element ip kpng cluster_bit_0 { 10.96.1.10 . tcp . 80 }
//! add element ip kpng cluster_backends_2 { 10.96.1.10 . tcp . 80 . 0 : 10.244.0.10 . 8080 }
//! add element ip kpng cluster_backends_2 { 10.96.1.10 . tcp . 80 . 1 : 10.244.2.10 . 8080 }
//! ```
//!
//! # Layout
//! `to-nft` is an instance of kpng's backend template
//! ([`kpng_backend::reconcile`]): the template owns the change path, the table of what
//! each service wants and what is committed, resets, verification and counters. The
//! backend begins at [`instance`]: how services render into the objects of kpng's tables
//! ([`NftRender`]) and how a plan of those objects becomes one nf_tables transaction
//! ([`Tables`]).
//! - [`entry`]: an object of the tables as the template keeps it: an element (packed, see
//!   [`packed`]) or a layout object (table, set, chain, `ct helper`).
//! - [`instance`]: [`NftRender`] and [`Tables`].
//! - [`objects`]: names of sets and maps, element keys and values, group names.
//! - [`rules`]: a rule as nft text and nf_tables expressions, built together.
//! - [`sets`]: set and map declarations (text and netlink).
//! - [`skeleton`]: the static part of each table, for the options in force.
//! - [`render`]: pure ENLS → elements, per service and for the node.
//! - [`affinity`]: groups of ClientIP affinity and annotated services (the only per-service
//!   chains) and their policy.
//! - [`layout`]: the layout objects besides the skeleton (large counts, affinity groups).
//! - [`reconcile`]: commands that bring the layout objects a table has to those it should
//!   have, touching only what differs ([`Tables`] uses it for every plan).
//! - [`plan`]: one transaction as typed commands, and its nft text.
//! - [`encode`], [`decode`]: commands and elements as netlink bytes, and back.
//! - [`kernel`]: the [`Kernel`] trait (where transactions go) and [`NetlinkKernel`], the
//!   real kernel.
//! - [`dry_run`]: [`DryRunKernel`], which prints instead of applying.
//! - [`aggregated`]: [`AggregatorKernel`], which publishes each transaction to an nftables
//!   aggregator (`to-nft --aggregator`).
//! - [`memory`]: [`MemoryKernel`], an in-memory table for tests that traces packets.
//! - [`options`]: how the backend is configured ([`NftOptions`]).
//! - [`backend`]: [`NftBackend`], the template's reconciler over the two.
//! - [`stats`]: the transactions' counters; [`metrics`]: the backend's metrics.
//! - [`error`]: the backend's errors ([`NftError`]).

pub mod affinity;
pub mod aggregated;
pub mod backend;
pub mod decode;
pub mod dry_run;
pub mod encode;
pub mod entry;
pub mod error;
pub mod instance;
pub mod kernel;
pub mod layout;
pub mod memory;
pub mod metrics;
pub mod objects;
pub mod options;
pub mod packed;
pub mod plan;
pub mod reconcile;
pub mod render;
pub mod rules;
pub mod sets;
pub mod skeleton;
pub mod stats;
pub mod text;

pub use aggregated::{AggregatorKernel, AggregatorTarget};
pub use backend::{NftBackend, TableSync};
pub use dry_run::DryRunKernel;
pub use error::NftError;
pub use instance::{NftRender, Tables};
pub use kernel::{Kernel, KernelContents, NetlinkKernel, cleanup, remove_tables_named};
pub use memory::MemoryKernel;
pub use metrics::NftMetrics;
pub use options::NftOptions;
pub use stats::NftStats;
