//! `kpng-bench`: measures kpng where users feel it, and prints tables.
//!
//! It moves itself into a fresh network namespace (root needed), so nothing on the host is
//! touched, builds a synthetic cluster with the testkit generator, and measures:
//! - `nft`: cold start of the whole table, then one change at a time (endpoint added and
//!   removed, service added and deleted) from the model update to the committed netlink
//!   transaction, with the kernel's commit time alone, against a full `nft -f` reload of the
//!   same ruleset (the resync-per-change approach), and against kube-proxy's iptables mode
//!   (the whole nat table through `iptables-restore`);
//! - `iptables`: `to-iptables` on the real kernel: cold start, then one change at a time
//!   (model update to the last `iptables-restore --noflush` done), against kube-proxy's
//!   whole nat table through `iptables-restore` and `to-nft`'s same change;
//! - `restart`: kpng started over a table far larger than the cluster it finds (read back,
//!   reconcile, one transaction), against a cold start of the small cluster;
//! - `kube`: one change at a time again, now from the fake API server's event through the
//!   kube source, store, node projection and runner to the committed transaction;
//! - `churn`: the kube source, store, projection and nftables backend against the fake API
//!   server, under a stream of events most of which change nothing a proxy uses: API
//!   events vs store changes vs node-state revisions vs kernel transactions;
//! - `memory`: the resident set of the real `kpng` binary synced to a generated cluster
//!   served by the fake API server, against the same binary synced to an empty one;
//! - `cold`: the real `kpng` binary, kube source to nftables, from process start to its first
//!   committed sync, with its peak resident set;
//! - `storm`: the real `kpng` binary with its default flags under a steady rate of real
//!   endpoint changes: API event to the kernel's commit notification, commits per second,
//!   kpng's CPU, against the same with kube-proxy's `--min-sync-period 1s`;
//! - `nftlb`: the nftlb daemon (Debian package) driven through its REST API as kube-nftlb
//!   drives it, against kpng's nftables backend: the same cluster loaded, services of 10, 50
//!   and 100 endpoints created and deleted, one endpoint added and removed;
//! - `dataplane`: real TCP connections from a client namespace to cluster IPs of a node
//!   namespace holding N services, time to connect (the first packet walks the rules), at
//!   each size against the first, through `to-nft` or `to-iptables`;
//! - `api`: one `to-api` server and N node streams: time until every node has its state,
//!   time for one endpoint change to reach every node, memory per connected node;
//! - `ebpf`: a pod on the node connects to cluster IPs through `to-ebpf` (translated at
//!   `connect()`), through `to-nft` (DNAT), and straight to the pods: connect latency,
//!   requests per second and conntrack entries per connection, at each size in one run;
//! - `ebpf changes`: one endpoint change through `to-ebpf` (map writes) and `to-nft` (one
//!   transaction) at each size, and each one's full load;
//! - `paths`: the resident set of each process of kpng's split deployment (`kube to-api`
//!   and `local to-nft`) and aggregator deployment (`to-nft --aggregator` and `aggregate`)
//!   beside the one process, once the node's first sync is committed;
//! - `aggregator`: N producers each making M updates a second to a table of their own,
//!   through one nftables aggregator against each committing alone: transactions and
//!   system calls per second, CPU, and the latency the aggregator adds.
//!
//! # Layout
//! - [`cluster`]: the synthetic cluster as model objects, and the changes applied to it.
//! - [`nft`]: the nftables scenario.
//! - [`ipt_change`]: the iptables backend scenario.
//! - [`restart`]: the restart over a stale table.
//! - [`kube`]: the in-process pipeline against the fake API server, and one change through it.
//! - [`churn`]: the churn scenario: kube source to kernel under a no-op-heavy event stream.
//! - [`memory`]: the kpng binary's resident set, loaded vs empty.
//! - [`iptables`]: kube-proxy's iptables layout for the same cluster, for comparison.
//! - [`cold`]: the kpng binary's cold start through the kube source into nftables.
//! - [`storm`]: the kpng binary under a steady rate of real changes.
//! - [`api`]: the gRPC API scenario.
//! - [`dataplane`]: first-packet latency through the node's rules.
//! - [`nftlb`]: nftlb through its REST API, side by side with kpng.
//! - [`ebpf`]: pod to cluster IP through eBPF, nftables and straight; the pod client.
//! - [`ebpf_change`]: one endpoint change through eBPF and nftables.
//! - [`paths`]: the memory of the split and aggregator deployments.
//! - [`idle`]: the `kpng` binary idle (its CPU), and its repair of foreign changes.
//! - [`aggregator`]: producers through the nftables aggregator and alone.
//! - [`syscalls`]: a system-call counter (perf, `raw_syscalls:sys_enter`).
//! - [`probe`]: the netlink kernel, instrumented (commit time, transactions, elements).
//! - [`table`]: percentiles and table printing.
//! - [`plot`]: the run as an SVG bar chart (`--plot`).

