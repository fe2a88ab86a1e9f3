//! `kpng aggregate`: the nftables aggregator daemon; `kpng publish`: a producer that
//! publishes a ruleset file and its edits.

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use kpng_aggregator::client::{Ack, Publisher};
use kpng_aggregator::daemon::{self, DaemonOptions, Handle};
use kpng_aggregator::service::PublishService;
use kpng_aggregator::updates::updates;
use kpng_aggregator::{Aggregator, Applier, LibNftApplier, NftApplier, Publication, State, Update};
use kpng_server::{ServeOptions, Served, ServerStats, serve_routes};

use crate::cli::{AggregateArgs, ConnRole, GlobalArgs, PublishArgs};
use crate::process::{AbortOnDrop, Process};

/// Runs the aggregator until a signal: adopts the aggregator's tables found in the kernel
/// (flushing nothing), then serves producers.
pub async fn run_aggregate(
    args: AggregateArgs,
    global: &GlobalArgs,
    process: &Process,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    if global.once {
        bail!("aggregate serves until interrupted: --once does not apply to it");
    }
    let security = args.conn.checked(&args.listen, ConnRole::Server)?;
    let bindings = kpng_aggregator::bindings::load(&args.producer_bindings)?;
    let mut applier: Box<dyn Applier> = match LibNftApplier::open(args.netns.as_deref()) {
        Ok(applier) => {
            tracing::info!("committing batches in-process with libnftables");
            Box::new(applier)
        }
        Err(error) => {
            tracing::warn!(%error, "libnftables unavailable: committing each batch with an nft process");
            match &args.netns {
                Some(netns) => Box::new(NftApplier::in_netns(netns)),
                None => Box::new(NftApplier::new()),
            }
        }
    };
    let (applier, listed) = tokio::task::spawn_blocking(move || {
        let listed = applier.ruleset();
        (applier, listed)
    })
    .await?;
    let listed = listed.context("listing the ruleset to adopt the aggregator's tables")?;
    let mut aggregator = Aggregator::with_bindings(args.producer_lease, bindings);
    let adopted = aggregator
        .adopt(&listed, std::time::Instant::now())
        .context("reading the ruleset nft listed")?;
    tracing::info!(
        producers = ?adopted,
        lease = ?args.producer_lease,
        "adopted the tables of producers found in the kernel; they stay until their lease ends"
    );
    let options = DaemonOptions {
        lease: args.producer_lease,
        min_sync_period: global.sync.min_sync_period,
        bindings: Some(args.producer_bindings.clone()),
        max_rejections: args.max_rejections,
    };
    let (handle, _daemon) = daemon::spawn(aggregator, applier, options);
    let _admin = admin_server(global, &handle, process);
    let served = Served {
        routes: PublishService::routes(handle, args.max_unacknowledged_bytes),
        stats: Arc::new(ServerStats::default()),
        what: "the nftables aggregator",
    };
    let options = ServeOptions {
        max_clients: process.budget.api_clients,
        client_timeout: Duration::from_secs(30),
    };
    let background = std::future::pending();
    serve_routes(served, background, &args.listen, &security, options, shutdown).await?;
    Ok(())
}

/// `/metrics` and `/state` on the metrics address (none when its port is 0).
fn admin_server(global: &GlobalArgs, handle: &Handle, process: &Process) -> Option<AbortOnDrop> {
    use axum::routing::get;
    let address = global.admin.metrics_bind_address;
    if address.port() == 0 {
        return None;
    }
    let (metrics, state) = (handle.clone(), handle.clone());
    let router =
        axum::Router::new().route("/metrics", get(move || async move { metrics.metrics() })).route(
            "/state",
            get(move || async move {
                let report = state.state().await.unwrap_or_else(|| state.observe().0);
                let body = serde_json::to_string_pretty(&report).unwrap_or_default();
                ([(axum::http::header::CONTENT_TYPE, "application/json")], body)
            }),
        );
    let server = kpng_server::admin::serve_admin(
        "metrics",
        address,
        router,
        process.http.clone(),
        process.problems.clone(),
        kpng_server::http::system_binder(),
    );
    Some(AbortOnDrop(tokio::spawn(server)))
}

