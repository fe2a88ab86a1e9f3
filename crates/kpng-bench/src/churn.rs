//! The churn scenario: the real kube source, store, projection and nftables backend
//! against the fake API server, under a stream of API events of which most change
//! nothing a proxy uses.

use std::time::{Duration, Instant};

use kpng_testkit::apiserver::Resource;
use kpng_testkit::generate::ClusterSpec;

use crate::kube::Pipeline;

/// One churn run's results.
pub struct ChurnRow {
    /// Services in the cluster.
    pub services: usize,
    /// Endpoints in the cluster.
    pub endpoints: usize,
    /// Events per second asked for.
    pub rate: u64,
    /// Share of no-op events (%).
    pub noop_percent: f64,
    /// API events sent (after the initial load).
    pub api_events: u64,
    /// Of them, real changes (a new endpoint address).
    pub real_events: u64,
    /// Store changes and revisions caused by them.
    pub store_changes: u64,
    /// Store revisions.
    pub revisions: u64,
    /// Node-state revisions.
    pub enls_revisions: u64,
    /// Kernel transactions and element operations.
    pub transactions: u64,
    /// Element operations.
    pub element_ops: u64,
    /// CPU used over the run, as % of one core.
    pub cpu_percent: f64,
}

impl ChurnRow {
    /// The share of no-op events that caused no store revision, in percent.
    pub fn noops_dropped(&self) -> f64 {
        let noops = self.api_events.saturating_sub(self.real_events);
        let leaked = self.revisions.saturating_sub(self.real_events);
        if noops == 0 { 100.0 } else { 100.0 * (1.0 - leaked as f64 / noops as f64) }
    }

    /// Node-state revisions per API event, in percent.
    pub fn revisions_per_event(&self) -> f64 {
        if self.api_events == 0 {
            0.0
        } else {
            100.0 * self.enls_revisions as f64 / self.api_events as f64
        }
    }
}

/// Runs `seconds` of churn at `rate` events/s with `noop_percent` % no-ops.
pub fn run(
    services: usize,
    endpoints: usize,
    rate: u64,
    noop_percent: f64,
    seconds: u64,
) -> anyhow::Result<ChurnRow> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
        let Pipeline { server, probe, store: store_stats, node: node_stats, slices } =
            Pipeline::start(&spec).await?;
        let base = (
            store_stats.snapshot(),
            node_stats.enls_revisions(),
            probe.transactions(),
            probe.elements(),
        );
        let cpu_start = crate::nft::cpu();
        let start = Instant::now();
        let total = rate * seconds;
        let mut real = 0usize;
        for i in 0..total {
            let service = (i as usize * 7919) % services;
            let (ns, name) = (format!("ns-{}", service % 10), format!("svc-{service}-v4"));
            // No-ops spread evenly: event i is real when the running count of real events
            // falls behind the asked-for share.
            if (real as f64) >= (i + 1) as f64 * (1.0 - noop_percent / 100.0) {
                server.touch(Resource::EndpointSlices, &ns, &name);
            } else {
                // A real change: the slice's first endpoint gets a new address.
                real += 1;
                let mut slice = slices[service].clone();
                let address = format!("10.251.{}.{}", (real >> 8) & 0xff, real & 0xff);
                slice["endpoints"][0]["addresses"][0] = serde_json::json!(address);
                server.apply(slice);
            }
            let due = start + Duration::from_secs_f64((i + 1) as f64 / rate as f64);
            tokio::time::sleep_until(due.into()).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let elapsed = start.elapsed().as_secs_f64();
        let cpu = (crate::nft::cpu() - cpu_start).as_secs_f64();
        let stats = store_stats.snapshot();
        Ok(ChurnRow {
            services,
            endpoints: services * endpoints,
            rate,
            noop_percent,
            api_events: stats.events - base.0.events,
            real_events: real as u64,
            store_changes: stats.changes - base.0.changes,
            revisions: stats.revisions - base.0.revisions,
            enls_revisions: node_stats.enls_revisions() - base.1,
            transactions: probe.transactions() - base.2,
            element_ops: probe.elements() - base.3,
            cpu_percent: 100.0 * cpu / elapsed,
        })
    })
}

/// Prints the churn table.
pub fn print(rows: &[ChurnRow]) {
    println!("churn: kube source -> store -> node state -> nftables, against the fake API server");
    println!(
        "{:>8} {:>9} {:>8} {:>7} | {:>10} {:>6} {:>10} {:>10} {:>10} {:>12} {:>10} | {:>14} {:>17} {:>8}",
        "services",
        "endpoints",
        "events/s",
        "no-op%",
        "api events",
        "real",
        "changes",
        "revisions",
        "enls revs",
        "transactions",
        "elem ops",
        "revs/events(%)",
        "no-ops dropped(%)",
        "cpu(%)*"
    );
    for r in rows {
        println!(
            "{:>8} {:>9} {:>8} {:>7.1} | {:>10} {:>6} {:>10} {:>10} {:>10} {:>12} {:>10} | {:>14.2} {:>17.2} {:>8.1}",
            r.services,
            r.endpoints,
            r.rate,
            r.noop_percent,
            r.api_events,
            r.real_events,
            r.store_changes,
            r.revisions,
            r.enls_revisions,
            r.transactions,
            r.element_ops,
            r.revisions_per_event(),
            r.noops_dropped(),
            r.cpu_percent
        );
    }
    println!("* of one core, for the whole bench process: the fake API server included");
}
