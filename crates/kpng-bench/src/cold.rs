//! The cold-start scenario with the whole pipeline: the real `kpng` binary (`kube` source
//! against the fake API server, `to-local ... to-nft`) from process start to its first
//! committed sync (the moment its log says its first plan is committed: the whole node
//! state, in one transaction or, over large empty tables, in several), with its peak
//! resident set until then and its resident set once the sync has settled, over empty
//! kpng tables.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::memory::status_kib;
use kpng_testkit::generate::{ClusterSpec, generate};

/// One cold start.
pub struct ColdRow {
    /// Services in the cluster.
    pub services: usize,
    /// Endpoints per service.
    pub endpoints: usize,
    /// Process start to the first committed sync (ms).
    pub sync_ms: f64,
    /// The API server's own serving time: a plain client listing every kind kpng lists,
    /// in kpng's pages, all kinds at once, reading each page through (ms).
    pub api_ms: f64,
    /// Peak resident set of the kpng process up to the sync and a second after (KiB).
    pub peak_kib: u64,
    /// Resident set a second after the sync (KiB).
    pub rss_kib: u64,
}

/// Runs kpng once over a fresh table for a generated cluster of `services` × `endpoints`.
pub fn run(services: usize, endpoints: usize) -> anyhow::Result<ColdRow> {
    let binary = crate::memory::kpng_binary()?;
    crate::memory::clean_tables(&binary, "the cold start")?;
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let (_runtime, server) = crate::memory::serve(generate(&spec))?;
    let url = server.url();
    let api_ms = api_serving_ms(&url)?;
    let start = Instant::now();
    let child = Command::new(&binary)
        .args(["kube", "--server", url.as_str(), "--kube-api-qps", "0"])
        .args(["to-local", "--node", "node-0", "to-nft"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    // The process's own high-water mark, read until it exits (the children's rusage
    // would count the bench's memory, shared by the child between fork and exec).
    let (mut child, mut peak_kib) = (child, 0);
    // Drained as it comes (a full pipe would stop kpng at its next log line); the last
    // lines explain a failure.
    let (committed_tx, committed) = std::sync::mpsc::channel();
    let log = child.stderr.take().map(|stderr| {
        std::thread::spawn(move || {
            use std::io::BufRead;
            let mut last = std::collections::VecDeque::new();
            for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
                // kpng starts with a reset: its first commit is the whole node state.
                if line.contains("nftables transaction committed") {
                    let _ = committed_tx.send(Instant::now());
                }
                if last.len() == 20 {
                    last.pop_front();
                }
                last.push_back(line);
            }
            Vec::from(last).join("\n")
        })
    });
    // Until a second after the commit: what a running kpng keeps is read then.
    let mut synced = None;
    let mut rss_kib = None;
    let exited = loop {
        if let Some(status) = child.try_wait()? {
            break Some(status);
        }
        peak_kib = peak_kib.max(vm_hwm_kib(child.id()).unwrap_or(0));
        if synced.is_none() {
            synced = committed.try_recv().ok();
        }
        if synced.is_some_and(|at: Instant| at.elapsed() >= SETTLE) {
            rss_kib = status_kib(child.id(), "VmRSS:");
            break None;
        }
        anyhow::ensure!(
            start.elapsed() < Duration::from_secs(120),
            "kpng did not sync in two minutes"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    let _ = child.kill();
    let _ = child.wait();
    drop(server);
    let log = log.and_then(|thread| thread.join().ok()).unwrap_or_default();
    if let Some(status) = exited {
        anyhow::bail!("kpng exited before its first sync had settled: {status}\n{log}");
    }
    let synced = synced.context("kpng did not log a commit")?;
    let rss_kib = rss_kib.context("no VmRSS for the kpng process")?;
    let sync_ms = synced.duration_since(start).as_secs_f64() * 1000.0;
    Ok(ColdRow { services, endpoints, sync_ms, api_ms, peak_kib, rss_kib })
}

/// The collections kpng's kube source lists.
const LISTED: [&str; 4] = [
    "/api/v1/nodes",
    "/apis/networking.k8s.io/v1/servicecidrs",
    "/api/v1/services",
    "/apis/discovery.k8s.io/v1/endpointslices",
];

/// How long the API server at `url` takes to serve every collection kpng lists, in pages
/// of [`kpng_sources::kube::PAGE_SIZE`], to a client that reads each page and only the
/// token of the next (the collections at once, as kpng lists them).
fn api_serving_ms(url: &str) -> anyhow::Result<f64> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let client = kube::Client::try_from(kube::Config::new(url.parse()?))?;
        let start = Instant::now();
        let mut lists = tokio::task::JoinSet::new();
        for path in LISTED {
            lists.spawn(list_through(client.clone(), path));
        }
        while let Some(listed) = lists.join_next().await {
            listed??;
        }
        Ok(start.elapsed().as_secs_f64() * 1000.0)
    })
}

/// Reads every page of the collection at `path`.
async fn list_through(client: kube::Client, path: &'static str) -> anyhow::Result<()> {
    #[derive(serde::Deserialize)]
    struct Page {
        metadata: Meta,
    }
    #[derive(serde::Deserialize)]
    struct Meta {
        #[serde(rename = "continue", default)]
        token: Option<String>,
    }
    let mut token: Option<String> = None;
    loop {
        let mut query = format!("{path}?limit={}", kpng_sources::kube::PAGE_SIZE);
        if let Some(token) = token.as_deref().filter(|t| !t.is_empty()) {
            query.push_str("&continue=");
            for byte in token.bytes() {
                match byte.is_ascii_alphanumeric() {
                    true => query.push(byte as char),
                    false => query.push_str(&format!("%{byte:02X}")),
                }
            }
        }
        let request = http::Request::get(&query).body(Vec::new())?;
        let body = client.request_text(request).await.with_context(|| format!("GET {query}"))?;
        let page: Page =
            serde_json::from_str(&body).with_context(|| format!("{query}: not a list"))?;
        token = page.metadata.token.filter(|t| !t.is_empty());
        if token.is_none() {
            return Ok(());
        }
    }
}

/// How long after its first commit kpng's resident set is read.
const SETTLE: Duration = Duration::from_secs(1);

/// The high-water mark of a process's resident set (KiB).
fn vm_hwm_kib(pid: u32) -> Option<u64> {
    status_kib(pid, "VmHWM:")
}

/// Prints the cold-start table.
pub fn print(rows: &[ColdRow]) {
    println!("cold start: kpng kube --server <fake> to-local --node node-0 to-nft, empty tables");
    println!(
        "{:>8} {:>4} | {:>12} {:>12} {:>14} {:>15} {:>15}",
        "services",
        "eps",
        "to-sync(ms)",
        "api lists",
        "above api(ms)",
        "peak rss(MiB)",
        "synced rss(MiB)"
    );
    for r in rows {
        println!(
            "{:>8} {:>4} | {:>12.1} {:>12.1} {:>14.1} {:>15.1} {:>15.1}",
            r.services,
            r.endpoints,
            r.sync_ms,
            r.api_ms,
            r.sync_ms - r.api_ms,
            r.peak_kib as f64 / 1024.0,
            r.rss_kib as f64 / 1024.0
        );
    }
    println!(
        "* peak rss: the kpng process's VmHWM, read every 2 ms; synced rss: its VmRSS a \
         second after the first commit; api lists: the fake API server serving every list \
         kpng makes (its pages, all kinds at once) to a client that reads them through, \
         before kpng starts"
    );
}
