//! The nftables aggregator under load: N producers, each owning a table of its own (a base
//! chain whose rule matches a set of addresses, as a firewall agent publishes), each making
//! M updates a second (one address added, the oldest removed). Through one aggregator (in
//! this process, on a unix socket, one transaction per batch) against each producer
//! committing every update on its own (one transaction each, as producers without an
//! aggregator do), both ways committing with an `nft -f -` process per transaction and with
//! libnftables in-process: kernel transactions and system calls per second, CPU, and the
//! time from when an update was due to its acknowledgement (or to the producer's own
//! commit).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;
use kpng_aggregator::client::{Ack, Publisher};
use kpng_aggregator::daemon::{self, DaemonOptions};
use kpng_aggregator::diff::Script;
use kpng_aggregator::service::{MAX_UNACKNOWLEDGED, PublishService};
use kpng_aggregator::{
    Aggregator, Applier, Chain, Family, LibNftApplier, NftApplier, Publication, Set, SetKind,
};
use kpng_aggregator::{State, Table, TableKey, Update};
use kpng_api::{Address, Security};
use kpng_server::{ServeOptions, Served, ServerStats, serve_routes};

use crate::syscalls::SyscallCounter;
use crate::table::percentiles;

/// Addresses in each producer's set before the run.
const INITIAL: usize = 100;

/// One way of committing, measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct Run {
    /// Updates committed.
    pub updates: usize,
    /// Kernel transactions (nft runs).
    pub transactions: u64,
    /// System calls of everything involved (producers, aggregator, nft).
    pub syscalls: u64,
    /// CPU (user + system) of everything involved.
    pub cpu: Duration,
    /// Wall time of the run.
    pub seconds: f64,
    /// Update due to committed: p50, p99, max (ms).
    pub latency: (f64, f64, f64),
}

/// How transactions are committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// An `nft -f -` process per transaction.
    Process,
    /// libnftables in this process.
    Library,
}

impl Via {
    /// Both ways.
    pub const ALL: [Via; 2] = [Via::Process, Via::Library];

    fn name(self) -> &'static str {
        match self {
            Via::Process => "nft",
            Via::Library => "lib",
        }
    }

    /// An applier committing this way.
    fn applier(self) -> anyhow::Result<Box<dyn Applier>> {
        Ok(match self {
            Via::Process => Box::new(NftApplier::new()),
            Via::Library => Box::new(LibNftApplier::open(None)?),
        })
    }
}

/// One load, both ways of committing, alone and aggregated.
pub struct AggregatorRow {
    /// Producers.
    pub producers: usize,
    /// Updates per second and producer.
    pub rate: u64,
    /// Each producer committing on its own, per way of committing.
    pub alone: Vec<(Via, Run)>,
    /// Through the aggregator, per way of committing.
    pub aggregated: Vec<(Via, Run)>,
}

/// Runs `producers` producers at `rate` updates a second each for `seconds`, alone and
/// through the aggregator, committing each way.
pub fn run(producers: usize, rate: u64, seconds: u64) -> anyhow::Result<AggregatorRow> {
    let mut row = AggregatorRow { producers, rate, alone: Vec::new(), aggregated: Vec::new() };
    for via in Via::ALL {
        let alone = alone(producers, rate, seconds, via).context("producers committing alone")?;
        delete_tables(producers);
        let aggregated =
            aggregated(producers, rate, seconds, via).context("through the aggregator")?;
        delete_tables(producers);
        row.alone.push((via, alone));
        row.aggregated.push((via, aggregated));
    }
    Ok(row)
}

fn table_name(producer: usize) -> String {
    format!("bench_{producer}")
}

/// The `i`-th address of `producer`'s set.
fn address(producer: usize, i: usize) -> String {
    format!("10.{}.{}.{}", producer % 250, (i / 250) % 250, i % 250 + 1)
}

const CHAIN: &str = "type filter hook input priority 0; policy accept;";
const RULE: &str = "ip saddr @allowed counter accept";

