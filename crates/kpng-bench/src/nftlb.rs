//! nftlb side by side: the Debian package's daemon, started in the bench's namespace with a
//! random key and driven through its REST API the way kube-nftlb drives it (one farm per
//! service port, mode `snat`, scheduler `rr`, `intra-connect` on, one backend per endpoint
//! named after its pod), against kpng's nftables backend for the same cluster and the same
//! operations. Every nftlb call returns once nftlb has applied it to the kernel.
//!
//! Kept in one file on purpose: the nftlb client, the scenario and its table are one
//! benchmark.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_model::global::{EndpointSlice, Service};
use kpng_model::{Family, Object};
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
    /// kpng's times.
    pub kpng: (f64, f64, f64),
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
        let client = kpng_nftlb::Client::new(&format!("http://127.0.0.1:{port}"), &key)?;
        let mut nftlb = Nftlb { child, client };
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
                            .clone()
                            .unwrap_or_else(|| format!("{}-{i}", slice.key.name)),
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
    format!("{}--{}--{port}", service.key.namespace, service.key.name)
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

/// Loads the same generated cluster into nftlb and into kpng, then creates and deletes a
/// service of 10, 50 and 100 endpoints and adds and removes one endpoint, `repeat` times
/// each, on both.
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
        slice.endpoints.push(added(r));
        let touched = cluster::apply(&mut b.model, Object::EndpointSlice(slice));
        b.change(touched)
    })?;
    kpng.push(add.wall);
    let remove = measure(&mut bench, repeat, "endpoint remove", |b, r| {
        let touched = cluster::apply(&mut b.model, Object::EndpointSlice(targets[r].1.clone()));
        b.change(touched)
    })?;
    kpng.push(remove.wall);

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
        slice.endpoints = vec![added(r)];
        slice.endpoints[0].pod_name = Some(format!("bench-added-{r}"));
        let farm = farms(service, &[&slice]).swap_remove(0);
        nftlb.post(vec![Farm { vip: None, ..farm }])
    })?);
    theirs.push(time(repeat, |r| {
        let farm = farm_name(&targets[r].0, &targets[r].0.ports[0].name);
        nftlb.call("DELETE", &format!("/farms/{farm}/backends/bench-added-{r}"), "").map(drop)
    })?);
    names.extend(["endpoint add".to_string(), "endpoint remove".to_string()]);
    drop(nftlb);
    let ops = names
        .into_iter()
        .zip(theirs)
        .zip(kpng)
        .map(|((name, nftlb), kpng)| OpRow { name, nftlb, kpng })
        .collect();
    Ok(NftlbRow { services, endpoints, ops })
}

/// Prints the nftlb table.
pub fn print(rows: &[NftlbRow]) {
    println!(
        "nftlb: nftlb's REST API (farms as kube-nftlb makes them) vs kpng's nftables backend, same cluster, same operations"
    );
    println!(
        "{:>8} {:>4} | {:<22} | {:>10} {:>10} {:>10} | {:>9} {:>9} {:>9} | {:>11}",
        "services",
        "eps",
        "operation",
        "nftlb p50",
        "nftlb p99",
        "nftlb max",
        "kpng p50",
        "kpng p99",
        "kpng max",
        "nftlb/kpng"
    );
    for row in rows {
        for op in &row.ops {
            let (n, k) = (op.nftlb, op.kpng);
            println!(
                "{:>8} {:>4} | {:<22} | {:>10.3} {:>10.3} {:>10.3} | {:>9.3} {:>9.3} {:>9.3} | {:>11.0}",
                row.services,
                row.endpoints,
                op.name,
                n.0,
                n.1,
                n.2,
                k.0,
                k.1,
                k.2,
                if k.0 > 0.0 { n.0 / k.0 } else { 0.0 },
            );
        }
    }
    println!(
        "* ms; nftlb: HTTP call to its answer (applied); kpng: model change to committed netlink transaction; ratio of p50s"
    );
}
