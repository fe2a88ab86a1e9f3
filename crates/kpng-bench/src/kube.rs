//! The whole in-process pipeline against the fake API server (kube source, store, node
//! projection, runner, nftables backend on the real kernel), and the one-change scenario
//! measured on it: from the API event to the committed transaction.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_nft::{NftBackend, NftOptions};
use kpng_runner::{NodeStats, RunnerOptions, run_node};
use kpng_sources::ConvertOptions;
use kpng_sources::kube::{KINDS, KubeSource, NodeSelection};
use kpng_store::StoreStats;
use kpng_testkit::apiserver::{FakeApiServer, Resource};
use kpng_testkit::generate::{ClusterSpec, generate};
use serde_json::{Value, json};

use crate::probe::{Probe, ProbedKernel};
use crate::table::{ChangeStats, percentiles};

/// A running pipeline for node `node-0`, synced to a generated cluster.
pub(crate) struct Pipeline {
    /// The fake API server the kube source watches.
    pub(crate) server: FakeApiServer,
    /// The kernel's probe.
    pub(crate) probe: Arc<Probe>,
    /// The store's counters.
    pub(crate) store: Arc<StoreStats>,
    /// The runner's counters.
    pub(crate) node: Arc<NodeStats>,
    /// Each generated service's IPv4 slice, as served at the start.
    pub(crate) slices: Vec<Value>,
}

impl Pipeline {
    /// Serves the cluster of `spec`, starts the pipeline (no pacing between changes) and
    /// waits until the initial load is committed. Call inside a Tokio runtime.
    pub(crate) async fn start(spec: &ClusterSpec) -> anyhow::Result<Pipeline> {
        let server = FakeApiServer::start(Duration::from_secs(5)).await?;
        let objects = generate(spec);
        let slices: Vec<Value> = objects
            .iter()
            .filter(|o| o["kind"] == "EndpointSlice" && o["addressType"] == "IPv4")
            .cloned()
            .collect();
        for object in objects {
            server.apply(object);
        }
        let client = kube::Client::try_from(kube::Config::new(server.url().parse()?))?;
        let (writer, reader) = kpng_store::store(&KINDS);
        let store = reader.stats();
        let source =
            KubeSource::new(client, ConvertOptions::default(), NodeSelection::One("node-0".into()));
        tokio::spawn(source.run(writer));
        let (kernel, probe) = ProbedKernel::open()?;
        let backend = NftBackend::new(NftOptions::default(), Box::new(kernel));
        let node = Arc::new(NodeStats::default());
        let options = RunnerOptions::new("node-0");
        tokio::spawn(run_node(reader, vec![Box::new(backend)], options, node.clone(), None));
        let mut commits = probe.commits();
        tokio::time::timeout(Duration::from_secs(300), commits.wait_for(|(n, _)| *n > 0))
            .await
            .context("the initial load was not committed within 300 s")??;
        // The initial load commits in parts: wait until none came for half a second, so
        // that the first change measured does not wait for the rest of it.
        loop {
            let before = probe.transactions();
            tokio::time::sleep(Duration::from_millis(500)).await;
            if probe.transactions() == before {
                break;
            }
        }
        Ok(Pipeline { server, probe, store, node, slices })
    }

    /// Runs `event` (API calls) and waits for the next committed transaction; returns the
    /// time from the event to the end of that commit.
    async fn timed<T>(&self, event: impl FnOnce(&FakeApiServer) -> T) -> anyhow::Result<Duration> {
        let mut commits = self.probe.commits();
        let before = commits.borrow_and_update().0;
        let start = Instant::now();
        event(&self.server);
        let (_, end) =
            *tokio::time::timeout(Duration::from_secs(10), commits.wait_for(|(n, _)| *n > before))
                .await
                .context("no transaction within 10 s of the API event")??;
        Ok(end.map_or(Duration::ZERO, |end| end.saturating_duration_since(start)))
    }
}

impl Pipeline {
    /// Runs `event`, which changes nothing the node enforces, and waits until the store
    /// has received it, so that it cannot land inside a later timed change.
    async fn settled<T>(&self, event: impl FnOnce(&FakeApiServer) -> T) -> anyhow::Result<()> {
        let before = self.store.snapshot().events;
        event(&self.server);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.store.snapshot().events == before {
            anyhow::ensure!(Instant::now() < deadline, "the store did not see the event in 10 s");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        Ok(())
    }
}

/// The JSON of extra service `bench/extra-<n>` and its slice with `endpoints` endpoints.
fn extra(n: usize, endpoints: usize) -> (Value, Value) {
    let name = format!("extra-{n}");
    let service = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name, "namespace": "bench" },
        "spec": {
            "type": "ClusterIP",
            "clusterIP": format!("10.99.{}.{}", (n >> 8) & 0xff, n & 0xff),
            "ports": [{ "name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080 }],
        },
    });
    let eps: Vec<Value> = (0..endpoints).map(|j| endpoint(n * 8 + j)).collect();
    let slice = json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{name}-v4"),
            "namespace": "bench",
            "labels": { "kubernetes.io/service-name": name },
        },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "protocol": "TCP", "port": 8080 }],
        "endpoints": eps,
    });
    (service, slice)
}

