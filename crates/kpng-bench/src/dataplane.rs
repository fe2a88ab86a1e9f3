//! The dataplane scenario: first-packet latency through kpng's rules.
//!
//! The testkit's namespace cluster (a client, the node kpng programs, a remote node, pods)
//! gets a generated cluster of N services loaded into the node's rules (`to-nft` or
//! `to-iptables`); a few services
//! spread over the table are pointed at real pods (two on the node, one on the remote node).
//! From the client, TCP connections to those services' cluster IPs are timed from `connect`
//! to the established socket (SYN, NAT lookup, SYN-ACK): each connection's first packet
//! misses conntrack and walks kpng's rules. The same number of connections straight to the
//! pods' addresses gives the path without any service lookup. Sizes are measured in
//! interleaved rounds, each loading its table afresh.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_iptables::{CommandKernel, IptablesBackend, IptablesOptions, Mode};
use kpng_local::NodeProjector;
use kpng_model::global::Endpoint;
use kpng_model::{Changes, GlobalModel, Object};
use kpng_nft::{NetlinkKernel, NftBackend, NftOptions};
use kpng_runner::{Backend, ChangeSet};
use kpng_testkit::generate::{ClusterSpec, service_ip};
use kpng_testkit::topology::{Cluster, in_netns};

use crate::cluster;
use crate::table::percentiles;

/// Services pointed at real pods, spread over the table.
const PROBED: usize = 8;
/// The pods' port (the generated slices' target port).
pub(crate) const POD_PORT: u16 = 8080;

/// The rules a size is loaded as.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Rules {
    /// `to-nft`.
    Nft,
    /// `to-iptables`.
    Iptables,
}

impl Rules {
    /// The name in tables.
    pub fn name(self) -> &'static str {
        match self {
            Rules::Nft => "to-nft",
            Rules::Iptables => "to-iptables",
        }
    }
}

/// One size's results.
pub struct DataplaneRow {
    /// The rules.
    pub rules: Rules,
    /// Services in the node's table.
    pub services: usize,
    /// Distinct endpoint counts among the services (0: every service has the same count).
    pub counts: usize,
    /// Connections timed per path.
    pub connections: usize,
    /// To a cluster IP: p50, p99, max (ms).
    pub service: (f64, f64, f64),
    /// Straight to a pod: p50, p99, max (ms).
    pub direct: (f64, f64, f64),
}

/// Rounds per run: every size is measured in each round, so drift in the machine's state
/// (caches, conntrack entries, other load) falls on all sizes alike.
const ROUNDS: usize = 5;

/// A size's node state and probe targets.
pub(crate) struct Size {
    pub(crate) services: usize,
    pub(crate) counts: usize,
    pub(crate) state: kpng_model::LocalState,
    pub(crate) targets: Vec<SocketAddr>,
}

