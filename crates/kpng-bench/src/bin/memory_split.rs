//! `kpng-memory-split`: where kpng's memory goes, by counting the bytes its allocations
//! hold (not the resident set, which the allocator's own keeping blurs): the global model,
//! the node state projected from it, the fingerprints the runner keeps in its place, and
//! each backend's own state after loading that node state, with the peak each step reached
//! above what was there before it.
//!
//! Each backend writes to a kernel that keeps nothing (to-nft's dry run into a sink, an
//! eBPF dataplane and iptables tables that accept and forget), so only the backend's own
//! memory is counted. Runs without privileges; prints a table.
//!
//! ```sh
//! cargo run --release -p kpng-bench --bin kpng-memory-split -- --services 1000,10000,30000
//! ```

use std::alloc::{GlobalAlloc, Layout};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};

use clap::Parser;
use kpng_backend::{Backend, ChangeSet};
use kpng_ebpf::dataplane::{Batch, Capacities, Dataplane, Snapshot};
use kpng_ebpf::maps::{Key, Value};
use kpng_ebpf::{EbpfBackend, EbpfError};
use kpng_iptables::{IptablesBackend, IptablesError, IptablesOptions};
use kpng_local::NodeProjector;
use kpng_model::{Changes, Family, GlobalModel, Kind};
use kpng_runner::size_class;
use kpng_testkit::generate::ClusterSpec;

#[path = "../cluster.rs"]
#[allow(dead_code)]
mod cluster;

