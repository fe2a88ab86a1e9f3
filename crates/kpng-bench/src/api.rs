//! The API scenario: one `to-api` server and N node streams (each its own connection, as N
//! backend processes would have), in this process. Measures the time until every node has
//! received its first state, the time from one endpoint change in the store until every
//! node has received it, the memory each connected node costs, and what decoding a state
//! costs one client.
//!
//! # Layout
//! - `raw`: the streams' clients, which count items rather than decode them.

use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_api::client::{LocalWatch, connect};
use kpng_api::{Address, Security};
use kpng_model::{Kind, Object};
use kpng_store::{SourceEvent, store};
use kpng_testkit::generate::ClusterSpec;
use raw::RawWatch;
use tokio::sync::mpsc;

use crate::cluster;
use crate::table::percentiles;

mod raw;

/// One row of the API table.
pub struct ApiRow {
    /// Connected node streams.
    pub streams: usize,
    /// Distinct nodes among them (each has its own projection).
    pub nodes: usize,
    /// Services in the cluster.
    pub services: usize,
    /// From the first connection to every node holding its whole state.
    pub connect_ms: f64,
    /// One endpoint change until every node received it: p50, p99, max (ms).
    pub change_ms: (f64, f64, f64),
    /// The same, until the first node received it (p50, ms).
    pub first_ms: f64,
    /// CPU time of the process (server and clients) per stream and change (µs): what the
    /// latencies cost, whatever else the machine runs.
    pub cpu_us: f64,
    /// Resident memory per connected node (server and client ends, KiB): at most this
    /// much is the server's per node.
    pub kib_per_stream: f64,
    /// One client that decodes its state into ops, alone: connection to whole state (ms).
    pub decoded_ms: f64,
}

fn rss_kib() -> u64 {
    crate::memory::status_kib(std::process::id(), "VmRSS:").unwrap_or(0)
}

/// The CPU time this process has used so far (user and system).
fn cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let Ok(usage) = getrusage(UsageWho::RUSAGE_SELF) else { return Duration::ZERO };
    let micros = |t: nix::sys::time::TimeVal| t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64;
    Duration::from_micros(micros(usage.user_time()) + micros(usage.system_time()))
}

/// Lets this process open a socket pair per stream.
fn raise_file_limit(streams: usize) -> anyhow::Result<()> {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    let wanted = (streams as u64 * 3 + 256).min(hard);
    if soft < wanted {
        setrlimit(Resource::RLIMIT_NOFILE, wanted, hard)?;
    }
    anyhow::ensure!(
        wanted >= streams as u64 * 2 + 64,
        "{streams} streams need {} open files; the hard limit is {hard}",
        streams * 2 + 64
    );
    Ok(())
}

/// Runs the scenario with `streams` streams of `nodes` distinct nodes (round robin) over
/// `services` services × `endpoints`, timing `repeat` endpoint changes.
pub fn run(
    streams: usize,
    nodes: usize,
    services: usize,
    endpoints: usize,
    repeat: usize,
) -> anyhow::Result<ApiRow> {
    raise_file_limit(streams)?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let nodes = nodes.clamp(1, streams.max(1));
    // On a worker, like the clients: the reports that the scenario waits for are then
    // handed over within the runtime, not to a thread woken for each.
    let scenario = runtime.spawn(scenario(streams, nodes, services, endpoints, repeat));
    runtime.block_on(scenario)?
}