/// `producer`'s table before the run, in the aggregator's model.
fn initial_state(producer: usize) -> State {
    let addresses: Vec<String> = (0..INITIAL).map(|i| address(producer, i)).collect();
    let mut table = Table::default();
    table.chains.insert("input".into(), Chain::new(Some(CHAIN), [RULE]));
    table.sets.insert("allowed".into(), Set::new(SetKind::Set, "type ipv4_addr;", addresses));
    let key = TableKey::new(Family::Ip, table_name(producer));
    State { tables: [(key, table)].into() }
}

/// The same tables as an nft script.
fn initial_script(producers: usize) -> String {
    let mut script = String::new();
    for p in 0..producers {
        let addresses: Vec<String> = (0..INITIAL).map(|i| address(p, i)).collect();
        script.push_str(&format!(
            "table ip {} {{\n  set allowed {{ type ipv4_addr; elements = {{ {} }}; }}\n  chain input {{\n    {CHAIN}\n    {RULE}\n  }}\n}}\n",
            table_name(p),
            addresses.join(", ")
        ));
    }
    script
}

fn nft(script: &str) -> anyhow::Result<()> {
    crate::feed("nft", &["-f", "-"], script)
}

fn delete_tables(producers: usize) {
    let script: String =
        (0..producers).map(|p| format!("delete table ip {}\n", table_name(p))).collect();
    if nft(&script).is_err() {
        for p in 0..producers {
            let _ = nft(&format!("delete table ip {}\n", table_name(p)));
        }
    }
}

/// CPU of this process and its waited-for children.
fn cpu() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let of = |who| {
        getrusage(who).map_or(Duration::ZERO, |u| {
            let (user, system) = (u.user_time(), u.system_time());
            let micros = |t: nix::sys::time::TimeVal| {
                Duration::from_micros(t.tv_sec() as u64 * 1_000_000 + t.tv_usec() as u64)
            };
            micros(user) + micros(system)
        })
    };
    of(UsageWho::RUSAGE_SELF) + of(UsageWho::RUSAGE_CHILDREN)
}

/// Each producer on a thread of its own commits every update (an `nft -f -` each, or
/// through a libnftables context of its own).
fn alone(producers: usize, rate: u64, seconds: u64, via: Via) -> anyhow::Result<Run> {
    nft(&initial_script(producers))?;
    let mut counter = SyscallCounter::start()?;
    let (syscalls, cpu_before) = (counter.read()?, cpu());
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let period = Duration::from_secs_f64(1.0 / rate as f64);
    let threads: Vec<_> = (0..producers)
        .map(|p| {
            std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
                let mut applier = via.applier()?;
                let mut latencies = Vec::new();
                let mut due = started;
                for seq in 0.. {
                    if due >= until {
                        break;
                    }
                    if let Some(wait) = due.checked_duration_since(Instant::now()) {
                        std::thread::sleep(wait);
                    }
                    let table = table_name(p);
                    // What the aggregator's script holds for the same update, in its order.
                    let commands = vec![
                        format!("delete element ip {table} allowed {{ {} }}", address(p, seq)),
                        format!(
                            "add element ip {table} allowed {{ {} }}",
                            address(p, seq + INITIAL)
                        ),
                    ];
                    applier.commit(&Script { commands })?;
                    latencies.push(due.elapsed());
                    due += period;
                }
                Ok(latencies)
            })
        })
        .collect();
    let mut latencies = Vec::new();
    for thread in threads {
        latencies.extend(thread.join().map_err(|_| anyhow::anyhow!("a producer panicked"))??);
    }
    let seconds = started.elapsed().as_secs_f64();
    Ok(Run {
        updates: latencies.len(),
        transactions: latencies.len() as u64,
        syscalls: counter.read()? - syscalls,
        cpu: cpu() - cpu_before,
        seconds,
        latency: percentiles(&mut latencies),
    })
}

