//! The command line: a source, then a sink, then (for `to-local`) one or more backends.
//!
//! ```text
//! kpng file --input PATH [--watch] [--service-proxy-name NAME] <sink>
//! kpng kube [--kubeconfig PATH] [--server URL] [--service-proxy-name NAME] <sink>
//! kpng api --server ADDR [--service-proxy-name NAME] <sink>
//! kpng local --server ADDR <backend> [<backend>...]
//! <sink>    := to-file --output PATH [--format yaml|json] | to-local <backend> [<backend>...]
//!            | to-api --listen ADDR [--max-clients N] [--client-timeout DURATION]
//! <backend> := to-json | to-nft | to-iptables [--iptables-mode auto|nft|legacy]
//!            | to-ebpf [--cgroup-path PATH] [--bpf-pin-path PATH]
//!            | to-nftlb --nftlb-key-file PATH [--nftlb-url URL] [--nftlb-interface IFACE]
//! kpng cleanup [--backend nft|iptables|ebpf|nftlb|all] [--bpf-pin-path PATH]
//!              [--nftlb-key-file PATH] [--nftlb-url URL]
//! kpng aggregate [--listen ADDR] [--producer-lease DURATION] [--netns NAME]
//! kpng publish --producer NAME --file PATH [--aggregator ADDR]
//! ```
//!
//! Options that concern the whole process ([`global`]: `--once`, `--node`, `--stats`, the
//! proxy, conntrack, sync and server options) are accepted anywhere after `kpng`: they are
//! moved to the front before parsing ([`hoist_global_args`]).
//!
//! Kept in one file on purpose: clap derives the whole tree (sources, sinks, backends)
//! from these declarations, and each subcommand's help is written beside its siblings'.
//! Process-wide options are in `global`.

mod global;

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use global::parse_duration;

pub use global::{
    GlobalArgs, GlobalOption, LogFormat, LoggingArgs, clap_message, global_args_from,
    global_options, hoist_global_args,
};

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

/// Where the global model comes from.
#[derive(Debug, Subcommand)]
pub enum SourceCommand {
    /// Read Kubernetes manifests (Service, EndpointSlice, Node, ServiceCIDR) from a file.
    File(FileArgs),
    /// Watch a Kubernetes API server: Services, EndpointSlices, ServiceCIDRs and this node
    /// (or every node).
    Kube(KubeArgs),
    /// Replicate another kpng's global model from its `to-api` (gRPC), so kpng instances
    /// chain: cluster watcher -> relay -> nodes.
    Api(ApiArgs),
    /// Run backends fed by another kpng's `to-api` with this node's state (gRPC). A
    /// reconnection that finds nothing new changes nothing in the kernel.
    Local(LocalArgs),
    /// Remove every kernel object kpng installed (its `ip kpng` and `ip6 kpng` nftables
    /// tables, its KPNG-* iptables chains, its eBPF programs' links and maps pinned under
    /// --bpf-pin-path) and nothing else, then exit.
    Cleanup(CleanupArgs),
    /// Run the nftables aggregator: the one process that programs the node's nftables,
    /// committing the tables many producers publish (over `aggregatorv1`) in one
    /// transaction per batch, paced by --min-sync-period.
    Aggregate(AggregateArgs),
    /// Publish a ruleset in nft syntax (tables, chains with rules, sets and maps with
    /// elements) to an aggregator as producer NAME, and its changes on every edit of the
    /// file; with --once, exit once the aggregator has committed it.
    Publish(PublishArgs),
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

