//! nftlb side by side: the Debian package's daemon, started in the bench's namespace with a
//! random key and driven through its REST API the way kube-nftlb drives it (one farm per
//! service port, mode `snat`, scheduler `rr`, `intra-connect` on, one backend per endpoint
//! named after its pod), against kpng's nftables backend for the same cluster and the same
//! operations. Every nftlb call returns once nftlb has applied it to the kernel.
//!
//! Kept in one file on purpose: the nftlb client, the scenario and its table are one
//! benchmark.

use std::collections::BTreeSet;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_local::NodeProjector;
use kpng_model::global::{EndpointSlice, LoadBalancing, Scheduler, Service};
use kpng_model::{Changes, Family, GlobalModel, Object};
use kpng_nftlb::{NftListing, NftlbBackend};
use kpng_runner::{Backend, ChangeSet};
use kpng_testkit::generate::ClusterSpec;
use serde::Serialize;

use crate::cluster;
use crate::nft::{Bench, measure};
use crate::table::percentiles;

/// What nftlb 1.0.7 holds: later farms are answered with success but never reach the
/// kernel. Of 1,200 farms of 4 backends, 1,024 did (4,096 backends), sent in one request or
/// in parts; which of the two counts is the limit is not known.
const MAX_FARMS: usize = 1024;
/// See [`MAX_FARMS`].
const MAX_BACKENDS: usize = 4096;

/// One operation, timed on both sides: p50, p99, max (ms).
pub struct OpRow {
    /// What was done.
    pub name: String,
    /// nftlb's times.
    pub nftlb: (f64, f64, f64),
    /// kpng's times (`to-nft`, services without annotations).
    pub kpng: (f64, f64, f64),
    /// `to-nft` with the service annotated as the nftlb farms are (`scheduler: rr`), for the
    /// operations on annotated services.
    pub annotated: Option<(f64, f64, f64)>,
    /// `to-nftlb` driving its own nftlb daemon (`None` where its farms would not fit).
    pub to_nftlb: Option<(f64, f64, f64)>,
}

/// The results at one cluster size.
pub struct NftlbRow {
    /// Services in the cluster.
    pub services: usize,
    /// Endpoints per service.
    pub endpoints: usize,
    /// Per operation.
    pub ops: Vec<OpRow>,
}

/// The nftlb daemon, stopped and its tables removed on drop.
struct Nftlb {
    child: Child,
    client: kpng_nftlb::Client,
    url: String,
    key: String,
}

