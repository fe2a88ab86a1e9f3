//! `to-local`: this node's ENLS, fed to backends.

use std::sync::Arc;

use anyhow::{Context, bail};
use kpng_backend::{Backend, JsonBackend, NodeStats, RunnerOptions, run_node};
use kpng_nft::render::NodePortAddresses;
use kpng_nft::skeleton::SkeletonOptions;
use kpng_nft::{DryRunKernel, NetlinkKernel, NftBackend, NftOptions};
use kpng_store::StoreReader;

use crate::cli::{BackendCommand, GlobalArgs};

/// The backends named on the command line, and their metrics.
pub struct Backends {
    /// The backends, in command-line order.
    pub backends: Vec<Box<dyn Backend>>,
    /// Metrics of their own.
    pub collectors: Vec<Box<dyn prometheus_client::collector::Collector>>,
}

/// Builds the backends named on the command line. Backends this build lacks are an error.
pub fn build_backends(
    commands: &[BackendCommand],
    global: &GlobalArgs,
) -> anyhow::Result<Backends> {
    let mut built = Backends { backends: Vec::new(), collectors: Vec::new() };
    for command in commands {
        match command {
            BackendCommand::ToJson(_) => {
                built.backends.push(Box::new(JsonBackend::new(std::io::stdout())))
            }
            BackendCommand::ToNft(_) => {
                let backend = nft_backend(global)?;
                built.collectors.push(Box::new(kpng_nft::NftMetrics(backend.stats())));
                built.backends.push(Box::new(backend));
            }
            BackendCommand::ToEbpf(args) => {
                let backend = ebpf_backend(args, global)?;
                built.collectors.push(Box::new(kpng_ebpf::EbpfMetrics(backend.stats())));
                built.backends.push(Box::new(backend));
            }
            other => bail!("backend {} is not available in this build of kpng", other.name()),
        }
    }
    Ok(built)
}

/// The nftables backend as the options describe it.
fn nft_backend(global: &GlobalArgs) -> anyhow::Result<NftBackend> {
    let nodeport_addresses = match global.nodeport_addresses.trim() {
        "primary" | "" => NodePortAddresses::Primary,
        list => NodePortAddresses::Cidrs(
            list.split(',')
                .map(|c| c.trim().parse::<ipnet::IpNet>().map(|n| n.trunc()))
                .collect::<Result<_, _>>()
                .with_context(|| {
                    format!(
                        "--nodeport-addresses {list:?}: expected `primary` or comma-separated CIDRs"
                    )
                })?,
        ),
    };
    let options = NftOptions {
        skeleton: SkeletonOptions {
            masquerade_all: global.masquerade_all,
            local_pods: Vec::new(),
            masquerade_bit: global.masquerade_bit,
        },
        nodeport_addresses,
        cluster_cidrs: global.cluster_cidr.iter().map(|n| n.trunc()).collect(),
    };
    let kernel: Box<dyn kpng_nft::Kernel> = if global.dry_run {
        Box::new(DryRunKernel::new(std::io::stdout()))
    } else {
        Box::new(NetlinkKernel::open()?)
    };
    Ok(NftBackend::new(options, kernel))
}

/// The eBPF backend as the options describe it: the kernel's programs and maps, or with
/// `--dry-run` the map writes printed on standard output.
fn ebpf_backend(
    args: &crate::cli::EbpfArgs,
    global: &GlobalArgs,
) -> anyhow::Result<kpng_ebpf::EbpfBackend> {
    use kpng_ebpf::{Dataplane, KernelDataplane, KernelOptions, MemoryDataplane};
    let dataplane: Box<dyn Dataplane> = if global.dry_run {
        Box::new(MemoryDataplane::printing(std::io::stdout()))
    } else {
        let cgroup = match &args.cgroup_path {
            Some(path) => path.clone(),
            None => kpng_ebpf::support::cgroup2_root()?,
        };
        let options = KernelOptions { cgroup, pin_root: args.bpf_pin_path.clone() };
        Box::new(KernelDataplane::open(options).context("starting the eBPF backend")?)
    };
    Ok(kpng_ebpf::EbpfBackend::new(dataplane))
}

/// Runs the node's backends until the source ends (or once, with `once`).
pub async fn run_to_local(
    reader: StoreReader,
    node: String,
    backends: Vec<Box<dyn Backend>>,
    once: bool,
    periods: (std::time::Duration, std::time::Duration),
    stats: Arc<NodeStats>,
) -> anyhow::Result<()> {
    let (min_sync_period, sync_period) = periods;
    let mut options = RunnerOptions::new(node);
    options.once = once;
    options.min_sync_period = min_sync_period;
    options.verify_period = (!sync_period.is_zero()).then_some(sync_period);
    run_node(reader, backends, options, stats).await?;
    Ok(())
}
