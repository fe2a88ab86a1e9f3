//! `/metrics` of `kpng aggregate`: per-producer counters in Prometheus's text format,
//! rendered from the engine's [`Report`].

use std::fmt::Write;

use crate::engine::{ProducerReport, Report};

/// Whole-aggregator counters, kept by the daemon.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    /// Batches run (each at most one transaction unless a producer was rejected).
    pub batches: u64,
    /// nft transactions committed.
    pub transactions: u64,
    /// Commands committed.
    pub commands: u64,
}

/// A per-producer metric: name, type, help, and its value.
type Metric = (&'static str, &'static str, &'static str, fn(&ProducerReport) -> f64);

/// Prometheus text for `report` and `totals`.
pub fn render(report: &Report, totals: &Totals) -> String {
    let mut out = String::new();
    let per_producer: [Metric; 6] = [
        ("publications_total", "counter", "Publications received from the producer.", |p| {
            p.stats.publications as f64
        }),
        (
            "objects",
            "gauge",
            "Objects committed for the producer (tables, chains, sets, rules, elements).",
            |p| p.objects as f64,
        ),
        ("batches_total", "counter", "Batches that committed a change of the producer.", |p| {
            p.stats.batches as f64
        }),
        (
            "commit_seconds_total",
            "counter",
            "Time spent in transactions holding the producer's changes.",
            |p| p.stats.commit_seconds,
        ),
        ("rejections_total", "counter", "Publications of the producer refused.", |p| {
            p.stats.rejections as f64
        }),
        ("lease_expiries_total", "counter", "Times the producer's lease ran out.", |p| {
            p.stats.lease_expiries as f64
        }),
    ];
    for (name, kind, help, value) in per_producer {
        let _ = writeln!(out, "# HELP kpng_aggregator_producer_{name} {help}");
        let _ = writeln!(out, "# TYPE kpng_aggregator_producer_{name} {kind}");
        for (producer, report) in &report.producers {
            let _ = writeln!(
                out,
                "kpng_aggregator_producer_{name}{{producer=\"{producer}\"}} {}",
                value(report)
            );
        }
    }
    let totals = [
        ("batches_total", "Batches run.", totals.batches),
        ("transactions_total", "nft transactions committed.", totals.transactions),
        ("commands_total", "nft commands committed.", totals.commands),
    ];
    for (name, help, value) in totals {
        let _ = writeln!(out, "# HELP kpng_aggregator_{name} {help}");
        let _ = writeln!(out, "# TYPE kpng_aggregator_{name} counter");
        let _ = writeln!(out, "kpng_aggregator_{name} {value}");
    }
    out
}
