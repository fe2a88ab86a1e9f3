//! Wires a source to a sink through the store.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use kpng_api::client::Retry;
use kpng_runner::NodeStats;
use kpng_sources::file::FileSource;
use kpng_sources::kube::{KubeSource, NodeSelection, Pacer};
use kpng_store::store;

use crate::cli::{Cli, ConnRole, GlobalArgs, KubeArgs, SinkCommand, SourceCommand};
use crate::process::Process;
use crate::servers::{admin_servers, health_checks};
use crate::signals;
use crate::sinks::to_file::run_to_file;
use crate::sinks::to_local::{
    build_backends, node_local, on_own_thread, run_to_local, runner_options,
};
use crate::stats::{StatsPrinter, StatsSources, print_stats};

/// Runs the pipeline the command line describes until it ends, fails, or a signal arrives.
pub async fn run(cli: Cli, process: Process) -> anyhow::Result<()> {
    let _hangups = signals::ignore_hangups();
    // Listening from now on: a signal while the sink starts (the first change set is being
    // written, say) still counts.
    let shutdown = signals::shutdown();
    let mut global = cli.global;
    if global.process.remove_kube_proxy
        && let Some(name) = service_proxy_name(&cli.source)
    {
        tracing::warn!(
            service_proxy_name = name,
            "--remove-kube-proxy ignored: with --service-proxy-name kpng runs beside the default proxy, whose rules stay"
        );
        global.process.remove_kube_proxy = false;
    }
    if global.process.init_only {
        return init_only(&global);
    }
    let retry = if global.once { Retry::UntilPermanent } else { Retry::Always };
    match cli.source {
        SourceCommand::File(args) => {
            crate::operator_files::warn_if_shared(&args.input, "--input");
            let source =
                FileSource::new(&args.input, args.watch, args.proxy_name.convert_options());
            let feed = |writer| async move { source.run(writer).await.context("file source") };
            run_pipeline(&FileSource::KINDS, feed, args.sink, &mut global, &process, shutdown).await
        }
        SourceCommand::Kube(args) => {
            let client = kube_client(&args).await?;
            let nodes = match args.all_nodes {
                true => NodeSelection::All,
                false => NodeSelection::One(node_name(&global)?),
            };
            let options = args.proxy_name.convert_options();
            let pacer = Pacer::new(args.kube_api_qps, args.kube_api_burst);
            let source = KubeSource::new(client, options, nodes).with_pacer(pacer);
            let feed = |writer| async move {
                source.run(writer).await;
                Ok(())
            };
            run_pipeline(
                &kpng_sources::kube::KINDS,
                feed,
                args.sink,
                &mut global,
                &process,
                shutdown,
            )
            .await
        }
        SourceCommand::Api(args) => {
            let security = args.conn.checked(&args.server, ConnRole::Client)?;
            let server = args.server.clone();
            let proxy = args.proxy_name.service_proxy_name.clone();
            tracing::info!(server = %server, "replicating the global model");
            let feed = |writer| async move {
                let context = format!("replicating the global model of {server}");
                kpng_sources::api::follow_global(server, security, proxy, writer, retry)
                    .await
                    .context(context)
            };
            run_pipeline(&kpng_model::Kind::ALL, feed, args.sink, &mut global, &process, shutdown)
                .await
        }
        SourceCommand::Local(args) => run_local(args, &mut global, &process, retry, shutdown).await,
        SourceCommand::Aggregate(args) => {
            crate::aggregate::run_aggregate(args, &global, &process, shutdown).await
        }
        SourceCommand::Publish(args) => {
            crate::aggregate::run_publish(args, &global, shutdown).await
        }
        SourceCommand::Config(args) => match args.command {
            crate::cli::ConfigCommand::PrintDefaults => {
                print!("{}", crate::config::print_defaults());
                Ok(())
            }
        },
        SourceCommand::Version => {
            println!("kpng {}", env!("CARGO_PKG_VERSION"));
            println!("commit: {}", env!("KPNG_GIT_COMMIT"));
            println!("sources: kube file api");
            println!("sinks: to-file to-local to-api");
            match kpng_ebpf::support::available() {
                true => println!("backends: to-nft to-iptables to-ebpf to-nftlb to-json"),
                false => println!(
                    "backends: to-nft to-iptables to-nftlb to-json (to-ebpf unavailable: {})",
                    kpng_ebpf::support::UNAVAILABLE.trim()
                ),
            }
            println!("wire: localv1 globalv1 (kpng extensions from field 100) aggregatorv1");
            Ok(())
        }
        SourceCommand::Cleanup(args) => {
            if args.kube_proxy {
                let failures = crate::leftovers::remove();
                if !failures.is_empty() {
                    bail!("removing kube-proxy's leftovers: {}", failures.join("; "));
                }
                eprintln!("kpng: kube-proxy's leftovers removed (if there were any)");
            }
            if args.backend.nft() {
                let names = kpng_nft::cleanup()?;
                match names.is_empty() {
                    true => eprintln!("kpng: no kpng table to remove"),
                    false => eprintln!("kpng: removed table {}", names.join(" and ")),
                }
            }
            if args.backend.iptables() {
                // Both variants: what a run in either mode may have left.
                for mode in [kpng_iptables::Mode::Nft, kpng_iptables::Mode::Legacy] {
                    let command = mode.command(kpng_model::Family::V4, "");
                    match kpng_iptables::kernel::cleanup(mode) {
                        Ok(0) => eprintln!("kpng: no KPNG chain in {command}"),
                        Ok(n) => eprintln!("kpng: removed {n} KPNG chains from {command}"),
                        // A variant that is not installed holds nothing of kpng's.
                        Err(kpng_iptables::IptablesError::Spawn { source, .. })
                            if source.kind() == std::io::ErrorKind::NotFound =>
                        {
                            eprintln!("kpng: {command} is not installed: nothing to remove")
                        }
                        Err(e) => {
                            return Err(anyhow::Error::new(e)
                                .context(format!("removing kpng's chains from {command}")));
                        }
                    }
                }
            }
            if args.backend.ebpf() {
                let removed = kpng_ebpf::cleanup(&args.pins.bpf_pin_path)
                    .context("removing kpng's eBPF programs and maps")?;
                match removed.is_empty() {
                    true => {
                        eprintln!("kpng: no eBPF pin under {}", args.pins.bpf_pin_path.display())
                    }
                    false => eprintln!(
                        "kpng: detached and unpinned {} eBPF objects under {}",
                        removed.len(),
                        args.pins.bpf_pin_path.display()
                    ),
                }
            }
            if args.backend.nftlb() {
                match &args.nftlb.nftlb_key_file {
                    Some(key) => {
                        let mut client = crate::sinks::to_local::nftlb_client(&args.nftlb, key)?;
                        let removed = kpng_nftlb::cleanup(&mut client).with_context(|| {
                            format!("removing the farms of nftlb at {}", args.nftlb.nftlb_url)
                        })?;
                        eprintln!("kpng: removed {} nftlb farms", removed.len());
                    }
                    None if args.backend == crate::cli::CleanupBackend::Nftlb => {
                        anyhow::bail!("kpng cleanup --backend nftlb needs --nftlb-key-file")
                    }
                    None => eprintln!("kpng: nftlb not asked (no --nftlb-key-file)"),
                }
            }
            Ok(())
        }
    }
}

