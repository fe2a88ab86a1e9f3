//! The eBPF scenario: a pod on the node connects to cluster IPs through `to-ebpf`, through
//! `to-nft`, and straight to the pods, at each table size, in one run.
//!
//! The namespace cluster of the tests gets a client pod on the node (10.244.0.50). For each
//! size, the node's nftables and the eBPF maps both hold the same generated services, a few
//! of them pointed at real pods. The client is a separate process (a thread cannot change
//! cgroup): `kpng-bench pod-client`, started in the bench's cgroup (its connects go through
//! the eBPF programs) or outside it (the nftables rules translate its packets), in the
//! client pod's namespace. Each round it times `connect()` to the established socket, then
//! reads the endpoint's greeting and closes: one request per connection, whose rate is
//! reported; then it sends as many requests over one kept connection per target (every
//! packet of those follows conntrack, NATed or not). Conntrack is flushed before each batch and counted after it, in the node's
//! namespace: every entry the batch created, and those with NAT. With the kernel's BPF
//! statistics on, the connect program's own run time per call is read too: what the
//! translation itself costs a connection.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use kpng_ebpf::{EbpfBackend, KernelDataplane, KernelOptions};
use kpng_runner::{Backend, ChangeSet};
use kpng_testkit::topology::Cluster;

use crate::dataplane::{POD_PORT, Size, load, size};
use crate::table::percentiles;

/// The client pod's address.
const CLIENT: &str = "10.244.0.50";
/// Rounds per run; every size and path is measured in each.
const ROUNDS: usize = 4;

/// A child cgroup and a pin directory of the bench's own, removed on drop.
pub struct Attachment {
    /// The cgroup.
    pub cgroup: PathBuf,
    /// The pin directory.
    pub pins: PathBuf,
}

impl Attachment {
    /// A fresh cgroup and pin directory named after `role`.
    pub fn new(role: &str) -> anyhow::Result<Attachment> {
        let name = format!("kpng-bench-{}-{role}", std::process::id());
        let cgroup = kpng_ebpf::support::cgroup2_root()?.join(&name);
        std::fs::create_dir_all(&cgroup)
            .with_context(|| format!("creating cgroup {}", cgroup.display()))?;
        Ok(Attachment { cgroup, pins: PathBuf::from("/sys/fs/bpf").join(name) })
    }

    /// An eBPF backend attached to the cgroup.
    pub fn backend(&self) -> anyhow::Result<EbpfBackend> {
        let options = KernelOptions { cgroup: self.cgroup.clone(), pin_root: self.pins.clone() };
        Ok(EbpfBackend::new(Box::new(KernelDataplane::open(options)?)))
    }
}

