//! Options for the whole process, one struct per component, accepted anywhere on the
//! command line and as keys of the config file. Every default is written once, in the
//! clap attributes below; the config file and `kpng config print-defaults` read them from
//! there.
//!
//! Kept in one file on purpose: every option group and its default is declared here
//! once, and the config file's key table and `config print-defaults` are derived from
//! these declarations.

use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, CommandFactory, Parser, ValueEnum};
use kpng_conntrack::tuning::ConntrackTuning;
use kpng_local::NodePortSelection;
use kpng_runner::proxy::LocalDetection;

/// Options for the whole process, accepted anywhere on the command line.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Apply the state once, then exit: 0 after the first successful sync of every backend
    /// (or the first write of `to-file`), non-zero with the error otherwise.
    #[arg(long, global = true)]
    pub once: bool,

    /// With --once, how long the source may take to connect and complete its initial list
    /// (or, for `kpng local`, to deliver the node's state); past it kpng exits non-zero with
    /// the last error (`0`: wait forever).
    #[arg(long, global = true, default_value = "60s", value_parser = parse_duration, value_name = "DURATION")]
    pub once_timeout: Duration,

    /// Print a tab-separated stats line every second on standard error: time (ms), source
    /// events, store revisions, node-state revisions, user and system CPU (ms), CPU %, RSS
    /// (MiB), and revisions per event (%).
    #[arg(long, global = true)]
    pub stats: bool,

    /// The node whose state `to-local` computes. Defaults to $NODE_NAME, then the hostname.
    #[arg(long, global = true, env = "NODE_NAME", value_name = "NAME")]
    pub node: Option<String>,

    /// Print what backends would install (for `to-nft`: nft commands that `nft -f`
    /// accepts) on standard output, and touch nothing.
    #[arg(long, global = true)]
    pub dry_run: bool,

    /// A YAML file with process-wide options keyed by flag name (`sync-period: 1m`); flags
    /// win over it. `kpng config print-defaults` prints a complete one.
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,

    /// Logging.
    #[command(flatten)]
    pub logging: LoggingArgs,

    /// What the dataplane enforces.
    #[command(flatten)]
    pub proxy: ProxyArgs,

    /// Conntrack tuning at start-up.
    #[command(flatten)]
    pub conntrack: ConntrackArgs,

    /// When backends apply changes and verify the kernel.
    #[command(flatten)]
    pub sync: SyncArgs,

    /// The admin and health-check servers.
    #[command(flatten)]
    pub admin: AdminArgs,

    /// The process itself.
    #[command(flatten)]
    pub process: ProcessArgs,
}

/// The process itself, as a node agent runs.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Process")]
pub struct ProcessArgs {
    /// The process's oom_score_adj (-1000 to 1000; kube-proxy's -999 makes the kernel's
    /// out-of-memory killer spare it). Default: leave it.
    #[arg(long, global = true, allow_hyphen_values = true, value_parser = clap::value_parser!(i32).range(-1000..=1000), value_name = "N")]
    pub oom_score_adj: Option<i32>,

    /// Exit (status 1) as soon as this file's content changes, so that what started kpng
    /// (a DaemonSet's kubelet) starts it again with the new file, as kube-proxy does with
    /// its --config (the kube-proxy entry sets it to that file).
    #[arg(long, global = true, value_name = "PATH")]
    pub exit_on_change: Option<PathBuf>,

    /// kpng replaces kube-proxy on this node: at start, remove kube-proxy's rules (its
    /// `kube-proxy` nftables tables, its iptables chains and the jumps into them in both
    /// iptables variants, its IPVS interface and ipsets) and nothing else: never the
    /// kubelet's chains, never a conntrack entry. Ignored, with a warning, beside
    /// --service-proxy-name (kube-proxy still runs then).
    #[arg(long, global = true)]
    pub remove_kube_proxy: bool,

    /// Do the privileged start-up work (conntrack tuning, --remove-kube-proxy) and exit 0,
    /// as an init container does, so that the main container needs only the capabilities
    /// its dataplane uses.
    #[arg(long, global = true)]
    pub init_only: bool,
}

