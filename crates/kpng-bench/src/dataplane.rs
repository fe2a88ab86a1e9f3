//! The dataplane scenario: first-packet latency through kpng's rules.
//!
//! The testkit's namespace cluster (a client, the node kpng programs, a remote node, pods)
//! gets a generated cluster of N services loaded into the node's nftables; a few services
//! spread over the table are pointed at real pods (two on the node, one on the remote node).
//! From the client, TCP connections to those services' cluster IPs are timed from `connect`
//! to the established socket (SYN, NAT lookup, SYN-ACK): each connection's first packet
//! misses conntrack and walks kpng's rules. The same number of connections straight to the
//! pods' addresses gives the path without any service lookup.

use std::io::Read;
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_backend::{Backend, ChangeSet};
use kpng_local::NodeProjector;
use kpng_model::global::Endpoint;
use kpng_model::{Changes, GlobalModel, Object};
use kpng_nft::{NetlinkKernel, NftBackend, NftOptions};
use kpng_testkit::generate::{ClusterSpec, service_ip};
use kpng_testkit::topology::{Cluster, in_netns};

use crate::cluster;
use crate::table::percentiles;

/// Services pointed at real pods, spread over the table.
const PROBED: usize = 8;
/// The pods' port (the generated slices' target port).
const POD_PORT: u16 = 8080;

/// One size's results.
pub struct DataplaneRow {
    /// Services in the node's table.
    pub services: usize,
    /// Connections timed per path.
    pub connections: usize,
    /// To a cluster IP: p50, p99, max (ms).
    pub service: (f64, f64, f64),
    /// Straight to a pod: p50, p99, max (ms).
    pub direct: (f64, f64, f64),
}

/// Loads `services` generated services into a namespace node and times `connections`
/// connections from the client to cluster IPs and to the pods.
pub fn run(services: usize, endpoints: usize, connections: usize) -> anyhow::Result<DataplaneRow> {
    anyhow::ensure!(services >= PROBED, "the dataplane scenario needs at least {PROBED} services");
    let mut net = Cluster::new();
    let pods: Vec<(IpAddr, &str)> =
        [("pod-a", true, 10), ("pod-b", true, 11), ("pod-c", false, 10)]
            .into_iter()
            .map(|(name, local, n)| {
                let pod = net.add_pod(name, local, n, &[POD_PORT]);
                (pod.ipv4, if local { "node-0" } else { "node-1" })
            })
            .collect();
    // The client reaches pods directly too, for the path without a service.
    net.client.ip(&["route", "add", "10.244.0.0/16", "via", "192.168.10.1"]);

    let spec = ClusterSpec { services, endpoints, nodes: 3, zones: 2 };
    let mut model = GlobalModel::new();
    for object in cluster::objects(&spec)? {
        model.apply(object);
    }
    let probed: Vec<usize> = (0..PROBED).map(|k| k * services / PROBED).collect();
    for &i in &probed {
        let mut slice = cluster::slice_of(&model, i);
        slice.endpoints = pods
            .iter()
            .map(|(ip, node)| Endpoint { address: *ip, ..cluster::extra_endpoint(0, node) })
            .collect();
        model.apply(Object::EndpointSlice(slice));
    }
    let mut projector = NodeProjector::new("node-0");
    projector.update(&model, &Changes::All);
    let state = projector.state().clone();
    drop((model, projector));
    // The backend talks to the node's kernel: its socket (and the `nft` it runs for the
    // skeleton) must be created inside the node's namespace.
    in_netns(&net.node, move || -> Result<(), String> {
        let kernel = NetlinkKernel::open().map_err(|e| e.to_string())?;
        let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel));
        backend.apply(&ChangeSet::full(&state)).map_err(|e| e.to_string())
    })
    .map_err(|e| anyhow::anyhow!("loading the node's table: {e}"))?;

    let targets: Vec<SocketAddr> = probed
        .iter()
        .map(|&i| format!("{}:80", service_ip(i)).parse())
        .collect::<Result<_, _>>()?;
    let direct: Vec<SocketAddr> =
        pods.iter().map(|(ip, _)| SocketAddr::new(*ip, POD_PORT)).collect();
    let service = in_netns(&net.client, move || time_connects(&targets, connections))
        .context("connections to cluster IPs")?;
    let direct = in_netns(&net.client, move || time_connects(&direct, connections))
        .context("connections to the pods")?;
    Ok(DataplaneRow { services, connections, service, direct })
}

/// Connects `count` times, cycling over `targets`; every connection must reach a pod (its
/// answer is read, untimed). Returns p50, p99 and max of the time to connect (ms).
fn time_connects(targets: &[SocketAddr], count: usize) -> anyhow::Result<(f64, f64, f64)> {
    // Warm up neighbour tables and routes first.
    for target in targets {
        answer(target, TcpStream::connect_timeout(target, Duration::from_secs(2))?)?;
    }
    let mut samples = Vec::with_capacity(count);
    for n in 0..count {
        let target = &targets[n % targets.len()];
        let start = Instant::now();
        let stream = TcpStream::connect_timeout(target, Duration::from_secs(2))
            .with_context(|| format!("connecting to {target}"))?;
        samples.push(start.elapsed());
        answer(target, stream)?;
    }
    Ok(percentiles(&mut samples))
}

/// Reads the pod's greeting: the connection reached a pod, not something else.
fn answer(target: &SocketAddr, mut stream: TcpStream) -> anyhow::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut buf = [0u8; 64];
    let n = stream.read(&mut buf).with_context(|| format!("reading from {target}"))?;
    anyhow::ensure!(
        buf[..n].starts_with(b"pod-"),
        "{target} answered {:?}, not a pod",
        String::from_utf8_lossy(&buf[..n])
    );
    Ok(())
}

/// Prints the dataplane table, with each size's p50 and p99 against the smallest size's.
pub fn print(rows: &[DataplaneRow]) {
    println!(
        "dataplane: TCP connect from a client namespace, first packet through the node's rules"
    );
    println!(
        "{:>8} {:>6} | {:>8} {:>8} {:>8} | {:>10} {:>10} | {:>9} {:>9}",
        "services",
        "conns",
        "p50(ms)",
        "p99(ms)",
        "max(ms)",
        "pod p50",
        "pod p99",
        "p50/first",
        "p99/first"
    );
    let first = rows.first().map(|r| r.service);
    for row in rows {
        let (p50, p99, max) = row.service;
        let ratio = |now: f64, then: f64| if then > 0.0 { now / then } else { 0.0 };
        let (f50, f99) = first.map_or((0.0, 0.0), |f| (f.0, f.1));
        println!(
            "{:>8} {:>6} | {:>8.3} {:>8.3} {:>8.3} | {:>10.3} {:>10.3} | {:>9.2} {:>9.2}",
            row.services,
            row.connections,
            p50,
            p99,
            max,
            row.direct.0,
            row.direct.1,
            ratio(p50, f50),
            ratio(p99, f99)
        );
    }
    println!(
        "* to {PROBED} cluster IPs spread over the table (3 pods behind each); pod: the same connections straight to the pods"
    );
}
