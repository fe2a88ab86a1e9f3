//! `kpng-dev`: developer tools for kpng.
//!
//! `kpng-dev generate --services N --endpoints M --nodes K [--format yaml|yaml-list|json]`
//! prints a synthetic cluster as Kubernetes manifests, ready for `kpng file --input`.
//!
//! `kpng-dev apiserver --input FILE [--port P]` serves manifests (or a generated cluster)
//! from the fake API server, so `kpng kube --server http://127.0.0.1:P` (and
//! `kubectl --server ... get svc -A`) can run against a local fake cluster.

use std::io::Write;

use anyhow::Context;
use clap::{Parser, Subcommand, ValueEnum};
use kpng_testkit::generate::{ClusterSpec, generate, to_json_list, to_yaml, to_yaml_list};

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
    /// Serve Services, EndpointSlices and Nodes from manifests with a fake API server
    /// (list and watch over HTTP), until interrupted.
    Apiserver {
        /// The manifests (multi-document YAML, or JSON objects/lists).
        #[arg(long)]
        input: Option<std::path::PathBuf>,
        /// Or a generated cluster with this many services (4 endpoints each).
        #[arg(long, conflicts_with = "input")]
        services: Option<usize>,
        /// The port on 127.0.0.1 (0: any).
        #[arg(long, default_value_t = 0)]
        port: u16,
    },
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    /// Multi-document YAML.
    Yaml,
    /// One `kind: List` YAML document (what `kubectl get ... -o yaml` prints).
    YamlList,
    /// One `kind: List` JSON document.
    Json,
}

fn main() -> anyhow::Result<()> {
    match Cli::parse().command {
        Command::Generate { services, endpoints, nodes, zones, format, output } => {
            generate_cmd(&ClusterSpec { services, endpoints, nodes, zones }, format, output)
        }
        Command::Apiserver { input, services, port } => apiserver(input, services, port),
    }
}

/// The objects of a manifests file, as JSON.
fn manifests(path: &std::path::Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut objects = Vec::new();
    for doc in text.split("\n---") {
        // A cluster's listing is one large document: allow a node per byte.
        let mut budget = serde_saphyr::Budget::default();
        budget.max_nodes = budget.max_nodes.max(doc.len());
        budget.max_events = budget.max_events.max(2 * doc.len());
        let mut options = serde_saphyr::Options::default();
        options.budget = Some(budget);
        let value: serde_json::Value = serde_saphyr::from_str_with_options(doc, options)
            .with_context(|| format!("parsing {}", path.display()))?;
        match value.get("items").and_then(serde_json::Value::as_array) {
            Some(items) => objects.extend(items.iter().cloned()),
            None if value.get("kind").is_some() => objects.push(value),
            None => {}
        }
    }
    Ok(objects)
}

fn apiserver(
    input: Option<std::path::PathBuf>,
    services: Option<usize>,
    port: u16,
) -> anyhow::Result<()> {
    let objects = match (input, services) {
        (Some(path), _) => manifests(&path)?,
        (None, Some(services)) => generate(&ClusterSpec { services, ..ClusterSpec::default() }),
        (None, None) => anyhow::bail!("give --input FILE or --services N"),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        let server = kpng_testkit::apiserver::FakeApiServer::start_on(
            port,
            std::time::Duration::from_secs(5),
        )
        .await?;
        let mut count = 0;
        for object in objects {
            if kpng_testkit::apiserver::Resource::of(&object).is_some() {
                server.apply(object);
                count += 1;
            }
        }
        eprintln!("serving {count} objects at {}", server.url());
        std::future::pending::<()>().await;
        Ok(())
    })
}

fn generate_cmd(
    spec: &ClusterSpec,
    format: Format,
    output: Option<std::path::PathBuf>,
) -> anyhow::Result<()> {
    let objects = generate(spec);
    let text = match format {
        Format::Yaml => to_yaml(&objects).context("serializing the cluster as YAML")?,
        Format::YamlList => to_yaml_list(&objects).context("serializing the cluster as YAML")?,
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
