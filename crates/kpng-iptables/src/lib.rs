//! kpng's iptables backend (`to-iptables`): kube-proxy's iptables mode, from the same node
//! state as every other backend, updated incrementally.
//!
//! kpng owns only chains named `KPNG-*` in the `nat` and `filter` tables of each family
//! (iptables and ip6tables), entered by six jumps inserted once into built-in chains. Each
//! change set rewrites only the chains whose rules changed, in one `iptables-restore
//! --noflush` per family; a change set that changes nothing runs nothing.
//!
//! # Chain layout
//!
//! ```text
//! nat PREROUTING, OUTPUT ─> KPNG-SERVICES
//!   -d 0.0.0.N/0.0.0.15 -j KPNG-SH-N          (≤ 16 rules: low nibble of the destination)
//!   -d <NodePort address> -j KPNG-NODEPORTS    (or every local address but loopback)
//! KPNG-SH-N:  -d 0.0.0.B/0.0.0.255 -j KPNG-SH-BB   (≤ 16 rules: low byte)
//! KPNG-SH-BB: -d <ip> -p <proto> -m <proto> --dport <port> -j KPNG-SVC-*|KPNG-SVL-*|KPNG-EXT-*|KPNG-FW-*
//! KPNG-NODEPORTS: -p <proto> -m <proto> --dport A:A+63 -j KPNG-NP-<PROTO>-<A/64>
//! KPNG-NP-*:  -p <proto> -m <proto> --dport <nodePort> -j KPNG-EXT-*
//! KPNG-SVC-* (Cluster set) / KPNG-SVL-* (Local set):
//!   the cluster IP's masquerade check, ClientIP affinity (-m recent --rcheck per endpoint),
//!   then -m statistic --mode random --probability 1/n ... -j KPNG-SEP-*
//! KPNG-SEP-*: -s <endpoint> -j KPNG-MARK-MASQ (hairpin); [-m recent --set] -j DNAT
//! KPNG-EXT-*: policy Cluster: mark for masquerade, -j KPNG-SVC-*; policy Local: local pods
//!   and the node itself -j KPNG-SVC-* (the node's masqueraded), others -j KPNG-SVL-*
//! KPNG-FW-*:  -s <loadBalancerSourceRange> -j KPNG-EXT-*; -j KPNG-MARK-DROP
//! nat POSTROUTING ─> KPNG-POSTROUTING: masquerade (fully random) what carries the mark bit
//! filter INPUT, FORWARD, OUTPUT (new connections) ─> KPNG-FILTER
//!   -m mark --mark <drop bit> -j DROP            (source ranges)
//!   -d 0.0.0.N/0.0.0.15 -j KPNG-FSH-N ...        (the same sharding: REJECT or DROP per
//!                                                destination without a usable endpoint, and
//!                                                REJECT for a cluster IP's other ports)
//!   -d <service CIDR> -j DROP                    (addresses no service holds)
//!   -d <NodePort address> -j KPNG-NODEPORTS      (REJECT or DROP per NodePort)
//! ```
//!
//! A new connection walks at most 16 + 16 rules to reach its leaf, whose rules are about
//! 1/256 of the destinations (service addresses are allocated at random), rather than a
//! rule per service. A one-service change rewrites that service's own chains and the leaf
//! of each of its destinations, never a chain that lists every service; the upper shard
//! chains change only when a leaf appears or goes. Chain names come from a versioned hash
//! of what they stand for ([`names`]), so a restart finds them.
//!
//! For example, `shop/web` (ClusterIP 10.96.1.10:80, endpoints 10.244.0.10:8080 and
//! 10.244.2.10:8080, `--cluster-cidr 10.244.0.0/16`) is these chains (the leaf and shard
//! rules shown are its own):
//!
//! ```text
//! -A KPNG-SERVICES -d 0.0.0.10/0.0.0.15 -j KPNG-SH-A
//! -A KPNG-SH-A -d 0.0.0.10/0.0.0.255 -j KPNG-SH-0A
//! -A KPNG-SH-0A -d 10.96.1.10/32 -p tcp -m tcp --dport 80 -j KPNG-SVC-HB5TYTUADGHVJ
//! -A KPNG-SVC-HB5TYTUADGHVJ -d 10.96.1.10/32 -p tcp -m tcp --dport 80 -j KPNG-MASQ-UNLESS-POD
//! -A KPNG-SVC-HB5TYTUADGHVJ -m statistic --mode random --probability 0.50000000000 -j KPNG-SEP-PMQ452M5XFAQD
//! -A KPNG-SVC-HB5TYTUADGHVJ -j KPNG-SEP-VIINZDXSJYG3A
//! -A KPNG-SEP-PMQ452M5XFAQD -s 10.244.0.10/32 -j KPNG-MARK-MASQ
//! -A KPNG-SEP-PMQ452M5XFAQD -p tcp -j DNAT --to-destination 10.244.0.10:8080
//! -A KPNG-SEP-VIINZDXSJYG3A -s 10.244.2.10/32 -j KPNG-MARK-MASQ
//! -A KPNG-SEP-VIINZDXSJYG3A -p tcp -j DNAT --to-destination 10.244.2.10:8080
//! -A KPNG-MASQ-UNLESS-POD -s 10.244.0.0/16 -j RETURN
//! -A KPNG-MASQ-UNLESS-POD -j KPNG-MARK-MASQ
//! (filter)
//! -A KPNG-FSH-0A -d 10.96.1.10/32 -j REJECT --reject-with icmp-port-unreachable
//! ```
//!
//! # Layout
//! - [`rule`]: rules as typed values, printed exactly as `iptables-save` prints them.
//! - [`names`]: fixed chain names and hashed per-service and per-endpoint names.
//! - [`render`]: pure ENLS service → its chains and dispatch entries.
//! - [`dispatch`]: the sharded dispatch chains built from every service's entries.
//! - [`state`]: the backend's half of the template: its objects ([`state::Key`]: a chain,
//!   or a jump from a built-in chain; [`state::Rules`]), [`state::IptablesRender`] (each
//!   service's own chains, and through [`Render::shared`](kpng_backend::reconcile::Render::shared)
//!   the dispatch chains many services share), and the restore inputs of a plan.
//! - [`kernel`]: the [`Kernel`] trait and [`CommandKernel`] (iptables-save/-restore of the
//!   chosen variant), and cleanup.
//! - [`leftovers`]: kube-proxy's chains, found and removed when kpng replaces it.
//! - [`memory`]: [`MemoryKernel`], in-memory tables for tests and `--dry-run`.
//! - [`backend`]: [`backend::IptablesKernel`], the template's kernel (a plan becomes one
//!   restore per family; each table's section commits whole, and a refused one holds back
//!   no other table or family: [`Unit::Group`](kpng_backend::reconcile::Unit)), and
//!   [`IptablesBackend`], the template's reconciler with the two, and its options.
//!   Everything else (the change loop, the owner-keyed table, the plan, resets, drift, the
//!   counters) is the template's, in [`kpng_backend::reconcile`].
//! - [`metrics`]: [`IptablesMetrics`], the counters for Prometheus.
//! - [`error`]: the error type, [`IptablesError`].

pub mod backend;
pub mod dispatch;
pub mod error;
pub mod kernel;
pub mod leftovers;
pub mod memory;
pub mod metrics;
pub mod names;
pub mod render;
pub mod rule;
pub mod state;

pub use backend::{IptablesBackend, IptablesOptions, IptablesStats};
pub use error::IptablesError;
pub use kernel::{CommandKernel, Kernel, Marks, Mode, Snapshot};
pub use memory::MemoryKernel;
pub use metrics::IptablesMetrics;

/// The backend's name on the command line.
pub const NAME: &str = "to-iptables";