/// Logging options.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Logging")]
pub struct LoggingArgs {
    /// Log filter for standard error, in RUST_LOG syntax (`info`, `debug`, `kpng_sources=debug`).
    #[arg(long, global = true, env = "KPNG_LOG", default_value = "info", value_name = "FILTER")]
    pub log: String,

    /// How log lines are written on standard error: `text` (colours only on a terminal)
    /// or `json` (one object per line with timestamp, level, message and fields).
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, value_name = "FORMAT")]
    pub logging_format: LogFormat,
}

/// `--logging-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// What the dataplane enforces, for every backend.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Proxy")]
pub struct ProxyArgs {
    /// The cluster's pod CIDRs (comma-separated, one per family): traffic from them is
    /// "local pod" traffic, not masqueraded to cluster IPs and short-circuited to the
    /// Cluster set for externalTrafficPolicy Local. Default: the node's podCIDRs.
    #[arg(long, global = true, value_delimiter = ',', value_name = "CIDRS")]
    pub cluster_cidr: Vec<ipnet::IpNet>,

    /// Masquerade (SNAT) all traffic to cluster IPs.
    #[arg(long, global = true)]
    pub masquerade_all: bool,

    /// How traffic from this node's pods is recognised: `ClusterCIDR` (sources in
    /// --cluster-cidr), `NodeCIDR` (sources in the Node's podCIDRs), `BridgeInterface`
    /// (arriving on --pod-bridge-interface) or `InterfaceNamePrefix` (arriving on an
    /// interface named --pod-interface-name-prefix*). Default: ClusterCIDR when
    /// --cluster-cidr is given, else NodeCIDR.
    #[arg(long, global = true, value_enum, value_name = "MODE")]
    pub detect_local_mode: Option<DetectLocalMode>,

    /// The bridge pods are attached to (with --detect-local-mode BridgeInterface).
    #[arg(long, global = true, value_name = "INTERFACE")]
    pub pod_bridge_interface: Option<String>,

    /// The name prefix of pods' interfaces on the node (with --detect-local-mode
    /// InterfaceNamePrefix).
    #[arg(long, global = true, value_name = "PREFIX")]
    pub pod_interface_name_prefix: Option<String>,

    /// Service CIDRs (comma-separated) added to the ranges of the cluster's ServiceCIDR
    /// objects, for clusters without them: new connections to an address in any of these
    /// ranges that no service holds are dropped (an allocated ClusterIP on a port it does
    /// not define is still rejected).
    #[arg(long, global = true, value_delimiter = ',', value_name = "CIDRS")]
    pub service_cidr: Vec<ipnet::IpNet>,

    /// Where NodePorts are accepted: `primary` (the Node object's primary IPs) or
    /// comma-separated CIDRs: the node's addresses inside them, followed as addresses come
    /// and go; a zero CIDR (`0.0.0.0/0`, `::/0`) means every local address of its family but
    /// loopback; a family without a CIDR in the list uses its primary IP, and one without a
    /// primary IP every local address.
    #[arg(long, global = true, default_value = "primary", value_parser = parse_nodeport_addresses, value_name = "primary|CIDRS")]
    pub nodeport_addresses: NodePortSelection,

    /// The node's primary IP of a family (comma-separated, one per family), in place of the
    /// one the Node object gives: where NodePorts are accepted with `primary`, and what
    /// counts as the node's own address (kube-proxy's --bind-address). Default: the Node
    /// object's.
    #[arg(long, global = true, value_delimiter = ',', value_name = "IPS")]
    pub node_ip: Vec<std::net::IpAddr>,

    /// The bit of the packet mark used to flag connections for masquerading (0-31).
    /// Only this bit is read or written.
    #[arg(long, global = true, default_value_t = 14, value_parser = clap::value_parser!(u8).range(0..32))]
    pub masquerade_bit: u8,
}

/// `--detect-local-mode`, with kube-proxy's names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum DetectLocalMode {
    /// Sources inside --cluster-cidr.
    #[value(name = "ClusterCIDR")]
    ClusterCidr,
    /// Sources inside the Node's podCIDRs.
    #[value(name = "NodeCIDR")]
    NodeCidr,
    /// Packets arriving on --pod-bridge-interface.
    #[value(name = "BridgeInterface")]
    BridgeInterface,
    /// Packets arriving on an interface named --pod-interface-name-prefix*.
    #[value(name = "InterfaceNamePrefix")]
    InterfaceNamePrefix,
}

