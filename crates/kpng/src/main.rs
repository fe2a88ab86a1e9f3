//! kpng: a Kubernetes service proxy built as a pipeline.
//!
//! ```text
//! [source] -> [global model (store)] -> [node-local state (ENLS)] -> [backends]
//! ```
//!
//! # Layout
//! - [`aggregate`]: `kpng aggregate` (the nftables aggregator daemon) and `kpng publish`
//!   (a producer of a static ruleset file).
//! - [`cli`]: the command line (clap): a source, a sink, backends, process-wide options.
//! - [`config`]: the config file, merged under the command line.
//! - [`kube_proxy`]: kpng started as kube-proxy: its flags and `KubeProxyConfiguration`
//!   translated into kpng's command line.
//! - [`leftovers`]: kube-proxy's rules, removed when kpng replaces it.
//! - [`limits`]: the open-file limit, raised at start and shared between clients and
//!   kpng's own work.
//! - [`node_agent`]: `--oom-score-adj` and `--exit-on-change`.
//! - [`once`]: `--once`'s deadline, and the last warning logged that explains it.
//! - [`operator_files`]: a warning for files given by flags that others could change.
//! - [`pipeline`]: wires the chosen source to the chosen sink through the store, and
//!   handles `--once`.
//! - [`refused_requests`]: requests the HTTP/2 layer refuses before kpng sees them, logged.
//! - [`servers`]: the admin and health-check HTTP servers.
//! - [`signals`]: SIGTERM and SIGINT (stop between two transactions), SIGHUP (ignored).
//! - [`sinks`]: `to-file` and `to-local`.
//! - [`stats`]: the `--stats` line, and the sources' own metrics.

mod aggregate;
mod cli;
mod config;
mod kube_proxy;
mod leftovers;
mod limits;
mod node_agent;
mod once;
mod operator_files;
mod pipeline;
mod process;
mod refused_requests;
mod servers;
mod signals;
mod sinks;
mod stats;

use std::io::IsTerminal;

use clap::Parser;
use tracing_subscriber::EnvFilter;

/// jemalloc, with one arena (see `kpng_runner::Allocator`): kpng holds less after a sync
/// than with the C library's allocator.
#[global_allocator]
static ALLOCATOR: kpng_runner::Allocator = kpng_runner::Allocator;

fn main() -> std::process::ExitCode {
    let (args, notices) = match kube_proxy::entry(std::env::args_os().collect()) {
        Ok(kube_proxy::Entry::Kpng(args)) => (args, Vec::new()),
        Ok(kube_proxy::Entry::Run { args, notices }) => (args, notices),
        Ok(kube_proxy::Entry::Print(text)) => {
            print!("{text}");
            return std::process::ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("kube-proxy (kpng): error: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    let args = match config::expand_args(args) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("kpng: error: {e:#}");
            return std::process::ExitCode::from(2);
        }
    };
    let cli = cli::Cli::parse_from(cli::hoist_global_args(args));
    // Everything is checked before anything is bound or started.
    match cli.to_local().map(|to_local| to_local.backends()) {
        Some(Err(e)) => e.exit(),
        Some(Ok(backends)) => {
            if let Err(message) = cli::check_backends(&backends) {
                eprintln!("kpng: error: {message}");
                return std::process::ExitCode::from(2);
            }
        }
        None => {}
    }
    if let Err(e) = cli.global.validate() {
        eprintln!("kpng: error: {e:#}");
        return std::process::ExitCode::from(2);
    }
    init_logging(&cli.global.logging);
    tracing::debug!(
        arenas = ?kpng_runner::arenas(),
        thread_cache_max = ?kpng_runner::thread_cache_max(),
        "allocator: jemalloc"
    );
    for notice in notices {
        match notice {
            kube_proxy::translate::Notice::Chose(text) => tracing::info!("kube-proxy: {text}"),
            kube_proxy::translate::Notice::Ignored(text) => {
                tracing::warn!("kube-proxy: ignored: {text}")
            }
            kube_proxy::translate::Notice::Differs(text) => {
                tracing::warn!("kube-proxy: kpng differs: {text}")
            }
        }
    }
    node_agent::set_oom_score_adj(cli.global.process.oom_score_adj);
    if let Err(e) = node_agent::exit_on_change(cli.global.process.exit_on_change.clone()) {
        eprintln!("kpng: error: --exit-on-change: {e}");
        return std::process::ExitCode::from(2);
    }
    if let Some(config) = &cli.global.config {
        operator_files::warn_if_shared(config, "--config");
    }
    let process = process::Process::new(limits::raise_and_share());

    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("kpng: cannot start the async runtime: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
    let result = runtime.block_on(pipeline::run(cli, process));
    // Whatever is still running (watchers, servers) gets a moment, not a veto; the
    // runner's thread, if any, is not waited for.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kpng: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Logs on standard error: text (coloured only on a terminal, and not with $NO_COLOR) or
/// one JSON object per line. The last warning is kept whatever the filter ([`once`]).
fn init_logging(args: &cli::LoggingArgs) {
    use tracing_subscriber::prelude::*;
    let filter = EnvFilter::try_new(&args.log).unwrap_or_else(|e| {
        eprintln!("kpng: invalid --log filter {:?}: {e}; using \"info\"", args.log);
        EnvFilter::new("info")
    });
    let layer = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let layer = match args.logging_format {
        cli::LogFormat::Text => {
            let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            layer.with_ansi(ansi).boxed()
        }
        cli::LogFormat::Json => layer.json().flatten_event(true).with_current_span(false).boxed(),
    };
    tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .with(once::LastWarning)
        .with(refused_requests::RefusedRequests.with_filter(refused_requests::filter()))
        .init();
}
