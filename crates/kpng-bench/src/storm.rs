//! The storm scenario: the real `kpng` binary with its default flags (kube source to
//! nftables) under a sustained stream of real endpoint changes through the fake API server.
//! Each change gives one endpoint a new address that names the event; the time from the
//! API event to the kernel's notification of the commit that carries that address is the
//! latency a user sees. With it: commits per second and kpng's own CPU (the fake API
//! server runs in the bench's process, not kpng's).

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_netlink::message::{NETLINK_NETFILTER, NFNL_SUBSYS_NFTABLES, messages};
use kpng_netlink::socket::NetlinkSocket;
use kpng_testkit::generate::{ClusterSpec, generate};
use serde_json::Value;

/// nf_tables' multicast group: every committed change, as `nft monitor` shows it.
const NFNLGRP_NFTABLES: u32 = 7;
/// `NFT_MSG_NEWSETELEM` and `NFT_MSG_NEWGEN` notifications.
const NEWSETELEM: u16 = (NFNL_SUBSYS_NFTABLES << 8) | 12;
const NEWGEN: u16 = (NFNL_SUBSYS_NFTABLES << 8) | 15;
/// Where kpng serves /readyz by default.
const HEALTHZ: &str = "127.0.0.1:10256";

/// One storm: a rate of real changes against one cluster size, one pacing.
pub struct StormRow {
    /// Services in the cluster.
    pub services: usize,
    /// Real endpoint changes per second sent.
    pub rate: u64,
    /// `--min-sync-period` given to kpng (`None`: the default).
    pub min_sync_period: Option<String>,
    /// Changes sent.
    pub events: usize,
    /// Changes whose address the kernel was seen to commit.
    pub seen: usize,
    /// API event to kernel commit: p50, p99, max (ms).
    pub latency: (f64, f64, f64),
    /// Kernel commits per second over the storm.
    pub commits_per_second: f64,
    /// kpng's CPU over the storm, in % of one core.
    pub cpu_percent: f64,
}

/// What the monitor thread has seen: when each event's address was committed, and commits.
#[derive(Default)]
struct Seen {
    first: Vec<Option<Instant>>,
    commits: u64,
}