impl Drop for Attachment {
    fn drop(&mut self) {
        let _ = kpng_ebpf::pins::cleanup(&self.pins);
        for _ in 0..50 {
            if std::fs::remove_dir(&self.cgroup).is_ok() || !self.cgroup.exists() {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// One path at one size.
pub struct PathRow {
    /// Connections timed.
    pub connections: usize,
    /// `connect()` p50, p99 (ms).
    pub connect: (f64, f64),
    /// Requests (a connection each) per second.
    pub rps: f64,
    /// Requests per second over connections kept open.
    pub kept_rps: f64,
    /// Conntrack entries per connection, all and NATed.
    pub conntrack: (f64, f64),
    /// The connect program's run time per call (ns), for the eBPF path.
    pub program_ns: Option<f64>,
}

/// One size: the three paths.
pub struct EbpfRow {
    /// Services in the tables.
    pub services: usize,
    /// Through the eBPF programs, through nftables, straight to the pods, and straight to
    /// the pods from inside the cgroup (the programs run and find no service).
    pub paths: [PathRow; 4],
}

/// What a batch of client connections measured.
#[derive(Default)]
struct Batch {
    connects: Vec<Duration>,
    /// The connect program's run time and calls during the batch (eBPF path).
    program: Option<(Duration, u64)>,
    /// The requests over kept connections.
    kept: Duration,
    /// Connections made, the untimed warm-up ones included.
    made: usize,
    total: Duration,
    entries: usize,
    nat: usize,
}

/// Runs `count` connections from the client pod over `targets`, inside the cgroup or not.
fn client(
    net: &Cluster,
    cgroup: Option<&PathBuf>,
    targets: &[SocketAddr],
    count: usize,
) -> anyhow::Result<Batch> {
    conntrack(net, &["-F"])?;
    let exe = std::env::current_exe()?;
    let join = match cgroup {
        Some(cg) => format!("echo $$ > '{}/cgroup.procs' && ", cg.display()),
        None => String::new(),
    };
    let script =
        format!("{join}exec ip netns exec '{}' \"$0\" \"$@\"", net.pod("client").ns.name());
    let out = Command::new("sh")
        .args(["-c", &script])
        .arg(exe)
        .arg("pod-client")
        .arg(count.to_string())
        .args(targets.iter().map(ToString::to_string))
        .stdin(Stdio::null())
        .output()
        .context("running the pod client")?;
    anyhow::ensure!(
        out.status.success(),
        "pod client failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut batch = Batch::default();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        match line.split_once(' ') {
            Some(("connect", ns)) => batch.connects.push(Duration::from_nanos(ns.parse()?)),
            Some(("total", ns)) => batch.total = Duration::from_nanos(ns.parse()?),
            Some(("kept", ns)) => batch.kept = Duration::from_nanos(ns.parse()?),
            _ => {}
        }
    }
    batch.made = batch.connects.len() + targets.len();
    batch.entries = conntrack(net, &["-L", "-s", CLIENT])?;
    batch.nat = conntrack(net, &["-L", "-s", CLIENT, "--dst-nat"])?;
    Ok(batch)
}

/// The run time and call count of the connect4 program attached under `pins`.
fn connect4_stats(pins: &std::path::Path) -> Option<(Duration, u64)> {
    use aya::programs::links::{FdLink, PinnedLink};
    let dir = kpng_ebpf::pins::link_dirs(pins).into_iter().next()?.1;
    let link: FdLink = PinnedLink::from_pin(dir.join("kpng_connect4")).ok()?.into();
    let id = link.info().ok()?.program_id();
    let program = aya::programs::loaded_programs().filter_map(Result::ok).find(|p| p.id() == id)?;
    Some((program.run_time(), program.run_count()))
}

/// Runs `conntrack` in the node's namespace; returns the number of entries it listed.
fn conntrack(net: &Cluster, args: &[&str]) -> anyhow::Result<usize> {
    let out = net.node.output("conntrack", args);
    anyhow::ensure!(
        out.status.success(),
        "conntrack {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).lines().count())
}

/// `kpng-bench pod-client COUNT TARGET...`: connects COUNT times over the targets, reads
/// each greeting; prints `connect <ns>` per connection and `total <ns>`.
pub fn pod_client(args: &[String]) -> anyhow::Result<()> {
    use std::io::Read;
    let count: usize = args.first().context("pod-client COUNT TARGET...")?.parse()?;
    let targets: Vec<SocketAddr> = args[1..].iter().map(|t| t.parse()).collect::<Result<_, _>>()?;
    anyhow::ensure!(!targets.is_empty(), "pod-client: no target");
    let timeout = Duration::from_secs(2);
    let request = |target: &SocketAddr| -> anyhow::Result<Duration> {
        let t0 = std::time::Instant::now();
        let mut stream = std::net::TcpStream::connect_timeout(target, timeout)
            .with_context(|| format!("connecting to {target}"))?;
        let took = t0.elapsed();
        stream.set_read_timeout(Some(timeout))?;
        let mut buf = [0u8; 64];
        let n = stream.read(&mut buf).with_context(|| format!("reading from {target}"))?;
        anyhow::ensure!(buf[..n].starts_with(b"pod-"), "{target} answered no pod");
        Ok(took)
    };
    // Neighbour tables, routes and the programs' maps warm first, untimed.
    for target in &targets {
        request(target)?;
    }
    let mut lines = String::new();
    let start = std::time::Instant::now();
    for n in 0..count {
        let took = request(&targets[n % targets.len()])?;
        lines.push_str(&format!("connect {}\n", took.as_nanos()));
    }
    lines.push_str(&format!("total {}\n", start.elapsed().as_nanos()));
    // Then as many requests over connections kept open, one per target, taking turns.
    let mut kept = Vec::new();
    for target in &targets {
        let mut stream = std::net::TcpStream::connect_timeout(target, timeout)?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_nodelay(true)?;
        let mut buf = [0u8; 64];
        let _greeting = stream.read(&mut buf)?;
        kept.push(stream);
    }
    let start = std::time::Instant::now();
    for n in 0..count {
        use std::io::Write;
        let stream = &mut kept[n % targets.len()];
        stream.write_all(b"x\n")?;
        let mut buf = [0u8; 64];
        let got = stream.read(&mut buf)?;
        anyhow::ensure!(buf[..got].starts_with(b"pod-"), "a kept connection answered no pod");
    }
    lines.push_str(&format!("kept {}\n", start.elapsed().as_nanos()));
    print!("{lines}");
    Ok(())
}

/// Measures every size: eBPF vs nftables vs direct.
pub fn run(sizes: &[usize], endpoints: usize, connections: usize) -> anyhow::Result<Vec<EbpfRow>> {
    let mut net = Cluster::new();
    let pods: Vec<(IpAddr, &'static str)> =
        [("pod-a", true, 10), ("pod-b", true, 11), ("pod-c", false, 10)]
            .into_iter()
            .map(|(name, local, n)| {
                let pod = net.add_pod(name, local, n, &[POD_PORT]);
                (pod.ipv4, if local { "node-0" } else { "node-1" })
            })
            .collect();
    net.add_pod("client", true, 50, &[9999]);
    let direct: Vec<SocketAddr> =
        pods.iter().map(|(ip, _)| SocketAddr::new(*ip, POD_PORT)).collect();
    let sizes: Vec<Size> =
        sizes.iter().map(|&n| size(n, endpoints, 0, &pods)).collect::<Result<_, _>>()?;
    let attachment = Attachment::new("dataplane")?;
    let mut backend = attachment.backend()?;
    // The kernel counts programs' run time while this is open.
    let _stats = aya::sys::enable_stats(aya::sys::Stats::RunTime).ok();
    let per_round = connections.div_ceil(ROUNDS);
    let mut batches: Vec<[Batch; 4]> = sizes.iter().map(|_| Default::default()).collect();
    for round in 0..ROUNDS {
        for (size, batch) in sizes.iter().zip(&mut batches) {
            load(&net, &size.state)?;
            backend.apply(&ChangeSet::full(&size.state)).context("loading the eBPF maps")?;
            // Let the kernel finish the work a table load leaves behind (the old table's
            // teardown) before anything is timed.
            std::thread::sleep(Duration::from_secs(1));
            let mut runs: [Batch; 4] = Default::default();
            // Each round starts with another path, so none always runs first.
            for k in 0..4 {
                let path = (round + k) % 4;
                runs[path] = match path {
                    0 => {
                        let before = connect4_stats(&attachment.pins);
                        let mut run =
                            client(&net, Some(&attachment.cgroup), &size.targets, per_round)?;
                        run.program = before.zip(connect4_stats(&attachment.pins)).map(
                            |((t0, n0), (t1, n1))| (t1.saturating_sub(t0), n1.saturating_sub(n0)),
                        );
                        run
                    }
                    1 => client(&net, None, &size.targets, per_round)?,
                    2 => client(&net, None, &direct, per_round)?,
                    _ => client(&net, Some(&attachment.cgroup), &direct, per_round)?,
                };
            }
            for (total, run) in batch.iter_mut().zip(runs) {
                total.connects.extend(run.connects);
                total.total += run.total;
                total.kept += run.kept;
                if let Some((time, calls)) = run.program {
                    let (t, n) = total.program.get_or_insert((Duration::ZERO, 0));
                    *t += time;
                    *n += calls;
                }
                total.made += run.made;
                total.entries += run.entries;
                total.nat += run.nat;
            }
        }
    }
    kpng_testkit::topology::in_netns(&net.node, || {
        kpng_nft::kernel::cleanup().map(drop).map_err(|e| e.to_string())
    })
    .map_err(|e| anyhow::anyhow!("removing the node's tables: {e}"))?;
    Ok(sizes
        .iter()
        .zip(batches)
        .map(|(size, batches)| EbpfRow { services: size.services, paths: batches.map(path_row) })
        .collect())
}

fn path_row(mut batch: Batch) -> PathRow {
    let connections = batch.connects.len();
    let (p50, p99, _) = percentiles(&mut batch.connects);
    let per = |n: usize| n as f64 / batch.made.max(1) as f64;
    PathRow {
        connections,
        connect: (p50, p99),
        rps: connections as f64 / batch.total.as_secs_f64().max(1e-9),
        kept_rps: connections as f64 / batch.kept.as_secs_f64().max(1e-9),
        conntrack: (per(batch.entries), per(batch.nat)),
        program_ns: batch
            .program
            .filter(|(_, calls)| *calls > 0)
            .map(|(time, calls)| time.as_nanos() as f64 / calls as f64),
    }
}

/// Prints the table: each path's numbers and its ratio to eBPF's.
pub fn print(rows: &[EbpfRow]) {
    println!("ebpf: a pod on the node connects to cluster IPs (connect, one request, close)");
    println!(
        "{:>8} {:<9} | {:>6} | {:>8} {:>8} | {:>9} {:>9} | {:>9} {:>9} | {:>8} {:>8}",
        "services",
        "path",
        "conns",
        "p50(ms)",
        "p99(ms)",
        "req/s",
        "kept/s",
        "ct/conn",
        "nat/conn",
        "p50/ebpf",
        "rps/ebpf"
    );
    for row in rows {
        let base = &row.paths[0];
        for (name, path) in ["ebpf", "nft", "direct", "direct+cg"].iter().zip(&row.paths) {
            let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
            println!(
                "{:>8} {:<9} | {:>6} | {:>8.3} {:>8.3} | {:>9.0} {:>9.0} | {:>9.2} {:>9.2} | {:>8.2} {:>8.2}",
                row.services,
                name,
                path.connections,
                path.connect.0,
                path.connect.1,
                path.rps,
                path.kept_rps,
                path.conntrack.0,
                path.conntrack.1,
                ratio(path.connect.0, base.connect.0),
                ratio(path.rps, base.rps),
            );
        }
    }
    for row in rows {
        if let Some(ns) = row.paths[0].program_ns {
            println!(
                "{:>8} services: the connect program ran {ns:.0} ns per call (kernel BPF statistics)",
                row.services
            );
        }
    }
    println!(
        "* ebpf: the client in the bench's cgroup (to-ebpf translates at connect); nft: the same client outside it (to-nft's DNAT); direct: to the pods' addresses; direct+cg: the same from inside the cgroup. req/s: a connection per request; kept/s: requests over connections kept open. ct/conn: node conntrack entries per connection, nat/conn: those NATed"
    );
}