fn parse_nodeport_addresses(text: &str) -> Result<NodePortSelection, String> {
    match text.trim() {
        "primary" | "" => Ok(NodePortSelection::Primary),
        list => list
            .split(',')
            .map(|c| c.trim().parse::<ipnet::IpNet>().map(|n| n.trunc()))
            .collect::<Result<_, _>>()
            .map(NodePortSelection::Cidrs)
            .map_err(|e| format!("{list:?}: {e}; expected `primary` or comma-separated CIDRs")),
    }
}

impl ProxyArgs {
    /// `--detect-local-mode` with the flags it needs.
    pub fn local_detection(&self) -> anyhow::Result<LocalDetection> {
        let need = |value: &Option<String>, flag: &str, mode: &str| {
            value
                .clone()
                .filter(|v| !v.is_empty())
                .with_context(|| format!("--detect-local-mode {mode} needs --{flag}"))
        };
        Ok(match self.detect_local_mode {
            None => LocalDetection::Auto,
            Some(DetectLocalMode::ClusterCidr) => {
                if self.cluster_cidr.is_empty() {
                    bail!("--detect-local-mode ClusterCIDR needs --cluster-cidr");
                }
                LocalDetection::ClusterCidr
            }
            Some(DetectLocalMode::NodeCidr) => LocalDetection::NodeCidr,
            Some(DetectLocalMode::BridgeInterface) => LocalDetection::BridgeInterface(need(
                &self.pod_bridge_interface,
                "pod-bridge-interface",
                "BridgeInterface",
            )?),
            Some(DetectLocalMode::InterfaceNamePrefix) => {
                LocalDetection::InterfaceNamePrefix(need(
                    &self.pod_interface_name_prefix,
                    "pod-interface-name-prefix",
                    "InterfaceNamePrefix",
                )?)
            }
        })
    }
}

/// Conntrack tuning at start-up (kube-proxy's flags), when a backend programs the kernel.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Conntrack")]
pub struct ConntrackArgs {
    /// Conntrack entries per CPU: the table holds at least this times the CPUs (0: leave
    /// the table's size, and --conntrack-min, alone).
    #[arg(long, global = true, default_value_t = 32_768, value_name = "N")]
    pub conntrack_max_per_core: u32,

    /// The least conntrack table size, whatever the CPUs.
    #[arg(long, global = true, default_value_t = 131_072, value_name = "N")]
    pub conntrack_min: u32,

    /// Idle timeout of established TCP connections (0: leave it).
    #[arg(long, global = true, default_value = "24h", value_parser = parse_duration, value_name = "DURATION")]
    pub conntrack_tcp_timeout_established: Duration,

    /// Timeout of TCP connections in CLOSE_WAIT (0: leave it).
    #[arg(long, global = true, default_value = "1h", value_parser = parse_duration, value_name = "DURATION")]
    pub conntrack_tcp_timeout_close_wait: Duration,

    /// Accept TCP packets outside the window instead of marking them invalid.
    #[arg(long, global = true)]
    pub conntrack_tcp_be_liberal: bool,

    /// Timeout of UDP flows seen in one direction (0: leave it).
    #[arg(long, global = true, default_value = "0", value_parser = parse_duration, value_name = "DURATION")]
    pub conntrack_udp_timeout: Duration,

    /// Timeout of UDP flows seen in both directions (0: leave it).
    #[arg(long, global = true, default_value = "0", value_parser = parse_duration, value_name = "DURATION")]
    pub conntrack_udp_timeout_stream: Duration,
}

impl ConntrackArgs {
    /// The tuning these flags ask for.
    pub fn tuning(&self) -> ConntrackTuning {
        ConntrackTuning {
            max_per_core: self.conntrack_max_per_core,
            min: self.conntrack_min,
            tcp_established: self.conntrack_tcp_timeout_established,
            tcp_close_wait: self.conntrack_tcp_timeout_close_wait,
            tcp_be_liberal: self.conntrack_tcp_be_liberal,
            udp: self.conntrack_udp_timeout,
            udp_stream: self.conntrack_udp_timeout_stream,
        }
    }
}