    /// Which Services and EndpointSlices are this proxy's (the API server sends only those).
    #[command(flatten)]
    pub proxy_name: ProxyNameArgs,

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

/// Which Services and EndpointSlices a source keeps: the same option on every source that
/// reads them (`kube`, `file`, `api`).
#[derive(Debug, Clone, Args)]
pub struct ProxyNameArgs {
    /// This proxy's name: only Services and EndpointSlices labelled
    /// `service.kubernetes.io/service-proxy-name=NAME` are proxied; unlabelled ones belong to
    /// the default proxy. Without it, only unlabelled ones.
    #[arg(long, value_name = "NAME", value_parser = parse_proxy_name)]
    pub service_proxy_name: Option<String>,
}

impl ProxyNameArgs {
    /// The conversion options this choice makes.
    pub fn convert_options(&self) -> kpng_sources::ConvertOptions {
        kpng_sources::ConvertOptions { service_proxy_name: self.service_proxy_name.clone() }
    }
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
    /// Which backend's objects to remove: `nft` only the nftables tables, `iptables` only
    /// the KPNG-* chains (of both iptables variants), `ebpf` only the eBPF links and maps,
    /// `nftlb` every farm of the nftlb daemon, `all` everything (nftlb's farms when
    /// --nftlb-key-file is given).
    #[arg(long, value_enum, default_value_t = CleanupBackend::All)]
    pub backend: CleanupBackend,
    /// Where `to-ebpf` pinned them.
    #[command(flatten)]
    pub pins: BpfPinArgs,
    /// The nftlb daemon `to-nftlb` drove.
    #[command(flatten)]
    pub nftlb: NftlbDaemonArgs,
    /// Also remove kube-proxy's leftovers: its `kube-proxy` nftables tables, its iptables
    /// chains and the jumps into them (both variants), its IPVS interface and ipsets.
    #[arg(long)]
    pub kube_proxy: bool,
}

impl CleanupBackend {
    /// Whether the nftables tables are removed.
    pub fn nft(self) -> bool {
        matches!(self, CleanupBackend::Nft | CleanupBackend::All)
    }

    /// Whether the iptables chains are removed.
    pub fn iptables(self) -> bool {
        matches!(self, CleanupBackend::Iptables | CleanupBackend::All)
    }

    /// Whether the eBPF links and maps are removed.
    pub fn ebpf(self) -> bool {
        matches!(self, CleanupBackend::Ebpf | CleanupBackend::All)
    }

    /// Whether nftlb's farms are removed.
    pub fn nftlb(self) -> bool {
        matches!(self, CleanupBackend::Nftlb | CleanupBackend::All)
    }
}

/// Backends `kpng cleanup` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CleanupBackend {
    /// The nftables tables.
    Nft,
    /// The KPNG-* chains of iptables and ip6tables, and the jumps into them.
    Iptables,
    /// The eBPF programs (detached) and maps (unpinned) under `--bpf-pin-path`.
    Ebpf,
    /// Every farm of the nftlb daemon `to-nftlb` drove.
    Nftlb,
    /// Everything kpng may have installed.
    All,
}

/// `kpng file`.
#[derive(Debug, Args)]
pub struct FileArgs {
    /// The manifests: multi-document YAML, JSON, or a `kind: List` (as printed by
    /// `kubectl get svc,endpointslices,nodes,servicecidrs -A -o yaml`). Other kinds are
    /// skipped.
    #[arg(long, short, value_name = "PATH")]
    pub input: PathBuf,

    /// Re-read the file whenever it changes and apply only the difference. What looks like
    /// a write in progress is not applied: an empty, unreadable or invalid file is logged
    /// and the last good state stays in force; one that ends mid-line or would remove more
    /// than half of the objects is applied only if it stays so for 10 s (to remove
    /// everything, write a List with `items: []`).
    #[arg(long)]
    pub watch: bool,

