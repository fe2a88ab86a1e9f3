//! The `--stats` line: what came in, what changed, and what it cost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use kpng_runner::NodeStats;
use kpng_store::StoreStats;
use nix::sys::resource::{UsageWho, getrusage};

/// The header printed before the first stats line.
pub const HEADER: &str = "time(ms)\tevents\trevisions\tenls_revisions\tuser(ms)\tsys(ms)\tcpu(%)\trss(MiB)\trevisions/events(%)";

/// The counters a stats line reports.
#[derive(Clone)]
pub struct StatsSources {
    /// The store's counters.
    pub store: Arc<StoreStats>,
    /// The node runner's counters, when there is one.
    pub node: Option<Arc<NodeStats>>,
}

/// Process CPU time, user and system.
fn cpu_times() -> (Duration, Duration) {
    match getrusage(UsageWho::RUSAGE_SELF) {
        Ok(usage) => {
            let d = |t: nix::sys::time::TimeVal| {
                Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000)
            };
            (d(usage.user_time()), d(usage.system_time()))
        }
        Err(_) => (Duration::ZERO, Duration::ZERO),
    }
}

/// Resident set size in MiB, from /proc/self/status.
fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// Produces stats lines; CPU % is measured since the previous line.
pub struct StatsPrinter {
    sources: StatsSources,
    start: Instant,
    last: (Instant, Duration),
}

impl StatsPrinter {
    /// A printer starting now.
    pub fn new(sources: StatsSources) -> Self {
        let now = Instant::now();
        let (user, sys) = cpu_times();
        StatsPrinter { sources, start: now, last: (now, user + sys) }
    }

    /// The next line.
    pub fn line(&mut self) -> String {
        let now = Instant::now();
        let (user, sys) = cpu_times();
        let wall = now.duration_since(self.last.0).as_secs_f64();
        let cpu = (user + sys).saturating_sub(self.last.1).as_secs_f64();
        self.last = (now, user + sys);
        let store = self.sources.store.snapshot();
        let enls = self.sources.node.as_ref().map_or(0, |n| n.enls_revisions());
        let ratio = if store.events == 0 {
            0.0
        } else {
            100.0 * store.revisions as f64 / store.events as f64
        };
        format!(
            "{}\t{}\t{}\t{}\t{}\t{}\t{:.1}\t{:.2}\t{:.2}",
            now.duration_since(self.start).as_millis(),
            store.events,
            store.revisions,
            enls,
            user.as_millis(),
            sys.as_millis(),
            if wall > 0.0 { 100.0 * cpu / wall } else { 0.0 },
            rss_mib(),
            ratio,
        )
    }
}

/// Prints a line every `interval` on standard error, forever (the caller prints [`HEADER`]).
pub async fn print_stats(mut printer: StatsPrinter, interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        eprintln!("{}", printer.line());
    }
}

/// The sources' own counters as metrics: `kpng_rejected_annotations_total`.
#[derive(Debug)]
pub struct SourceMetrics;

impl prometheus_client::collector::Collector for SourceMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> std::fmt::Result {
        use prometheus_client::encoding::EncodeMetric;
        let metric = prometheus_client::metrics::counter::ConstCounter::new(
            kpng_sources::convert::rejected_annotations(),
        );
        metric.encode(encoder.encode_descriptor(
            "kpng_rejected_annotations",
            "Load-balancing annotations of Services with a key or value kpng does not know \
             (each read of such a Service counts); the service is balanced as without them.",
            None,
            metric.metric_type(),
        )?)
    }
}
