//! `to-local`: this node's ENLS, fed to backends.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use kpng_conntrack::tuning::HostSysctls;
use kpng_conntrack::{
    CleanerMetrics, FlowCleaner, FlowError, FlowTable, Removed, StaleChecks, UdpCheck,
};
use kpng_local::NodeLocal;
use kpng_nft::{AggregatorKernel, AggregatorTarget, NftBackend, NftOptions};
use kpng_runner::lock::InstanceLock;
use kpng_runner::runner::AddressUpdates;
use kpng_runner::{Backend, JsonBackend, NodeStats, RunnerOptions, Target, run_node};
use kpng_store::StoreReader;

use crate::cli::{BackendCommand, EbpfArgs, GlobalArgs, IptablesArgs, NftArgs, NftlbDaemonArgs};

/// The backends named on the command line, and their metrics.
pub struct Backends {
    /// The backends, in command-line order.
    pub backends: Vec<Box<dyn Backend>>,
    /// Metrics of their own.
    pub collectors: Vec<Box<dyn prometheus_client::collector::Collector>>,
    /// One kpng per node and dataplane: held as long as the backends run.
    pub locks: Vec<InstanceLock>,
}

/// Builds the backends named on the command line. Backends this build lacks are an error.
pub fn build_backends(
    commands: &[BackendCommand],
    global: &GlobalArgs,
    problems: &kpng_backend::Problems,
) -> anyhow::Result<Backends> {
    let mut built = Backends { backends: Vec::new(), collectors: Vec::new(), locks: Vec::new() };
    // Where kube-proxy's nftables-mode metrics count failed clean-ups of its rules.
    let mut nft_stats = None;
    for command in commands {
        match command {
            BackendCommand::ToJson(_) => {
                built.backends.push(Box::new(JsonBackend::new(std::io::stdout())))
            }
            BackendCommand::ToNft(args) => {
                if !global.dry_run {
                    built.locks.push(InstanceLock::take("nftables")?);
                }
                let backend = nft_backend(args, global)?;
                nft_stats = Some(backend.stats());
                built.collectors.push(Box::new(kpng_nft::NftMetrics::of(&backend)));
                built.backends.push(Box::new(backend));
            }
            BackendCommand::ToIptables(args) => {
                if !global.dry_run {
                    built.locks.push(InstanceLock::take("iptables")?);
                }
                let backend = iptables_backend(args, global)?;
                built.collectors.push(Box::new(kpng_iptables::IptablesMetrics::of(&backend)));
                built.backends.push(Box::new(backend));
            }
            BackendCommand::ToNftlb(args) => {
                if global.dry_run {
                    anyhow::bail!(
                        "to-nftlb has no --dry-run: nftlb's farms are listed by GET /farms on its API"
                    );
                }
                let Some(key) = &args.daemon.nftlb_key_file else {
                    anyhow::bail!(
                        "to-nftlb needs --nftlb-key-file (nftlb refuses calls without its key)"
                    );
                };
                built.locks.push(InstanceLock::take("nftlb")?);
                let client = nftlb_client(&args.daemon, key)?;
                let mut backend = kpng_nftlb::NftlbBackend::new(
                    Box::new(client),
                    Box::new(kpng_nftlb::NftListing),
                );
                if let Some(iface) = &args.nftlb_interface {
                    if iface.is_empty() || iface.len() > 15 {
                        anyhow::bail!("--nftlb-interface {iface:?}: not an interface name");
                    }
                    backend = backend
                        .with_direct_return(iface.clone(), Box::new(kpng_nftlb::NeighbourTable));
                }
                built.backends.push(Box::new(backend));
            }
            BackendCommand::ToEbpf(args) => {
                if !global.dry_run {
                    built.locks.push(InstanceLock::take("ebpf")?);
                }
                let backend = ebpf_backend(args, global)?.with_problems(problems.clone());
                built.collectors.push(Box::new(kpng_ebpf::EbpfMetrics::of(&backend)));
                let sockets = backend.connected_udp();
                built.backends.push(Box::new(backend));
                if let Some(sockets) = sockets {
                    // Connected UDP sockets point at their endpoint for good: once the maps
                    // hold each state, those whose endpoint stopped serving are cut.
                    let cleaner = FlowCleaner::new("ebpf-sockets", Box::new(EbpfSockets(sockets)));
                    built.collectors.push(Box::new(CleanerMetrics::new(
                        cleaner.stats(),
                        (
                            "kpng_ebpf_udp_sockets_destroyed",
                            "Connected UDP sockets destroyed because their endpoint stopped serving.",
                        ),
                        (
                            "kpng_ebpf_udp_socket_cleanup_failures",
                            "Destructions of stale connected UDP sockets that failed (they are retried).",
                        ),
                    )));
                    built.backends.push(Box::new(cleaner));
                }
            }
        }
    }
    if programs_kernel(commands, global) {
        if global.process.remove_kube_proxy {
            // Best effort: what could not be removed is logged, and kpng's rules go in.
            let failures = crate::leftovers::remove().len() as u64;
            if let Some(stats) = &nft_stats {
                stats.cleanup_failures.fetch_add(failures, std::sync::atomic::Ordering::Relaxed);
            }
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        global.conntrack.tuning().apply(&mut HostSysctls::default(), cpus);
        // Stale UDP flows, once the dataplanes hold each state.
        let cleaner = FlowCleaner::conntrack();
        built.collectors.push(Box::new(CleanerMetrics::conntrack(cleaner.stats())));
        built.backends.push(Box::new(cleaner));
    }
    Ok(built)
}

/// The connected UDP sockets `to-ebpf` translated, as the stale-flow cleanup sees them.
struct EbpfSockets(kpng_ebpf::ConnectedUdp);

impl FlowTable for EbpfSockets {
    fn flows(&self) -> &'static str {
        "connected UDP sockets"
    }

    fn remove_stale(
        &mut self,
        checks: &[UdpCheck],
        nodeport_addrs: &[std::net::IpAddr],
    ) -> Result<Removed, FlowError> {
        let checks = StaleChecks::new(checks, nodeport_addrs);
        let (v4, v6) = self.0.destroy(&|service, endpoint| checks.stale(service, endpoint))?;
        Ok(Removed { v4, v6 })
    }
}

