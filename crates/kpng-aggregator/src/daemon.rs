//! The task that owns the [`Aggregator`] and the [`Applier`]: it takes producers'
//! connections and publications through a [`Handle`], runs a batch whenever something is
//! pending and the [`Pace`] allows, ends leases on time, and answers each producer with the
//! revisions committed or refused.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpng_api::peer::PeerIdentity;
use kpng_backend::pace::Pace;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::applier::Applier;
use crate::engine::{Aggregator, Binding, Refusal, Rejection, Report};
use crate::metrics::Totals;
use crate::model::Publication;

/// How the daemon behaves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonOptions {
    /// How long a producer's tables outlive its connection (`--producer-lease`).
    pub lease: Duration,
    /// Least time between batches after a burst (`--min-sync-period`); zero: no limit.
    pub min_sync_period: Duration,
    /// Where producer names' owners are saved whenever a name is first used
    /// (`--producer-bindings`); `None`: kept in memory only.
    pub bindings: Option<PathBuf>,
    /// A producer whose publications are refused this many times in a row is cut off
    /// (`--max-rejections`).
    pub max_rejections: u32,
}

/// Acknowledgements waiting for a producer to read them; one more and it is cut off (a
/// producer that does not read them would otherwise make them pile up).
pub const ACK_QUEUE: usize = 256;

impl Default for DaemonOptions {
    /// A 60 s lease, no rate limit, bindings in memory, cut off after 10 rejections in a
    /// row.
    fn default() -> Self {
        DaemonOptions {
            lease: Duration::from_secs(60),
            min_sync_period: Duration::ZERO,
            bindings: None,
            max_rejections: 10,
        }
    }
}

/// What a producer hears back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This revision is committed.
    Committed(u64),
    /// This revision was refused.
    Rejected(Rejection),
}

/// A producer's connection, as the daemon knows it.
#[derive(Debug)]
pub struct Connection {
    /// The producer.
    pub producer: String,
    id: u64,
    handle: Handle,
    cut: Arc<Mutex<Option<String>>>,
}

impl Connection {
    /// Publishes; the outcome arrives on the connection's outcome channel.
    pub async fn publish(&self, publication: Publication) {
        let request =
            Request::Publish { producer: self.producer.clone(), id: self.id, publication };
        let _ = self.handle.requests.send(request).await;
    }

    /// Refuses a publication the server could not read: counted with the daemon's own
    /// refusals, and answered on the outcome channel.
    pub async fn reject(&self, rejection: Rejection) {
        let request = Request::Reject { producer: self.producer.clone(), id: self.id, rejection };
        let _ = self.handle.requests.send(request).await;
    }

    /// Why the daemon cut this connection off, once it has (its outcome channel then
    /// ends).
    pub fn cut_reason(&self) -> Option<String> {
        self.cut.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// A handle on the reason, for the stream that outlives the connection.
    pub fn cut_slot(&self) -> Arc<Mutex<Option<String>>> {
        self.cut.clone()
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        let request = Request::Disconnect { producer: self.producer.clone(), id: self.id };
        if let Err(mpsc::error::TrySendError::Full(request)) =
            self.handle.requests.try_send(request)
        {
            // The daemon is busy: the disconnection waits its turn rather than being lost.
            let requests = self.handle.requests.clone();
            if let Ok(runtime) = tokio::runtime::Handle::try_current() {
                runtime.spawn(async move { requests.send(request).await });
            }
        }
    }
}

enum Request {
    Connect {
        producer: String,
        identity: PeerIdentity,
        outcomes: mpsc::Sender<Outcome>,
        cut: Arc<Mutex<Option<String>>>,
        reply: oneshot::Sender<Result<u64, Refusal>>,
    },
    Publish {
        producer: String,
        id: u64,
        publication: Publication,
    },
    Reject {
        producer: String,
        id: u64,
        rejection: Rejection,
    },
    Disconnect {
        producer: String,
        id: u64,
    },
    State {
        reply: oneshot::Sender<Report>,
    },
}

/// How servers reach the daemon: cheap to clone.
#[derive(Debug, Clone)]
pub struct Handle {
    requests: mpsc::Sender<Request>,
    observed: Arc<Mutex<(Report, Totals)>>,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Request")
    }
}

impl Handle {
    /// Connects `producer`, published by `identity`: its outcomes arrive on the channel
    /// returned. Refused when the name is invalid, already connected or another identity's,
    /// or the daemon stopped.
    pub async fn connect(
        &self,
        producer: &str,
        identity: PeerIdentity,
    ) -> Result<(Connection, mpsc::Receiver<Outcome>), Refusal> {
        let (outcomes, receiver) = mpsc::channel(ACK_QUEUE);
        let (reply, answer) = oneshot::channel();
        let cut = Arc::new(Mutex::new(None));
        let producer = producer.to_string();
        let request = Request::Connect {
            producer: producer.clone(),
            identity,
            outcomes,
            cut: cut.clone(),
            reply,
        };
        let stopped = || Refusal::NotConnected(producer.clone());
        self.requests.send(request).await.map_err(|_| stopped())?;
        let id = answer.await.map_err(|_| stopped())??;
        let connection = Connection { producer, id, handle: self.clone(), cut };
        Ok((connection, receiver))
    }

