//! `kpng-dev`: developer tools for kpng.
//!
//! `kpng-dev generate --services N --endpoints M --nodes K` prints a synthetic cluster as
//! Kubernetes manifests, ready for `kpng file --input`.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kpng_testkit::generate::{ClusterSpec, generate, to_json_list, to_yaml};

/// Developer tools for kpng.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print a synthetic cluster (nodes, services, endpoint slices) as Kubernetes manifests.
    Generate {
        /// Number of services.
        #[arg(long, default_value_t = 1000)]
        services: usize,
        /// Endpoints per service.
        #[arg(long, default_value_t = 4)]
        endpoints: usize,
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Number of zones the nodes are spread over.
        #[arg(long, default_value_t = 2)]
        zones: usize,
        /// Output format.
        #[arg(long, value_enum, default_value_t = Format::Yaml)]
        format: Format,
        /// Write to this file instead of standard output.
        #[arg(long)]
        output: Option<std::path::PathBuf>,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// Multi-document YAML.
    Yaml,
    /// One `kind: List` JSON document.
    Json,
}

fn main() -> anyhow::Result<()> {
    let Command::Generate { services, endpoints, nodes, zones, format, output } =
        Cli::parse().command;
    let objects = generate(&ClusterSpec { services, endpoints, nodes, zones });
    let text = match format {
        Format::Yaml => to_yaml(&objects).context("serializing the cluster as YAML")?,
        Format::Json => to_json_list(&objects),
    };
    match output {
        Some(path) => {
            std::fs::write(&path, text).with_context(|| format!("writing {}", path.display()))?
        }
        None => std::io::stdout()
            .lock()
            .write_all(text.as_bytes())
            .context("writing to standard output")?,
    }
    Ok(())
}
