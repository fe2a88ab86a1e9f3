//! The nftables scenario.

use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_local::NodeProjector;
use kpng_model::{Changes, GlobalModel, Object, Touched};
use kpng_nft::entry::LayoutName;
use kpng_nft::{NftBackend, NftOptions};
use kpng_runner::{Backend, ChangeSet};
use kpng_testkit::generate::ClusterSpec;

use crate::cluster;
use crate::probe::{Probe, ProbedKernel};
use crate::table::{ChangeStats, NftRow, percentiles};

pub(crate) fn cpu() -> Duration {
    nix::sys::resource::getrusage(nix::sys::resource::UsageWho::RUSAGE_SELF)
        .map(|u| {
            let d = |t: nix::sys::time::TimeVal| {
                Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000)
            };
            d(u.user_time()) + d(u.system_time())
        })
        .unwrap_or_default()
}

/// The cold start of a bench: the whole table in one transaction.
pub(crate) struct Cold {
    /// Node state to committed transaction (ms).
    pub(crate) total_ms: f64,
    /// The kernel's commits alone, every part of a streamed start summed (ms); on a
    /// second thread, they overlap the rendering.
    pub(crate) kernel_ms: f64,
    /// Netlink bytes of every part.
    pub(crate) bytes: u64,
}

/// A generated cluster loaded into the nftables backend on the real kernel, for node
/// `node-0`.
pub(crate) struct Bench {
    pub(crate) model: GlobalModel,
    projector: NodeProjector,
    backend: NftBackend,
    probe: Arc<Probe>,
}

impl Bench {
    /// Generates the cluster of `spec` and loads it into fresh tables in one transaction.
    /// Returns the bench and the cold start's costs.
    pub(crate) fn load(spec: &ClusterSpec) -> anyhow::Result<(Bench, Cold)> {
        let mut model = GlobalModel::new();
        for object in cluster::objects(spec)? {
            model.apply(object);
        }
        let mut projector = NodeProjector::new("node-0");
        projector.update(&model, &Changes::All);
        // A cold start: no table left by an earlier scenario.
        kpng_nft::kernel::cleanup().context("removing earlier tables")?;
        let (kernel, probe) = ProbedKernel::open()?;
        let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel));
        let start = Instant::now();
        backend.apply(&ChangeSet::full(projector.state())).context("cold start")?;
        // Every part of a streamed cold start: the kernel's share is their sum.
        let (kernel, bytes) = probe.committed_so_far();
        let cold = Cold {
            total_ms: start.elapsed().as_secs_f64() * 1000.0,
            kernel_ms: kernel.as_secs_f64() * 1000.0,
            bytes,
        };
        Ok((Bench { model, projector, backend, probe }, cold))
    }

    /// Elements the backend holds.
    pub(crate) fn elements(&self) -> usize {
        self.backend.element_count()
    }

    /// Applies one model change and pushes the resulting change set to the backend.
    pub(crate) fn change(
        &mut self,
        touched: std::collections::BTreeSet<Touched>,
    ) -> anyhow::Result<Option<Commit>> {
        self.probe.reset_last();
        let ops = self.projector.update(&self.model, &Changes::Touched(touched));
        if ops.is_empty() {
            return Ok(None);
        }
        self.backend.apply(&ChangeSet::changes(&ops, self.projector.state()))?;
        Ok(Some(Commit { kernel: self.probe.last_commit(), bytes: self.probe.last_bytes() }))
    }
}

/// What one change cost the kernel.
pub(crate) struct Commit {
    /// The commit alone.
    kernel: Duration,
    /// Netlink bytes sent.
    bytes: u64,
}

/// Times `repeat` rounds of `step`, returning wall times, kernel times and CPU per round.
pub(crate) fn measure(
    bench: &mut Bench,
    repeat: usize,
    name: &'static str,
    mut step: impl FnMut(&mut Bench, usize) -> anyhow::Result<Option<Commit>>,
) -> anyhow::Result<ChangeStats> {
    let (mut wall, mut kernel, mut bytes) = (Vec::new(), Vec::new(), Vec::new());
    let cpu_start = cpu();
    for r in 0..repeat {
        let start = Instant::now();
        let commit = step(bench, r)?;
        wall.push(start.elapsed());
        if let Some(commit) = commit {
            kernel.push(commit.kernel);
            bytes.push(commit.bytes);
        }
    }
    let cpu_per = (cpu() - cpu_start).as_secs_f64() * 1000.0 / repeat.max(1) as f64;
    let (k50, k99, _) = percentiles(&mut kernel);
    bytes.sort_unstable();
    let bytes = bytes.get(bytes.len() / 2).copied().unwrap_or(0);
    Ok(ChangeStats { name, wall: percentiles(&mut wall), kernel: (k50, k99), cpu: cpu_per, bytes })
}