/// Whether kpng programs this node's kernel: some backend does (`to-nft`, `to-ebpf`) and
/// this is no dry run. Conntrack tuning and cleanup, and the health-check NodePort
/// servers, run exactly then, whichever kernel backends there are.
pub fn programs_kernel(commands: &[BackendCommand], global: &GlobalArgs) -> bool {
    !global.dry_run && commands.iter().any(BackendCommand::programs_kernel)
}

/// Where kernel backends send their changes: the kernel, or with `--dry-run` standard
/// output.
fn target(global: &GlobalArgs) -> Target {
    match global.dry_run {
        true => Target::DryRun(Box::new(std::io::stdout())),
        false => Target::Kernel,
    }
}

/// The nftables backend as the options describe it: the kernel, standard output with
/// `--dry-run`, or an aggregator with `--aggregator`.
fn nft_backend(args: &NftArgs, global: &GlobalArgs) -> anyhow::Result<NftBackend> {
    let options = NftOptions {
        masquerade_all: global.proxy.masquerade_all,
        masquerade_bit: global.proxy.masquerade_bit,
        local_detection: global.proxy.local_detection()?,
        cluster_cidrs: global.proxy.cluster_cidr.iter().map(|n| n.trunc()).collect(),
        ..NftOptions::default()
    };
    let Some(address) = &args.aggregator else {
        return Ok(NftBackend::open(options, target(global))?);
    };
    if global.dry_run {
        anyhow::bail!(
            "to-nft: --dry-run prints the transactions and --aggregator publishes them: choose one"
        );
    }
    kpng_aggregator::model::check_name("producer", &args.producer).context("to-nft --producer")?;
    let security = args.conn.checked(address, crate::cli::ConnRole::Client)?;
    let target =
        AggregatorTarget { address: address.clone(), security, producer: args.producer.clone() };
    Ok(NftBackend::new(options, Box::new(AggregatorKernel::new(target)?)))
}

/// The iptables backend as the options describe it: the kernel through the chosen
/// variant's commands, or with `--dry-run` the restore input printed on standard output.
fn iptables_backend(
    args: &IptablesArgs,
    global: &GlobalArgs,
) -> anyhow::Result<kpng_iptables::IptablesBackend> {
    let options = kpng_iptables::IptablesOptions {
        masquerade_all: global.proxy.masquerade_all,
        masquerade_bit: global.proxy.masquerade_bit,
        local_detection: global.proxy.local_detection()?,
        cluster_cidrs: global.proxy.cluster_cidr.iter().map(|n| n.trunc()).collect(),
        localhost_nodeports: args.localhost_nodeports,
        ..kpng_iptables::IptablesOptions::default()
    };
    let mode = kpng_iptables::Mode::from(args.iptables_mode);
    kpng_iptables::IptablesBackend::open(options, mode, target(global))
        .context("starting to-iptables")
}

/// A client of the nftlb daemon the options name.
pub(crate) fn nftlb_client(
    args: &NftlbDaemonArgs,
    key: &std::path::Path,
) -> anyhow::Result<kpng_nftlb::Client> {
    crate::operator_files::warn_if_shared(key, "--nftlb-key-file");
    Ok(kpng_nftlb::Client::with_key_file(&args.nftlb_url, &key.display().to_string())?)
}