impl Nftlb {
    /// Starts `nftlb` on a free loopback port with a random key and waits for its API.
    fn start() -> anyhow::Result<Nftlb> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let mut bytes = [0u8; 16];
        std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        let key: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        let child = Command::new("nftlb")
            .args(["-H", "127.0.0.1", "-P", &port.to_string(), "-l", "0", "-L", "0"])
            .env("NFTLB_SERVER_KEY", &key)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("cannot run nftlb (install the Debian package nftlb, or skip this scenario with --nftlb-services 0)")?;
        let url = format!("http://127.0.0.1:{port}");
        let client = kpng_nftlb::Client::new(&url, &key)?;
        let mut nftlb = Nftlb { child, client, url, key };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match nftlb.call("GET", "/farms", "") {
                Ok(_) => return Ok(nftlb),
                Err(e) if Instant::now() > deadline => {
                    return Err(e.context("nftlb's API did not come up within 10 s"));
                }
                Err(_) => {
                    if let Some(status) = nftlb.child.try_wait()? {
                        anyhow::bail!("nftlb exited at start: {status}");
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }

    /// One API call; returns the response body once nftlb has answered 200.
    fn call(&self, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
        Ok(self.client.call(method, path, body)?)
    }

    /// Creates or extends farms.
    fn post(&self, farms: Vec<Farm>) -> anyhow::Result<()> {
        // Serialized from structs, not a JSON value, to keep the keys in nftlb's order.
        #[derive(Serialize)]
        struct Farms {
            farms: Vec<Farm>,
        }
        self.call("POST", "/farms", &serde_json::to_string(&Farms { farms })?).map(drop)
    }
}

impl Nftlb {
    /// Checks that the kernel holds every virtual address: nftlb's answer is not taken on
    /// trust.
    fn check_loaded(&self, vips: &[String]) -> anyhow::Result<()> {
        let out = Command::new("nft").args(["list", "table", "ip", "nftlb"]).output()?;
        anyhow::ensure!(out.status.success(), "nftlb made no ip nftlb table");
        let listing = String::from_utf8_lossy(&out.stdout);
        let missing: Vec<&String> =
            vips.iter().filter(|vip| !listing.contains(&format!(" {vip} "))).collect();
        anyhow::ensure!(
            missing.is_empty(),
            "{} of {} virtual addresses not in the kernel, first {:?}",
            missing.len(),
            vips.len(),
            &missing[..missing.len().min(5)]
        );
        Ok(())
    }
}

impl Drop for Nftlb {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        for family in ["ip", "ip6", "netdev"] {
            let _ = Command::new("nft")
                .args(["delete", "table", family, "nftlb"])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// A farm as nftlb's API takes it. nftlb reads keys in order: the name must come first.
#[derive(Serialize, Clone)]
#[serde(rename_all = "kebab-case")]
struct Farm {
    name: String,
    #[serde(flatten)]
    vip: Option<FarmVip>,
    backends: Vec<FarmBackend>,
}

/// What a new farm needs besides its name and backends.
#[derive(Serialize, Clone)]
#[serde(rename_all = "kebab-case")]
struct FarmVip {
    family: &'static str,
    virtual_addr: String,
    virtual_ports: String,
    mode: &'static str,
    protocol: String,
    scheduler: &'static str,
    intra_connect: &'static str,
    state: &'static str,
}

/// One backend of a farm.
#[derive(Serialize, Clone)]
#[serde(rename_all = "kebab-case")]
struct FarmBackend {
    name: String,
    ip_addr: String,
    port: String,
    state: &'static str,
}

/// The farms kube-nftlb would make for `service`: one per port, on its IPv4 cluster IP, with
/// one backend per endpoint of its IPv4 slices.
fn farms(service: &Service, slices: &[&EndpointSlice]) -> Vec<Farm> {
    let Some(vip) = service.cluster_ip(Family::V4) else { return Vec::new() };
    service
        .ports
        .iter()
        .map(|port| {
            let mut backends = Vec::new();
            for slice in slices.iter().filter(|s| s.family == Family::V4) {
                let Some(target) =
                    slice.ports.iter().find(|p| p.name == port.name && p.protocol == port.protocol)
                else {
                    continue;
                };
                for (i, ep) in slice.endpoints.iter().enumerate() {
                    backends.push(FarmBackend {
                        name: ep
                            .pod_name
                            .as_ref()
                            .map_or_else(|| format!("{}-{i}", slice.key.name), ToString::to_string),
                        ip_addr: ep.address.to_string(),
                        port: target.port.to_string(),
                        state: "up",
                    });
                }
            }
            Farm {
                name: farm_name(service, &port.name),
                vip: Some(FarmVip {
                    family: "ipv4",
                    virtual_addr: vip.to_string(),
                    virtual_ports: port.port.to_string(),
                    mode: "snat",
                    protocol: port.protocol.as_str().to_ascii_lowercase(),
                    scheduler: "rr",
                    intra_connect: "on",
                    state: "up",
                }),
                backends,
            }
        })
        .collect()
}

fn farm_name(service: &Service, port: &str) -> String {
    format!("{}--{}--{port}", service.key.namespace(), service.key.name())
}

/// The farms of the extra service `n` with `endpoints` endpoints, as kpng's bench adds it.
fn extra_farms(bench: &Bench, n: usize, endpoints: usize) -> Vec<Farm> {
    let (Object::Service(service), Object::EndpointSlice(slice)) =
        cluster::extra_service(&bench.model, n, endpoints)
    else {
        unreachable!("extra_service returns a service and its slice")
    };
    farms(&service, &[&slice])
}

/// Times `repeat` rounds of an nftlb operation.
fn time(
    repeat: usize,
    mut step: impl FnMut(usize) -> anyhow::Result<()>,
) -> anyhow::Result<(f64, f64, f64)> {
    let mut samples = Vec::with_capacity(repeat);
    for r in 0..repeat {
        let start = Instant::now();
        step(r)?;
        samples.push(start.elapsed());
    }
    Ok(percentiles(&mut samples))
}

/// The settings the operations' services are annotated with for `to-nft` and `to-nftlb`:
/// round robin, as the farms kube-nftlb makes.
fn round_robin() -> LoadBalancing {
    LoadBalancing { scheduler: Some(Scheduler::RoundRobin), ..LoadBalancing::default() }
}

/// The extra service `bench/extra-<n>` (as [`cluster::extra_service`]) annotated with
/// [`round_robin`].
fn annotated_service(model: &GlobalModel, n: usize, endpoints: usize) -> (Object, Object) {
    let (mut service, slice) = cluster::extra_service(model, n, endpoints);
    if let Object::Service(s) = &mut service {
        s.load_balancing = round_robin();
    }
    (service, slice)
}

/// Loads the same generated cluster into nftlb and into kpng, then creates and deletes a
/// service of 10, 50 and 100 endpoints and adds and removes one endpoint, `repeat` times
/// each: on nftlb driven directly, on `to-nftlb` driving a fresh nftlb, and on `to-nft`
/// (creates and deletes also with the service annotated as the farms are).
pub fn run(services: usize, endpoints: usize, repeat: usize) -> anyhow::Result<NftlbRow> {
    const SIZES: [usize; 3] = [10, 50, 100];
    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let (mut bench, cold) = Bench::load(&spec)?;
    // One endpoint added to, then removed from, existing services.
    let pick = |r: usize| (r * 7919) % services.max(1);
    let targets: Vec<_> = (0..repeat)
        .map(|r| {
            let slice = cluster::slice_of(&bench.model, pick(r));
            let service =
                bench.model.service(&slice.service_key()).cloned().expect("generated service");
            (service, slice)
        })
        .collect();
    let added = |r: usize| cluster::extra_endpoint(60_000 + r, "node-1");

    // kpng first, before nftlb runs: nftlb's daemon must not share the cores meanwhile.
    let mut kpng = vec![(cold.total_ms, cold.total_ms, cold.total_ms)];
    for size in SIZES {
        // Distinct services per size, so no create meets a leftover of another.
        let base = size * 1000;
        kpng.push(
            measure(&mut bench, repeat, "create", |b, r| b.add_service(base + r, size))?.wall,
        );
        let delete = |b: &mut Bench, r| b.delete_service(base + r, size);
        kpng.push(measure(&mut bench, repeat, "delete", delete)?.wall);
    }
    let add = measure(&mut bench, repeat, "endpoint add", |b, r| {
        let mut slice = targets[r].1.clone();
        crate::cluster::push_endpoint(&mut slice, added(r));
        let touched = cluster::apply(&mut b.model, Object::EndpointSlice(slice));
        b.change(touched)
    })?;
    kpng.push(add.wall);
    let remove = measure(&mut bench, repeat, "endpoint remove", |b, r| {
        let touched = cluster::apply(&mut b.model, Object::EndpointSlice(targets[r].1.clone()));
        b.change(touched)
    })?;
    kpng.push(remove.wall);
    let mut annotated = vec![None];
    for size in SIZES {
        let base = size * 1000 + 500;
        let create = measure(&mut bench, repeat, "create", |b, r| {
            let (service, slice) = annotated_service(&b.model, base + r, size);
            let mut touched = cluster::apply(&mut b.model, service);
            touched.extend(cluster::apply(&mut b.model, slice));
            b.change(touched)
        })?;
        annotated.push(Some(create.wall));
        let delete =
            measure(&mut bench, repeat, "delete", |b, r| b.delete_service(base + r, size))?;
        annotated.push(Some(delete.wall));
    }
    annotated.extend([None, None]);
    let backend = through_to_nftlb(&mut bench, repeat, &targets, &added)?;

    let all: Vec<Farm> = bench
        .model
        .services()
        .flat_map(|s| farms(s, &bench.model.slices_of(&s.key).collect::<Vec<_>>()))
        .collect();
    let backends: usize = all.iter().map(|f| f.backends.len()).sum();
    anyhow::ensure!(
        all.len() < MAX_FARMS && backends + 100 <= MAX_BACKENDS,
        "{services} services need {} nftlb farms with {backends} backends, and nftlb holds no \
         more than {MAX_FARMS} farms or {MAX_BACKENDS} backends (with the operations' 100 more): \
         use a smaller --nftlb-services",
        all.len()
    );
    let vips: Vec<String> =
        all.iter().filter_map(|f| f.vip.as_ref()).map(|v| v.virtual_addr.clone()).collect();
    let nftlb = Nftlb::start()?;
    let start = Instant::now();
    // In parts, as a controller would send them.
    for part in all.chunks(500) {
        nftlb.post(part.to_vec()).context("loading the cluster into nftlb")?;
    }
    let load_ms = start.elapsed().as_secs_f64() * 1000.0;
    nftlb.check_loaded(&vips).context("after loading the cluster into nftlb")?;
    let mut names = vec![format!("load {services} services")];
    let mut theirs = vec![(load_ms, load_ms, load_ms)];
    for size in SIZES {
        let base = size * 1000;
        theirs.push(time(repeat, |r| nftlb.post(extra_farms(&bench, base + r, size)))?);
        theirs.push(time(repeat, |r| {
            for farm in extra_farms(&bench, base + r, size) {
                nftlb.call("DELETE", &format!("/farms/{}", farm.name), "")?;
            }
            Ok(())
        })?);
        names.push(format!("create svc, {size} eps"));
        names.push(format!("delete svc, {size} eps"));
    }
    theirs.push(time(repeat, |r| {
        let (service, slice) = &targets[r];
        let mut slice = slice.clone();
        slice.endpoints = Box::from([added(r)]);
        slice.endpoints[0].pod_name = Some(format!("bench-added-{r}").into());
        let farm = farms(service, &[&slice]).swap_remove(0);
        nftlb.post(vec![Farm { vip: None, ..farm }])
    })?);
    theirs.push(time(repeat, |r| {
        let farm = farm_name(&targets[r].0, &targets[r].0.ports[0].name);
        nftlb.call("DELETE", &format!("/farms/{farm}/backends/bench-added-{r}"), "").map(drop)
    })?);
    names.extend(["endpoint add".to_string(), "endpoint remove".to_string()]);
    drop(nftlb);
    let rows = names.len();
    let ops = names
        .into_iter()
        .zip(theirs)
        .zip(kpng)
        .zip(annotated)
        .zip(backend.map_or_else(|| vec![None; rows], |b| b.into_iter().map(Some).collect()))
        .map(|((((name, nftlb), kpng), annotated), to_nftlb)| OpRow {
            name,
            nftlb,
            kpng,
            annotated,
            to_nftlb,
        })
        .collect();
    Ok(NftlbRow { services, endpoints, ops })
}

/// The same operations through `to-nftlb`, on a fresh nftlb daemon: the cluster loaded in
/// one full sync, then each change projected to the node state and applied (each apply
/// returns once nftlb answered and the kernel was read back).
fn through_to_nftlb(
    bench: &mut Bench,
    repeat: usize,
    targets: &[(Service, EndpointSlice)],
    added: &dyn Fn(usize) -> kpng_model::global::Endpoint,
) -> anyhow::Result<Option<Vec<(f64, f64, f64)>>> {
    let mut projector = NodeProjector::new("node-0");
    projector.update(&bench.model, &Changes::All);
    // kpng makes a farm per port and family (kube-nftlb IPv4 only): more than nftlb holds
    // at the larger sizes, and to-nftlb would rightly refuse to go on.
    let state = projector.state();
    let farms: Vec<_> =
        state.services.values().flat_map(|s| kpng_nftlb::farm::farms_of(s, false)).collect();
    let backends: usize = farms.iter().map(|f| f.backends.len()).sum();
    if farms.len() + 100 > MAX_FARMS || backends + 1000 > MAX_BACKENDS {
        eprintln!(
            "to-nftlb skipped at {} services: {} farms of {backends} backends, more than nftlb \
             installs",
            state.services.len(),
            farms.len()
        );
        return Ok(None);
    }
    let nftlb = Nftlb::start()?;
    let client = kpng_nftlb::Client::new(&nftlb.url, &nftlb.key)?;
    let mut backend = NftlbBackend::new(Box::new(client), Box::new(NftListing));
    let start = Instant::now();
    backend.apply(&ChangeSet::full(projector.state())).context("to-nftlb's first sync")?;
    let load_ms = start.elapsed().as_secs_f64() * 1000.0;
    let mut times = vec![(load_ms, load_ms, load_ms)];
    let mut apply = |model: &mut GlobalModel, objects: Vec<Change>| -> anyhow::Result<()> {
        let mut touched = BTreeSet::new();
        for object in objects {
            touched.extend(match object {
                Change::Set(object) => cluster::apply(model, object),
                Change::Delete(object) => cluster::delete(model, &object),
            });
        }
        let ops = projector.update(model, &Changes::Touched(touched));
        backend.apply(&ChangeSet::changes(&ops, projector.state())).context("to-nftlb")?;
        Ok(())
    };
    for size in [10, 50, 100] {
        let base = size * 1000 + 700;
        let model = &mut bench.model;
        times.push(time(repeat, |r| {
            let (service, slice) = annotated_service(model, base + r, size);
            apply(model, vec![Change::Set(service), Change::Set(slice)])
        })?);
        times.push(time(repeat, |r| {
            let (service, slice) = annotated_service(model, base + r, size);
            apply(
                model,
                vec![Change::Delete(slice.object_ref()), Change::Delete(service.object_ref())],
            )
        })?);
    }
    let model = &mut bench.model;
    times.push(time(repeat, |r| {
        let mut slice = targets[r].1.clone();
        crate::cluster::push_endpoint(&mut slice, added(r));
        apply(model, vec![Change::Set(Object::EndpointSlice(slice))])
    })?);
    times.push(time(repeat, |r| {
        apply(model, vec![Change::Set(Object::EndpointSlice(targets[r].1.clone()))])
    })?);
    Ok(Some(times))
}

/// A model change of the to-nftlb scenario.
enum Change {
    Set(Object),
    Delete(kpng_model::global::ObjectRef),
}

/// Prints the nftlb table.
pub fn print(rows: &[NftlbRow]) {
    println!(
        "nftlb: nftlb's REST API driven directly (farms as kube-nftlb makes them, scheduler rr), \
         to-nftlb driving nftlb, and to-nft (plain, and annotated scheduler: rr); same cluster, \
         same operations"
    );
    println!(
        "{:>8} {:>4} | {:<22} | {:>9} {:>9} | {:>9} {:>9} | {:>9} {:>9} | {:>9} {:>9} | {:>11} {:>11}",
        "services",
        "eps",
        "operation",
        "nftlb p50",
        "p99",
        "to-nftlb",
        "p99",
        "to-nft",
        "p99",
        "annotated",
        "p99",
        "nftlb/ann.",
        "to-nftlb/ann."
    );
    let ms = |v: f64| format!("{v:.3}");
    let ratio = |a: f64, b: f64| if b > 0.0 { format!("{:.0}", a / b) } else { "-".into() };
    for row in rows {
        for op in &row.ops {
            let (n, k) = (op.nftlb, op.kpng);
            let (b50, b99) = op.to_nftlb.map_or(("-".into(), "-".into()), |b| (ms(b.0), ms(b.1)));
            // Operations on annotated services compare with annotated to-nft, the others
            // with plain to-nft.
            let (a50, a99) = op.annotated.map_or(("-".into(), "-".into()), |a| (ms(a.0), ms(a.1)));
            let base = op.annotated.map_or(k.0, |a| a.0);
            println!(
                "{:>8} {:>4} | {:<22} | {:>9} {:>9} | {:>9} {:>9} | {:>9} {:>9} | {:>9} {:>9} | {:>11} {:>11}",
                row.services,
                row.endpoints,
                op.name,
                ms(n.0),
                ms(n.1),
                b50,
                b99,
                ms(k.0),
                ms(k.1),
                a50,
                a99,
                ratio(n.0, base),
                op.to_nftlb.map_or("-".into(), |b| ratio(b.0, base)),
            );
        }
    }
    println!(
        "* ms; nftlb: HTTP call to its answer (applied); to-nftlb: node-state change to nftlb's \
         answer and the kernel read back; to-nft: model change to committed netlink transaction; \
         ratios of p50s against annotated to-nft where measured, else plain to-nft"
    );
}