    /// Which Services and EndpointSlices are this proxy's.
    #[command(flatten)]
    pub proxy_name: ProxyNameArgs,

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

/// How a gRPC connection is protected (`to-api`, `aggregate`, and their clients `api`,
/// `local`, `publish`, `to-nft --aggregator`). A unix:// socket admits, and its clients
/// trust, root and kpng's own user, plus what --allow-uid and --allow-gid add; tcp://
/// needs mutual TLS, or --insecure.
#[derive(Debug, Clone, Args)]
pub struct ConnArgs {
    /// Our TLS certificate (PEM) for mutual TLS on tcp:// addresses; needs --tls-key and
    /// --tls-ca. For loopback it needs the loopback IPs as subject alternative names.
    #[arg(long, value_name = "PATH", requires_all = ["tls_key", "tls_ca"])]
    pub tls_cert: Option<PathBuf>,
    /// Our TLS private key (PEM).
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_ca"])]
    pub tls_key: Option<PathBuf>,
    /// The CA (PEM) that must have signed the peer's certificate.
    #[arg(long, value_name = "PATH", requires_all = ["tls_cert", "tls_key"])]
    pub tls_ca: Option<PathBuf>,
    /// Allow plaintext TCP, loopback included: anyone who reaches the port may connect,
    /// and whoever listens on it is believed. Logged as a warning at start.
    #[arg(long)]
    pub insecure: bool,
    /// On a unix:// socket, a user (name or uid; repeat or separate with commas) allowed
    /// besides root and kpng's own user: on a server, to connect (the socket becomes mode
    /// 0666 and each client's credentials are checked); on a client, to be the server.
    #[arg(long, value_name = "USER", value_delimiter = ',', value_parser = parse_uid)]
    pub allow_uid: Vec<u32>,
    /// On a unix:// server socket, a group (name or gid; repeat or separate with commas)
    /// whose members may connect (its primary or a supplementary group). With one group the
    /// socket becomes mode 0660 and that group's.
    #[arg(long, value_name = "GROUP", value_delimiter = ',', value_parser = parse_gid)]
    pub allow_gid: Vec<u32>,
}

/// Which end of a connection a command is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnRole {
    /// It listens (`to-api`, `aggregate`).
    Server,
    /// It connects (`api`, `local`, `publish`, `to-nft --aggregator`).
    Client,
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
        let allowed =
            kpng_api::peer::Allowed { uids: self.allow_uid.clone(), gids: self.allow_gid.clone() };
        kpng_api::Security { tls, insecure: self.insecure, allowed }
    }

    /// The settings for `address`, checked before anything starts (TLS files readable,
    /// plaintext asked for, users and groups where they apply); plaintext TCP is logged as
    /// a warning.
    pub fn checked(
        &self,
        address: &kpng_api::Address,
        role: ConnRole,
    ) -> anyhow::Result<kpng_api::Security> {
        if role == ConnRole::Client && !self.allow_gid.is_empty() {
            anyhow::bail!(
                "--allow-gid admits clients to a server; a client trusts a server by its user \
                 (--allow-uid)"
            );
        }
        let security = self.security();
        security.validate(address)?;
        if let Some(files) = &security.tls {
            crate::operator_files::warn_if_shared(&files.cert, "--tls-cert");
            crate::operator_files::warn_if_shared(&files.key, "--tls-key");
            crate::operator_files::warn_if_shared(&files.ca, "--tls-ca");
        }
        if security.is_plaintext_tcp(address) {
            tracing::warn!(
                %address,
                "--insecure: plaintext TCP; anyone who reaches the port can connect, and \
                 anyone who listens on it in its place is believed"
            );
        }
        Ok(security)
    }
}

/// A size in bytes: a number, or with `Ki`, `Mi` or `Gi`.
fn parse_bytes(text: &str) -> Result<usize, String> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let shift = match unit {
        "" => 0,
        "Ki" => 10,
        "Mi" => 20,
        "Gi" => 30,
        _ => return Err(format!("{text:?}: expected a number of bytes, or with Ki, Mi or Gi")),
    };
    let number: usize = number.parse().map_err(|_| format!("{text:?} is not a size"))?;
    number
        .checked_mul(1 << shift)
        .filter(|bytes| *bytes > 0)
        .ok_or_else(|| format!("{text:?}: more than 0, and not that much"))
}

fn parse_uid(text: &str) -> Result<u32, String> {
    parse_id(text, "user", |name| {
        nix::unistd::User::from_name(name).map(|user| user.map(|u| u.uid.as_raw()))
    })
}

fn parse_gid(text: &str) -> Result<u32, String> {
    parse_id(text, "group", |name| {
        nix::unistd::Group::from_name(name).map(|group| group.map(|g| g.gid.as_raw()))
    })
}

/// A number, or a `what` (user, group) looked up by name.
fn parse_id(
    text: &str,
    what: &str,
    lookup: impl FnOnce(&str) -> nix::Result<Option<u32>>,
) -> Result<u32, String> {
    if let Ok(id) = text.parse() {
        return Ok(id);
    }
    match lookup(text) {
        Ok(Some(id)) => Ok(id),
        Ok(None) => Err(format!("no {what} named {text:?} (give a name or a number)")),
        Err(e) => Err(format!("looking up {what} {text:?}: {e}")),
    }
}

/// A gRPC address: `unix:///path` or `tcp://host:port`.
fn parse_address(text: &str) -> Result<kpng_api::Address, String> {
    text.parse().map_err(|e: kpng_api::addr::AddressError| e.to_string())
}