/// The node state for `services` generated services, a few of them pointed at `pods`.
/// With `counts` > 0, service `i` gets `1 + i % counts` endpoints instead, so the table
/// holds that many distinct endpoint counts.
pub(crate) fn size(
    services: usize,
    endpoints: usize,
    counts: usize,
    pods: &[(IpAddr, &'static str)],
) -> anyhow::Result<Size> {
    anyhow::ensure!(services >= PROBED, "the dataplane scenario needs at least {PROBED} services");
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let mut model = GlobalModel::new();
    for object in cluster::objects(&spec)? {
        model.apply(object);
    }
    let probed: Vec<usize> = (0..PROBED).map(|k| k * services / PROBED).collect();
    if counts > 0 {
        for i in (0..services).filter(|i| !probed.contains(i)) {
            let mut slice = cluster::slice_of(&model, i);
            slice.endpoints =
                (0..1 + i % counts).map(|j| cluster::extra_endpoint(j, "node-1")).collect();
            model.apply(Object::EndpointSlice(slice));
        }
    }
    for &i in &probed {
        let mut slice = cluster::slice_of(&model, i);
        slice.endpoints = pods
            .iter()
            .map(|(ip, node)| Endpoint { address: *ip, ..cluster::extra_endpoint(0, node) })
            .collect();
        model.apply(Object::EndpointSlice(slice));
    }
    let mut projector = NodeProjector::new("node-0");
    projector.update(&model, &Changes::All);
    let targets = probed
        .iter()
        .map(|&i| format!("{}:80", service_ip(i)).parse())
        .collect::<Result<_, _>>()?;
    Ok(Size { services, counts, state: projector.state().clone(), targets })
}

/// Replaces the node's tables with `state`. The backend's socket (and the `nft` it runs
/// for the skeleton) must be created inside the node's namespace.
pub(crate) fn load(net: &Cluster, state: &kpng_model::LocalState) -> anyhow::Result<()> {
    load_as(net, state, Rules::Nft)
}

/// Replaces the node's rules with `state` as `rules`, removing the other kinds first. The
/// commands and sockets are made inside the node's namespace.
fn load_as(net: &Cluster, state: &kpng_model::LocalState, rules: Rules) -> anyhow::Result<()> {
    let state = state.clone();
    in_netns(&net.node, move || -> Result<(), String> {
        clear().map_err(|e| e.to_string())?;
        match rules {
            Rules::Nft => {
                let kernel = NetlinkKernel::open().map_err(|e| e.to_string())?;
                let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel));
                backend.apply(&ChangeSet::full(&state)).map_err(|e| e.to_string())
            }
            Rules::Iptables => {
                let kernel = CommandKernel::new(Mode::Auto).map_err(|e| e.to_string())?;
                let mut backend =
                    IptablesBackend::new(IptablesOptions::default(), Box::new(kernel));
                backend.apply(&ChangeSet::full(&state)).map_err(|e| e.to_string())
            }
        }
    })
    .map_err(|e| anyhow::anyhow!("loading the node's rules as {}: {e}", rules.name()))
}

/// Runs `iptables-restore` (the whole nat table) with `text`.
fn restore_nat(text: &str) -> Result<(), String> {
    restore_with("iptables-restore", text)
}

/// Runs `command` (an `iptables-restore`, tables replaced whole) with `text`.
fn restore_with(command: &str, text: &str) -> Result<(), String> {
    use std::io::Write;
    let mut child = std::process::Command::new(command)
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("iptables-restore: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin.write_all(text.as_bytes()).map_err(|e| format!("iptables-restore: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("iptables-restore: {e}"))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!("iptables-restore: {}", String::from_utf8_lossy(&out.stderr))),
    }
}

/// Removes every kind of rules from the current namespace: kpng's nftables tables, and the
/// nat and filter tables of iptables and ip6tables replaced by empty ones (reading kpng's
/// chains back first, as `kpng cleanup` does, takes minutes at 30k services).
pub(crate) fn clear() -> anyhow::Result<()> {
    kpng_nft::kernel::cleanup()?;
    let empty = "*nat\nCOMMIT\n*filter\nCOMMIT\n";
    restore_nat(empty).map_err(anyhow::Error::msg)?;
    restore_with("ip6tables-restore", empty).map_err(anyhow::Error::msg)
}

