//! The paths scenario: the memory of kpng's deployments other than one process, at one
//! cluster size, beside the one process (`kpng kube to-local to-nft`):
//! - split: `kpng kube to-api`, the cluster's watcher serving the node states over gRPC, and
//!   `kpng local to-nft`, the node's backend fed by it (no global model on the node);
//! - aggregator: `kpng kube to-local to-nft --aggregator`, which publishes its tables, and
//!   `kpng aggregate`, the process that holds every producer's publication and commits it.
//!
//! Each process's resident set and peak (VmHWM) is read once the node's kpng is ready (its
//! first sync committed), after half a second to settle.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use kpng_testkit::generate::{ClusterSpec, generate};

use crate::memory::status_kib;
use crate::storm::{Killed, wait_ready};

/// One process of one deployment.
pub struct PathRow {
    /// Services in the cluster.
    pub services: usize,
    /// The deployment.
    pub path: &'static str,
    /// The process.
    pub process: &'static str,
    /// Resident set once the node is synced (KiB).
    pub rss_kib: u64,
    /// Peak resident set up to then (KiB).
    pub peak_kib: u64,
}

/// Flags that keep a second kpng process off the first one's health and metrics ports.
const QUIET: [&str; 4] =
    ["--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0"];

/// Runs the three deployments over `services` × `endpoints`.
pub fn run(services: usize, endpoints: usize) -> anyhow::Result<Vec<PathRow>> {
    let binary = crate::memory::kpng_binary()?;
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let (_runtime, server) = crate::memory::serve(generate(&spec))?;
    let url = server.url();
    let dir = tempfile::tempdir().context("a directory for the sockets")?;
    let socket = |name: &str| format!("unix://{}", dir.path().join(name).display());
    let mut rows = Vec::new();
    let mut row = |path, process, child: &Killed| -> anyhow::Result<()> {
        let pid = child.0.id();
        rows.push(PathRow {
            services,
            path,
            process,
            rss_kib: status_kib(pid, "VmRSS:").context("no VmRSS")?,
            peak_kib: status_kib(pid, "VmHWM:").context("no VmHWM")?,
        });
        Ok(())
    };

    crate::memory::clean_tables(&binary, "the paths scenario")?;
    let node =
        start_node(&binary, &["kube", "--server", &url, "to-local", "--node", "node-0"], &[])?;
    settle();
    row("one process", "kpng kube to-local to-nft", &node)?;
    drop(node);

    crate::memory::clean_tables(&binary, "the split deployment")?;
    let api = socket("api.sock");
    let kube = ["kube", "--all-nodes", "--server", &url, "to-api", "--listen", &api];
    let watcher = spawn(&binary, &QUIET, &kube)?;
    let node = start_node(&binary, &["local", "--server", &api, "--node", "node-0"], &[])?;
    settle();
    row("split", "kpng kube to-api", &watcher)?;
    row("split", "kpng local to-nft", &node)?;
    drop((node, watcher));

    crate::memory::clean_tables(&binary, "the aggregator deployment")?;
    let aggregator = socket("aggregator.sock");
    let owner = spawn(&binary, &QUIET, &["aggregate", "--listen", &aggregator])?;
    let kube = ["kube", "--server", &url, "to-local", "--node", "node-0"];
    let node = start_node(&binary, &kube, &["--aggregator", &aggregator])?;
    settle();
    row("aggregator", "kpng kube to-local to-nft --aggregator", &node)?;
    row("aggregator", "kpng aggregate", &owner)?;
    drop((node, owner));
    crate::memory::clean_tables(&binary, "the next scenario")?;
    drop(server);
    Ok(rows)
}

/// Lets allocations from the first sync settle.
fn settle() {
    std::thread::sleep(Duration::from_millis(500));
}

/// Starts `kpng FLAGS ARGS` in the background.
fn spawn(binary: &Path, flags: &[&str], args: &[&str]) -> anyhow::Result<Killed> {
    let child = Command::new(binary)
        .args(flags)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    Ok(Killed(child))
}

/// Starts the node's kpng, `kpng ARGS to-nft TO_NFT`, and waits until it is ready.
fn start_node(binary: &Path, args: &[&str], to_nft: &[&str]) -> anyhow::Result<Killed> {
    let mut all = args.to_vec();
    all.push("to-nft");
    all.extend(to_nft);
    let mut node = spawn(binary, &[], &all)?;
    wait_ready(&mut node.0).with_context(|| format!("kpng {}", all.join(" ")))?;
    Ok(node)
}

/// Prints the paths table.
pub fn print(rows: &[PathRow]) {
    println!("paths: kpng's deployments, each process once the node's first sync is committed");
    println!(
        "{:>8} {:>11} {:>40} | {:>10} {:>15}",
        "services", "deployment", "process", "rss(KiB)", "peak rss(KiB)"
    );
    for r in rows {
        println!(
            "{:>8} {:>11} {:>40} | {:>10} {:>15}",
            r.services,
            r.path.replace(' ', "-"),
            r.process.replace(' ', "_"),
            r.rss_kib,
            r.peak_kib
        );
    }
    println!(
        "* split: the node's kpng holds no global model; aggregator: `kpng aggregate` holds to-nft's publication"
    );
}