/// A ready endpoint at `10.250.x.y` on node-1.
fn endpoint(n: usize) -> Value {
    json!({
        "addresses": [format!("10.250.{}.{}", (n >> 8) & 0xff, n & 0xff)],
        "conditions": { "ready": true, "serving": true, "terminating": false },
        "nodeName": "node-1",
    })
}

/// One size's results.
pub struct KubeRow {
    /// Services in the cluster.
    pub services: usize,
    /// Endpoints per service.
    pub endpoints: usize,
    /// Per kind of change: API event to committed transaction.
    pub changes: Vec<ChangeStats>,
}

/// Times `repeat` rounds of `change`, each returning its event-to-commit time.
async fn rounds<'a, F>(
    pipeline: &'a Pipeline,
    repeat: usize,
    name: &'static str,
    mut change: impl FnMut(&'a Pipeline, usize) -> F,
) -> anyhow::Result<ChangeStats>
where
    F: std::future::Future<Output = anyhow::Result<Duration>>,
{
    let mut samples = Vec::with_capacity(repeat);
    let cpu_start = crate::nft::cpu();
    for r in 0..repeat {
        samples.push(change(pipeline, r).await.with_context(|| format!("{name} #{r}"))?);
    }
    let cpu = (crate::nft::cpu() - cpu_start).as_secs_f64() * 1000.0 / repeat.max(1) as f64;
    Ok(ChangeStats { name, wall: percentiles(&mut samples), kernel: (0.0, 0.0), cpu, bytes: 0 })
}

/// Loads `services` services into the pipeline and times single changes through it.
pub fn run(services: usize, endpoints: usize, repeat: usize) -> anyhow::Result<KubeRow> {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    runtime.block_on(async {
        let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
        let pipeline = Pipeline::start(&spec).await?;
        let pick = |r: usize| (r * 7919) % services.max(1);
        let added = |p: &Pipeline, r: usize| {
            let mut slice = p.slices[pick(r)].clone();
            if let Some(eps) = slice["endpoints"].as_array_mut() {
                eps.push(endpoint(50_000 + r));
            }
            slice
        };
        let mut changes = Vec::new();
        changes.push(
            rounds(&pipeline, repeat, "endpoint add", |p, r| async move {
                p.timed(|s| s.apply(added(p, r))).await
            })
            .await?,
        );
        changes.push(
            rounds(&pipeline, repeat, "endpoint remove", |p, r| async move {
                p.timed(|s| s.apply(p.slices[pick(r)].clone())).await
            })
            .await?,
        );
        // The slice first: alone it changes nothing the node enforces, so the service's
        // event is the one whose commit is timed, and it carries the endpoints.
        changes.push(
            rounds(&pipeline, repeat, "service add", |p, r| async move {
                let (service, slice) = extra(r, endpoints);
                p.settled(|s| s.apply(slice)).await?;
                p.timed(|s| s.apply(service)).await
            })
            .await?,
        );
        changes.push(
            rounds(&pipeline, repeat, "service delete", |p, r| async move {
                let name = format!("extra-{r}");
                let time = p.timed(|s| s.delete(Resource::Services, "bench", &name)).await?;
                let slice = format!("{name}-v4");
                p.settled(|s| s.delete(Resource::EndpointSlices, "bench", &slice)).await?;
                Ok(time)
            })
            .await?,
        );
        Ok(KubeRow { services, endpoints, changes })
    })
}

/// Prints the one-change table through the kube source.
pub fn print(rows: &[KubeRow]) {
    println!(
        "one change through the kube source: API event -> watch -> store -> node state -> committed transaction"
    );
    println!(
        "{:>8} {:>4} | {:<16} {:>8} {:>8} {:>8} {:>8}",
        "services", "eps", "change", "p50(ms)", "p99(ms)", "max(ms)", "cpu(ms)*"
    );
    for row in rows {
        for change in &row.changes {
            let (p50, p99, max) = change.wall;
            println!(
                "{:>8} {:>4} | {:<16} {:>8.3} {:>8.3} {:>8.3} {:>8.3}",
                row.services, row.endpoints, change.name, p50, p99, max, change.cpu
            );
        }
    }
    println!("* per change, for the whole bench process: the fake API server included");
}
