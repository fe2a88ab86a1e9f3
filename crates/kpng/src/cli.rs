//! The command line: a source, then a sink, then (for `to-local`) one or more backends.
//!
//! ```text
//! kpng file --input PATH [--watch] <sink>
//! kpng kube [--kubeconfig PATH] [--server URL] <sink>
//! kpng api --server ADDR <sink>
//! kpng local --server ADDR <backend> [<backend>...]
//! <sink>    := to-file --output PATH [--format yaml|json] | to-local <backend> [<backend>...]
//!            | to-api --listen ADDR
//! <backend> := to-json | to-nft
//! ```
//!
//! Options that concern the whole process (`--once`, `--node`, `--stats`, `--log`) are
//! accepted anywhere after `kpng`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

const AFTER_HELP: &str = "\
A pipeline reads left to right: a source fills the global model, a sink consumes it.
Examples:
  kpng file --input examples/cluster.yaml to-local --node node-a to-json --once
  kpng file --input cluster.yaml --watch to-file --output model.yaml
  kpng --stats file --input cluster.yaml --watch to-local to-json
  kpng kube to-api --listen unix:///run/kpng/kpng.sock     # one watcher serves...
  kpng local --server unix:///run/kpng/kpng.sock to-nft    # ...backends in other processes";

/// kpng: a Kubernetes service proxy built as a pipeline.
///
/// Sources write a reduced global model (services, endpoint slices, nodes); each node's
/// Expected Node-Local State is projected from it and diffed, and backends receive only real
/// changes.
#[derive(Debug, Parser)]
#[command(name = "kpng", version, after_help = AFTER_HELP, propagate_version = true)]
pub struct Cli {
    /// Options for the whole process.
    #[command(flatten)]
    pub global: GlobalArgs,
    /// The source of the global model.
    #[command(subcommand)]
    pub source: SourceCommand,
}

/// Options for the whole process, accepted anywhere on the command line.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Apply the state once, then exit: 0 after the first successful sync of every backend
    /// (or the first write of `to-file`), non-zero with the error otherwise.
    #[arg(long, global = true)]
    pub once: bool,

    /// Print a tab-separated stats line every second on standard error: time (ms), source
    /// events, store revisions, node-state revisions, user and system CPU (ms), CPU %, RSS
    /// (MiB), and revisions per event (%).
    #[arg(long, global = true)]
    pub stats: bool,

    /// The node whose state `to-local` computes. Defaults to $NODE_NAME, then the hostname.
    #[arg(long, global = true, env = "NODE_NAME", value_name = "NAME")]
    pub node: Option<String>,

    /// Log filter for standard error, in RUST_LOG syntax (`info`, `debug`, `kpng_sources=debug`).
    #[arg(long, global = true, env = "KPNG_LOG", default_value = "info", value_name = "FILTER")]
    pub log: String,

    /// Print what backends would install (for `to-nft`: nft commands that `nft -f`
    /// accepts) on standard output, and touch nothing.
    #[arg(long, global = true)]
    pub dry_run: bool,

    /// The cluster's pod CIDRs (comma-separated, one per family): traffic from them is
    /// "local pod" traffic, not masqueraded to cluster IPs and short-circuited to the
    /// Cluster set for externalTrafficPolicy Local. Default: the node's podCIDRs.
    #[arg(long, global = true, value_delimiter = ',', value_name = "CIDRS")]
    pub cluster_cidr: Vec<ipnet::IpNet>,

    /// Masquerade (SNAT) all traffic to cluster IPs.
    #[arg(long, global = true)]
    pub masquerade_all: bool,

    /// Where NodePorts are accepted: `primary` (the Node object's primary IPs) or
    /// comma-separated CIDRs (local addresses inside them; `0.0.0.0/0,::/0` for all but
    /// loopback).
    #[arg(long, global = true, default_value = "primary", value_name = "primary|CIDRS")]
    pub nodeport_addresses: String,

    /// The bit of the packet mark used to flag connections for masquerading (0-31).
    /// Only this bit is read or written.
    #[arg(long, global = true, default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..32))]
    pub masquerade_bit: u8,

    /// Where /healthz, /livez and /readyz are served (port 0: not at all). Not with --once.
    #[arg(
        long,
        global = true,
        env = "KPNG_HEALTHZ_BIND_ADDRESS",
        default_value = "0.0.0.0:10256",
        value_name = "IP:PORT"
    )]
    pub healthz_bind_address: std::net::SocketAddr,

    /// Where /metrics (Prometheus) and /state (the model and this node's state as JSON) are
    /// served (port 0: not at all). Not with --once.
    #[arg(
        long,
        global = true,
        env = "KPNG_METRICS_BIND_ADDRESS",
        default_value = "127.0.0.1:10249",
        value_name = "IP:PORT"
    )]
    pub metrics_bind_address: std::net::SocketAddr,

    /// Least time between two change sets applied by backends, after a burst of two;
    /// changes arriving meanwhile are applied together (`0`: every change at once).
    #[arg(long, global = true, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
    pub min_sync_period: std::time::Duration,

    /// A YAML file with process-wide options keyed by flag name (`min-sync-period: 2s`);
    /// flags win over it. `kpng config print-defaults` prints a complete one.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// The sync period: how often backends check that the kernel still holds what they
    /// committed and repair what changed behind their back (`0`: never); /healthz and
    /// /livez fail when a change has waited unapplied for more than twice this (`30s`,
    /// `1m`, `500ms`).
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub sync_period: std::time::Duration,
}