/// `to-api`.
#[derive(Debug, Args)]
pub struct ToApiArgs {
    /// Where to listen: unix:///path (created mode 0600 unless --allow-uid or --allow-gid
    /// say otherwise, its directory if missing; refused in a directory others can write) or
    /// tcp://host:port with mutual TLS (port 0: any; the address is logged).
    #[arg(long, value_name = "ADDR", default_value = kpng_api::addr::DEFAULT_ADDRESS, value_parser = parse_address)]
    pub listen: kpng_api::Address,
    /// Clients (connections) served at once; one more is closed at once and retries later
    /// (default: a quarter of the open-file limit).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_clients: Option<u32>,
    /// A client that leaves an answer unread this long, or a connection that opens no
    /// stream for this long, is disconnected (its slot and memory are freed).
    #[arg(long, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub client_timeout: std::time::Duration,
    /// Connection security.
    #[command(flatten)]
    pub conn: ConnArgs,
}

/// The aggregator's default address.
pub const AGGREGATOR_ADDRESS: &str = "unix:///run/kpng/aggregator.sock";

/// `kpng aggregate`.
#[derive(Debug, Args)]
pub struct AggregateArgs {
    /// Where producers connect: unix:///path (created mode 0600 unless --allow-uid or
    /// --allow-gid say otherwise, its directory if missing; refused in a directory others
    /// can write) or tcp://host:port (mutual TLS, or plaintext with --insecure).
    #[arg(long, value_name = "ADDR", default_value = AGGREGATOR_ADDRESS, value_parser = parse_address)]
    pub listen: kpng_api::Address,
    /// Where each producer name's owner is kept: the identity (Unix user, or TLS
    /// certificate names) that first published under it. Another identity is refused that
    /// name, after a restart too. Remove an entry (with the aggregator stopped) to free a
    /// name.
    #[arg(long, value_name = "PATH", default_value = "/var/lib/kpng/aggregator-producers.json")]
    pub producer_bindings: PathBuf,
    /// A producer whose publications are refused this many times in a row is cut off (its
    /// stream ends with the reason; its tables stay for the lease).
    #[arg(long, value_name = "N", default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_rejections: u32,
    /// Bytes of a producer's publications held before the aggregator has answered them;
    /// past it the producer's stream is not read until answers come, and a larger
    /// publication is refused. The default (128 MiB) holds two whole states of `to-nft` at
    /// 100,000 services.
    #[arg(long, value_name = "BYTES", default_value_t = kpng_aggregator::service::MAX_UNACKNOWLEDGED, value_parser = parse_bytes)]
    pub max_unacknowledged_bytes: usize,
    /// How long a producer that disconnected keeps its tables; then they are deleted.
    /// After a restart, producers found in the kernel get this long to publish again.
    #[arg(long, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub producer_lease: std::time::Duration,
    /// Program this named network namespace (`ip netns exec NAME nft ...`) instead of
    /// the process's own.
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,
    /// Connection security.
    #[command(flatten)]
    pub conn: ConnArgs,
}

/// `kpng publish`.
#[derive(Debug, Args)]
pub struct PublishArgs {
    /// This producer's name (letters, digits, '_', '-', '.'); its tables are marked with it.
    #[arg(long, value_name = "NAME")]
    pub producer: String,
    /// The ruleset, in nft syntax; watched, and its changes published.
    #[arg(long, value_name = "PATH")]
    pub file: PathBuf,
    /// The aggregator: unix:///path or tcp://host:port.
    #[arg(long, value_name = "ADDR", default_value = AGGREGATOR_ADDRESS, value_parser = parse_address)]
    pub aggregator: kpng_api::Address,
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
    /// Which Services and EndpointSlices of the stream are this proxy's.
    #[command(flatten)]
    pub proxy_name: ProxyNameArgs,
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
    /// endpoints are elements of hash maps. Use --dry-run to print the ruleset, and
    /// --aggregator to publish the tables through `kpng aggregate` instead of programming
    /// them directly.
    ToNft(NftArgs),
    /// eBPF socket-level translation: cgroup programs choose the endpoint at connect()
    /// (TCP) or sendmsg() (UDP) for sockets of this node, so their packets need no NAT.
    /// Cluster IPs, and for local sockets NodePorts, external and load-balancer IPs; SCTP
    /// and traffic from other hosts stay on the packet path: use with to-nft
    /// (`to-local to-ebpf to-nft`). --dry-run prints the map writes.
    ToEbpf(EbpfArgs),
    /// iptables (kube-proxy's iptables mode): KPNG-* chains in the nat and filter tables
    /// of iptables and ip6tables, sharded so that neither a new connection nor a change
    /// walks a rule per service; each change is one iptables-restore --noflush per family.
    /// --dry-run prints the restore input.
    ToIptables(IptablesArgs),
    /// nftlb: one farm per service port and family, driven through the nftlb daemon's REST
    /// API (which must run on this node); an endpoint change adds or deletes one backend.
    /// Cluster IPs only: NodePorts, externalIPs, load-balancer IPs and ClientIP affinity
    /// are logged as not enforced.
    ToNftlb(NftlbArgs),
}

