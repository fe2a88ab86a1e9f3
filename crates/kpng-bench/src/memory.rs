//! The memory scenario: the resident set of the real `kpng` binary (kube source, store,
//! node projection, the JSON backend) once it has synced a generated cluster served by the
//! fake API server, against the same binary synced to an empty cluster.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use kpng_testkit::apiserver::FakeApiServer;
use kpng_testkit::generate::{ClusterSpec, generate};

/// One memory measurement.
pub struct MemoryRow {
    /// Services in the cluster.
    pub services: usize,
    /// Endpoints in the cluster.
    pub endpoints: usize,
    /// Resident set after the first sync, in KiB.
    pub rss_kib: u64,
    /// Peak resident set (VmHWM) up to then, in KiB.
    pub peak_kib: u64,
}

/// The `kpng` binary next to this one.
pub fn kpng_binary() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name("kpng");
    anyhow::ensure!(
        path.exists(),
        "the memory scenario runs the kpng binary, not found at {}: build it with \
         `cargo build --release -p kpng -p kpng-bench`, or pass --memory-services 0",
        path.display()
    );
    Ok(path)
}

/// Runs `kpng cleanup`: the scenario `what` starts over empty tables.
pub(crate) fn clean_tables(binary: &std::path::Path, what: &str) -> anyhow::Result<()> {
    let cleanup = Command::new(binary).arg("cleanup").stderr(Stdio::null()).status()?;
    anyhow::ensure!(cleanup.success(), "kpng cleanup failed before {what}");
    Ok(())
}

/// The fake API server serving `objects`, and the runtime it runs on (drop the server
/// before the runtime).
pub(crate) fn serve(
    objects: Vec<serde_json::Value>,
) -> anyhow::Result<(tokio::runtime::Runtime, FakeApiServer)> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    let server = runtime.block_on(FakeApiServer::start(Duration::from_secs(60)))?;
    for object in objects {
        server.apply(object);
    }
    Ok((runtime, server))
}

fn rss_kib(pid: u32) -> anyhow::Result<u64> {
    status_kib(pid, "VmRSS:").context("no VmRSS in /proc/PID/status")
}

/// Runs kpng against a fake cluster of `services` × `endpoints` (0 services: the baseline).
pub fn run(services: usize, endpoints: usize) -> anyhow::Result<MemoryRow> {
    let binary = kpng_binary()?;
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let (_runtime, server) = serve(generate(&spec))?;
    let url = server.url();
    let mut child = Command::new(&binary)
        .args(["kube", "--server", url.as_str(), "to-local", "--node", "node-0", "to-json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let pid = child.id();
    let stdout = child.stdout.take().context("no stdout")?;
    let mut synced = false;
    let mut endpoint_ops = 0;
    for line in BufReader::new(stdout).lines() {
        let line = line?;
        if line.contains("\"endpoint\"") {
            endpoint_ops += 1;
        }
        if line == "{\"op\":\"sync\"}" {
            synced = true;
            break;
        }
    }
    // Let allocations from the initial load settle.
    std::thread::sleep(Duration::from_millis(500));
    let rss = rss_kib(pid);
    let peak = status_kib(pid, "VmHWM:").context("no VmHWM in /proc/PID/status");
    let _ = child.kill();
    let _ = child.wait();
    drop(server);
    anyhow::ensure!(synced, "kpng exited before its first sync");
    Ok(MemoryRow { services, endpoints: endpoint_ops, rss_kib: rss?, peak_kib: peak? })
}

/// Prints the memory table: each row against the first (the empty cluster).
pub fn print(rows: &[MemoryRow]) {
    println!(
        "memory: kpng kube --server <fake> to-local --node node-0 to-json, after the first sync"
    );
    println!(
        "{:>8} {:>15} | {:>10} {:>17} {:>15}",
        "services", "node endpoints", "rss(KiB)", "above empty(KiB)", "peak rss(KiB)"
    );
    let base = rows.first().map_or(0, |r| r.rss_kib);
    for r in rows {
        println!(
            "{:>8} {:>15} | {:>10} {:>17} {:>15}",
            r.services,
            r.endpoints,
            r.rss_kib,
            r.rss_kib as i64 - base as i64,
            r.peak_kib
        );
    }
    println!("* peak rss: the process's VmHWM when its resident set is read");
}

/// A `/proc/PID/status` field in KiB (`VmRSS:`, `VmHWM:`).
pub(crate) fn status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