/// The built-in default of process-wide option `--key`, as written on the command line.
pub fn builtin_default(key: &str) -> Option<String> {
    use clap::CommandFactory;
    let command = Defaults::command();
    let arg = command.get_arguments().find(|a| a.get_long() == Some(key))?;
    arg.get_default_values().first().map(|v| v.to_string_lossy().into_owned())
}

/// Checks process-wide option arguments (`["--sync-period", "10s"]`) as the command line
/// would; the error is clap's message.
pub fn check_global_args(args: &[String]) -> Result<(), String> {
    global_args_from(args).map(|_| ())
}

/// Process-wide options from `args` alone.
pub fn global_args_from(args: &[String]) -> Result<GlobalArgs, String> {
    Defaults::try_parse_from(args).map(|d| d.global).map_err(|e| e.to_string())
}

/// A duration: a number and a unit (`ms`, `s`, `m`, `h`), e.g. `30s`, `1m`, `1.5s`.
pub fn parse_duration(text: &str) -> Result<std::time::Duration, String> {
    let at = text.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(text.len());
    let (number, unit) = text.split_at(at);
    let value: f64 = number.parse().map_err(|_| format!("{text:?} is not a duration like 30s"))?;
    let seconds = match unit {
        "" if value == 0.0 => 0.0,
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{text:?}: the unit must be ms, s, m or h")),
    };
    std::time::Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// Parses no arguments: the defaults (and environment) of [`GlobalArgs`].
#[derive(Debug, Parser)]
#[command(no_binary_name = true)]
struct Defaults {
    #[command(flatten)]
    global: GlobalArgs,
}

impl GlobalArgs {
    /// The values of every option left unset.
    pub fn default_values() -> GlobalArgs {
        Defaults::try_parse_from(Vec::<String>::new()).expect("the defaults parse").global
    }

    /// Combines options given after a later backend with these.
    pub fn merge(&mut self, later: GlobalArgs) {
        self.once |= later.once;
        self.stats |= later.stats;
        self.dry_run |= later.dry_run;
        self.masquerade_all |= later.masquerade_all;
        if !later.cluster_cidr.is_empty() {
            self.cluster_cidr = later.cluster_cidr;
        }
        if later.nodeport_addresses != "primary" {
            self.nodeport_addresses = later.nodeport_addresses;
        }
        if later.masquerade_bit != 14 {
            self.masquerade_bit = later.masquerade_bit;
        }
        if later.node.is_some() {
            self.node = later.node;
        }
        if later.log != "info" {
            self.log = later.log;
        }
        let defaults = Self::default_values();
        if later.healthz_bind_address != defaults.healthz_bind_address {
            self.healthz_bind_address = later.healthz_bind_address;
        }
        if later.metrics_bind_address != defaults.metrics_bind_address {
            self.metrics_bind_address = later.metrics_bind_address;
        }
        if later.min_sync_period != defaults.min_sync_period {
            self.min_sync_period = later.min_sync_period;
        }
        if later.sync_period != defaults.sync_period {
            self.sync_period = later.sync_period;
        }
    }
}

/// Where the global model comes from.
#[derive(Debug, Subcommand)]
pub enum SourceCommand {
    /// Read Kubernetes manifests (Service, EndpointSlice, Node) from a file.
    File(FileArgs),
    /// Watch a Kubernetes API server: Services, EndpointSlices and this node (or every node).
    Kube(KubeArgs),
    /// Replicate another kpng's global model from its `to-api` (gRPC), so kpng instances
    /// chain: cluster watcher -> relay -> nodes.
    Api(ApiArgs),
    /// Run backends fed by another kpng's `to-api` with this node's state (gRPC). A
    /// reconnection that finds nothing new changes nothing in the kernel.
    Local(LocalArgs),
    /// Remove every kernel object kpng installed (its `ip kpng` and `ip6 kpng` nftables
    /// tables) and nothing else, then exit.
    Cleanup(CleanupArgs),
    /// Print the version, the git commit built from, and what this build contains.
    Version,
    /// The config file (`--config PATH`).
    Config(ConfigArgs),
}

/// `kpng config`.
#[derive(Debug, Args)]
pub struct ConfigArgs {
    /// What to do.
    #[command(subcommand)]
    pub command: ConfigCommand,
}

/// `kpng config` commands.
#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print a complete config file: every key at its default, each explained.
    PrintDefaults,
}