mod aggregator;
mod api;
mod churn;
mod cluster;
mod cold;
mod dataplane;
mod ebpf;
mod ebpf_change;
mod idle;
mod ipt_change;
mod iptables;
mod kube;
mod memory;
mod nft;
mod nftlb;
mod paths;
mod plot;
mod probe;
mod projection;
mod publication;
mod restart;
mod storm;
mod syscalls;
mod table;

use clap::Parser;

/// kpng's benchmarks. Runs in a network namespace of its own; needs root and `nft`.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    /// nftables scenario: cluster sizes (number of services), comma-separated (0 skips it).
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    services: Vec<usize>,
    /// Endpoints per service.
    #[arg(long, default_value_t = 4)]
    endpoints: usize,
    /// Repetitions of each single change.
    #[arg(long, default_value_t = 200)]
    repeat: usize,
    /// Full `nft -f` reloads to time per size, and kube-proxy's `iptables-restore` of the
    /// same cluster for comparison (both slow at large sizes; 0 skips both).
    #[arg(long, default_value_t = 5)]
    reloads: usize,
    /// iptables backend scenario (`to-iptables`): cluster sizes, comma-separated (0 skips
    /// it); repetitions as --repeat, endpoints as --endpoints, full reloads as --reloads.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    iptables_services: Vec<usize>,
    /// One change through the kube source (API event to commit): cluster sizes, comma-separated
    /// (0 skips it); repetitions as --repeat, endpoints as --endpoints.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    kube_services: Vec<usize>,
    /// Churn: API events per second (comma-separated rates; 0 skips the churn scenario).
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    churn_rates: Vec<u64>,
    /// Churn: share of no-op events (resourceVersion bumps), in percent.
    #[arg(long, default_value_t = 99.5)]
    churn_noop: f64,
    /// Churn: seconds per rate.
    #[arg(long, default_value_t = 5)]
    churn_seconds: u64,
    /// Churn: cluster sizes (services), comma-separated; every rate runs at every size.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    churn_services: Vec<usize>,
    /// Churn and memory: endpoints per service.
    #[arg(long, default_value_t = 2)]
    churn_endpoints: usize,
    /// Memory: cluster sizes (services) to measure the kpng binary's resident set at, each
    /// against an empty cluster (0 skips the memory scenario; needs the kpng binary built).
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    memory_services: Vec<usize>,
    /// Cold start of the kpng binary (kube source to nftables): cluster sizes (0 skips it;
    /// needs the kpng binary built).
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    cold_services: Vec<usize>,
    /// nftlb side by side: cluster sizes (services) to load into nftlb and kpng, comma-separated
    /// (0 skips it; needs the `nftlb` daemon on PATH). nftlb holds at most 1,024 farms (one
    /// per service port) or 4,096 backends, 800 services of 4 endpoints, and needs a minute
    /// or more to load them.
    #[arg(long, value_delimiter = ',', default_value = "100")]
    nftlb_services: Vec<usize>,
    /// nftlb side by side: repetitions of each operation.
    #[arg(long, default_value_t = 5)]
    nftlb_repeat: usize,
    /// Dataplane: cluster sizes (services) in the node's table, comma-separated; the ratios
    /// compare each size with the first (0 skips the scenario).
    #[arg(long, value_delimiter = ',', default_value = "100")]
    dataplane_services: Vec<usize>,
    /// Dataplane: distinct endpoint counts among the services (service i has 1 + i % N
    /// endpoints), comma-separated; every size runs with each (0: all alike).
    #[arg(long, value_delimiter = ',', default_value = "2,200")]
    dataplane_counts: Vec<usize>,
    /// Dataplane: the rules the node gets, comma-separated: `nft` (to-nft), `iptables`
    /// (to-iptables).
    #[arg(long, value_delimiter = ',', default_value = "nft")]
    dataplane_backends: Vec<dataplane::Rules>,
    /// Dataplane: connections timed per size and path.
    #[arg(long, default_value_t = 1000)]
    dataplane_connections: usize,
    /// API: numbers of node streams to connect to one to-api server, comma-separated (0
    /// skips the API scenario).
    #[arg(long, value_delimiter = ',', default_value = "100,1000")]
    api_streams: Vec<usize>,
    /// API: cluster size (services); endpoints per service as --churn-endpoints.
    #[arg(long, default_value_t = 1000)]
    api_services: usize,
    /// API: endpoint changes to time per stream count.
    #[arg(long, default_value_t = 20)]
    api_repeat: usize,
    /// eBPF vs nftables vs direct, a pod on the node connecting to cluster IPs: cluster
    /// sizes (services), comma-separated (0 skips it; needs clang at build time).
    #[arg(long, value_delimiter = ',', default_value = "100")]
    ebpf_services: Vec<usize>,
    /// eBPF dataplane: connections timed per size and path.
    #[arg(long, default_value_t = 600)]
    ebpf_connections: usize,
    /// One endpoint change through eBPF and nftables: cluster sizes, comma-separated (0 skips
    /// it); repetitions as --repeat (each an addition and a removal).
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    ebpf_change_services: Vec<usize>,
    /// Restart over a stale table: services in the table when kpng starts, comma-separated
    /// (0 skips the scenario).
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    restart_stale: Vec<usize>,
    /// Restart: services in the cluster kpng finds.
    #[arg(long, default_value_t = 100)]
    restart_kept: usize,
    /// Projection of the whole node state from the model: cluster sizes (services),
    /// comma-separated (0 skips it); endpoints as --endpoints.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    projection_services: Vec<usize>,
    /// Projection: repetitions per size.
    #[arg(long, default_value_t = 10)]
    projection_repeat: usize,
    /// The size of `to-nft --aggregator`'s whole-state publication: cluster sizes
    /// (services), comma-separated (0 skips it); endpoints as --endpoints.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    publication_services: Vec<usize>,
    /// Storm: real endpoint changes per second sent to the kpng binary, comma-separated (0
    /// skips the scenario; needs the kpng binary built).
    #[arg(long, value_delimiter = ',', default_value = "10,100,1000")]
    storm_rates: Vec<u64>,
    /// Storm: cluster sizes (services), comma-separated; endpoints as --endpoints.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    storm_services: Vec<usize>,
    /// Storm: seconds per rate.
    #[arg(long, default_value_t = 5)]
    storm_seconds: u64,
    /// Storm: `--min-sync-period` values to run beside the default, comma-separated (none:
    /// the default only).
    #[arg(long, value_delimiter = ',', default_value = "1s")]
    storm_min_sync_periods: Vec<String>,
    /// Idle: cluster sizes (services) kpng is left idle over with its default flags, then
    /// repairs two foreign changes, comma-separated (0 skips the scenario; needs the kpng
    /// binary built); endpoints as --endpoints.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    idle_services: Vec<usize>,
    /// Idle: seconds of idling timed per size (the default --sync-period is 30 s).
    #[arg(long, default_value_t = 65)]
    idle_seconds: u64,
    /// Idle: kpng's --sync-period, in place of its default (30s); repairs wait for it.
    #[arg(long, value_name = "DURATION")]
    idle_sync_period: Option<String>,
    /// Paths: cluster sizes (services) at which to measure the memory of kpng's split
    /// deployment (`kube to-api` and `local to-nft`) and aggregator deployment (`to-nft
    /// --aggregator` and `aggregate`) beside the one process, comma-separated (0 skips it;
    /// needs the kpng binary built); endpoints as --endpoints.
    #[arg(long, value_delimiter = ',', default_value = "1000")]
    paths_services: Vec<usize>,
    /// Aggregator: numbers of producers, comma-separated (0 skips the scenario).
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    aggregator_producers: Vec<usize>,
    /// Aggregator: updates per second of each producer, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "10")]
    aggregator_rates: Vec<u64>,
    /// Aggregator's own work: elements a producer holds, comma-separated (0 skips it).
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,100000,500000")]
    aggregator_elements: Vec<usize>,
    /// Aggregator: seconds per load and mode.
    #[arg(long, default_value_t = 5)]
    aggregator_seconds: u64,
    /// Also draw the run as an SVG bar chart into this file (log time axis: kpng against
    /// full reloads, nftlb, and the dataplane without a service).
    #[arg(long, value_name = "FILE")]
    plot: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    // The eBPF scenario's client process: `kpng-bench pod-client COUNT TARGET...`.
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("pod-client") {
        return ebpf::pod_client(&args[2..]);
    }
    let cli = Cli::parse();
    let filter = std::env::var("KPNG_LOG").unwrap_or_else(|_| "warn".into());
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_new(filter).unwrap_or_else(|_| "warn".into()),
        )
        .init();
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET)
        .map_err(|e| anyhow::anyhow!("cannot enter a new network namespace (run as root): {e}"))?;
    // The churn scenario's fake API server listens on this namespace's loopback.
    let lo = std::process::Command::new("ip").args(["link", "set", "lo", "up"]).status()?;
    anyhow::ensure!(lo.success(), "cannot bring loopback up in the bench namespace: {lo}");
    let mut nft_rows = Vec::new();
    for &services in cli.services.iter().filter(|s| **s > 0) {
        nft_rows.push(nft::run(services, cli.endpoints, cli.repeat, cli.reloads)?);
    }
    if !nft_rows.is_empty() {
        table::print_nft(&nft_rows);
    }
    let mut ipt_rows = Vec::new();
    for &services in cli.iptables_services.iter().filter(|s| **s > 0) {
        ipt_rows.push(ipt_change::run(services, cli.endpoints, cli.repeat, cli.reloads)?);
    }
    if !ipt_rows.is_empty() {
        println!();
        ipt_change::print(&ipt_rows, &nft_rows);
    }
    let mut restart_rows = Vec::new();
    for &stale in cli.restart_stale.iter().filter(|s| **s > 0) {
        restart_rows.push(restart::run(stale, cli.restart_kept, cli.endpoints)?);
    }
    if !restart_rows.is_empty() {
        println!();
        restart::print(&restart_rows);
    }
    let mut projection_rows = Vec::new();
    for &services in cli.projection_services.iter().filter(|s| **s > 0) {
        projection_rows.push(projection::run(services, cli.endpoints, cli.projection_repeat)?);
    }
    if !projection_rows.is_empty() {
        println!();
        projection::print(&projection_rows);
    }
    let mut publication_rows = Vec::new();
    for &services in cli.publication_services.iter().filter(|s| **s > 0) {
        publication_rows.push(publication::run(services, cli.endpoints)?);
    }
    if !publication_rows.is_empty() {
        println!();
        publication::print(&publication_rows);
    }
    let mut kube_rows = Vec::new();
    for &services in cli.kube_services.iter().filter(|s| **s > 0) {
        kube_rows.push(kube::run(services, cli.endpoints, cli.repeat)?);
    }
    if !kube_rows.is_empty() {
        println!();
        kube::print(&kube_rows);
    }
    let mut churn = Vec::new();
    for &services in cli.churn_services.iter().filter(|s| **s > 0) {
        for &rate in cli.churn_rates.iter().filter(|r| **r > 0) {
            let (endpoints, noop, seconds) =
                (cli.churn_endpoints, cli.churn_noop, cli.churn_seconds);
            churn.push(churn::run(services, endpoints, rate, noop, seconds)?);
        }
    }
    if !churn.is_empty() {
        println!();
        churn::print(&churn);
    }
    let sizes: Vec<usize> = cli.memory_services.iter().copied().filter(|s| *s > 0).collect();
    if !sizes.is_empty() {
        let mut rows = vec![memory::run(0, cli.churn_endpoints)?];
        for services in sizes {
            rows.push(memory::run(services, cli.churn_endpoints)?);
        }
        println!();
        memory::print(&rows);
    }
    let mut cold_rows = Vec::new();
    for &services in cli.cold_services.iter().filter(|s| **s > 0) {
        cold_rows.push(cold::run(services, cli.endpoints)?);
    }
    if !cold_rows.is_empty() {
        println!();
        cold::print(&cold_rows);
    }
    let mut storm_rows = Vec::new();
    for &services in cli.storm_services.iter().filter(|s| **s > 0) {
        for &rate in cli.storm_rates.iter().filter(|r| **r > 0) {
            let periods = std::iter::once(None)
                .chain(cli.storm_min_sync_periods.iter().filter(|p| !p.is_empty()).map(Some));
            for period in periods {
                let period = period.map(String::as_str);
                let seconds = cli.storm_seconds;
                storm_rows.push(storm::run(services, cli.endpoints, rate, seconds, period)?);
            }
        }
    }
    if !storm_rows.is_empty() {
        println!();
        storm::print(&storm_rows);
    }
    let mut paths_rows = Vec::new();
    for &services in cli.paths_services.iter().filter(|s| **s > 0) {
        paths_rows.extend(paths::run(services, cli.endpoints)?);
    }
    if !paths_rows.is_empty() {
        println!();
        paths::print(&paths_rows);
    }
    let mut idle_rows = Vec::new();
    for &services in cli.idle_services.iter().filter(|s| **s > 0) {
        let period = cli.idle_sync_period.as_deref();
        idle_rows.push(idle::run(services, cli.endpoints, cli.idle_seconds, period)?);
    }
    if !idle_rows.is_empty() {
        println!();
        idle::print(&idle_rows);
    }
    let mut nftlb_rows = Vec::new();
    for &services in cli.nftlb_services.iter().filter(|s| **s > 0) {
        nftlb_rows.push(nftlb::run(services, cli.endpoints, cli.nftlb_repeat)?);
    }
    if !nftlb_rows.is_empty() {
        println!();
        nftlb::print(&nftlb_rows);
    }
    let mut rows = Vec::new();
    for &streams in cli.api_streams.iter().filter(|s| **s > 0) {
        // Every stream its own node (a projection each), then all streams of one node (one
        // projection shared): the difference is what projections cost.
        for nodes in [streams, 1] {
            let (services, endpoints) = (cli.api_services, cli.churn_endpoints);
            rows.push(api::run(streams, nodes, services, endpoints, cli.api_repeat)?);
        }
    }
    if !rows.is_empty() {
        println!();
        api::print(&rows);
    }
    let mut change_rows = Vec::new();
    for &services in cli.ebpf_change_services.iter().filter(|s| **s > 0) {
        change_rows.push(ebpf_change::run(services, cli.endpoints, cli.repeat)?);
    }
    if !change_rows.is_empty() {
        println!();
        ebpf_change::print(&change_rows);
    }
    let mut aggregator_rows = Vec::new();
    for &producers in cli.aggregator_producers.iter().filter(|p| **p > 0) {
        for &rate in cli.aggregator_rates.iter().filter(|r| **r > 0) {
            aggregator_rows.push(aggregator::run(producers, rate, cli.aggregator_seconds)?);
        }
    }
    if !aggregator_rows.is_empty() {
        println!();
        aggregator::print(&aggregator_rows);
    }
    let mut engine_rows = Vec::new();
    for &elements in cli.aggregator_elements.iter().filter(|e| **e > 0) {
        engine_rows.push(aggregator::engine(elements, cli.repeat)?);
    }
    if !engine_rows.is_empty() {
        println!();
        aggregator::print_engine(&engine_rows);
    }
    let sizes: Vec<usize> = cli.ebpf_services.iter().copied().filter(|s| *s > 0).collect();
    if !sizes.is_empty() {
        let rows = ebpf::run(&sizes, cli.endpoints, cli.ebpf_connections)?;
        println!();
        ebpf::print(&rows);
    }
    // Last: tearing down its namespaces (large tables, many conntrack entries) keeps the
    // kernel busy for a while, which would disturb any scenario after it.
    let sizes: Vec<usize> = cli.dataplane_services.iter().copied().filter(|s| *s > 0).collect();
    let dataplane_rows = if sizes.is_empty() {
        Vec::new()
    } else {
        let (counts, connections) = (&cli.dataplane_counts, cli.dataplane_connections);
        dataplane::run(&sizes, counts, &cli.dataplane_backends, cli.endpoints, connections)?
    };
    if !dataplane_rows.is_empty() {
        println!();
        dataplane::print(&dataplane_rows);
    }
    if let Some(path) = &cli.plot {
        let sections = chart(&nft_rows, &kube_rows, &cold_rows, &dataplane_rows, &nftlb_rows);
        let title = format!(
            "kpng-bench, {} cores, Linux {} (p50 unless noted)",
            std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel_release()
        );
        std::fs::write(path, plot::svg(&title, &sections))
            .map_err(|e| anyhow::anyhow!("writing the plot to {}: {e}", path.display()))?;
    }
    Ok(())
}