/// Publishes the file's ruleset as `args.producer`, then every edit as the difference.
/// With --once, returns once the aggregator committed the whole ruleset.
pub async fn run_publish(
    args: PublishArgs,
    global: &GlobalArgs,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let security = args.conn.checked(&args.aggregator, ConnRole::Client)?;
    kpng_aggregator::model::check_name("producer", &args.producer)?;
    crate::operator_files::warn_if_shared(&args.file, "--file");
    let mut state = read_ruleset(&args.file)?;
    let mut modified = modified(&args.file);
    let mut revision = 1;
    let mut delay = Duration::from_millis(200);
    tokio::pin!(shutdown);
    loop {
        let first = Publication { revision, updates: vec![Update::Whole(state.clone())] };
        let connecting = Publisher::connect(&args.aggregator, &security, &args.producer, first);
        let connected = tokio::select! {
            () = &mut shutdown => return Ok(()),
            connected = connecting => connected,
        };
        let mut publisher = match connected {
            Ok(publisher) => publisher,
            Err(error) if error.is_permanent() => {
                return Err(error).context(format!("publishing to {}", args.aggregator));
            }
            Err(error) => {
                tracing::warn!(%error, ?delay, "cannot reach the aggregator; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
                continue;
            }
        };
        delay = Duration::from_millis(200);
        tracing::info!(producer = %args.producer, revision, "published the whole ruleset");
        if global.once {
            return match publisher.wait_for(revision).await? {
                Ok(committed) => {
                    tracing::info!(revision = committed, "the aggregator committed the ruleset");
                    Ok(())
                }
                Err(rejection) => bail!("the aggregator refused the ruleset: {rejection}"),
            };
        }
        let file = Watched { path: &args.file, state: &mut state, modified: &mut modified };
        match follow(&mut publisher, file, &mut revision, &mut shutdown).await {
            Ok(()) => return Ok(()),
            Err(error) => tracing::warn!(%error, "the aggregator's stream ended; reconnecting"),
        }
        revision += 1;
    }
}

struct Watched<'a> {
    path: &'a Path,
    state: &'a mut State,
    modified: &'a mut Option<SystemTime>,
}

/// Logs acknowledgements and publishes the file's edits until shutdown (`Ok`) or the
/// stream ends (`Err`).
async fn follow(
    publisher: &mut Publisher,
    file: Watched<'_>,
    revision: &mut u64,
    shutdown: &mut (impl Future<Output = ()> + Unpin),
) -> anyhow::Result<()> {
    let sender = publisher.sender();
    let mut poll = tokio::time::interval(Duration::from_millis(500));
    // After a rejection the aggregator holds our last committed state: the next
    // publication is whole.
    let mut whole = false;
    loop {
        tokio::select! {
            () = &mut *shutdown => return Ok(()),
            ack = publisher.next_ack() => match ack? {
                Some(Ack::Committed(committed)) => tracing::info!(revision = committed, "committed"),
                Some(Ack::Rejected(rejection)) => {
                    tracing::error!(%rejection, "the aggregator refused a revision");
                    whole = true;
                }
                None => bail!("the aggregator ended the stream"),
            },
            _ = poll.tick() => {
                let now = modified(file.path);
                if now == *file.modified {
                    continue;
                }
                *file.modified = now;
                let new = match read_ruleset(file.path) {
                    Ok(new) => new,
                    Err(error) => {
                        tracing::error!("{error:#}; the last good ruleset stays");
                        continue;
                    }
                };
                let changes = match whole {
                    true => vec![Update::Whole(new.clone())],
                    false => updates(file.state, &new),
                };
                if changes.is_empty() {
                    continue;
                }
                *revision += 1;
                sender.publish(Publication { revision: *revision, updates: changes }).await?;
                tracing::info!(revision = *revision, "published the file's changes");
                *file.state = new;
                whole = false;
            }
        }
    }
}

fn modified(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

/// The ruleset in the file, checked: an error names the line and the object.
fn read_ruleset(path: &Path) -> anyhow::Result<State> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let parsed =
        kpng_aggregator::parse::parse(&text).with_context(|| path.display().to_string())?;
    parsed.state.validate().with_context(|| path.display().to_string())?;
    Ok(parsed.state)
}