async fn scenario(
    streams: usize,
    nodes: usize,
    services: usize,
    endpoints: usize,
    repeat: usize,
) -> anyhow::Result<ApiRow> {
    let spec = ClusterSpec { services, endpoints, nodes, zones: 3 };
    let objects = cluster::objects(&spec)?;
    let mut slice = objects
        .iter()
        .find_map(|o| match o {
            Object::EndpointSlice(s) if s.key.name.ends_with("-v4") => Some(s.clone()),
            _ => None,
        })
        .context("no IPv4 slice generated")?;
    let (mut writer, reader) = store(&Kind::ALL);
    writer.apply(SourceEvent::relist(&Kind::ALL, objects));

    let dir = tempfile::tempdir()?;
    let address = Address::Unix(dir.path().join("kpng.sock"));
    let hub = kpng_server::Hub::new(reader);
    let served = address.clone();
    // Every stream its own connection: room for all of them, and no client dropped while
    // the bench process is busy with the others.
    let options = kpng_server::ServeOptions {
        max_clients: streams + 64,
        client_timeout: Duration::from_secs(600),
    };
    let server = tokio::spawn(async move {
        kpng_server::serve(hub, &served, &Security::default(), options, std::future::pending())
            .await
    });
    let Address::Unix(path) = &address else { unreachable!() };
    let start = Instant::now();
    while !path.exists() {
        anyhow::ensure!(start.elapsed() < Duration::from_secs(10), "the server did not start");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let base_rss = rss_kib();

    // Each client reports (its index, when) after each change set.
    let (report, mut reports) = mpsc::unbounded_channel::<(usize, Instant)>();
    let start = Instant::now();
    for i in 0..streams {
        let (address, report) = (address.clone(), report.clone());
        tokio::spawn(async move {
            let channel = connect(&address, &Security::default()).await?;
            let mut watch = RawWatch::start(channel, &format!("node-{}", i % nodes)).await?;
            while watch.next().await?.is_some() {
                if report.send((i, Instant::now())).is_err() {
                    break;
                }
            }
            anyhow::Ok(())
        });
    }
    let wait_all = async |reports: &mut mpsc::UnboundedReceiver<(usize, Instant)>| {
        let mut first: Option<Instant> = None;
        let mut last = Instant::now();
        for _ in 0..streams {
            let (_, at) = tokio::time::timeout(Duration::from_secs(120), reports.recv())
                .await
                .context("a node stream did not deliver within 120 s")?
                .context("node streams ended")?;
            first.get_or_insert(at);
            last = at;
        }
        anyhow::Ok((first.unwrap_or(last), last))
    };
    wait_all(&mut reports).await?;
    let connect_ms = start.elapsed().as_secs_f64() * 1000.0;
    let kib_per_stream = rss_kib().saturating_sub(base_rss) as f64 / streams.max(1) as f64;

    let (mut all, mut first) = (Vec::new(), Vec::new());
    let cpu_before = cpu_time();
    for r in 0..repeat {
        if r % 2 == 0 {
            cluster::push_endpoint(&mut slice, cluster::extra_endpoint(r, "node-0"));
        } else {
            cluster::pop_endpoint(&mut slice);
        }
        let changed = Instant::now();
        writer.apply(vec![SourceEvent::Applied(Object::EndpointSlice(slice.clone()))]);
        let (f, last) = wait_all(&mut reports).await?;
        all.push(last - changed);
        first.push(f - changed);
    }
    let changes = (repeat * streams).max(1) as f64;
    let cpu_us = (cpu_time() - cpu_before).as_secs_f64() * 1e6 / changes;
    // What the streams' clients skip: decoding a whole state, for one client alone.
    let started = Instant::now();
    let channel = connect(&address, &Security::default()).await?;
    let mut decoding = LocalWatch::start(channel, "node-0", true).await?;
    decoding.next().await?.context("the decoding client's stream ended")?;
    let decoded_ms = started.elapsed().as_secs_f64() * 1000.0;
    server.abort();
    let (first_ms, _, _) = percentiles(&mut first);
    Ok(ApiRow {
        streams,
        nodes,
        services,
        connect_ms,
        change_ms: percentiles(&mut all),
        first_ms,
        cpu_us,
        kib_per_stream,
        decoded_ms,
    })
}

/// Prints the API table.
pub fn print(rows: &[ApiRow]) {
    println!(
        "api: N node streams (one connection each) on one to-api; one endpoint change reaches every node"
    );
    println!(
        "{:>8} {:>6} {:>9} | {:>12} | {:>10} {:>10} {:>10} {:>11} | {:>11} | {:>11} | {:>12}",
        "streams",
        "nodes",
        "services",
        "connect(ms)",
        "all p50",
        "all p99",
        "all max",
        "first p50",
        "cpu/chg(us)",
        "KiB/stream",
        "decoded(ms)"
    );
    for r in rows {
        println!(
            "{:>8} {:>6} {:>9} | {:>12.1} | {:>10.2} {:>10.2} {:>10.2} {:>11.2} | {:>11.1} | {:>11.1} | {:>12.1}",
            r.streams,
            r.nodes,
            r.services,
            r.connect_ms,
            r.change_ms.0,
            r.change_ms.1,
            r.change_ms.2,
            r.first_ms,
            r.cpu_us,
            r.kib_per_stream,
            r.decoded_ms
        );
    }
    println!(
        "* clients count items (decoded: one client alone decoding its whole state into ops); \
         cpu/chg: process CPU per stream and change, server and client ends; KiB/stream: both \
         ends, an upper bound of the server's memory per node"
    );
}