/// `kpng kube`.
#[derive(Debug, Args)]
pub struct KubeArgs {
    /// The kubeconfig to use. Default: $KUBECONFIG, then ~/.kube/config, then the
    /// in-cluster service account.
    #[arg(long, env = "KUBECONFIG", value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,

    /// The API server URL, overriding the kubeconfig's (alone: an unauthenticated server).
    #[arg(long, alias = "master", value_name = "URL")]
    pub server: Option<String>,

    /// This proxy's name: only Services and EndpointSlices labelled
    /// `service.kubernetes.io/service-proxy-name=NAME` are proxied (the API server sends only
    /// those); unlabelled ones belong to the default proxy. Without it, only unlabelled ones.
    #[arg(long, value_name = "NAME", value_parser = parse_proxy_name)]
    pub service_proxy_name: Option<String>,

    /// Watch every Node, not only this one (what a cluster-wide `to-api` needs).
    #[arg(long)]
    pub all_nodes: bool,

    /// API requests per second, on average, from this client (0: no limit). A list counts
    /// once however many pages it takes, a watch once when it starts; watches are
    /// long-lived, so this paces lists and re-lists.
    #[arg(long, default_value_t = 5.0, value_name = "QPS", value_parser = parse_qps, allow_negative_numbers = true)]
    pub kube_api_qps: f64,

    /// API requests allowed at once before `--kube-api-qps` paces them.
    #[arg(long, default_value_t = 10, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub kube_api_burst: u32,

    /// What consumes the model.
    #[command(subcommand)]
    pub sink: SinkCommand,
}

fn parse_proxy_name(text: &str) -> Result<String, String> {
    kpng_sources::convert::check_proxy_name(text).map(|()| text.to_string())
}

fn parse_qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(qps) if qps.is_finite() && qps >= 0.0 => Ok(qps),
        _ => Err(format!("{text:?} is not a rate: a number of requests per second, 0 or more")),
    }
}

/// `kpng cleanup`.
#[derive(Debug, Args)]
pub struct CleanupArgs {
    /// Which backend's objects to remove.
    #[arg(long, value_enum, default_value_t = CleanupBackend::All)]
    pub backend: CleanupBackend,
}

/// Backends `kpng cleanup` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CleanupBackend {
    /// The nftables tables.
    Nft,
    /// Everything kpng may have installed.
    All,
}

/// `kpng file`.
#[derive(Debug, Args)]
pub struct FileArgs {
    /// The manifests: multi-document YAML, JSON, or a `kind: List` (as printed by
    /// `kubectl get svc,endpointslices,nodes -A -o yaml`). Other kinds are skipped.
    #[arg(long, short, value_name = "PATH")]
    pub input: PathBuf,

    /// Re-read the file whenever it changes and apply only the difference. An invalid
    /// edit is logged and the last good state stays in force.
    #[arg(long)]
    pub watch: bool,

