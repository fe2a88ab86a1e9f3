//! What one endpoint change costs `to-ebpf` (map writes, time to apply them to the
//! kernel's maps) at each cluster size, next to `to-nft` (one netlink transaction) for the
//! same changes, and what loading the whole cluster costs each.

use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_model::{Changes, GlobalModel, Object};
use kpng_runner::{Backend, ChangeSet};
use kpng_testkit::generate::ClusterSpec;

use crate::cluster;
use crate::ebpf::Attachment;
use crate::table::percentiles;

/// One size.
pub struct ChangeRow {
    /// Services.
    pub services: usize,
    /// eBPF: elements in the maps after the load.
    pub elements: usize,
    /// eBPF: loading the whole cluster (ms).
    pub ebpf_load_ms: f64,
    /// nftables: loading the whole cluster (ms).
    pub nft_load_ms: f64,
    /// eBPF: the bench's resident set grown by the load (KiB), first in the process: what
    /// the backend keeps, and what the allocator kept of the load's own work.
    pub ebpf_kib: u64,
    /// eBPF: the process's peak resident set above the resident set before the load (KiB).
    pub ebpf_peak_kib: u64,
    /// eBPF: one endpoint added or removed, p50 and p99 (µs).
    pub ebpf: (f64, f64),
    /// eBPF: map writes per change (mean).
    pub writes: f64,
    /// nftables: the same changes, p50 and p99 (µs).
    pub nft: (f64, f64),
}

fn micros(samples: &mut [Duration]) -> (f64, f64) {
    let (p50, p99, _) = percentiles(samples);
    (p50 * 1000.0, p99 * 1000.0)
}

/// Endpoint `r` added to (`add`) or removed from a generated service's slice.
fn endpoint_change(model: &mut GlobalModel, services: usize, r: usize, add: bool) -> Changes {
    let mut slice = cluster::slice_of(model, (r * 7919) % services.max(1));
    match add {
        true => cluster::push_endpoint(&mut slice, cluster::extra_endpoint(r, "node-1")),
        false => {
            cluster::pop_endpoint(&mut slice);
        }
    }
    Changes::Touched(cluster::apply(model, Object::EndpointSlice(slice)))
}

/// Loads `services` generated services into both backends, then times `repeat` endpoint
/// additions and as many removals through each.
pub fn run(services: usize, endpoints: usize, repeat: usize) -> anyhow::Result<ChangeRow> {
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let (mut model, mut projector) = cluster::projected(&spec)?;

    let attachment = Attachment::new("changes")?;
    let mut ebpf = attachment.backend()?;
    let rss = || crate::memory::status_kib(std::process::id(), "VmRSS:").unwrap_or(0);
    let hwm = || crate::memory::status_kib(std::process::id(), "VmHWM:").unwrap_or(0);
    let before = rss();
    let start = Instant::now();
    ebpf.apply(&ChangeSet::full(projector.state())).context("loading the eBPF maps")?;
    let ebpf_load_ms = start.elapsed().as_secs_f64() * 1000.0;
    let ebpf_kib = rss().saturating_sub(before);
    // The peak over the load, above the resident set before it (the high-water mark may
    // predate the load: then the load's own peak is not seen, and this is a lower bound).
    let ebpf_peak_kib = hwm().saturating_sub(before);
    let elements = ebpf.held().len();

    kpng_nft::kernel::cleanup().context("removing earlier tables")?;
    let mut nft = kpng_nft::NftBackend::new(
        kpng_nft::NftOptions::default(),
        Box::new(kpng_nft::NetlinkKernel::open()?),
    );
    let start = Instant::now();
    nft.apply(&ChangeSet::full(projector.state())).context("loading nftables")?;
    let nft_load_ms = start.elapsed().as_secs_f64() * 1000.0;

    let (mut ebpf_times, mut nft_times) = (Vec::new(), Vec::new());
    let writes_before = ebpf.stats().writes.load(std::sync::atomic::Ordering::Relaxed);
    for add in [true, false] {
        for r in 0..repeat {
            let changes = endpoint_change(&mut model, services, r, add);
            let ops = projector.update(&model, &changes);
            let change = ChangeSet::changes(&ops, projector.state());
            let t = Instant::now();
            ebpf.apply(&change).context("an endpoint change through to-ebpf")?;
            ebpf_times.push(t.elapsed());
            let t = Instant::now();
            nft.apply(&change).context("an endpoint change through to-nft")?;
            nft_times.push(t.elapsed());
        }
    }
    let writes = ebpf.stats().writes.load(std::sync::atomic::Ordering::Relaxed) - writes_before;
    kpng_nft::kernel::cleanup().context("removing the tables")?;
    Ok(ChangeRow {
        services,
        elements,
        ebpf_load_ms,
        nft_load_ms,
        ebpf_kib,
        ebpf_peak_kib,
        ebpf: micros(&mut ebpf_times),
        writes: writes as f64 / ebpf_times.len().max(1) as f64,
        nft: micros(&mut nft_times),
    })
}

/// Prints the table.
pub fn print(rows: &[ChangeRow]) {
    println!(
        "ebpf changes: one endpoint added or removed, applied to the kernel (eBPF map writes vs one nftables transaction)"
    );
    println!(
        "{:>8} {:>9} | {:>10} {:>10} | {:>9} {:>9} | {:>9} {:>9} {:>7} | {:>9} {:>9} | {:>9}",
        "services",
        "elements",
        "load ebpf",
        "load nft",
        "mem ebpf",
        "peak ebpf",
        "ebpf p50",
        "ebpf p99",
        "writes",
        "nft p50",
        "nft p99",
        "nft/ebpf"
    );
    for row in rows {
        let ratio = if row.ebpf.0 > 0.0 { row.nft.0 / row.ebpf.0 } else { 0.0 };
        println!(
            "{:>8} {:>9} | {:>8.1}ms {:>8.1}ms | {:>6.1}MiB {:>6.1}MiB | {:>7.1}µs {:>7.1}µs {:>7.1} | {:>7.1}µs {:>7.1}µs | {:>9.2}",
            row.services,
            row.elements,
            row.ebpf_load_ms,
            row.nft_load_ms,
            row.ebpf_kib as f64 / 1024.0,
            row.ebpf_peak_kib as f64 / 1024.0,
            row.ebpf.0,
            row.ebpf.1,
            row.writes,
            row.nft.0,
            row.nft.1,
            ratio
        );
    }
    println!(
        "* from the change set to the last map write (ebpf) or the committed transaction (nft); mem ebpf: the bench's resident set grown by the eBPF load, the first in the process (what the backend keeps); peak ebpf: the peak resident set over it, above the resident set before it; writes: map element writes per change"
    );
}
