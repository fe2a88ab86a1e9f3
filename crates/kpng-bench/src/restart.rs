//! The restart scenario: kpng starts over a table far larger than the cluster it finds (a
//! node moved to a smaller cluster, or most services deleted while kpng was down). The
//! backend reads the tables back and reconciles them in one transaction; the row shows how
//! long that takes against a cold start of the same small cluster on empty tables.

use std::time::Instant;

use anyhow::Context;
use kpng_local::NodeProjector;
use kpng_model::{Changes, GlobalModel};
use kpng_nft::{NftBackend, NftOptions};
use kpng_runner::{Backend, ChangeSet};
use kpng_testkit::generate::ClusterSpec;

use crate::cluster;
use crate::probe::ProbedKernel;

/// One restart over a stale table.
pub struct RestartRow {
    /// Services in the table when kpng starts.
    pub stale: usize,
    /// Services in the cluster kpng finds.
    pub kept: usize,
    /// Elements in the table before and after.
    pub elements: (usize, usize),
    /// Start to committed (ms): read-back, reconcile and commit.
    pub total_ms: f64,
    /// Reading the tables back (ms).
    pub read_ms: f64,
    /// The kernel's commit alone (ms).
    pub kernel_ms: f64,
    /// Netlink bytes of the transaction.
    pub bytes: u64,
    /// The same cluster on empty tables (ms).
    pub cold_ms: f64,
}

/// Loads `stale` services, then starts a new backend over them for a cluster of `kept`.
pub fn run(stale: usize, kept: usize, endpoints: usize) -> anyhow::Result<RestartRow> {
    let spec = |services| ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let (bench, _) = crate::nft::Bench::load(&spec(stale))?;
    let before = bench.elements();
    drop(bench);

    let state = |services| -> anyhow::Result<kpng_model::local::LocalState> {
        let mut model = GlobalModel::new();
        for object in cluster::objects(&spec(services))? {
            model.apply(object);
        }
        let mut projector = NodeProjector::new("node-0");
        projector.update(&model, &Changes::All);
        Ok(projector.state().clone())
    };
    let small = state(kept)?;
    let (kernel, probe) = ProbedKernel::open()?;
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel));
    let start = Instant::now();
    backend.apply(&ChangeSet::full(&small)).context("restart over the stale table")?;
    let total_ms = start.elapsed().as_secs_f64() * 1000.0;
    let row = RestartRow {
        stale,
        kept,
        elements: (before, backend.element_count()),
        total_ms,
        read_ms: probe.last_read().as_secs_f64() * 1000.0,
        kernel_ms: probe.last_commit().as_secs_f64() * 1000.0,
        bytes: probe.last_bytes(),
        cold_ms: 0.0,
    };
    drop(backend);
    let (_, cold) = crate::nft::Bench::load(&spec(kept))?;
    Ok(RestartRow { cold_ms: cold.total_ms, ..row })
}

/// Prints the restart table.
pub fn print(rows: &[RestartRow]) {
    println!("Restart over a stale table (read back, reconcile, one transaction)");
    println!(
        "{:>7} {:>6} {:>16} {:>10} {:>9} {:>10} {:>12} | {:>8} {:>9}",
        "stale",
        "kept",
        "elements",
        "total(ms)",
        "read(ms)",
        "kern(ms)",
        "netlink(KiB)",
        "cold(ms)",
        "total/cold"
    );
    for row in rows {
        println!(
            "{:>7} {:>6} {:>16} {:>10.1} {:>9.1} {:>10.1} {:>12.1} | {:>8.1} {:>9.1}",
            row.stale,
            row.kept,
            format!("{} -> {}", row.elements.0, row.elements.1),
            row.total_ms,
            row.read_ms,
            row.kernel_ms,
            row.bytes as f64 / 1024.0,
            row.cold_ms,
            if row.cold_ms > 0.0 { row.total_ms / row.cold_ms } else { 0.0 },
        );
    }
}