/// One aggregator in this process; each producer a task publishing its updates as they are
/// due, without waiting for the previous one's acknowledgement.
fn aggregated(producers: usize, rate: u64, seconds: u64, via: Via) -> anyhow::Result<Run> {
    let applier = via.applier()?;
    let dir = tempfile::tempdir()?;
    let address: Address = format!("unix://{}", dir.path().join("aggregator.sock").display())
        .parse()
        .map_err(|e| anyhow::anyhow!("the socket's address: {e}"))?;
    // Counting starts before the runtime's threads exist, so theirs are counted.
    let mut counter = SyscallCounter::start()?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let run = runtime.block_on(async {
        let lease = Duration::from_secs(60);
        let options = DaemonOptions { lease, ..DaemonOptions::default() };
        let (handle, _daemon) = daemon::spawn(Aggregator::new(lease), applier, options);
        let served = Served {
            routes: PublishService::routes(handle.clone(), MAX_UNACKNOWLEDGED),
            stats: Arc::new(ServerStats::default()),
            what: "the bench's aggregator",
        };
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serve_options =
            ServeOptions { max_clients: 64, client_timeout: Duration::from_secs(30) };
        let server_address = address.clone();
        let server = tokio::spawn(async move {
            let shutdown = async {
                let _ = stopped.await;
            };
            let security = Security::default();
            let background = std::future::pending();
            serve_routes(served, background, &server_address, &security, serve_options, shutdown)
                .await
        });
        let mut publishers = Vec::new();
        for p in 0..producers {
            let first = Publication { revision: 1, updates: vec![Update::Whole(initial_state(p))] };
            let mut publisher = connect(&address, &table_name(p), &first).await?;
            if let Err(rejection) = publisher.wait_for(1).await? {
                anyhow::bail!("the initial state was refused: {rejection}");
            }
            publishers.push(publisher);
        }
        let transactions_before = transactions(&handle.metrics());
        let (syscalls, cpu_before) = (counter.read()?, cpu());
        let started = Instant::now();
        let until = started + Duration::from_secs(seconds);
        let period = Duration::from_secs_f64(1.0 / rate as f64);
        let mut tasks = Vec::new();
        for (p, publisher) in publishers.into_iter().enumerate() {
            tasks.push(tokio::spawn(produce(p, publisher, started, until, period)));
        }
        let mut latencies = Vec::new();
        for task in tasks {
            latencies.extend(task.await??);
        }
        let seconds = started.elapsed().as_secs_f64();
        let committed = transactions(&handle.metrics()) - transactions_before;
        let run = Run {
            updates: latencies.len(),
            transactions: committed,
            syscalls: 0,
            cpu: cpu() - cpu_before,
            seconds,
            latency: percentiles(&mut latencies),
        };
        let _ = stop.send(());
        let _ = server.await;
        anyhow::Ok((run, syscalls))
    })?;
    let (mut run, before) = run;
    run.syscalls = counter.read()? - before;
    Ok(run)
}

/// Connects, retrying while the server starts listening.
async fn connect(
    address: &Address,
    producer: &str,
    first: &Publication,
) -> anyhow::Result<Publisher> {
    let mut tries = 0;
    loop {
        match Publisher::connect(address, &Security::default(), producer, first.clone()).await {
            Ok(publisher) => return Ok(publisher),
            Err(_) if tries < 100 => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(error) => return Err(error).context("connecting to the aggregator"),
        }
    }
}

