//! The iptables backend scenario: `to-iptables` on the real kernel (the system's iptables
//! variant), cold start and one change at a time, next to kube-proxy's full
//! `iptables-restore` of the same cluster and `to-nft`'s p50 for the same change.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_iptables::{CommandKernel, IptablesBackend, IptablesOptions, Mode};
use kpng_local::NodeProjector;
use kpng_model::{Changes, GlobalModel, Object, Touched};
use kpng_runner::{Backend, ChangeSet};
use kpng_testkit::generate::ClusterSpec;

use crate::cluster;
use crate::table::{NftRow, percentiles};

/// One kind of change's timings.
pub struct IptChange {
    /// What changed.
    pub name: &'static str,
    /// Model update to the last restore's exit: p50, p99, max (ms).
    pub wall: (f64, f64, f64),
    /// CPU per change, kpng and the iptables-restore it ran (ms).
    pub cpu: f64,
    /// Chains written or deleted per change (median).
    pub chains: u64,
}

/// One size's results.
pub struct IptRow {
    /// Services.
    pub services: usize,
    /// Endpoints per service.
    pub endpoints: usize,
    /// kpng's chains (both families, both tables).
    pub chains: usize,
    /// Cold start over empty tables (ms).
    pub cold_ms: f64,
    /// Per kind of change.
    pub changes: Vec<IptChange>,
    /// kube-proxy's whole nat table through one iptables-restore (ms, median).
    pub full_ms: Option<f64>,
}

fn cpu_with_children() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let of = |who| {
        getrusage(who)
            .map(|u| {
                let d = |t: nix::sys::time::TimeVal| {
                    Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000)
                };
                d(u.user_time()) + d(u.system_time())
            })
            .unwrap_or_default()
    };
    of(UsageWho::RUSAGE_SELF) + of(UsageWho::RUSAGE_CHILDREN)
}

struct Bench {
    model: GlobalModel,
    projector: NodeProjector,
    backend: IptablesBackend,
}

impl Bench {
    fn change(&mut self, touched: BTreeSet<Touched>) -> anyhow::Result<()> {
        let ops = self.projector.update(&self.model, &Changes::Touched(touched));
        if !ops.is_empty() {
            self.backend.apply(&ChangeSet::changes(&ops, self.projector.state()))?;
        }
        Ok(())
    }

    fn written(&self) -> u64 {
        // Chains written or deleted (jumps from built-in chains are written at the start).
        self.backend.template_stats().writes.load(std::sync::atomic::Ordering::Relaxed)
    }
}

fn measure(
    bench: &mut Bench,
    repeat: usize,
    name: &'static str,
    mut step: impl FnMut(&mut Bench, usize) -> anyhow::Result<()>,
) -> anyhow::Result<IptChange> {
    let (mut wall, mut chains) = (Vec::new(), Vec::new());
    let cpu_start = cpu_with_children();
    for r in 0..repeat {
        let before = bench.written();
        let start = Instant::now();
        step(bench, r)?;
        wall.push(start.elapsed());
        chains.push(bench.written() - before);
    }
    let cpu = (cpu_with_children() - cpu_start).as_secs_f64() * 1000.0 / repeat.max(1) as f64;
    chains.sort_unstable();
    let chains = chains.get(chains.len() / 2).copied().unwrap_or(0);
    Ok(IptChange { name, wall: percentiles(&mut wall), cpu, chains })
}

