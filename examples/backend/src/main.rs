//! `kpng-example-backend`: the example dataplane as a process of its own, fed over gRPC by
//! a `kpng local` server (split mode), as another vendor's dataplane would be.
//!
//! ```text
//! kpng-example-backend --server unix:///run/kpng/local.sock --node node-1 \
//!     --output /run/kpng/frontends.table [--sync-period 30]
//! ```
//!
//! It follows the node's stream, applies each change set through the template (a reset
//! at each connection, then only what changed), retries a failed one with the whole state
//! at the next change or sync period, and every `--sync-period` seconds verifies the file
//! and repairs it. Exits 2 on bad arguments.

use std::time::Duration;

use kpng_api::client::{Retry, follow_node};
use kpng_api::{Address, Security};
use kpng_backend::{Backend, ChangeSet, error_chain};
use kpng_model::LocalState;

struct Args {
    server: Address,
    node: String,
    output: std::path::PathBuf,
    sync_period: Duration,
}

const USAGE: &str = "usage: kpng-example-backend --server unix:///PATH --node NAME --output FILE [--sync-period SECONDS]";

fn args() -> Result<Args, String> {
    let mut server = None;
    let mut node = None;
    let mut output = None;
    let mut sync_period = Duration::from_secs(30);
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        if flag == "--help" || flag == "-h" {
            return Err(USAGE.to_string());
        }
        let value = argv.next().ok_or_else(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--server" => {
                server = Some(value.parse::<Address>().map_err(|e| format!("--server: {e}"))?)
            }
            "--node" => node = Some(value),
            "--output" => output = Some(value.into()),
            "--sync-period" => {
                let seconds: u64 = value
                    .parse()
                    .map_err(|_| format!("--sync-period: {value:?} is not a number of seconds"))?;
                sync_period = Duration::from_secs(seconds.max(1));
            }
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    Ok(Args {
        server: server.ok_or("--server is required")?,
        node: node.ok_or("--node is required")?,
        output: output.ok_or("--output is required")?,
        sync_period,
    })
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args = match args() {
        Ok(args) => args,
        Err(text) => {
            eprintln!("{text}");
            std::process::exit(2);
        }
    };
    let mut backend = kpng_example_backend::backend(&args.output);
    let (changes, mut received) = tokio::sync::mpsc::channel(16);
    let follow = follow_node(args.server, Security::default(), args.node, changes, Retry::Always);
    tokio::spawn(follow);
    let mut state = LocalState::default();
    // Nothing is applied before the server's first change set: a restart must not empty
    // the table while it connects.
    let mut started = false;
    let mut failed = true;
    let mut period = tokio::time::interval(args.sync_period);
    loop {
        tokio::select! {
            ops = received.recv() => {
                let Some(ops) = ops else { return };
                started = true;
                if let Err(error) = ops.iter().try_for_each(|op| state.apply(op)) {
                    eprintln!("kpng-example-backend: the stream sent an inconsistent change: {error}");
                    failed = true;
                    continue;
                }
                let changes = match failed {
                    true => ChangeSet::full(&state),
                    false => ChangeSet::changes(&ops, &state),
                };
                failed = apply(&mut backend, &changes);
            }
            _ = period.tick(), if started => {
                let drifted = !matches!(backend.verify(), Ok(true));
                if failed || drifted {
                    failed = apply(&mut backend, &ChangeSet::full(&state));
                }
            }
        }
    }
}

/// Applies `changes`; whether it failed.
fn apply(backend: &mut impl Backend, changes: &ChangeSet<'_>) -> bool {
    match backend.apply(changes) {
        Ok(()) => false,
        Err(error) => {
            eprintln!("kpng-example-backend: {}", error_chain(&error));
            true
        }
    }
}
