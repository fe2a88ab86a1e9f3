//! The idle scenario: the real `kpng` binary with its default flags (kube source to
//! nftables, `--sync-period 30s`) over a generated cluster in which nothing changes. It
//! reports kpng's CPU while idle, as a share of one core and per hour, and how long kpng
//! takes to repair two foreign changes made with `nft`: one element deleted from a set, then
//! one base chain flushed. While no other process commits, a verification reads nothing
//! back (the ruleset generation is still kpng's). A neighbour then commits to a table of
//! its own once a second for as long again (as kubelet and CNI plugins do through
//! iptables-nft): kpng's CPU meanwhile shows whether those commits cost it read-backs. A
//! foreign commit to kpng's own tables makes the next verification read them back and
//! repair them.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_testkit::generate::{ClusterSpec, generate, service_ip};

use kpng_netlink::attr;
use kpng_netlink::message::{NETLINK_NETFILTER, NFNL_SUBSYS_NFTABLES, messages};
use kpng_netlink::nftables::announce::NFNLGRP_NFTABLES;
use kpng_netlink::socket::NetlinkSocket;

use crate::storm::{cpu_time, start_ready};

/// `NFT_MSG_NEWRULE` and `NFT_MSG_NEWSETELEM` announcements.
const NEWRULE: u16 = (NFNL_SUBSYS_NFTABLES << 8) | 6;
const NEWSETELEM: u16 = (NFNL_SUBSYS_NFTABLES << 8) | 12;

/// One idle run.
pub struct IdleRow {
    /// Services in the cluster.
    pub services: usize,
    /// Seconds kpng was watched while nothing changed.
    pub seconds: f64,
    /// kpng's CPU over them (ms).
    pub cpu_ms: f64,
    /// kpng's CPU over as long again while a neighbour committed once a second (ms).
    pub neighbour_cpu_ms: f64,
    /// A foreign deletion of one element to its repair (s).
    pub element_repair_s: f64,
    /// A foreign flush of a base chain to its repair (s).
    pub chain_repair_s: f64,
}

/// Runs kpng idle over `services` × `endpoints` for `seconds`, then breaks its tables twice.
/// `sync_period`: kpng's `--sync-period`, when not its default.
pub fn run(
    services: usize,
    endpoints: usize,
    seconds: u64,
    sync_period: Option<&str>,
) -> anyhow::Result<IdleRow> {
    let binary = crate::memory::kpng_binary()?;
    crate::memory::clean_tables(&binary, "the idle run")?;
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let (_runtime, server) = crate::memory::serve(generate(&spec))?;
    let flags: Vec<&str> = sync_period.iter().flat_map(|p| ["--sync-period", p]).collect();
    let kpng = start_ready(&binary, &server.url(), &flags)?;
    // The start-up sync's rest and its first verification are not idling.
    std::thread::sleep(Duration::from_secs(2));
    let pid = kpng.0.id();
    let (cpu_start, start) = (cpu_time(pid)?, Instant::now());
    std::thread::sleep(Duration::from_secs(seconds));
    let cpu_ms = (cpu_time(pid)? - cpu_start).as_secs_f64() * 1000.0;
    let seconds = start.elapsed().as_secs_f64();
    let cpu_start = cpu_time(pid)?;
    for second in 0..seconds.round() as u64 {
        let verb = if second % 2 == 0 { "add" } else { "delete" };
        anyhow::ensure!(nft(&[verb, "table", "ip", "neighbour"])?, "the neighbour's commit failed");
        std::thread::sleep(Duration::from_secs(1));
    }
    let neighbour_cpu_ms = (cpu_time(pid)? - cpu_start).as_secs_f64() * 1000.0;
    let _ = nft(&["delete", "table", "ip", "neighbour"]);

    let ip = service_ip(0);
    let element = format!("{{ {ip} }}");
    let delete = ["delete", "element", "ip", "kpng", "cluster_ips", &element];
    let octets: std::net::Ipv4Addr =
        ip.parse().with_context(|| format!("service 0's cluster IP {ip} is not IPv4"))?;
    let octets = octets.octets();
    let element_repair_s = repair(&delete, NEWSETELEM, "cluster_ips", &octets)?;
    let flush = ["flush", "chain", "ip", "kpng", "nat_prerouting"];
    let chain_repair_s = repair(&flush, NEWRULE, "nat_prerouting", &[])?;
    drop(kpng);
    drop(server);
    Ok(IdleRow { services, seconds, cpu_ms, neighbour_cpu_ms, element_repair_s, chain_repair_s })
}

/// Runs `nft ARGS`; whether it succeeded.
fn nft(args: &[&str]) -> anyhow::Result<bool> {
    let status = Command::new("nft")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .context("cannot run nft")?;
    Ok(status.success())
}

/// Breaks the tables with `nft BREAK` and times how long until the kernel announces that a
/// commit wrote back a `kind` message (an element, a rule) into `object` (a set, a chain)
/// holding the bytes `needle`. (Asking `nft` instead takes it most of a minute at 100,000
/// services: it reads every set's elements to answer.)
fn repair(break_it: &[&str], kind: u16, object: &str, needle: &[u8]) -> anyhow::Result<f64> {
    let mut socket = NetlinkSocket::open(NETLINK_NETFILTER)?;
    socket.subscribe(NFNLGRP_NFTABLES)?;
    let what = break_it.join(" ");
    anyhow::ensure!(nft(break_it)?, "`nft {what}` failed");
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(180) {
        // A receive times out every few seconds, and the buffer may overflow: go on.
        let Ok(datagram) = socket.receive() else { continue };
        let written = messages(&datagram).into_iter().any(|message| {
            let attrs = attr::parse(message.netfilter_payload());
            message.kind == kind
                && attr::find(&attrs, 2).map(attr::string).as_deref() == Some(object)
                && (needle.is_empty() || message.body.windows(needle.len()).any(|w| w == needle))
        });
        if written {
            return Ok(start.elapsed().as_secs_f64());
        }
    }
    anyhow::bail!("kpng did not repair `nft {what}` within three minutes")
}

/// Prints the idle table.
pub fn print(rows: &[IdleRow]) {
    println!(
        "idle: kpng kube --server <fake> to-local --node node-0 to-nft (--sync-period 30s unless --idle-sync-period), nothing changing"
    );
    println!(
        "{:>8} {:>8} {:>9} {:>8} {:>12} {:>18} | {:>17} {:>15}",
        "services",
        "idle(s)",
        "cpu(ms)",
        "core(%)",
        "cpu/hour(s)",
        "neighbour cpu(ms)",
        "element repair(s)",
        "chain repair(s)"
    );
    for r in rows {
        let share = r.cpu_ms / (r.seconds * 1000.0);
        println!(
            "{:>8} {:>8.1} {:>9.1} {:>8.3} {:>12.1} {:>18.1} | {:>17.2} {:>15.2}",
            r.services,
            r.seconds,
            r.cpu_ms,
            share * 100.0,
            share * 3600.0,
            r.neighbour_cpu_ms,
            r.element_repair_s,
            r.chain_repair_s
        );
    }
    println!(
        "* neighbour: kpng's CPU over as long again while another process adds or deletes a table of its own once a second"
    );
    println!(
        "* repair: an `nft` command deletes service 0's cluster IP from cluster_ips (then flushes nat_prerouting) to the kernel's announcement of the commit that writes it back; a verification comes every --sync-period"
    );
}