/// Runs `program` with `args` and `input` on its standard input; an error with its
/// standard error when it fails.
fn feed(program: &str, args: &[&str], input: &str) -> anyhow::Result<()> {
    use anyhow::Context;
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(program)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("running {program}"))?;
    child.stdin.take().context("the child's input")?.write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    anyhow::ensure!(
        out.status.success(),
        "{program} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// The running kernel's release.
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or("?".into(), |s| s.trim().into())
}

/// The chart's sections from the run's results (scenarios not run are left out).
fn chart(
    nft: &[table::NftRow],
    kube: &[kube::KubeRow],
    cold: &[cold::ColdRow],
    dataplane: &[dataplane::DataplaneRow],
    nftlb: &[nftlb::NftlbRow],
) -> Vec<plot::Section> {
    use plot::{Bar, Section};
    let bar = |label: String, ms: f64, kpng: bool| Bar { label, ms, kpng };
    let mut sections = Vec::new();
    if !nft.is_empty() {
        let mut bars = Vec::new();
        for row in nft {
            let n = row.services;
            let p50 = row.changes.first().map_or(0.0, |c| c.wall.0);
            bars.push(bar(format!("{n} svc: kpng, model to commit"), p50, true));
            if let Some(k) = kube.iter().find(|k| k.services == n) {
                let p50 = k.changes.first().map_or(0.0, |c| c.wall.0);
                bars.push(bar(format!("{n} svc: kpng, API event to commit"), p50, true));
            }
            bars.push(bar(format!("{n} svc: nft -f whole table"), row.reload_ms, false));
            if let Some(ms) = row.iptables_ms {
                bars.push(bar(format!("{n} svc: iptables-restore nat table"), ms, false));
            }
        }
        sections
            .push(Section { title: "One endpoint added vs the whole table reloaded".into(), bars });
    }
    if !nft.is_empty() || !cold.is_empty() {
        let mut bars = Vec::new();
        for row in nft {
            let label = format!("{} svc: node state to kernel", row.services);
            bars.push(bar(label, row.cold_start_ms, true));
        }
        for row in cold {
            let label = format!("{} svc: kpng binary, kube source", row.services);
            bars.push(bar(label, row.sync_ms, true));
        }
        sections.push(Section { title: "Cold start (one run)".into(), bars });
    }
    if let Some(row) = nftlb.last() {
        let mut bars = Vec::new();
        for op in &row.ops {
            bars.push(bar(format!("nftlb: {}", op.name), op.nftlb.0, false));
            bars.push(bar(format!("kpng: {}", op.name), op.kpng.0, true));
        }
        let title = format!("nftlb's REST API vs kpng, {} services", row.services);
        sections.push(Section { title, bars });
    }
    if !dataplane.is_empty() {
        let mut bars = Vec::new();
        for row in dataplane {
            let n = row.services;
            let rules = row.rules.name();
            bars.push(bar(
                format!("{n} svc, {rules}: connect to a cluster IP"),
                row.service.0,
                true,
            ));
            bars.push(bar(format!("{n} svc: connect to the pod"), row.direct.0, false));
        }
        sections.push(Section { title: "First packet: TCP connect from a client".into(), bars });
    }
    sections
}