/// Producer `p`: an update whenever one is due, each acknowledged (acknowledgements name
/// the latest revision committed, so one may complete several).
async fn produce(
    p: usize,
    mut publisher: Publisher,
    started: Instant,
    until: Instant,
    period: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let due_by_revision: Arc<Mutex<BTreeMap<u64, Instant>>> = Arc::default();
    let last = Arc::new(AtomicU64::new(1));
    let done = Arc::new(AtomicBool::new(false));
    let sender = publisher.sender();
    let sending = {
        let (due_by_revision, last, done) = (due_by_revision.clone(), last.clone(), done.clone());
        tokio::spawn(async move {
            let table = TableKey::new(Family::Ip, table_name(p));
            let mut due = started;
            let mut seq = 0;
            while due < until {
                tokio::time::sleep_until(due.into()).await;
                let revision = seq as u64 + 2;
                let updates = vec![
                    Update::AddElements {
                        table: table.clone(),
                        set: "allowed".into(),
                        elements: vec![address(p, seq + INITIAL)],
                    },
                    Update::RemoveElements {
                        table: table.clone(),
                        set: "allowed".into(),
                        elements: vec![address(p, seq)],
                    },
                ];
                due_by_revision.lock().unwrap_or_else(|e| e.into_inner()).insert(revision, due);
                sender.publish(Publication { revision, updates }).await?;
                last.store(revision, Ordering::SeqCst);
                due += period;
                seq += 1;
            }
            done.store(true, Ordering::SeqCst);
            anyhow::Ok(())
        })
    };
    let mut latencies = Vec::new();
    let mut acked = 1;
    while !(done.load(Ordering::SeqCst) && acked >= last.load(Ordering::SeqCst)) {
        let ack = tokio::time::timeout(Duration::from_millis(50), publisher.next_ack()).await;
        match ack {
            Err(_) => continue,
            Ok(Ok(Some(Ack::Committed(revision)))) => {
                let now = Instant::now();
                let mut due = due_by_revision.lock().unwrap_or_else(|e| e.into_inner());
                let later = due.split_off(&(revision + 1));
                latencies.extend(due.values().map(|d| now - *d));
                *due = later;
                acked = acked.max(revision);
            }
            Ok(Ok(Some(Ack::Rejected(rejection)))) => anyhow::bail!("refused: {rejection}"),
            Ok(Ok(None)) => anyhow::bail!("the aggregator ended the stream"),
            Ok(Err(error)) => return Err(error).context("reading acknowledgements"),
        }
    }
    sending.await??;
    Ok(latencies)
}