/// Builds the cluster, loads it, and measures single changes and the full reload.
pub fn run(
    services: usize,
    endpoints: usize,
    repeat: usize,
    reloads: usize,
) -> anyhow::Result<NftRow> {
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let (mut bench, cold) = Bench::load(&spec)?;

    let mut changes = Vec::new();
    let pick = |r: usize| (r * 7919) % services.max(1);
    let add = measure(&mut bench, repeat, "endpoint add", |b, r| {
        let mut slice = cluster::slice_of(&b.model, pick(r));
        cluster::push_endpoint(&mut slice, cluster::extra_endpoint(r, "node-1"));
        let touched = cluster::apply(&mut b.model, Object::EndpointSlice(slice));
        b.change(touched)
    })?;
    changes.push(add);
    let remove = measure(&mut bench, repeat, "endpoint remove", |b, r| {
        let mut slice = cluster::slice_of(&b.model, pick(r));
        cluster::pop_endpoint(&mut slice);
        let touched = cluster::apply(&mut b.model, Object::EndpointSlice(slice));
        b.change(touched)
    })?;
    changes.push(remove);
    let replace = measure(&mut bench, repeat, "endpoint replace", |b, r| {
        let mut slice = cluster::slice_of(&b.model, pick(r));
        if let Some(last) = slice.endpoints.last_mut() {
            *last = cluster::extra_endpoint(r + 40_000, "node-1");
        }
        let touched = cluster::apply(&mut b.model, Object::EndpointSlice(slice));
        b.change(touched)
    })?;
    changes.push(replace);
    changes.push(measure(&mut bench, repeat, "service add", |b, r| b.add_service(r, endpoints))?);
    let delete = |b: &mut Bench, r| b.delete_service(r, endpoints);
    changes.push(measure(&mut bench, repeat, "service delete", delete)?);

    let elements = bench.backend.element_count();
    let chains = bench.backend.chains();
    // Counts beyond the pick tree: one rule each in the counts chains.
    let rules = (chains.iter())
        .filter(|(name, _)| matches!(name, LayoutName::Chain(_, c) if c.ends_with("_counts")))
        .map(|(_, rules)| rules)
        .sum();
    let chains = chains.len();
    let reload_ms = full_reload(&bench, reloads)?;
    // kube-proxy's iptables-restore of the same cluster, for comparison (none without
    // reloads: at 30,000 services one takes most of a minute).
    let iptables_ms = match reloads {
        0 => None,
        _ => crate::iptables::restore(&crate::iptables::ruleset(bench.projector.state()), reloads)?,
    };
    Ok(NftRow {
        services,
        endpoints,
        elements,
        chains,
        large_counts: rules,
        cold_start_ms: cold.total_ms,
        cold_kernel_ms: cold.kernel_ms,
        cold_bytes: cold.bytes,
        changes,
        reload_ms,
        iptables_ms,
    })
}

impl Bench {
    /// Adds the extra service `bench/extra-<n>` with `endpoints` endpoints.
    pub(crate) fn add_service(
        &mut self,
        n: usize,
        endpoints: usize,
    ) -> anyhow::Result<Option<Commit>> {
        let (service, slice) = cluster::extra_service(&self.model, n, endpoints);
        let mut touched = cluster::apply(&mut self.model, service);
        touched.extend(cluster::apply(&mut self.model, slice));
        self.change(touched)
    }

    /// Deletes the extra service `bench/extra-<n>` and its slice.
    pub(crate) fn delete_service(
        &mut self,
        n: usize,
        endpoints: usize,
    ) -> anyhow::Result<Option<Commit>> {
        let (service, slice) = cluster::extra_service(&self.model, n, endpoints);
        let mut touched = cluster::delete(&mut self.model, &slice.object_ref());
        touched.extend(cluster::delete(&mut self.model, &service.object_ref()));
        self.change(touched)
    }
}

/// Median time of replacing both tables with the whole ruleset through `nft -f`.
fn full_reload(bench: &Bench, reloads: usize) -> anyhow::Result<f64> {
    let ruleset = bench.backend.ruleset();
    let text = format!("delete table ip kpng\ndelete table ip6 kpng\n{ruleset}");
    let path = std::env::temp_dir().join(format!("kpng-bench-{}.nft", std::process::id()));
    std::fs::write(&path, text)?;
    let mut times = Vec::new();
    for _ in 0..reloads {
        let start = Instant::now();
        let out = Command::new("nft")
            .arg("-f")
            .arg(&path)
            .stdout(Stdio::null())
            .output()
            .context("running nft")?;
        anyhow::ensure!(
            out.status.success(),
            "nft -f failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        times.push(start.elapsed());
    }
    let _ = std::fs::remove_file(&path);
    Ok(percentiles(&mut times).0)
}
