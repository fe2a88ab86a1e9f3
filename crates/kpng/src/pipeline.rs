//! Wires a source to a sink through the store.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use kpng_backend::NodeStats;
use kpng_sources::file::FileSource;
use kpng_sources::kube::{KubeSource, NodeSelection, Pacer};
use kpng_store::store;

use crate::cli::{Cli, GlobalArgs, KubeArgs, SinkCommand, SourceCommand};
use crate::sinks::to_file::run_to_file;
use crate::sinks::to_local::{
    build_backends, node_local, programs_kernel, run_to_local, runner_options,
};
use crate::stats::{StatsPrinter, StatsSources, print_stats};

/// Runs the pipeline the command line describes until it ends, fails, or a signal arrives.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let mut global = cli.global;
    match cli.source {
        SourceCommand::File(args) => {
            let source =
                FileSource::new(&args.input, args.watch, args.proxy_name.convert_options());
            let feed = |writer| async move { source.run(writer).await.context("file source") };
            run_pipeline(&FileSource::KINDS, feed, args.sink, &mut global).await
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
            run_pipeline(&kpng_sources::kube::KINDS, feed, args.sink, &mut global).await
        }
        SourceCommand::Api(args) => {
            let security = args.conn.security();
            security.validate(&args.server)?;
            let server = args.server.clone();
            let proxy = args.proxy_name.service_proxy_name.clone();
            tracing::info!(server = %server, "replicating the global model");
            let feed = |writer| async move {
                kpng_api::client::follow_global(server, security, proxy, writer).await;
                Ok(())
            };
            run_pipeline(&kpng_model::Kind::ALL, feed, args.sink, &mut global).await
        }
        SourceCommand::Local(args) => run_local(args, &mut global).await,
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
                true => println!("backends: to-nft to-ebpf to-json"),
                false => println!(
                    "backends: to-nft to-json (to-ebpf unavailable: {})",
                    kpng_ebpf::support::UNAVAILABLE.trim()
                ),
            }
            println!("wire: localv1 globalv1 (kpng extensions from field 100)");
            Ok(())
        }
        SourceCommand::Cleanup(args) => {
            if args.backend.nft() {
                let removed = kpng_nft::kernel::cleanup()?;
                let names: Vec<String> = removed
                    .iter()
                    .map(|f| format!("{} kpng", kpng_nft::objects::table_family(*f)))
                    .collect();
                match names.is_empty() {
                    true => eprintln!("kpng: no kpng table to remove"),
                    false => eprintln!("kpng: removed table {}", names.join(" and ")),
                }
            }
            if args.backend.ebpf() {
                let removed = kpng_ebpf::pins::cleanup(&args.pins.bpf_pin_path)
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
            Ok(())
        }
    }
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
    kube::Client::try_from(config).context("creating the Kubernetes client")
}