    /// Every producer with its committed tables, as the daemon holds them between batches
    /// (for `/state`); `None` when the daemon stopped.
    pub async fn state(&self) -> Option<Report> {
        let (reply, answer) = oneshot::channel();
        self.requests.send(Request::State { reply }).await.ok()?;
        answer.await.ok()
    }

    /// The producers without their tables, after the last batch, and the totals (for
    /// `/metrics`).
    pub fn observe(&self) -> (Report, Totals) {
        self.observed.lock().map(|guard| guard.clone()).unwrap_or_else(|e| e.into_inner().clone())
    }

    /// `/metrics` text.
    pub fn metrics(&self) -> String {
        let (report, totals) = self.observe();
        crate::metrics::render(&report, &totals)
    }
}

/// Starts the daemon over `aggregator` (already adopted) and `applier`; it runs until every
/// [`Handle`] is dropped.
pub fn spawn(
    aggregator: Aggregator,
    applier: Box<dyn Applier>,
    options: DaemonOptions,
) -> (Handle, tokio::task::JoinHandle<()>) {
    let (requests, receiver) = mpsc::channel(1024);
    let report = aggregator.report(std::time::Instant::now(), false);
    let observed = Arc::new(Mutex::new((report, Totals::default())));
    let handle = Handle { requests, observed: observed.clone() };
    let daemon = Daemon {
        aggregator: Some((aggregator, applier)),
        connections: BTreeMap::new(),
        next_id: 0,
        pace: Pace::new(options.min_sync_period),
        bindings: options.bindings,
        max_rejections: options.max_rejections.max(1),
        observed,
        totals: Totals::default(),
    };
    (handle, tokio::spawn(daemon.run(receiver)))
}

/// Saves the names' owners after a name was first used. A failure is logged: the name
/// stays bound while this process runs, but a restart would not know it.
fn save_bindings(path: Option<&std::path::Path>, aggregator: &Aggregator) {
    let Some(path) = path else { return };
    match crate::bindings::save(path, aggregator.bindings()) {
        Ok(()) => tracing::info!(path = %path.display(), "producer bindings saved"),
        Err(error) => {
            tracing::error!(%error, "producer bindings not saved: a restart would free the new name")
        }
    }
}

/// A connected producer, as the daemon answers it.
struct Producing {
    id: u64,
    outcomes: mpsc::Sender<Outcome>,
    /// Publications refused since the last one committed.
    refused_in_a_row: u32,
    cut: Arc<Mutex<Option<String>>>,
}

struct Daemon {
    /// `None` only while a batch runs on a blocking thread.
    aggregator: Option<(Aggregator, Box<dyn Applier>)>,
    connections: BTreeMap<String, Producing>,
    next_id: u64,
    pace: Pace,
    bindings: Option<PathBuf>,
    max_rejections: u32,
    observed: Arc<Mutex<(Report, Totals)>>,
    totals: Totals,
}