impl BackendCommand {
    /// The backend's name on the command line.
    pub fn name(&self) -> &'static str {
        match self {
            BackendCommand::ToJson(_) => "to-json",
            BackendCommand::ToNft(_) => "to-nft",
            BackendCommand::ToEbpf(_) => "to-ebpf",
            BackendCommand::ToIptables(_) => "to-iptables",
            BackendCommand::ToNftlb(_) => "to-nftlb",
        }
    }

    /// Whether the backend programs the kernel's dataplane. Such a backend takes the node's
    /// instance lock, and brings with it what every kernel dataplane needs: conntrack
    /// tuning and stale-flow cleanup, and the health-check NodePort servers.
    pub fn programs_kernel(&self) -> bool {
        match self {
            BackendCommand::ToNft(_)
            | BackendCommand::ToEbpf(_)
            | BackendCommand::ToIptables(_)
            | BackendCommand::ToNftlb(_) => true,
            BackendCommand::ToJson(_) => false,
        }
    }

    fn chain(&self) -> &Chain {
        match self {
            BackendCommand::ToJson(c) => c,
            BackendCommand::ToNft(n) => &n.chain,
            BackendCommand::ToEbpf(e) => &e.chain,
            BackendCommand::ToIptables(i) => &i.chain,
            BackendCommand::ToNftlb(n) => &n.chain,
        }
    }
}

/// `to-nft` options.
#[derive(Debug, Clone, Args)]
pub struct NftArgs {
    /// Publish kpng's tables to the nftables aggregator at ADDR (`kpng aggregate`;
    /// unix:///path or tcp://host:port) instead of programming nftables directly: each
    /// transaction is one publication, committed with the other producers' changes. The
    /// aggregator owns the tables; the `helper` annotation is not enforced this way.
    #[arg(long, value_name = "ADDR", value_parser = parse_address)]
    pub aggregator: Option<kpng_api::Address>,
    /// The producer name kpng publishes under (with --aggregator).
    #[arg(long, value_name = "NAME", default_value = "kpng", requires = "aggregator")]
    pub producer: String,
    /// How the connection to the aggregator is protected.
    #[command(flatten)]
    pub conn: ConnArgs,
    /// Further backends.
    #[command(flatten)]
    pub chain: Chain,
}

/// Where the nftlb daemon listens, and its key.
#[derive(Debug, Clone, Args)]
pub struct NftlbDaemonArgs {
    /// The nftlb daemon's API: `http://HOST:PORT` (nftlb's `-H` and `-P`).
    #[arg(long, default_value = "http://127.0.0.1:5555")]
    pub nftlb_url: String,
    /// A file whose first line is the daemon's key (its `NFTLB_SERVER_KEY`).
    #[arg(long)]
    pub nftlb_key_file: Option<PathBuf>,
}

/// `to-nftlb` options.
#[derive(Debug, Clone, Args)]
pub struct NftlbArgs {
    /// The daemon.
    #[command(flatten)]
    pub daemon: NftlbDaemonArgs,
    /// Direct server return (`mode: dsr`): the interface clients' traffic reaches this node
    /// on. nftlb forwards it there, at the interface's ingress, to the endpoints' link-layer
    /// addresses, which must be neighbours of this node. Without it, `mode: dsr` services
    /// get `snat` farms and the mode is reported unsupported.
    #[arg(long, value_name = "INTERFACE")]
    pub nftlb_interface: Option<String>,
    /// Further backends.
    #[command(flatten)]
    pub chain: Chain,
}