/// kpng's allocator (jemalloc), counting the bytes allocations hold and their peak.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
/// Allocations live.
static COUNT: AtomicUsize = AtomicUsize::new(0);
/// What the live allocations take from the allocator: their size classes
/// ([`kpng_runner::size_class`]).
static CLASSES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is passed to kpng's allocator unchanged; the counters only
// observe sizes.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: the caller's contract is the allocator's.
        let ptr = unsafe { kpng_runner::Allocator.alloc(layout) };
        if !ptr.is_null() {
            let live = LIVE.fetch_add(layout.size(), Ordering::Relaxed) + layout.size();
            PEAK.fetch_max(live, Ordering::Relaxed);
            COUNT.fetch_add(1, Ordering::Relaxed);
            CLASSES.fetch_add(size_class(layout.size()), Ordering::Relaxed);
        }
        ptr
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { kpng_runner::Allocator.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        COUNT.fetch_sub(1, Ordering::Relaxed);
        CLASSES.fetch_sub(size_class(layout.size()), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: as above.
        let new = unsafe { kpng_runner::Allocator.realloc(ptr, layout, new_size) };
        if !new.is_null() {
            CLASSES.fetch_add(size_class(new_size), Ordering::Relaxed);
            CLASSES.fetch_sub(size_class(layout.size()), Ordering::Relaxed);
            if new_size >= layout.size() {
                let grown = new_size - layout.size();
                let live = LIVE.fetch_add(grown, Ordering::Relaxed) + grown;
                PEAK.fetch_max(live, Ordering::Relaxed);
            } else {
                LIVE.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
            }
        }
        new
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// What one step left held, and the peak above the start it reached on the way.
#[derive(Debug, Clone, Copy)]
struct Step {
    kept: isize,
    peak: usize,
    /// Allocations it left live.
    count: isize,
    /// What they take from the allocator (their size classes).
    classes: isize,
}

/// Runs `f`, counting what it leaves held and its peak.
fn step<T>(f: impl FnOnce() -> T) -> (T, Step) {
    let start = LIVE.load(Ordering::Relaxed);
    let (count, classes) = (COUNT.load(Ordering::Relaxed), CLASSES.load(Ordering::Relaxed));
    PEAK.store(start, Ordering::Relaxed);
    let out = f();
    let kept = LIVE.load(Ordering::Relaxed) as isize - start as isize;
    let peak = PEAK.load(Ordering::Relaxed) - start;
    let count = COUNT.load(Ordering::Relaxed) as isize - count as isize;
    let classes = CLASSES.load(Ordering::Relaxed) as isize - classes as isize;
    (out, Step { kept, peak, count, classes })
}

/// eBPF maps that accept every write and keep nothing.
struct NoMaps;

impl Dataplane for NoMaps {
    fn read(&mut self) -> Result<Option<Snapshot>, EbpfError> {
        Ok(None)
    }

    fn install(&mut self, _: &Capacities) -> Result<(), EbpfError> {
        Ok(())
    }

    fn write(&mut self, _: &Batch) -> Result<(), EbpfError> {
        Ok(())
    }

    fn grow(&mut self, _: &Capacities, _: &HashMap<Key, Value>) -> Result<(), EbpfError> {
        Ok(())
    }
}

/// iptables tables that accept every restore and keep nothing.
struct NoTables;

impl kpng_iptables::Kernel for NoTables {
    fn read(&mut self, _: Family) -> Result<kpng_iptables::Snapshot, IptablesError> {
        Ok(kpng_iptables::Snapshot::default())
    }

    fn restore(&mut self, _: Family, _: &str) -> Result<(), IptablesError> {
        Ok(())
    }
}

#[derive(Parser)]
#[command(about = "Where kpng's memory goes: the model, the node state, each backend")]
struct Cli {
    /// Cluster sizes (services), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,30000")]
    services: Vec<usize>,
    /// Endpoints per service.
    #[arg(long, default_value_t = 4)]
    endpoints: usize,
}

/// The layers, each a column.
const LAYERS: [&str; 6] =
    ["model", "node state", "fingerprints", "to-nft", "to-ebpf", "to-iptables"];

/// One line of a table: the cluster size, then the model and node state, then each backend.
fn print_row(
    services: impl std::fmt::Display,
    eps: impl std::fmt::Display,
    cells: &[impl AsRef<str>],
) {
    let cell = |i: usize| cells.get(i).map_or("", |c| c.as_ref());
    println!(
        "{services:>8} {eps:>4} | {:>16} {:>16} {:>16} | {:>16} {:>16} {:>16}",
        cell(0),
        cell(1),
        cell(2),
        cell(3),
        cell(4),
        cell(5)
    );
}

fn mib(bytes: isize) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    println!(
        "where the memory goes: bytes held by allocations after each step (and the step's peak above its start), MiB"
    );
    print_row("services", "eps", &LAYERS);
    let mut kept = Vec::new();
    for &services in &cli.services {
        let spec = ClusterSpec { services, endpoints: cli.endpoints, nodes: 3, zones: 2 };
        // The objects as a source reads them, applied one by one and dropped.
        let (model, model_step) = step(|| {
            let mut model = GlobalModel::new();
            for object in cluster::objects(&spec)? {
                model.apply(object);
            }
            // As the store does when each kind's list is done.
            for kind in Kind::ALL {
                model.compact(kind);
            }
            anyhow::Ok(model)
        });
        let model = model?;
        let (projector, state_step) = step(|| {
            // As the runner projects the first sync: the whole state, without the ops.
            let mut projector = NodeProjector::new("node-0");
            projector.refresh(&model, &Changes::All);
            projector
        });
        let state = projector.state();
        let (lean, prints_step) = step(|| {
            // What the runner keeps of it: the whole state is delivered, then dropped.
            let mut lean = NodeProjector::lean("node-0", Default::default());
            lean.refresh(&model, &Changes::All);
            lean.settle();
            lean
        });
        drop(lean);
        let full = ChangeSet::full(state);
        let (nft, nft_step) = step(|| {
            let kernel = kpng_nft::DryRunKernel::new(std::io::sink());
            let mut nft = kpng_nft::NftBackend::new(Default::default(), Box::new(kernel));
            nft.apply(&full).map(|_| nft)
        });
        drop(nft?);
        let (ebpf, ebpf_step) = step(|| {
            let mut ebpf = EbpfBackend::new(Box::new(NoMaps));
            ebpf.apply(&full).map(|_| ebpf)
        });
        drop(ebpf?);
        let (iptables, iptables_step) = step(|| {
            let mut iptables = IptablesBackend::new(IptablesOptions::default(), Box::new(NoTables));
            iptables.apply(&full).map(|_| iptables)
        });
        drop(iptables?);
        let steps = [model_step, state_step, prints_step, nft_step, ebpf_step, iptables_step];
        let cells = steps.map(|s| format!("{:.1} ({:.1})", mib(s.kept), mib(s.peak as isize)));
        print_row(services, cli.endpoints, &cells);
        kept.push((services, steps));
    }
    println!(
        "* node state: the whole ENLS of the node; fingerprints: what the runner keeps of it instead (the ENLS is then read from the model)"
    );
    println!(
        "* each backend loads the whole node state into a kernel that keeps nothing (to-nft: its dry run into a sink), so only its own state is counted; the model's peak is the test generator's (every object generated at once), not a source's"
    );
    println!();
    println!("allocations each step left live, in thousands, and the size classes they take (MiB)");
    print_row("services", "eps", &LAYERS);
    for (services, steps) in kept {
        let cells = steps.map(|s| format!("{:.0}k {:.1}", s.count as f64 / 1000.0, mib(s.classes)));
        print_row(services, cli.endpoints, &cells);
    }
    println!(
        "* a size class is what kpng's allocator (jemalloc) takes for an allocation: its size rounded up to one of a few sizes per power of two; the size classes above the bytes held are what allocations cost beyond themselves"
    );
    Ok(())
}