/// When backends apply changes and verify the kernel.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Sync")]
pub struct SyncArgs {
    /// Least time between two change sets applied by backends, after a burst of two;
    /// changes arriving meanwhile are applied together. By default (`0`) a change set is
    /// applied as soon as the one before it has committed, and what arrives meanwhile
    /// coalesces into the next; after a sync that took longer than 2 ms the next waits as
    /// long (at most 100 ms), so a storm of changes costs about half a core. kube-proxy's
    /// `1s` paces its full-table syncs; kpng's change sets are incremental and need no pace.
    #[arg(long, global = true, default_value = "0s", value_parser = parse_duration, value_name = "DURATION")]
    pub min_sync_period: Duration,

    /// The sync period: how often backends check that the kernel still holds what they
    /// committed and repair what changed behind their back (`0`: never); /healthz and
    /// /livez fail when a change has waited unapplied for more than twice this (`30s`,
    /// `1m`, `500ms`).
    #[arg(long, global = true, default_value = "30s", value_parser = parse_duration, value_name = "DURATION")]
    pub sync_period: Duration,
}

/// The admin and health-check servers.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Servers")]
pub struct AdminArgs {
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
}

impl GlobalArgs {
    /// Checks what the parser cannot: options that need one another. Called before
    /// anything is bound or started.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.proxy.local_detection()?;
        Ok(())
    }
}

/// A duration: a number and a unit (`ms`, `s`, `m`, `h`), e.g. `30s`, `1m`, `1.5s`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
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
    Duration::try_from_secs_f64(seconds).map_err(|e| format!("{text:?}: {e}"))
}

/// Parses process-wide options alone.
#[derive(Debug, Parser)]
#[command(no_binary_name = true)]
struct Defaults {
    #[command(flatten)]
    global: GlobalArgs,
}

/// Process-wide options from `args` alone (`["--sync-period", "10s"]`); the error is
/// clap's message, on one line.
pub fn global_args_from(args: &[String]) -> Result<GlobalArgs, String> {
    Defaults::try_parse_from(args).map(|d| d.global).map_err(|e| clap_message(&e))
}

#[cfg(test)]
impl GlobalArgs {
    /// The values of every option left unset.
    pub fn default_values() -> GlobalArgs {
        Defaults::try_parse_from(Vec::<String>::new()).expect("the defaults parse").global
    }
}

/// A process-wide option, as the config file and the command line see it.
#[derive(Debug, Clone)]
pub struct GlobalOption {
    /// The flag's name without dashes: `sync-period`.
    pub name: String,
    /// Whether it takes a value (else it is a switch).
    pub takes_value: bool,
    /// Whether the value is a comma-separated list.
    pub list: bool,
    /// The first sentence of its help.
    pub help: String,
    /// The built-in default, as written on the command line.
    pub default: Option<String>,
    /// What the value stands for (`DURATION`), or its choices (`text|json`).
    pub value_name: String,
}

/// Every process-wide option.
pub fn global_options() -> Vec<GlobalOption> {
    Defaults::command()
        .get_arguments()
        .filter_map(|arg| {
            let name = arg.get_long()?.to_string();
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let mut sentence = match help.find(". ") {
                Some(at) => help[..=at].to_string(),
                None => help.clone(),
            };
            if !sentence.ends_with('.') {
                sentence.push('.');
            }
            let choices: Vec<String> =
                arg.get_possible_values().iter().map(|v| v.get_name().to_string()).collect();
            let value_name = match choices.is_empty() {
                true => arg.get_value_names().and_then(|n| n.first()).map(|n| n.to_string()),
                false => Some(choices.join("|")),
            };
            Some(GlobalOption {
                name,
                takes_value: arg.get_action().takes_values(),
                list: arg.get_value_delimiter().is_some(),
                help: sentence.replace('\n', " "),
                default: arg.get_default_values().first().map(|v| v.to_string_lossy().into_owned()),
                value_name: value_name.unwrap_or_else(|| "VALUE".into()),
            })
        })
        .collect()
}