/// Runs `feed` (a source writing to the store) and the sink the command line names.
async fn run_pipeline<F, Fut>(
    kinds: &[kpng_model::Kind],
    feed: F,
    sink: SinkCommand,
    global: &mut GlobalArgs,
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
            let built = build_backends(&commands, global)?;
            let mut backends = built.backends;
            backends.extend(health_checks(&commands, global, &node_stats));
            collectors = built.collectors;
            _locks = built.locks;
            let (local, addresses) = node_local(global)?;
            let options = runner_options(global, node_name(global)?, local);
            Sink::Local { options, backends, addresses }
        }
        SinkCommand::ToApi(to_api) => {
            if global.once {
                bail!("to-api serves until interrupted: --once does not apply to it");
            }
            let security = to_api.conn.security();
            security.validate(&to_api.listen)?;
            let hub = kpng_server::Hub::new(reader.clone());
            Sink::Api { hub, listen: to_api.listen, security }
        }
    };
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
        },
    );
    let once = global.once;
    let sink = async {
        match sink {
            Sink::File(to_file) => run_to_file(reader, to_file, once).await,
            Sink::Local { options, backends, addresses } => {
                tracing::info!(node = %options.node, "computing the node-local state");
                run_to_local(reader, backends, options, addresses, node_stats.clone()).await
            }
            Sink::Api { hub, listen, security } => {
                kpng_server::serve(hub, &listen, &security, std::future::pending()).await?;
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

    let result = tokio::select! {
        result = feed(writer) => result,
        result = sink => result,
        () = stats => Ok(()),
        () = admin => Ok(()),
        () = shutdown_signal() => {
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
        options: kpng_backend::RunnerOptions,
        backends: Vec<Box<dyn kpng_backend::Backend>>,
        addresses: Option<kpng_backend::runner::AddressUpdates>,
    },
    Api {
        hub: Arc<kpng_server::Hub>,
        listen: kpng_api::Address,
        security: kpng_api::Security,
    },
}

/// The admin HTTP servers `global` asks for (none with --once; a port of 0 disables one).
/// Never returns.
fn admin_servers(
    global: &GlobalArgs,
    sources: kpng_server::admin::AdminSources,
) -> impl std::future::Future<Output = ()> + use<> {
    use kpng_server::admin::{Admin, serve_admin};
    let admin = Admin::new(sources);
    let mut servers = Vec::new();
    if !global.once {
        if global.admin.healthz_bind_address.port() != 0 {
            let router = admin.health_router();
            servers.push(tokio::spawn(serve_admin(
                "healthz",
                global.admin.healthz_bind_address,
                router,
            )));
        }
        if global.admin.metrics_bind_address.port() != 0 {
            let router = admin.metrics_router();
            servers.push(tokio::spawn(serve_admin(
                "metrics",
                global.admin.metrics_bind_address,
                router,
            )));
        }
    }
    async move {
        let _abort_on_drop: Vec<_> = servers.into_iter().map(AbortOnDrop).collect();
        std::future::pending::<()>().await
    }
}

/// Aborts a task when dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The health-check NodePort servers, alongside backends that program the kernel
/// ([`programs_kernel`]; not for `to-json` alone, nor in a dry run).
fn health_checks(
    commands: &[crate::cli::BackendCommand],
    global: &GlobalArgs,
    stats: &Arc<NodeStats>,
) -> Option<Box<dyn kpng_backend::Backend>> {
    programs_kernel(commands, global).then(|| {
        let all = std::net::IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED);
        let proxy = (stats.clone(), global.sync.sync_period * 2);
        Box::new(kpng_server::healthcheck::HealthCheckBackend::new(all, Some(proxy)))
            as Box<dyn kpng_backend::Backend>
    })
}

/// `kpng local`: backends fed by another kpng's node stream.
async fn run_local(args: crate::cli::LocalArgs, global: &mut GlobalArgs) -> anyhow::Result<()> {
    let security = args.conn.security();
    security.validate(&args.server)?;
    let commands =
        args.backends.backends().map_err(|e| anyhow::anyhow!(crate::cli::clap_message(&e)))?;
    if global.stats {
        bail!(
            "--stats reports a store's revisions; `kpng local` has none (use it on the to-api side)"
        );
    }
    let node = node_name(global)?;
    let stats = Arc::new(NodeStats::default());
    let built = build_backends(&commands, global)?;
    let _locks = built.locks;
    let mut backends = built.backends;
    backends.extend(health_checks(&commands, global, &stats));
    let (local, addresses) = node_local(global)?;
    let options = runner_options(global, node.clone(), local);
    tracing::info!(%node, server = %args.server, "following the node-local state");
    let admin = admin_servers(
        global,
        kpng_server::admin::AdminSources {
            reader: None,
            node: Some((node.clone(), stats.clone())),
            server: None,
            health_timeout: global.sync.sync_period * 2,
            collectors: built.collectors,
        },
    );
    let (changes, received) = tokio::sync::mpsc::channel(4);
    let follow = kpng_api::client::follow_node(args.server, security, node, changes);
    tokio::select! {
        () = admin => Ok(()),
        () = follow => Ok(()),
        result = kpng_backend::run_remote(received, backends, options, stats, addresses) => Ok(result?),
        () = shutdown_signal() => {
            tracing::info!("signal received; exiting (kernel state, if any, stays in force)");
            Ok(())
        }
    }
}

/// Resolves on SIGINT or SIGTERM, listening from the moment it is called: a signal that
/// arrives before the future is first polled (while the first change set is being written,
/// say) still counts. A kernel transaction in flight is finished first (a backend applies a
/// change set without yielding). From then on a second signal ends the process at once,
/// whatever is still winding down.
fn shutdown_signal() -> impl std::future::Future<Output = ()> + use<> {
    let signals = Signals::listen();
    async move {
        signals.first().await;
        std::thread::spawn(|| {
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build();
            if let Ok(runtime) = runtime {
                runtime.block_on(async { Signals::listen().first().await });
                eprintln!("kpng: second signal; exiting now");
                std::process::exit(130);
            }
        });
    }
}

/// SIGTERM and SIGINT handlers, installed when created (inside a runtime).
struct Signals {
    terminate: Option<tokio::signal::unix::Signal>,
    interrupt: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    fn listen() -> Signals {
        use tokio::signal::unix::{SignalKind, signal};
        Signals {
            terminate: signal(SignalKind::terminate()).ok(),
            interrupt: signal(SignalKind::interrupt()).ok(),
        }
    }

    /// The first of the two signals.
    async fn first(mut self) {
        async fn next(signal: &mut Option<tokio::signal::unix::Signal>) {
            match signal {
                Some(s) => {
                    s.recv().await;
                }
                None => std::future::pending().await,
            }
        }
        tokio::select! {
            () = next(&mut self.terminate) => {}
            () = next(&mut self.interrupt) => {}
        }
    }
}