/// `to-iptables` options.
#[derive(Debug, Clone, Args)]
pub struct IptablesArgs {
    /// Which iptables to drive: `nft` (`iptables-nft`), `legacy` (`iptables-legacy`) or
    /// `auto`: the variant the kubelet uses (its KUBE-IPTABLES-HINT or KUBE-KUBELET-CANARY
    /// chain in mangle), else the one holding kpng's chains from an earlier run, else the
    /// system's `iptables`.
    #[arg(long, value_enum, default_value_t = IptablesMode::Auto)]
    pub iptables_mode: IptablesMode,
    /// Accept IPv4 NodePorts on 127.0.0.1 too, as kube-proxy's iptables mode does
    /// (`iptables.localhostNodePorts`), when NodePorts are on every local address: sets
    /// net.ipv4.conf.all.route_localnet, and drops packets from elsewhere to 127.0.0.0/8
    /// that are not NodePort traffic.
    #[arg(long)]
    pub localhost_nodeports: bool,
    /// Further backends.
    #[command(flatten)]
    pub chain: Chain,
}

/// `--iptables-mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum IptablesMode {
    /// The system's `iptables`.
    Auto,
    /// `iptables-nft`.
    Nft,
    /// `iptables-legacy`.
    Legacy,
}

impl From<IptablesMode> for kpng_iptables::Mode {
    fn from(mode: IptablesMode) -> Self {
        match mode {
            IptablesMode::Auto => kpng_iptables::Mode::Auto,
            IptablesMode::Nft => kpng_iptables::Mode::Nft,
            IptablesMode::Legacy => kpng_iptables::Mode::Legacy,
        }
    }
}

/// `to-ebpf` options.
#[derive(Debug, Clone, Args)]
pub struct EbpfArgs {
    /// The cgroup v2 whose sockets (and its descendants') are translated. Default: the
    /// root of the cgroup2 mount (every socket of the node).
    #[arg(long, value_name = "PATH")]
    pub cgroup_path: Option<PathBuf>,
    /// Where the links and maps are pinned.
    #[command(flatten)]
    pub pins: BpfPinArgs,
    /// Further backends.
    #[command(flatten)]
    pub chain: Chain,
}

/// Where `to-ebpf` pins its programs' links and maps; `kpng cleanup` looks there too.
#[derive(Debug, Clone, Args)]
pub struct BpfPinArgs {
    /// The bpffs directory where kpng pins its programs' links and maps (bpffs is mounted
    /// at /sys/fs/bpf when it is not).
    #[arg(long, default_value = kpng_ebpf::support::DEFAULT_PIN_ROOT, value_name = "PATH")]
    pub bpf_pin_path: PathBuf,
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
#[command(
    name = "to-local",
    no_binary_name = true,
    override_usage = "kpng [OPTIONS] <SOURCE> ... to-local <BACKEND> [OPTIONS] [<BACKEND> [OPTIONS]]..."
)]
struct NextBackend {
    #[command(subcommand)]
    backend: BackendCommand,
}

impl ToLocalArgs {
    /// Every backend in command-line order (process-wide options were moved out of the
    /// chain before parsing).
    pub fn backends(&self) -> Result<Vec<BackendCommand>, clap::Error> {
        let mut backends = vec![self.backend.clone()];
        let mut next = self.backend.chain().next.clone();
        while !next.is_empty() {
            let parsed = NextBackend::try_parse_from(&next)?;
            next = parsed.backend.chain().next.clone();
            backends.push(parsed.backend);
        }
        Ok(backends)
    }
}

/// A dataplane backend given twice: each programs its own kernel objects, and a second one
/// would program the same (`to-json` may be repeated).
pub fn check_backends(backends: &[BackendCommand]) -> Result<(), String> {
    let kernel = backends.iter().filter(|b| b.programs_kernel()).map(BackendCommand::name);
    let mut seen = std::collections::BTreeSet::new();
    for name in kernel {
        if !seen.insert(name) {
            return Err(format!(
                "{name} is given twice: a dataplane backend runs once per process (a second \
                 would program the same kernel objects)"
            ));
        }
    }
    Ok(())
}

