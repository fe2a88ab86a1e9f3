//! kpng's nftlb backend (`to-nftlb`): the node state as nftlb farms, through nftlb's REST
//! API, for those who keep the nftlb daemon.
//!
//! Each service port with a cluster IP of a family is one farm whose backends are the
//! endpoints of the port's Cluster set (its Local set with `internalTrafficPolicy:
//! Local`): topology and terminating fallback are applied before nftlb sees them. By
//! default a farm is in `snat` mode with the `weight` scheduler and every weight 1 (a
//! uniform random pick, as kpng's other backends make); the service's load-balancing
//! annotations (kube-nftlb's keys) become the farm's fields of the same name:
//!
//! | annotation | farm |
//! |---|---|
//! | `scheduler: rr`, `symhash`, `hash` | `scheduler` |
//! | `persistence: <key>` | `persistence` and `persist-ttl` (`sched-param` with `hash`) |
//! | `mode: dnat`, `dsr` (with `--nftlb-interface`) | `mode` |
//! | `helper: <name>` | `helper` |
//! | `log: output`, `forward` | `log` |
//!
//! ClientIP session affinity is `srcip` persistence with the affinity's timeout. A `dsr`
//! farm ([`link`]) is hooked on the interface clients arrive on (`iface`, the backend's
//! `--nftlb-interface`), forwards out of the interface its backends are neighbours on
//! (`oface`, with that interface's link-layer address) to each backend's link-layer
//! address, read from the neighbour table; without conntrack every packet chooses, so its
//! scheduler is `hash` of the persistence key (`srcip srcport` when unset) or `symhash`,
//! and its backends have no port (the packet keeps the service's). nftlb does not list
//! these link-layer fields: they are resolved when a farm or backend is created. The mode
//! `stlsdnat` (nftlb's keeps the service port and takes replies on one interface only),
//! `dsr` without `--nftlb-interface`, NodePorts, externalIPs and load-balancer IPs are not
//! expressed; a service that has them is logged once. A port without endpoints has a farm
//! without backends, which nftlb does not reject as `to-nft` does.
//!
//! kpng owns the daemon's farms: what it does not want goes. nftlb programs the nftables
//! of the host it runs on, which must be this node: after each change kpng reads the
//! kernel back (`nft list chain ip nftlb nat-<farm>`) to check that nftlb installed what
//! it answered success for.
//!
//! # Layout
//!
//! - [`farm`]: farms and their names from the node state; the JSON nftlb reads and lists.
//! - [`client`]: nftlb's REST API over HTTP/1.1.
//! - [`check`]: what the kernel holds of a farm.
//! - [`link`]: where a `dsr` farm's backends are on the link layer.
//! - [`backend`]: where kpng's backend template ends and this backend begins:
//!   [`NftlbBackend`] is the template's reconciler with [`backend::NftlbRender`] (a
//!   service into farms) and [`backend::NftlbKernel`] (farms listed back, a plan as the
//!   fewest calls, the kernel checked after); [`cleanup`].
//! - [`mod@error`]: what can fail, [`NftlbError`].

pub mod backend;
pub mod check;
pub mod client;
pub mod error;
pub mod farm;
pub mod link;

pub use backend::{Api, NftlbBackend, cleanup, list_farms};
pub use check::{Installed, NftListing};
pub use client::Client;
pub use error::NftlbError;
pub use link::{LinkLayer, NeighbourTable};

/// The backend's name, as on the command line.
pub const NAME: &str = "to-nftlb";