impl Daemon {
    async fn run(mut self, mut requests: mpsc::Receiver<Request>) {
        loop {
            let Some((aggregator, _)) = self.aggregator.as_ref() else { return };
            let pending = aggregator.has_pending();
            let expiry = aggregator.next_expiry().map(Instant::from_std);
            let lease_ends = async {
                match expiry {
                    Some(at) => tokio::time::sleep_until(at).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                request = requests.recv() => match request {
                    Some(request) => self.handle(request),
                    None => return,
                },
                () = lease_ends => {
                    if let Some((aggregator, _)) = self.aggregator.as_mut() {
                        let expired = aggregator.expire(std::time::Instant::now());
                        tracing::info!(producers = ?expired, "producer leases ended: removing their tables");
                    }
                    self.observe();
                }
                () = self.pace.ready(), if pending => {
                    self.pace.spend();
                    self.batch().await;
                }
            }
        }
    }

    fn handle(&mut self, request: Request) {
        let Some((aggregator, _)) = self.aggregator.as_mut() else { return };
        match request {
            Request::Connect { producer, identity, outcomes, cut, reply } => {
                let result = aggregator.connect(&producer, &identity.key()).map(|binding| {
                    self.next_id += 1;
                    let id = self.next_id;
                    let producing = Producing { id, outcomes, refused_in_a_row: 0, cut };
                    self.connections.insert(producer.clone(), producing);
                    (id, binding)
                });
                match &result {
                    Ok((_, binding)) => {
                        tracing::info!(%producer, %identity, "producer connected");
                        if *binding == Binding::New {
                            save_bindings(self.bindings.as_deref(), aggregator);
                        }
                    }
                    Err(refusal) => {
                        tracing::warn!(%producer, %identity, %refusal, "producer refused")
                    }
                }
                let _ = reply.send(result.map(|(id, _)| id));
                self.observe();
            }
            Request::Publish { producer, id, publication } => {
                if self.connections.get(&producer).is_none_or(|p| p.id != id) {
                    return;
                }
                if let Err(rejection) = aggregator.publish(&producer, publication) {
                    self.answer(&producer, Outcome::Rejected(rejection));
                }
            }
            Request::Reject { producer, id, rejection } => {
                if self.connections.get(&producer).is_some_and(|p| p.id == id) {
                    self.answer(&producer, Outcome::Rejected(rejection));
                }
            }
            Request::State { reply } => {
                let _ = reply.send(aggregator.report(std::time::Instant::now(), true));
            }
            Request::Disconnect { producer, id } => {
                if self.connections.get(&producer).is_some_and(|p| p.id == id) {
                    self.connections.remove(&producer);
                    aggregator.disconnect(&producer, std::time::Instant::now());
                    tracing::info!(%producer, "producer disconnected: its tables stay for the lease");
                    self.observe();
                }
            }
        }
    }

    async fn batch(&mut self) {
        let Some((mut aggregator, mut applier)) = self.aggregator.take() else { return };
        let started = Instant::now();
        let joined = tokio::task::spawn_blocking(move || {
            let batch = aggregator.commit(applier.as_mut(), std::time::Instant::now());
            (aggregator, applier, batch)
        })
        .await;
        let Ok((aggregator, applier, batch)) = joined else {
            tracing::error!("the batch's thread panicked; the aggregator stops");
            return;
        };
        let took = started.elapsed();
        self.pace.finished(took);
        tracing::info!(
            transactions = batch.transactions,
            commands = batch.commands,
            acks = batch.acks.len(),
            rejections = batch.rejections.len(),
            removed = batch.removed.len(),
            ?took,
            "batch"
        );
        self.aggregator = Some((aggregator, applier));
        for (producer, revision) in &batch.acks {
            self.answer(producer, Outcome::Committed(*revision));
        }
        for rejection in batch.rejections {
            let producer = rejection.producer.clone();
            self.answer(&producer, Outcome::Rejected(rejection));
        }
        self.totals.batches += 1;
        self.totals.transactions += batch.transactions as u64;
        self.totals.commands += batch.commands as u64;
        self.observe();
    }

    /// Answers `producer`'s connection, if it has one: a commit clears its count of
    /// refusals in a row, a refusal adds to it (and is logged with that count, its object
    /// and message already cut short). A producer refused `max_rejections` times in a row,
    /// or that leaves [`ACK_QUEUE`] answers unread, is cut off: its connection ends with the
    /// reason and its lease starts.
    fn answer(&mut self, producer: &str, outcome: Outcome) {
        let Some(producing) = self.connections.get_mut(producer) else { return };
        let cut = match &outcome {
            Outcome::Committed(_) => {
                producing.refused_in_a_row = 0;
                None
            }
            Outcome::Rejected(rejection) => {
                producing.refused_in_a_row += 1;
                let in_a_row = producing.refused_in_a_row;
                tracing::warn!(%rejection, in_a_row, "publication refused");
                (in_a_row >= self.max_rejections).then(|| {
                    format!("{in_a_row} publications in a row were refused (--max-rejections)")
                })
            }
        };
        let cut = match producing.outcomes.try_send(outcome) {
            Ok(()) => cut,
            Err(mpsc::error::TrySendError::Full(_)) => Some(format!(
                "it left {ACK_QUEUE} acknowledgements unread (a producer must read them)"
            )),
            Err(mpsc::error::TrySendError::Closed(_)) => cut,
        };
        if let Some(reason) = cut {
            self.cut_off(producer, reason);
        }
    }

    /// Ends `producer`'s connection with `reason`: the stream is closed (the server tells
    /// the producer why) and the lease starts.
    fn cut_off(&mut self, producer: &str, reason: String) {
        let Some(producing) = self.connections.remove(producer) else { return };
        tracing::warn!(%producer, %reason, "producer cut off: its tables stay for the lease");
        *producing.cut.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason);
        if let Some((aggregator, _)) = self.aggregator.as_mut() {
            aggregator.disconnect(producer, std::time::Instant::now());
            aggregator.cut(producer);
        }
        self.observe();
    }

    /// Publishes the report for `/metrics` (after what changes it, not after each
    /// publication); without the producers' tables, which `/state` asks for.
    fn observe(&self) {
        let Some((aggregator, _)) = self.aggregator.as_ref() else { return };
        let report = aggregator.report(std::time::Instant::now(), false);
        if let Ok(mut observed) = self.observed.lock() {
            *observed = (report, self.totals);
        }
    }
}