/// Process-wide options are accepted anywhere: this moves them, with their values, right
/// after the program name, so that they are parsed once and every later parser (the chain
/// of backends) sees only its own arguments. Nothing moves after `--`.
pub fn hoist_global_args(args: Vec<OsString>) -> Vec<OsString> {
    let options = global_options();
    let mut args = args.into_iter();
    let mut hoisted: Vec<OsString> = args.next().into_iter().collect();
    let mut rest = Vec::new();
    while let Some(arg) = args.next() {
        let text = arg.to_string_lossy().into_owned();
        if text == "--" {
            rest.push(arg);
            rest.extend(args.by_ref());
            break;
        }
        let global = text.strip_prefix("--").and_then(|flag| {
            let (name, inline) = match flag.split_once('=') {
                Some((name, _)) => (name, true),
                None => (flag, false),
            };
            options.iter().find(|o| o.name == name).map(|o| o.takes_value && !inline)
        });
        match global {
            Some(value_follows) => {
                hoisted.push(arg);
                if value_follows {
                    hoisted.extend(args.next());
                }
            }
            None => rest.push(arg),
        }
    }
    hoisted.extend(rest);
    hoisted
}

/// Clap's message alone: one line, without its `error: ` prefix and usage.
pub fn clap_message(error: &clap::Error) -> String {
    let text = error.to_string();
    let first = text.lines().next().unwrap_or_default();
    first.strip_prefix("error: ").unwrap_or(first).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn os(list: &[&str]) -> Vec<OsString> {
        list.iter().map(OsString::from).collect()
    }

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

    #[test]
    fn process_wide_options_move_to_the_front_with_their_values() {
        let out = hoist_global_args(os(&[
            "kpng",
            "file",
            "-i",
            "c.yaml",
            "to-local",
            "--node",
            "n1",
            "to-json",
            "--once",
            "--sync-period=5s",
            "to-nft",
            "--masquerade-bit",
            "3",
            "--",
            "--stats",
        ]));
        assert_eq!(
            out,
            os(&[
                "kpng",
                "--node",
                "n1",
                "--once",
                "--sync-period=5s",
                "--masquerade-bit",
                "3",
                "file",
                "-i",
                "c.yaml",
                "to-local",
                "to-json",
                "to-nft",
                "--",
                "--stats",
            ])
        );
    }

    #[test]
    fn the_components_hold_the_defaults() {
        let defaults = GlobalArgs::default_values();
        assert_eq!(defaults.conntrack.tuning(), ConntrackTuning::default());
        assert_eq!(defaults.proxy.nodeport_addresses, NodePortSelection::Primary);
        assert_eq!(defaults.sync.sync_period, Duration::from_secs(30));
        assert_eq!(defaults.logging.logging_format, LogFormat::Text);
        let options = global_options();
        let option = |name: &str| options.iter().find(|o| o.name == name).unwrap().clone();
        assert!(option("cluster-cidr").list && option("cluster-cidr").takes_value);
        assert!(!option("masquerade-all").takes_value);
        assert_eq!(option("conntrack-min").default.as_deref(), Some("131072"));
    }

    #[test]
    fn modes_that_need_a_flag_say_which() {
        let parse = |args: &[&str]| {
            global_args_from(&args.iter().map(|a| a.to_string()).collect::<Vec<_>>()).unwrap()
        };
        let error = parse(&["--detect-local-mode", "BridgeInterface"]).validate().unwrap_err();
        assert!(error.to_string().contains("--pod-bridge-interface"), "{error}");
        let error = parse(&["--detect-local-mode", "ClusterCIDR"]).validate().unwrap_err();
        assert!(error.to_string().contains("--cluster-cidr"), "{error}");
        let detection = parse(&[
            "--detect-local-mode",
            "InterfaceNamePrefix",
            "--pod-interface-name-prefix",
            "veth",
        ])
        .proxy
        .local_detection()
        .unwrap();
        assert_eq!(detection, LocalDetection::InterfaceNamePrefix("veth".into()));
        let error =
            global_args_from(&["--nodeport-addresses".into(), "10.0.0.0/33".into()]).unwrap_err();
        assert!(error.contains("--nodeport-addresses") && error.contains("primary"), "{error}");
    }
}