/// Runs kpng over a generated cluster and sends `rate` real changes a second for `seconds`.
pub fn run(
    services: usize,
    endpoints: usize,
    rate: u64,
    seconds: u64,
    min_sync_period: Option<&str>,
) -> anyhow::Result<StormRow> {
    let binary = crate::memory::kpng_binary()?;
    crate::memory::clean_tables(&binary, "the storm")?;
    let total = (rate * seconds) as usize;
    anyhow::ensure!(total < 65_536, "a storm names its events in 16 bits: {total} is too many");
    let objects = generate(&ClusterSpec { services, endpoints, nodes: 3, zones: 2 });
    let slices: Vec<Value> = objects
        .iter()
        .filter(|o| o["kind"] == "EndpointSlice" && o["addressType"] == "IPv4")
        .cloned()
        .collect();
    let (_runtime, server) = crate::memory::serve(objects)?;
    let flags: Vec<&str> = min_sync_period.iter().flat_map(|p| ["--min-sync-period", p]).collect();
    let kpng = start_ready(&binary, &server.url(), &flags)?;
    // Subscribed only now: the first sync's notifications would overflow the socket.
    let seen = Arc::new(Mutex::new(Seen { first: vec![None; total + 1], commits: 0 }));
    let stop = Arc::new(AtomicBool::new(false));
    monitor(seen.clone(), stop.clone())?;
    std::thread::sleep(Duration::from_millis(300));
    let pid = kpng.0.id();
    let cpu_start = cpu_time(pid)?;
    let commits_start = seen.lock().unwrap_or_else(|e| e.into_inner()).commits;
    let start = Instant::now();
    let mut sent = vec![start; total + 1];
    for (i, sent_at) in sent.iter_mut().enumerate().skip(1) {
        let service = (i * 7919) % slices.len();
        let mut slice = slices[service].clone();
        let address = format!("10.251.{}.{}", i >> 8, i & 0xff);
        slice["endpoints"][0]["addresses"][0] = Value::from(address);
        let due = start + Duration::from_secs_f64(i as f64 / rate as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        *sent_at = Instant::now();
        server.apply(slice);
    }
    std::thread::sleep(Duration::from_millis(1500));
    let elapsed = start.elapsed().as_secs_f64();
    let cpu = (cpu_time(pid)? - cpu_start).as_secs_f64();
    stop.store(true, Ordering::Relaxed);
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    let mut latencies: Vec<Duration> = (1..=total)
        .filter_map(|i| seen.first[i].map(|at| at.saturating_duration_since(sent[i])))
        .collect();
    let count = latencies.len();
    Ok(StormRow {
        services,
        rate,
        min_sync_period: min_sync_period.map(str::to_owned),
        events: total,
        seen: count,
        latency: crate::table::percentiles(&mut latencies),
        commits_per_second: (seen.commits - commits_start) as f64 / elapsed,
        cpu_percent: 100.0 * cpu / elapsed,
    })
}

/// Kills kpng when the scenario ends, however it ends.
pub(crate) struct Killed(pub(crate) Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `kpng kube --server URL FLAGS to-local --node node-0 to-nft` and waits until it
/// is ready (its first sync committed).
pub(crate) fn start_ready(binary: &Path, url: &str, flags: &[&str]) -> anyhow::Result<Killed> {
    let child = Command::new(binary)
        .args(["kube", "--server", url])
        .args(flags)
        .args(["to-local", "--node", "node-0", "to-nft"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("cannot run {}", binary.display()))?;
    let mut kpng = Killed(child);
    wait_ready(&mut kpng.0)?;
    Ok(kpng)
}

/// Waits until kpng's /readyz answers 200 (its first sync is committed).
pub(crate) fn wait_ready(child: &mut Child) -> anyhow::Result<()> {
    let deadline = Instant::now() + Duration::from_secs(300);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait()? {
            anyhow::bail!("kpng exited before its first sync: {status}");
        }
        if ready().unwrap_or(false) {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    anyhow::bail!("kpng was not ready within 300 s")
}

fn ready() -> std::io::Result<bool> {
    let mut stream = std::net::TcpStream::connect(HEALTHZ)?;
    stream.write_all(b"GET /readyz HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"))
}

/// Follows nf_tables' notifications on a thread until `stop`: each element whose key holds
/// an address 10.251.x.y marks event x*256+y as committed.
fn monitor(seen: Arc<Mutex<Seen>>, stop: Arc<AtomicBool>) -> anyhow::Result<()> {
    let mut socket = NetlinkSocket::open(NETLINK_NETFILTER)?;
    socket.subscribe(NFNLGRP_NFTABLES)?;
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            // A timeout or an overflow (ENOBUFS) ends one receive, not the monitor.
            let Ok(datagram) = socket.receive() else { continue };
            let at = Instant::now();
            let mut seen = seen.lock().unwrap_or_else(|e| e.into_inner());
            for message in messages(&datagram) {
                match message.kind {
                    NEWGEN => seen.commits += 1,
                    NEWSETELEM => {
                        for pair in message.body.windows(4).filter(|w| w[..2] == [10, 251]) {
                            let event = usize::from(pair[2]) << 8 | usize::from(pair[3]);
                            if let Some(slot @ None) = seen.first.get_mut(event) {
                                *slot = Some(at);
                            }
                        }
                    }
                    _ => {}
                }
            }
        }
    });
    Ok(())
}

/// A process's CPU time so far (user and system).
pub(crate) fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // Fields after the command name (which may hold spaces), from the state (field 3) on.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).context("no command in /proc/PID/stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields
        .get(11..13)
        .context("short /proc/PID/stat")?
        .iter()
        .map(|f| f.parse::<u64>().unwrap_or(0))
        .sum();
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)?.unwrap_or(100) as f64;
    Ok(Duration::from_secs_f64(ticks as f64 / per_second))
}

/// Prints the storm table.
pub fn print(rows: &[StormRow]) {
    println!(
        "storm: kpng kube --server <fake> to-local --node node-0 to-nft (default flags), real \
         endpoint changes at a steady rate"
    );
    println!(
        "{:>8} {:>8} {:>10} | {:>7} {:>7} | {:>8} {:>8} {:>8} | {:>10} {:>9}",
        "services",
        "events/s",
        "min-sync",
        "events",
        "seen",
        "p50(ms)",
        "p99(ms)",
        "max(ms)",
        "commits/s",
        "kpng cpu%"
    );
    for r in rows {
        let (p50, p99, max) = r.latency;
        println!(
            "{:>8} {:>8} {:>10} | {:>7} {:>7} | {:>8.2} {:>8.2} {:>8.2} | {:>10.1} {:>9.1}",
            r.services,
            r.rate,
            r.min_sync_period.as_deref().unwrap_or("default"),
            r.events,
            r.seen,
            p50,
            p99,
            max,
            r.commits_per_second,
            r.cpu_percent
        );
    }
    println!(
        "* latency: API event (the fake server's write) to the kernel's notification of the \
         commit carrying it; seen: events whose endpoint this node's rules hold"
    );
}