/// `kpng_aggregator_transactions_total` in `/metrics` text.
fn transactions(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("kpng_aggregator_transactions_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0, |v| v as u64)
}

/// Prints the table.
pub fn print(rows: &[AggregatorRow]) {
    println!(
        "nftables aggregator: N producers, each with a table of its own, each adding and removing one set element M times a second"
    );
    println!(
        "(alone: each producer commits each update; aggregated: one aggregator, one transaction per batch of everyone's updates; via nft: an nft -f process per transaction, lib: libnftables in-process)"
    );
    println!(
        "{:>9} {:>7} {:>14} | {:>7} {:>7} {:>11} {:>6} | {:>8} {:>8} {:>8}",
        "producers",
        "each/s",
        "mode",
        "updates",
        "txn/s",
        "syscalls/s",
        "cpu%",
        "p50(ms)",
        "p99(ms)",
        "max(ms)"
    );
    for row in rows {
        let runs = row
            .alone
            .iter()
            .map(|r| ("alone", r))
            .chain(row.aggregated.iter().map(|r| ("aggregated", r)));
        for (mode, (via, run)) in runs {
            let per_second = |n: u64| n as f64 / run.seconds.max(1e-9);
            println!(
                "{:>9} {:>7} {:>14} | {:>7} {:>7.1} {:>11.0} {:>6.1} | {:>8.2} {:>8.2} {:>8.2}",
                row.producers,
                row.rate,
                format!("{mode} {}", via.name()),
                run.updates,
                per_second(run.transactions),
                per_second(run.syscalls),
                run.cpu.as_secs_f64() / run.seconds.max(1e-9) * 100.0,
                run.latency.0,
                run.latency.1,
                run.latency.2
            );
        }
        let ratio = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
        for ((via, alone), (_, aggregated)) in row.alone.iter().zip(&row.aggregated) {
            println!(
                "{:>9} {:>7} {:>14} | transactions {:.2}x, syscalls {:.2}x, cpu {:.2}x of alone; added latency p50 {:+.2} ms, p99 {:+.2} ms",
                "",
                "",
                format!("ratio {}", via.name()),
                ratio(
                    aggregated.transactions as f64 / aggregated.seconds,
                    alone.transactions as f64 / alone.seconds
                ),
                ratio(
                    aggregated.syscalls as f64 / aggregated.seconds,
                    alone.syscalls as f64 / alone.seconds
                ),
                ratio(
                    aggregated.cpu.as_secs_f64() / aggregated.seconds,
                    alone.cpu.as_secs_f64() / alone.seconds
                ),
                aggregated.latency.0 - alone.latency.0,
                aggregated.latency.1 - alone.latency.1
            );
        }
        let process = row.aggregated.iter().find(|(v, _)| *v == Via::Process);
        let library = row.aggregated.iter().find(|(v, _)| *v == Via::Library);
        if let (Some((_, process)), Some((_, library))) = (process, library) {
            println!(
                "{:>9} {:>7} {:>14} | aggregated via lib against via nft: p50 {:.2}x, p99 {:.2}x, cpu {:.2}x, syscalls {:.2}x",
                "",
                "",
                "lib/nft",
                ratio(library.latency.0, process.latency.0),
                ratio(library.latency.1, process.latency.1),
                ratio(
                    library.cpu.as_secs_f64() / library.seconds,
                    process.cpu.as_secs_f64() / process.seconds
                ),
                ratio(
                    library.syscalls as f64 / library.seconds,
                    process.syscalls as f64 / process.seconds
                )
            );
        }
    }
}

/// The aggregator's own work for one update as a producer's state grows: one element added
/// and one removed, published and committed in a batch, against an applier that records
/// scripts instead of running nft (what is left is the aggregator itself).
pub struct EngineRow {
    /// Elements the producer holds.
    pub elements: usize,
    /// Publication and batch per update: p50, p99, max (ms).
    pub update: (f64, f64, f64),
}

/// Times `repeat` updates of a producer holding `elements` elements.
pub fn engine(elements: usize, repeat: usize) -> anyhow::Result<EngineRow> {
    use kpng_aggregator::MemoryApplier;
    let now = Instant::now();
    let mut aggregator = Aggregator::new(Duration::from_secs(60));
    let mut applier = MemoryApplier::default();
    aggregator.connect("big", "uid:0").map_err(|e| anyhow::anyhow!("{e}"))?;
    let key = TableKey::new(Family::Ip, "big");
    let mut table = Table::default();
    let addresses = (0..elements).map(|i| address(i / 62_500, i % 62_500));
    table.sets.insert("allowed".into(), Set::new(SetKind::Set, "type ipv4_addr;", addresses));
    table.chains.insert("input".into(), Chain::new(Some(CHAIN), [RULE]));
    let whole = State { tables: [(key.clone(), table)].into() };
    let first = Publication { revision: 1, updates: vec![Update::Whole(whole)] };
    aggregator.publish("big", first).map_err(|e| anyhow::anyhow!("{e}"))?;
    anyhow::ensure!(aggregator.commit(&mut applier, now).acks.len() == 1, "the whole state");
    let mut samples = Vec::with_capacity(repeat);
    for seq in 0..repeat {
        let (gone, new) = (address(0, seq), address(249, seq));
        let updates = vec![
            Update::RemoveElements {
                table: key.clone(),
                set: "allowed".into(),
                elements: vec![gone],
            },
            Update::AddElements { table: key.clone(), set: "allowed".into(), elements: vec![new] },
        ];
        let started = Instant::now();
        let publication = Publication { revision: seq as u64 + 2, updates };
        aggregator.publish("big", publication).map_err(|e| anyhow::anyhow!("{e}"))?;
        let batch = aggregator.commit(&mut applier, now);
        samples.push(started.elapsed());
        anyhow::ensure!(batch.acks.len() == 1 && batch.commands <= 2, "one update: {batch:?}");
    }
    Ok(EngineRow { elements, update: percentiles(&mut samples) })
}

/// Prints the engine table.
pub fn print_engine(rows: &[EngineRow]) {
    println!(
        "nftables aggregator's own work per update (publication and batch, nft not run) as the producer's state grows"
    );
    println!("{:>9} | {:>8} {:>8} {:>8} | vs first", "elements", "p50(ms)", "p99(ms)", "max(ms)");
    let first = rows.first().map_or(0.0, |r| r.update.0);
    for row in rows {
        let ratio = if first > 0.0 { row.update.0 / first } else { 0.0 };
        println!(
            "{:>9} | {:>8.3} {:>8.3} {:>8.3} | {:>7.1}x",
            row.elements, row.update.0, row.update.1, row.update.2, ratio
        );
    }
}
