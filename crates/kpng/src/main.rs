//! kpng: a Kubernetes service proxy built as a pipeline.
//!
//! ```text
//! [source] -> [global model (store)] -> [node-local state (ENLS)] -> [backends]
//! ```
//!
//! # Layout
//! - [`cli`]: the command line (clap): a source, a sink, backends, process-wide options.
//! - [`config`]: the config file, merged under the command line.
//! - [`pipeline`]: wires the chosen source to the chosen sink through the store, and
//!   handles signals and `--once`.
//! - [`sinks`]: `to-file` and `to-local`.
//! - [`stats`]: the `--stats` line.

mod cli;
mod config;
mod pipeline;
mod sinks;
mod stats;

use clap::Parser;
use tracing_subscriber::EnvFilter;

fn main() -> std::process::ExitCode {
    let args = match config::expand_args(std::env::args_os().collect()) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("kpng: error: {e:#}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let cli = cli::Cli::parse_from(args);
    let filter = EnvFilter::try_new(&cli.global.log).unwrap_or_else(|e| {
        eprintln!("kpng: invalid --log filter {:?}: {e}; using \"info\"", cli.global.log);
        EnvFilter::new("info")
    });
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter(filter).init();

    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("kpng: cannot start the async runtime: {e}");
                return std::process::ExitCode::FAILURE;
            }
        };
    let result = runtime.block_on(pipeline::run(cli));
    // Whatever is still running (watchers, servers) gets a moment, not a veto.
    runtime.shutdown_timeout(std::time::Duration::from_secs(2));
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kpng: error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