    /// This proxy's name: only Services and EndpointSlices labelled
    /// `service.kubernetes.io/service-proxy-name=NAME` are proxied; unlabelled ones belong to
    /// the default proxy. Without it, only unlabelled ones.
    #[arg(long, value_name = "NAME", value_parser = parse_proxy_name)]
    pub service_proxy_name: Option<String>,

    /// What consumes the model.
    #[command(subcommand)]
    pub sink: SinkCommand,
}

/// What consumes the global model.
#[derive(Debug, Subcommand)]
#[allow(clippy::enum_variant_names)] // the variants are the command names: to-file, to-local, to-api
pub enum SinkCommand {
    /// Write the global model to a file, rewritten (atomically) on every change.
    ToFile(ToFileArgs),
    /// Compute this node's state and feed it to one or more backends.
    ToLocal(ToLocalArgs),
    /// Serve the global model and each node's state over gRPC (/globalv1.Sets/Watch,
    /// /localv1.Sets/Watch), wire-compatible with the original kpng.
    ToApi(ToApiArgs),
}

/// How a gRPC connection is protected (`to-api`, `api`, `local`).
#[derive(Debug, Clone, Args)]
pub struct ConnArgs {
    /// Our TLS certificate (PEM) for mutual TLS on tcp:// addresses; needs --tls-key and
    /// --tls-ca.
    #[arg(long, value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// Our TLS private key (PEM).
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) that must have signed the peer's certificate.
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// Allow plaintext TCP to or on an address that is not loopback.
    #[arg(long)]
    pub insecure: bool,
}

impl ConnArgs {
    /// The security settings these flags describe.
    pub fn security(&self) -> kpng_api::Security {
        let tls = match (&self.tls_cert, &self.tls_key, &self.tls_ca) {
            (Some(cert), Some(key), Some(ca)) => {
                Some(kpng_api::TlsFiles { cert: cert.clone(), key: key.clone(), ca: ca.clone() })
            }
            _ => None,
        };
        kpng_api::Security { tls, insecure: self.insecure }
    }
}

/// A gRPC address: `unix:///path` or `tcp://host:port`.
fn parse_address(text: &str) -> Result<kpng_api::Address, String> {
    text.parse().map_err(|e: kpng_api::addr::AddressError| e.to_string())
}

/// `to-api`.
#[derive(Debug, Args)]
pub struct ToApiArgs {
    /// Where to listen: unix:///path (created mode 0600, its directory if missing) or
    /// tcp://host:port (port 0: any; the address is logged).
    #[arg(long, value_name = "ADDR", default_value = kpng_api::addr::DEFAULT_ADDRESS, value_parser = parse_address)]
    pub listen: kpng_api::Address,
    /// Connection security.
    #[command(flatten)]
    pub conn: ConnArgs,
}

/// `kpng api`.
#[derive(Debug, Args)]
pub struct ApiArgs {
    /// The `to-api` server to replicate: unix:///path or tcp://host:port.
    #[arg(long, value_name = "ADDR", default_value = kpng_api::addr::DEFAULT_ADDRESS, value_parser = parse_address)]
    pub server: kpng_api::Address,
    /// Connection security.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// This proxy's name: only Services and EndpointSlices labelled
    /// `service.kubernetes.io/service-proxy-name=NAME` are kept from the stream; unlabelled
    /// ones belong to the default proxy. Without it, only unlabelled ones.
    #[arg(long, value_name = "NAME", value_parser = parse_proxy_name)]
    pub service_proxy_name: Option<String>,
    /// What consumes the model.
    #[command(subcommand)]
    pub sink: SinkCommand,
}

/// `kpng local`.
#[derive(Debug, Args)]
#[command(after_help = "Several backends may follow one another: `local to-json to-nft`.")]
pub struct LocalArgs {
    /// The `to-api` server: unix:///path or tcp://host:port.
    #[arg(long, value_name = "ADDR", default_value = kpng_api::addr::DEFAULT_ADDRESS, value_parser = parse_address)]
    pub server: kpng_api::Address,
    /// Connection security.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// The backends.
    #[command(flatten)]
    pub backends: ToLocalArgs,
}

/// `to-file`.
#[derive(Debug, Args)]
pub struct ToFileArgs {
    /// The file to write. It is replaced by rename, so readers never see half a file.
    #[arg(long, short, value_name = "PATH")]
    pub output: PathBuf,
    /// The format.
    #[arg(long, value_enum, default_value_t = FileFormat::Yaml)]
    pub format: FileFormat,
}

