//! The task that owns the [`Aggregator`] and the [`Applier`]: it takes producers'
//! connections and publications through a [`Handle`], runs a batch whenever something is
//! pending and the [`Pace`] allows, ends leases on time, and answers each producer with the
//! revisions committed or refused.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpng_api::peer::PeerIdentity;
use kpng_runner::Pace;
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
}

impl Default for DaemonOptions {
    /// A 60 s lease, no rate limit, bindings in memory.
    fn default() -> Self {
        DaemonOptions {
            lease: Duration::from_secs(60),
            min_sync_period: Duration::ZERO,
            bindings: None,
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
}

impl Connection {
    /// Publishes; the outcome arrives on the connection's outcome channel.
    pub async fn publish(&self, publication: Publication) {
        let request =
            Request::Publish { producer: self.producer.clone(), id: self.id, publication };
        let _ = self.handle.requests.send(request).await;
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
        outcomes: mpsc::UnboundedSender<Outcome>,
        reply: oneshot::Sender<Result<u64, Refusal>>,
    },
    Publish {
        producer: String,
        id: u64,
        publication: Publication,
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
    ) -> Result<(Connection, mpsc::UnboundedReceiver<Outcome>), Refusal> {
        let (outcomes, receiver) = mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        let request =
            Request::Connect { producer: producer.to_string(), identity, outcomes, reply };
        let stopped = || Refusal::NotConnected(producer.to_string());
        self.requests.send(request).await.map_err(|_| stopped())?;
        let id = answer.await.map_err(|_| stopped())??;
        let connection = Connection { producer: producer.to_string(), id, handle: self.clone() };
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

struct Daemon {
    /// `None` only while a batch runs on a blocking thread.
    aggregator: Option<(Aggregator, Box<dyn Applier>)>,
    connections: BTreeMap<String, (u64, mpsc::UnboundedSender<Outcome>)>,
    next_id: u64,
    pace: Pace,
    bindings: Option<PathBuf>,
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
            Request::Connect { producer, identity, outcomes, reply } => {
                let result = aggregator.connect(&producer, &identity.key()).map(|binding| {
                    self.next_id += 1;
                    self.connections.insert(producer.clone(), (self.next_id, outcomes));
                    (self.next_id, binding)
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
                let Some((current, outcomes)) = self.connections.get(&producer) else { return };
                if *current != id {
                    return;
                }
                if let Err(rejection) = aggregator.publish(&producer, publication) {
                    tracing::warn!(%rejection, "publication refused");
                    let _ = outcomes.send(Outcome::Rejected(rejection));
                }
            }
            Request::State { reply } => {
                let _ = reply.send(aggregator.report(std::time::Instant::now(), true));
            }
            Request::Disconnect { producer, id } => {
                if self.connections.get(&producer).is_some_and(|(current, _)| *current == id) {
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
        for (producer, revision) in &batch.acks {
            if let Some((_, outcomes)) = self.connections.get(producer) {
                let _ = outcomes.send(Outcome::Committed(*revision));
            }
        }
        for rejection in batch.rejections {
            tracing::warn!(%rejection, "producer's changes refused by nft");
            if let Some((_, outcomes)) = self.connections.get(&rejection.producer) {
                let _ = outcomes.send(Outcome::Rejected(rejection));
            }
        }
        self.totals.batches += 1;
        self.totals.transactions += batch.transactions as u64;
        self.totals.commands += batch.commands as u64;
        self.aggregator = Some((aggregator, applier));
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