/// The eBPF backend as the options describe it: the kernel's programs and maps, or with
/// `--dry-run` the map writes printed on standard output.
fn ebpf_backend(args: &EbpfArgs, global: &GlobalArgs) -> anyhow::Result<kpng_ebpf::EbpfBackend> {
    let options = kpng_ebpf::EbpfOptions {
        cgroup: args.cgroup_path.clone(),
        pin_root: args.pins.bpf_pin_path.clone(),
    };
    let backend = kpng_ebpf::EbpfBackend::open(options, target(global))
        .context("starting the eBPF backend")?;
    Ok(backend.with_udp_flow_timeout(udp_flow_timeout(global)))
}

/// How long an unconnected UDP socket's flow keeps its endpoint with `to-ebpf`, as a
/// conntrack entry would: `--conntrack-udp-timeout-stream` when kpng sets it, else the
/// node's `nf_conntrack_udp_timeout_stream`, else the kernel's default (120 s).
fn udp_flow_timeout(global: &GlobalArgs) -> std::time::Duration {
    let set = global.conntrack.conntrack_udp_timeout_stream;
    if !set.is_zero() {
        return set;
    }
    let path = "/proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream";
    let read = std::fs::read_to_string(path).ok().and_then(|text| text.trim().parse().ok());
    std::time::Duration::from_secs(read.unwrap_or(u64::from(kpng_ebpf::render::FLOW_SECONDS)))
}

/// What only this node knows, and a watcher of its addresses when they matter.
pub fn node_local(global: &GlobalArgs) -> anyhow::Result<(NodeLocal, Option<AddressUpdates>)> {
    let nodeports = global.proxy.nodeport_addresses.clone();
    let service_cidrs = global.proxy.service_cidr.iter().map(|n| n.trunc()).collect();
    let node_ips = global.proxy.node_ip.clone();
    if !nodeports.needs_local_addresses() || global.dry_run {
        return Ok((NodeLocal { nodeports, addresses: Vec::new(), service_cidrs, node_ips }, None));
    }
    let addresses = kpng_netlink::rtnetlink::local_addresses()
        .context("listing the node's addresses for --nodeport-addresses")?;
    let mut watcher = kpng_netlink::rtnetlink::AddressWatcher::open()
        .context("watching the node's addresses for --nodeport-addresses")?;
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    std::thread::Builder::new()
        .name("addresses".into())
        .spawn(move || {
            while watcher.wait().is_ok() {
                // Addresses often change in bursts (an interface coming up): one look after.
                std::thread::sleep(std::time::Duration::from_millis(20));
                match kpng_netlink::rtnetlink::local_addresses() {
                    Ok(addresses) => {
                        if tx.blocking_send(addresses).is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(error = %kpng_runner::error_chain(&e), "cannot list the node's addresses"),
                }
            }
            tracing::warn!("the node's addresses are no longer watched");
        })
        .context("starting the address watcher")?;
    Ok((NodeLocal { nodeports, addresses, service_cidrs, node_ips }, Some(rx)))
}

/// Runs the node's backends until the source ends (or once, with `once`), on a thread of
/// their own.
pub async fn run_to_local(
    reader: StoreReader,
    backends: Vec<Box<dyn Backend>>,
    options: RunnerOptions,
    addresses: Option<AddressUpdates>,
    stats: Arc<NodeStats>,
) -> anyhow::Result<()> {
    on_own_thread(move || run_node(reader, backends, options, stats, addresses)).await??;
    Ok(())
}

/// Runs the future `make` returns on a thread of its own, with a runtime of its own, and
/// resolves to its output. Backends apply change sets synchronously (a large initial load
/// takes seconds); on their own thread they never hold up the process's runtime, where
/// signals, the admin servers and the health-check servers are served. When the process
/// exits meanwhile, the thread ends with it: a kernel transaction is atomic, so one cut
/// short leaves the previous rules in force.
pub fn on_own_thread<F, Fut, T>(make: F) -> impl Future<Output = anyhow::Result<T>>
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
    T: Send + 'static,
{
    let (done, result) = tokio::sync::oneshot::channel();
    let thread = std::thread::Builder::new().name("kpng-runner".into()).spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
        let _ = done.send(runtime.map(|runtime| runtime.block_on(make())));
    });
    async move {
        thread.context("starting the runner's thread")?;
        let output = result.await.context("the runner's thread ended without a result")?;
        output.context("starting the runner's runtime")
    }
}

/// The runner's options from the command line.
pub fn runner_options(global: &GlobalArgs, node: String, local: NodeLocal) -> RunnerOptions {
    let mut options = RunnerOptions::new(node);
    options.once = global.once;
    options.min_sync_period = global.sync.min_sync_period;
    options.verify_period = (!global.sync.sync_period.is_zero()).then_some(global.sync.sync_period);
    options.local = local;
    options
}