/// Formats of `to-file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FileFormat {
    /// YAML.
    Yaml,
    /// JSON (pretty-printed).
    Json,
}

/// `to-local`.
#[derive(Debug, Args)]
#[command(after_help = "Several backends may follow one another: `to-local to-json to-json`.")]
pub struct ToLocalArgs {
    /// The first backend.
    #[command(subcommand)]
    pub backend: BackendCommand,
}

/// A backend of `to-local`.
#[derive(Debug, Clone, Subcommand)]
#[allow(clippy::enum_variant_names)] // the variants are the command names: to-json, to-nft, ...
pub enum BackendCommand {
    /// Write the node's op stream as JSON lines on standard output (reset, set, delete,
    /// sync): the debugging backend.
    ToJson(Chain),
    /// nftables: one table per family with a constant number of chains; services and
    /// endpoints are elements of hash maps. Use --dry-run to print the ruleset.
    ToNft(Chain),
    /// iptables. Not available in this build.
    ToIptables(Chain),
    /// A userspace proxy. Not available in this build.
    ToUserspace(Chain),
}

impl BackendCommand {
    /// The backend's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            BackendCommand::ToJson(_) => "to-json",
            BackendCommand::ToNft(_) => "to-nft",
            BackendCommand::ToIptables(_) => "to-iptables",
            BackendCommand::ToUserspace(_) => "to-userspace",
        }
    }

    fn chain(&self) -> &Chain {
        match self {
            BackendCommand::ToJson(c)
            | BackendCommand::ToNft(c)
            | BackendCommand::ToIptables(c)
            | BackendCommand::ToUserspace(c) => c,
        }
    }
}

/// What follows a backend: further backends, with their own options.
#[derive(Debug, Clone, Args)]
pub struct Chain {
    /// Further backends, each with its options.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "BACKEND",
        hide = true
    )]
    pub next: Vec<String>,
}

/// The parser for backends after the first.
#[derive(Debug, Parser)]
#[command(name = "to-local", no_binary_name = true)]
struct NextBackend {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    backend: BackendCommand,
}

impl ToLocalArgs {
    /// Every backend in command-line order. Options for the whole process given after a
    /// later backend are merged into `global`.
    pub fn backends(&self, global: &mut GlobalArgs) -> Result<Vec<BackendCommand>, clap::Error> {
        let mut backends = vec![self.backend.clone()];
        let mut next = self.backend.chain().next.clone();
        while !next.is_empty() {
            let parsed = NextBackend::try_parse_from(&next)?;
            global.merge(parsed.global);
            next = parsed.backend.chain().next.clone();
            backends.push(parsed.backend);
        }
        Ok(backends)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn global_options_anywhere_and_backends_chain() {
        let cli = parse(&[
            "kpng", "file", "--input", "c.yaml", "to-local", "--node", "n1", "to-json", "--once",
            "to-json", "--stats",
        ]);
        let mut global = cli.global.clone();
        let SourceCommand::File(file) = cli.source else { panic!() };
        let SinkCommand::ToLocal(local) = file.sink else { panic!() };
        let backends = local.backends(&mut global).unwrap();
        assert_eq!(backends.iter().map(|b| b.name()).collect::<Vec<_>>(), ["to-json", "to-json"]);
        assert!(global.once && global.stats);
        assert_eq!(global.node.as_deref(), Some("n1"));

        let cli = parse(&[
            "kpng", "--once", "file", "-i", "c.yaml", "to-file", "-o", "out.json", "--format",
            "json",
        ]);
        assert!(cli.global.once);
    }

    #[test]
    fn unknown_backends_are_rejected() {
        let cli = parse(&["kpng", "file", "--input", "c", "to-local", "to-json", "to-bogus"]);
        let mut global = cli.global.clone();
        let SourceCommand::File(file) = cli.source else { panic!() };
        let SinkCommand::ToLocal(local) = file.sink else { panic!() };
        let err = local.backends(&mut global).unwrap_err().to_string();
        assert!(err.contains("to-bogus"), "{err}");
    }
}

#[cfg(test)]
mod duration_tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_take_a_unit() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(parse_duration("30").unwrap_err().contains("unit"));
        assert!(parse_duration("fast").unwrap_err().contains("not a duration"));
    }
}
