//! `to-local`: this node's ENLS, fed to backends.

use std::sync::Arc;

use anyhow::bail;
use kpng_backend::{Backend, JsonBackend, NodeStats, RunnerOptions, run_node};
use kpng_store::StoreReader;

use crate::cli::BackendCommand;

/// Builds the backends named on the command line. Backends this build lacks are an error.
pub fn build_backends(commands: &[BackendCommand]) -> anyhow::Result<Vec<Box<dyn Backend>>> {
    let mut backends: Vec<Box<dyn Backend>> = Vec::new();
    for command in commands {
        match command {
            BackendCommand::ToJson(_) => {
                backends.push(Box::new(JsonBackend::new(std::io::stdout())))
            }
            other => bail!("backend {} is not available in this build of kpng", other.name()),
        }
    }
    Ok(backends)
}

/// Runs the node's backends until the source ends (or once, with `once`).
pub async fn run_to_local(
    reader: StoreReader,
    node: String,
    backends: Vec<Box<dyn Backend>>,
    once: bool,
    stats: Arc<NodeStats>,
) -> anyhow::Result<()> {
    let mut options = RunnerOptions::new(node);
    options.once = once;
    run_node(reader, backends, options, stats).await?;
    Ok(())
}