/// Loads a generated cluster into `to-iptables`, then times single changes.
pub fn run(
    services: usize,
    endpoints: usize,
    repeat: usize,
    reloads: usize,
) -> anyhow::Result<IptRow> {
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let (model, projector) = cluster::projected(&spec)?;
    // Alone in the namespace: earlier scenarios' tables and chains go first.
    kpng_nft::kernel::cleanup().context("removing earlier nftables tables")?;
    kpng_iptables::kernel::cleanup(Mode::Auto).context("removing earlier chains")?;
    let kernel = CommandKernel::new(Mode::Auto).context("iptables")?;
    let mut backend = IptablesBackend::new(IptablesOptions::default(), Box::new(kernel));
    let start = Instant::now();
    backend.apply(&ChangeSet::full(projector.state())).context("cold start")?;
    let cold_ms = start.elapsed().as_secs_f64() * 1000.0;
    let mut bench = Bench { model, projector, backend };

    let pick = |r: usize| (r * 7919) % services.max(1);
    let mut changes = Vec::new();
    changes.push(measure(&mut bench, repeat, "endpoint add", |b, r| {
        let mut slice = cluster::slice_of(&b.model, pick(r));
        cluster::push_endpoint(&mut slice, cluster::extra_endpoint(r, "node-1"));
        let touched = cluster::apply(&mut b.model, Object::EndpointSlice(slice));
        b.change(touched)
    })?);
    changes.push(measure(&mut bench, repeat, "endpoint remove", |b, r| {
        let mut slice = cluster::slice_of(&b.model, pick(r));
        cluster::pop_endpoint(&mut slice);
        let touched = cluster::apply(&mut b.model, Object::EndpointSlice(slice));
        b.change(touched)
    })?);
    changes.push(measure(&mut bench, repeat, "service add", |b, r| {
        let (service, slice) = cluster::extra_service(&b.model, r, endpoints);
        let mut touched = cluster::apply(&mut b.model, service);
        touched.extend(cluster::apply(&mut b.model, slice));
        b.change(touched)
    })?);
    changes.push(measure(&mut bench, repeat, "service delete", |b, r| {
        let (service, slice) = cluster::extra_service(&b.model, r, endpoints);
        let mut touched = cluster::delete(&mut b.model, &slice.object_ref());
        touched.extend(cluster::delete(&mut b.model, &service.object_ref()));
        b.change(touched)
    })?);
    // A change set that changes nothing runs nothing.
    let before = bench.backend.stats().restores.load(std::sync::atomic::Ordering::Relaxed);
    bench.backend.apply(&ChangeSet::changes(&[], bench.projector.state()))?;
    let after = bench.backend.stats().restores.load(std::sync::atomic::Ordering::Relaxed);
    anyhow::ensure!(before == after, "a change set without changes ran iptables-restore");

    let chains = bench.backend.held().len();
    crate::dataplane::clear().context("removing the chains")?;
    let full_ms =
        crate::iptables::restore(&crate::iptables::ruleset(bench.projector.state()), reloads)?;
    Ok(IptRow { services, endpoints, chains, cold_ms, changes, full_ms })
}

/// Prints the table, with `to-nft`'s p50 for the same size and change when it ran.
pub fn print(rows: &[IptRow], nft: &[NftRow]) {
    println!(
        "iptables backend (to-iptables: one iptables-restore --noflush per family and change)"
    );
    println!(
        "{:>8} {:>4} {:>7} {:>10} | {:<16} {:>8} {:>8} {:>8} {:>8} {:>7} | {:>10} {:>10} | {:>8} {:>9}",
        "services",
        "eps",
        "chains",
        "cold(ms)",
        "change",
        "p50(ms)",
        "p99(ms)",
        "max(ms)",
        "cpu(ms)*",
        "chains",
        "full(ms)",
        "full/p50",
        "nft p50",
        "ipt/nft"
    );
    for row in rows {
        for change in &row.changes {
            let (p50, p99, max) = change.wall;
            let nft_p50 = nft
                .iter()
                .filter(|n| n.services == row.services && n.endpoints == row.endpoints)
                .flat_map(|n| &n.changes)
                .find(|c| c.name == change.name)
                .map(|c| c.wall.0);
            println!(
                "{:>8} {:>4} {:>7} {:>10.1} | {:<16} {:>8.3} {:>8.3} {:>8.3} {:>8.3} {:>7} | {:>10} {:>10} | {:>8} {:>9}",
                row.services,
                row.endpoints,
                row.chains,
                row.cold_ms,
                change.name,
                p50,
                p99,
                max,
                change.cpu,
                change.chains,
                row.full_ms.map_or("n/a".into(), |ms| format!("{ms:.1}")),
                row.full_ms
                    .filter(|_| p50 > 0.0)
                    .map_or("n/a".into(), |ms| format!("{:.0}", ms / p50)),
                nft_p50.map_or("n/a".into(), |ms| format!("{ms:.3}")),
                nft_p50.filter(|n| *n > 0.0).map_or("n/a".into(), |n| format!("{:.0}", p50 / n)),
            );
        }
    }
    println!(
        "* per change, kpng and the iptables-restore it runs; chains: written or deleted per change (median); full: kube-proxy's whole nat table through iptables-restore, as its every sync; nft p50: to-nft's same change in this run"
    );
}