/// For each of `sizes` (services in the node's table) and each of `counts` (distinct
/// endpoint counts, 0: uniform), times `connections` connections from the client to cluster
/// IPs and as many to the pods, over interleaved rounds.
pub fn run(
    sizes: &[usize],
    counts: &[usize],
    backends: &[Rules],
    endpoints: usize,
    connections: usize,
) -> anyhow::Result<Vec<DataplaneRow>> {
    let mut net = Cluster::new();
    let pods: Vec<(IpAddr, &'static str)> =
        [("pod-a", true, 10), ("pod-b", true, 11), ("pod-c", false, 10)]
            .into_iter()
            .map(|(name, local, n)| {
                let pod = net.add_pod(name, local, n, &[POD_PORT]);
                (pod.ipv4, if local { "node-0" } else { "node-1" })
            })
            .collect();
    // The client reaches pods directly too, for the path without a service.
    net.client.ip(&["route", "add", "10.244.0.0/16", "via", "192.168.10.1"]);
    let direct: Vec<SocketAddr> =
        pods.iter().map(|(ip, _)| SocketAddr::new(*ip, POD_PORT)).collect();
    let counts = if counts.is_empty() { &[0][..] } else { counts };
    let sizes: Vec<Size> = sizes
        .iter()
        .flat_map(|&n| counts.iter().map(move |&k| (n, k)))
        .map(|(n, k)| size(n, endpoints, k, &pods))
        .collect::<Result<_, _>>()?;
    let per_round = connections.div_ceil(ROUNDS);
    let backends = if backends.is_empty() { &[Rules::Nft][..] } else { backends };
    let runs: Vec<(Rules, &Size)> =
        backends.iter().flat_map(|b| sizes.iter().map(move |s| (*b, s))).collect();
    let mut samples: Vec<(Vec<Duration>, Vec<Duration>)> = vec![Default::default(); runs.len()];
    for _ in 0..ROUNDS {
        for ((rules, size), (service, pod)) in runs.iter().zip(&mut samples) {
            load_as(&net, &size.state, *rules)?;
            let targets = size.targets.clone();
            service.extend(
                in_netns(&net.client, move || time_connects(&targets, per_round))
                    .context("connections to cluster IPs")?,
            );
            let direct = direct.clone();
            pod.extend(
                in_netns(&net.client, move || time_connects(&direct, per_round))
                    .context("connections to the pods")?,
            );
        }
    }
    // Leave the namespaces light to tear down.
    in_netns(&net.node, || clear().map_err(|e| e.to_string()))
        .map_err(|e| anyhow::anyhow!("removing the node's tables: {e}"))?;
    Ok(runs
        .iter()
        .zip(samples)
        .map(|((rules, size), (mut service, mut pod))| DataplaneRow {
            rules: *rules,
            services: size.services,
            counts: size.counts,
            connections: service.len(),
            service: percentiles(&mut service),
            direct: percentiles(&mut pod),
        })
        .collect())
}

/// Connects `count` times, cycling over `targets`; every connection must reach a pod (its
/// answer is read, untimed). Returns the times to connect.
fn time_connects(targets: &[SocketAddr], count: usize) -> anyhow::Result<Vec<Duration>> {
    // Warm up neighbour tables and routes first.
    for target in targets {
        answer(target, TcpStream::connect_timeout(target, Duration::from_secs(2))?)?;
    }
    let mut samples = Vec::with_capacity(count);
    for n in 0..count {
        let target = &targets[n % targets.len()];
        let start = Instant::now();
        let stream = TcpStream::connect_timeout(target, Duration::from_secs(2))
            .with_context(|| format!("connecting to {target}"))?;
        samples.push(start.elapsed());
        answer(target, stream)?;
    }
    Ok(samples)
}

/// Reads the pod's greeting: the connection reached a pod, not something else.
fn answer(target: &SocketAddr, mut stream: TcpStream) -> anyhow::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf).with_context(|| format!("reading from {target}"))?;
    anyhow::ensure!(
        buf[..n].starts_with(b"pod-"),
        "{target} answered {:?}, not a pod",
        String::from_utf8_lossy(&buf[..n])
    );
    Ok(())
}

/// Prints the dataplane table, with each size's p50 and p99 against the first size's of
/// the same rules.
pub fn print(rows: &[DataplaneRow]) {
    println!(
        "dataplane: TCP connect from a client namespace, first packet through the node's rules"
    );
    println!(
        "{:<11} {:>8} {:>6} {:>6} | {:>8} {:>8} {:>8} | {:>10} {:>10} | {:>9} {:>9}",
        "rules",
        "services",
        "counts",
        "conns",
        "p50(ms)",
        "p99(ms)",
        "max(ms)",
        "pod p50",
        "pod p99",
        "p50/first",
        "p99/first"
    );
    for row in rows {
        let first = rows.iter().find(|r| r.rules == row.rules).map(|r| r.service);
        let (p50, p99, max) = row.service;
        let ratio = |now: f64, then: f64| if then > 0.0 { now / then } else { 0.0 };
        let (f50, f99) = first.map_or((0.0, 0.0), |f| (f.0, f.1));
        println!(
            "{:<11} {:>8} {:>6} {:>6} | {:>8.3} {:>8.3} {:>8.3} | {:>10.3} {:>10.3} | {:>9.2} {:>9.2}",
            row.rules.name(),
            row.services,
            if row.counts == 0 { "1".to_string() } else { row.counts.to_string() },
            row.connections,
            p50,
            p99,
            max,
            row.direct.0,
            row.direct.1,
            ratio(p50, f50),
            ratio(p99, f99)
        );
    }
    println!(
        "* to {PROBED} cluster IPs spread over the table (3 pods behind each); counts: distinct endpoint counts among the other services; pod: the same connections straight to the pods"
    );
}
