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
//! | `mode: dnat` | `mode` |
//! | `helper: <name>` | `helper` |
//! | `log: output`, `forward` | `log` |
//!
//! ClientIP session affinity is `srcip` persistence with the affinity's timeout. The
//! modes `stlsdnat` and `dsr`, NodePorts, externalIPs and load-balancer IPs are not
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
//! - [`backend`]: [`NftlbBackend`], the diff of farms into calls; [`cleanup`].
//! - [`mod@error`]: what can fail, [`NftlbError`].

pub mod backend;
pub mod check;
pub mod client;
pub mod error;
pub mod farm;

pub use backend::{Api, NftlbBackend, cleanup, list_farms};
pub use check::{Installed, NftListing};
pub use client::Client;
pub use error::NftlbError;

/// The backend's name, as on the command line.
pub const NAME: &str = "to-nftlb";