/// The `--service-proxy-name` of the source, if it has one.
fn service_proxy_name(source: &SourceCommand) -> Option<&str> {
    match source {
        SourceCommand::File(args) => args.proxy_name.service_proxy_name.as_deref(),
        SourceCommand::Kube(args) => args.proxy_name.service_proxy_name.as_deref(),
        SourceCommand::Api(args) => args.proxy_name.service_proxy_name.as_deref(),
        _ => None,
    }
}

/// `--init-only`: the privileged start-up work, then exit. With `--dry-run` nothing is
/// touched.
fn init_only(global: &GlobalArgs) -> anyhow::Result<()> {
    if global.dry_run {
        tracing::info!("--init-only with --dry-run: nothing to do");
        return Ok(());
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    global.conntrack.tuning().apply(&mut kpng_conntrack::tuning::HostSysctls::default(), cpus);
    if global.process.remove_kube_proxy {
        let failures = crate::leftovers::remove();
        if !failures.is_empty() {
            bail!("removing kube-proxy's leftovers: {}", failures.join("; "));
        }
    }
    tracing::info!("start-up work done (--init-only)");
    Ok(())
}

/// The node name: `--node`, then $NODE_NAME (both via clap), then the hostname.
fn node_name(global: &GlobalArgs) -> anyhow::Result<String> {
    match &global.node {
        Some(node) if !node.is_empty() => Ok(node.clone()),
        _ => gethostname::gethostname()
            .into_string()
            .ok()
            .filter(|h| !h.is_empty())
            .context("no --node given, $NODE_NAME unset, and the hostname is not usable"),
    }
}

/// A client for the API server the arguments name.
async fn kube_client(args: &KubeArgs) -> anyhow::Result<kube::Client> {
    use kube::config::{KubeConfigOptions, Kubeconfig};
    let parse = |url: &str| {
        url.parse::<http::Uri>().with_context(|| format!("--server {url:?} is not a URL"))
    };
    let mut config = match (&args.kubeconfig, &args.server) {
        (Some(path), _) => {
            crate::operator_files::warn_if_shared(path, "--kubeconfig");
            let kubeconfig = Kubeconfig::read_from(path).with_context(|| format!("reading kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("using kubeconfig {}", path.display()))?
        }
        (None, Some(server)) => kube::Config::new(parse(server)?),
        (None, None) => kube::Config::infer().await.context(
            "no kubeconfig ($KUBECONFIG or ~/.kube/config) and not in a cluster: use --kubeconfig or --server",
        )?,
    };
    if let Some(server) = &args.server {
        config.cluster_url = parse(server)?;
    }
    tracing::info!(server = %config.cluster_url, "Kubernetes API server");
    kube::Client::try_from(config).context("creating the Kubernetes client")
}

/// Runs `feed` (a source writing to the store) and the sink the command line names.
async fn run_pipeline<F, Fut>(
    kinds: &[kpng_model::Kind],
    feed: F,
    sink: SinkCommand,
    global: &mut GlobalArgs,
    process: &Process,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()>
where
    F: FnOnce(kpng_store::StoreWriter) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let (writer, reader) = store(kinds);
    let store_stats = reader.stats();
    let node_stats = Arc::new(NodeStats::default());

    let mut collectors = Vec::new();
    let mut _locks = Vec::new();
    // Validate the sink fully before starting anything.
    let sink = match sink {
        SinkCommand::ToFile(to_file) => Sink::File(to_file),
        SinkCommand::ToLocal(to_local) => {
            let commands =
                to_local.backends().map_err(|e| anyhow::anyhow!(crate::cli::clap_message(&e)))?;
            let built = build_backends(&commands, global, &process.readiness)?;
            let mut backends = built.backends;
            backends.extend(health_checks(&commands, global, &node_stats, process));
            collectors = built.collectors;
            _locks = built.locks;
            let (local, addresses) = node_local(global)?;
            let mut options = runner_options(global, node_name(global)?, local);
            options.stop = process.stop.clone();
            options.problems = process.readiness.clone();
            Sink::Local { options, backends, addresses }
        }
        SinkCommand::ToApi(to_api) => {
            if global.once {
                bail!("to-api serves until interrupted: --once does not apply to it");
            }
            if to_api.client_timeout.is_zero() {
                bail!("--client-timeout must be longer than 0");
            }
            let security = to_api.conn.checked(&to_api.listen, ConnRole::Server)?;
            let hub = kpng_server::Hub::new(reader.clone());
            let options = kpng_server::ServeOptions {
                max_clients: to_api.max_clients.map_or(process.budget.api_clients, |n| n as usize),
                client_timeout: to_api.client_timeout,
            };
            Sink::Api { hub, listen: to_api.listen, security, options }
        }
    };
    collectors.push(Box::new(crate::stats::SourceMetrics));
    let admin = admin_servers(
        global,
        kpng_server::admin::AdminSources {
            reader: Some(reader.clone()),
            node: match &sink {
                Sink::Local { options, .. } => Some((options.node.clone(), node_stats.clone())),
                _ => None,
            },
            server: match &sink {
                Sink::Api { hub, .. } => Some(hub.stats()),
                _ => None,
            },
            health_timeout: global.sync.sync_period * 2,
            collectors,
            bind_problems: process.problems.clone(),
            readiness_problems: process.readiness.clone(),
            http: Some(process.http.clone()),
        },
        process,
    );
    let once = global.once;
    let mut ready = reader.clone();
    let listed = async move {
        ready.wait_ready().await;
    };
    let sink = async {
        match sink {
            Sink::File(to_file) => run_to_file(reader, to_file, once).await,
            Sink::Local { options, backends, addresses } => {
                tracing::info!(node = %options.node, "computing the node-local state");
                run_to_local(reader, backends, options, addresses, node_stats.clone()).await
            }
            Sink::Api { hub, listen, security, options } => {
                kpng_server::serve(hub, &listen, &security, options, std::future::pending())
                    .await?;
                Ok(())
            }
        }
    };

    let sources = StatsSources { store: store_stats, node: Some(node_stats.clone()) };
    if global.stats {
        eprintln!("{}", crate::stats::HEADER);
    }
    let mut printer = global.stats.then(|| StatsPrinter::new(sources.clone()));
    let stats = async {
        match global.stats {
            true => print_stats(StatsPrinter::new(sources), Duration::from_secs(1)).await,
            false => std::future::pending().await,
        }
    };

    let what = "the source did not connect and complete its initial list";
    let once_deadline = async {
        match once {
            true => crate::once::deadline(global.once_timeout, what, listed).await,
            false => std::future::pending().await,
        }
    };
    let result = tokio::select! {
        result = feed(writer) => result,
        result = once_deadline => result,
        result = sink => result,
        () = stats => Ok(()),
        () = admin => Ok(()),
        () = shutdown => {
            process.stop.stop();
            tracing::info!("signal received; exiting (kernel state, if any, stays in force)");
            Ok(())
        }
    };
    if let Some(printer) = printer.as_mut() {
        eprintln!("{}", printer.line());
    }
    result
}

enum Sink {
    File(crate::cli::ToFileArgs),
    Local {
        options: kpng_runner::RunnerOptions,
        backends: Vec<Box<dyn kpng_runner::Backend>>,
        addresses: Option<kpng_runner::runner::AddressUpdates>,
    },
    Api {
        hub: Arc<kpng_server::Hub>,
        listen: kpng_api::Address,
        security: kpng_api::Security,
        options: kpng_server::ServeOptions,
    },
}

/// `kpng local`: backends fed by another kpng's node stream.
async fn run_local(
    args: crate::cli::LocalArgs,
    global: &mut GlobalArgs,
    process: &Process,
    retry: Retry,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    let security = args.conn.checked(&args.server, ConnRole::Client)?;
    let commands =
        args.backends.backends().map_err(|e| anyhow::anyhow!(crate::cli::clap_message(&e)))?;
    if global.stats {
        bail!(
            "--stats reports a store's revisions; `kpng local` has none (use it on the to-api side)"
        );
    }
    let node = node_name(global)?;
    let stats = Arc::new(NodeStats::default());
    let built = build_backends(&commands, global, &process.readiness)?;
    let _locks = built.locks;
    let mut backends = built.backends;
    backends.extend(health_checks(&commands, global, &stats, process));
    let (local, addresses) = node_local(global)?;
    let mut options = runner_options(global, node.clone(), local);
    options.stop = process.stop.clone();
    options.problems = process.readiness.clone();
    tracing::info!(%node, server = %args.server, "following the node-local state");
    let admin = admin_servers(
        global,
        kpng_server::admin::AdminSources {
            reader: None,
            node: Some((node.clone(), stats.clone())),
            server: None,
            health_timeout: global.sync.sync_period * 2,
            collectors: built.collectors,
            bind_problems: process.problems.clone(),
            readiness_problems: process.readiness.clone(),
            http: Some(process.http.clone()),
        },
        process,
    );
    let (changes, mut incoming) = tokio::sync::mpsc::channel(4);
    let context = format!("following node {node}'s state from {}", args.server);
    let follow = kpng_api::client::follow_node(args.server, security, node, changes, retry);
    // Change sets pass through a relay that notes the first one: with --once, it must come
    // within --once-timeout.
    let (forward, received) = tokio::sync::mpsc::channel(1);
    let delivered = Arc::new(tokio::sync::Notify::new());
    let first = delivered.clone();
    let relay = async move {
        while let Some(ops) = incoming.recv().await {
            first.notify_one();
            if forward.send(ops).await.is_err() {
                break;
            }
        }
        // Either end stopped: the runner sees its channel close, the follower its own.
        drop((forward, incoming));
        std::future::pending::<()>().await
    };
    let once_deadline = async {
        match global.once {
            true => {
                let what = "the server did not deliver this node's state";
                crate::once::deadline(global.once_timeout, what, delivered.notified()).await
            }
            false => std::future::pending().await,
        }
    };
    let mut runner = std::pin::pin!(on_own_thread(move || {
        kpng_runner::run_remote(received, backends, options, stats, addresses)
    }));
    tokio::select! {
        () = admin => Ok(()),
        () = relay => Ok(()),
        result = once_deadline => result,
        result = follow => match result {
            // The runner stopped taking change sets: its own result says why.
            Ok(()) => Ok((&mut runner).await??),
            Err(error) => Err(error).context(context),
        },
        result = &mut runner => Ok(result??),
        () = shutdown => {
            process.stop.stop();
            tracing::info!("signal received; exiting (kernel state, if any, stays in force)");
            Ok(())
        }
    }
}