impl Cli {
    /// The `to-local` arguments, wherever the command line has them.
    pub fn to_local(&self) -> Option<&ToLocalArgs> {
        let sink = match &self.source {
            SourceCommand::File(args) => &args.sink,
            SourceCommand::Kube(args) => &args.sink,
            SourceCommand::Api(args) => &args.sink,
            SourceCommand::Local(args) => return Some(&args.backends),
            _ => return None,
        };
        match sink {
            SinkCommand::ToLocal(args) => Some(args),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(args: &[&str]) -> Cli {
        let args = hoist_global_args(args.iter().map(std::ffi::OsString::from).collect());
        Cli::try_parse_from(args).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn global_options_anywhere_and_backends_chain() {
        let cli = parse(&[
            "kpng", "file", "--input", "c.yaml", "to-local", "--node", "n1", "to-json", "--once",
            "to-json", "--stats",
        ]);
        let backends = cli.to_local().unwrap().backends().unwrap();
        assert_eq!(backends.iter().map(|b| b.name()).collect::<Vec<_>>(), ["to-json", "to-json"]);
        assert!(cli.global.once && cli.global.stats);
        assert_eq!(cli.global.node.as_deref(), Some("n1"));

        let cli = parse(&[
            "kpng", "--once", "file", "-i", "c.yaml", "to-file", "-o", "out.json", "--format",
            "json",
        ]);
        assert!(cli.global.once);
    }

    #[test]
    fn ebpf_options_stay_with_their_backend() {
        let cli = parse(&[
            "kpng",
            "file",
            "-i",
            "c",
            "to-local",
            "to-ebpf",
            "--cgroup-path",
            "/cg",
            "--once",
            "--bpf-pin-path",
            "/sys/fs/bpf/x",
            "to-nft",
            "to-json",
        ]);
        let backends = cli.to_local().unwrap().backends().unwrap();
        let names: Vec<_> = backends.iter().map(|b| b.name()).collect();
        assert_eq!(names, ["to-ebpf", "to-nft", "to-json"]);
        let BackendCommand::ToEbpf(ebpf) = &backends[0] else { unreachable!("parsed above") };
        assert_eq!(ebpf.cgroup_path.as_deref(), Some(std::path::Path::new("/cg")));
        assert_eq!(ebpf.pins.bpf_pin_path, std::path::Path::new("/sys/fs/bpf/x"));
        assert!(cli.global.once, "a process-wide option between a backend's own is hoisted");
        let kernel: Vec<bool> = backends.iter().map(BackendCommand::programs_kernel).collect();
        assert_eq!(kernel, [true, true, false]);

        let cli = parse(&["kpng", "cleanup", "--backend", "nft"]);
        let SourceCommand::Cleanup(args) = cli.source else { unreachable!("parsed above") };
        assert!(args.backend.nft() && !args.backend.ebpf());
        assert_eq!(args.pins.bpf_pin_path, std::path::Path::new("/sys/fs/bpf/kpng"));
        let cli = parse(&["kpng", "cleanup", "--backend", "ebpf", "--bpf-pin-path", "/p"]);
        let SourceCommand::Cleanup(args) = cli.source else { unreachable!("parsed above") };
        assert!(!args.backend.nft() && args.backend.ebpf());
        assert_eq!(args.pins.bpf_pin_path, std::path::Path::new("/p"));
    }

    #[test]
    fn a_dataplane_backend_given_twice_is_refused() {
        let backends = |args: &[&str]| {
            let mut all = vec!["kpng", "file", "--input", "c", "to-local"];
            all.extend(args);
            parse(&all).to_local().unwrap().backends().unwrap()
        };
        let error = check_backends(&backends(&["to-nft", "to-ebpf", "to-nft"])).unwrap_err();
        assert!(error.starts_with("to-nft is given twice"), "{error}");
        assert!(check_backends(&backends(&["to-json", "to-json", "to-nft"])).is_ok());
    }

    #[test]
    fn unknown_backends_are_rejected() {
        let cli = parse(&["kpng", "file", "--input", "c", "to-local", "to-json", "to-bogus"]);
        let err = cli.to_local().unwrap().backends().unwrap_err().to_string();
        assert!(err.contains("to-bogus"), "{err}");
        // The usage line shows the chain, not options the user never typed.
        assert!(err.contains("to-local <BACKEND>") && !err.contains("--cluster-cidr"), "{err}");
    }
}
