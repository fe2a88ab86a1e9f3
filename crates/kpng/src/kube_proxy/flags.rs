//! kube-proxy's command line, flag for flag: every flag kube-proxy v1.33 registers on
//! Linux (upstream's `cmd/kube-proxy/app/options.go` `AddFlags`, component-base's logging
//! flags, klog's legacy flags, `--version` and `--help`), parsed as its flag library parses
//! them: `--name=value` or `--name value`, a boolean as `--name` or `--name=false`, `_` the
//! same as `-`, the last of a repeated flag winning, and no positional argument.
//!
//! What each flag does in kpng is in [`FLAGS`]: most set a field of the configuration
//! ([`super::config::Configuration`]), as upstream's flags fill the same structure; with
//! `--config` those are ignored (the file replaces them), except the ones upstream still
//! applies ([`Scope::Always`]).

use super::config::{
    ClientConnection, Configuration, Conntrack, DetectLocal, GoDuration, Iptables, Ipvs, Logging,
    Nftables, host_of, join_host_port, parse_go_duration,
};

/// When a flag applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scope {
    /// A field of the configuration: ignored when `--config` gives a file.
    Config,
    /// Applied even over a `--config` file (logging, `--hostname-override`, `--master`).
    Always,
    /// Says what to do rather than how (`--config`, `--cleanup`, `--init-only`, ...).
    Action,
    /// Accepted and ignored, whatever else is given: kpng has nothing it could change.
    Ignored,
}

/// One kube-proxy flag.
#[derive(Debug)]
pub struct Flag {
    pub name: &'static str,
    /// `Some("TYPE")` for a flag that takes a value; `None` for a boolean.
    pub value: Option<&'static str>,
    /// The default, as kube-proxy's `--help` shows it.
    pub default: &'static str,
    pub scope: Scope,
    /// Deprecated upstream, and hidden from its `--help`.
    pub hidden: bool,
    pub help: &'static str,
}

const fn flag(
    name: &'static str,
    value: Option<&'static str>,
    default: &'static str,
    scope: Scope,
    help: &'static str,
) -> Flag {
    Flag { name, value, default, scope, hidden: false, help }
}

use Scope::{Action, Always, Config, Ignored};

const B: Option<&str> = None;
const S: Option<&str> = Some("string");
const D: Option<&str> = Some("duration");
const I: Option<&str> = Some("int32");

/// Every flag, in kube-proxy's order.
pub const FLAGS: &[Flag] = &[
    flag(
        "config",
        S,
        "",
        Action,
        "The KubeProxyConfiguration file (kubeproxy.config.k8s.io/v1alpha1). Its values replace the other flags', but for logging, --hostname-override and --master. A file without `kind: KubeProxyConfiguration` is read as kpng's own config file. kpng exits when the file changes, so that its pod restarts and reads it again.",
    ),
    flag(
        "write-config-to",
        S,
        "",
        Action,
        "Write the configuration kpng would run with (this command line's, defaulted) to this file as a KubeProxyConfiguration, and exit.",
    ),
    flag(
        "cleanup",
        B,
        "false",
        Action,
        "Remove kube-proxy's rules (iptables, nftables, IPVS leftovers) and kpng's, then exit.",
    ),
    flag(
        "feature-gates",
        Some("mapStringBool"),
        "",
        Config,
        "Feature gates (key=true|false,...): accepted; kpng has none of kube-proxy's gates and logs that it ignores them.",
    ),
    flag(
        "kubeconfig",
        S,
        "",
        Config,
        "The kubeconfig to reach the API server with (default: the in-cluster service account).",
    ),
    flag("master", S, "", Always, "The API server's address, overriding the kubeconfig's."),
    flag(
        "kube-api-content-type",
        S,
        "application/vnd.kubernetes.protobuf",
        Config,
        "Content type of requests to the API server: accepted and ignored (kpng speaks JSON).",
    ),
    flag(
        "kube-api-burst",
        I,
        "10",
        Config,
        "API requests allowed at once before --kube-api-qps paces them.",
    ),
    flag(
        "kube-api-qps",
        Some("float32"),
        "5",
        Config,
        "API requests per second, on average (lists and re-lists; watches are long-lived).",
    ),
    flag(
        "hostname-override",
        S,
        "",
        Always,
        "The name of this node (default: the hostname, in lower case).",
    ),
    flag(
        "bind-address",
        Some("ip"),
        "0.0.0.0",
        Config,
        "Overrides the node's primary IP of its family (it binds nothing): kpng's --node-ip.",
    ),
    flag(
        "healthz-bind-address",
        Some("ipport"),
        "0.0.0.0:10256",
        Config,
        "Where /healthz, /livez and /readyz are served (ip or ip:port; empty: nowhere).",
    ),
    flag(
        "metrics-bind-address",
        Some("ipport"),
        "127.0.0.1:10249",
        Config,
        "Where /metrics is served (ip or ip:port; empty: nowhere).",
    ),
    flag(
        "bind-address-hard-fail",
        B,
        "false",
        Config,
        "Exit when a server cannot bind: kpng always does.",
    ),
    flag(
        "profiling",
        B,
        "false",
        Config,
        "/debug/pprof: accepted and ignored (kpng has no pprof).",
    ),
    flag(
        "show-hidden-metrics-for-version",
        S,
        "",
        Config,
        "Accepted and ignored (kpng hides no metric).",
    ),
    flag(
        "init-only",
        B,
        "false",
        Action,
        "Do the privileged start-up work (conntrack sysctls, kube-proxy's leftovers removed) and exit, so that the main container needs only the capabilities its dataplane uses.",
    ),
    flag(
        "proxy-mode",
        S,
        "",
        Config,
        "iptables (the default on Linux: kpng's to-iptables) or nftables (to-nft); ipvs is refused: kpng has no IPVS dataplane.",
    ),
    flag(
        "iptables-masquerade-bit",
        I,
        "14",
        Config,
        "The packet mark bit that flags connections to masquerade (0-31).",
    ),
    flag("masquerade-all", B, "false", Config, "Masquerade all traffic to cluster IPs."),
    flag(
        "iptables-localhost-nodeports",
        B,
        "true",
        Config,
        "NodePorts on 127.0.0.1 in iptables mode (IPv4, with NodePorts on every local address): to-iptables --localhost-nodeports.",
    ),
    flag(
        "iptables-sync-period",
        D,
        "30s",
        Config,
        "How often the rules are checked and repaired (iptables and nftables modes).",
    ),
    flag(
        "iptables-min-sync-period",
        D,
        "1s",
        Config,
        "Least time between two syncs (iptables and nftables modes); 0 applies each change at once.",
    ),
    flag("ipvs-sync-period", D, "30s", Config, "IPVS mode only: accepted and ignored."),
    flag("ipvs-min-sync-period", D, "1s", Config, "IPVS mode only: accepted and ignored."),
    flag("ipvs-scheduler", S, "", Config, "IPVS mode only: accepted and ignored."),
    flag(
        "ipvs-exclude-cidrs",
        Some("strings"),
        "[]",
        Config,
        "IPVS mode only: accepted and ignored.",
    ),
    flag("ipvs-strict-arp", B, "false", Config, "IPVS mode only: accepted and ignored."),
    flag("ipvs-tcp-timeout", D, "0s", Config, "IPVS mode only: accepted and ignored."),
    flag("ipvs-tcpfin-timeout", D, "0s", Config, "IPVS mode only: accepted and ignored."),
    flag("ipvs-udp-timeout", D, "0s", Config, "IPVS mode only: accepted and ignored."),
    flag(
        "detect-local-mode",
        S,
        "",
        Config,
        "How local traffic is recognised: ClusterCIDR (the default), NodeCIDR, BridgeInterface or InterfaceNamePrefix.",
    ),
    flag(
        "pod-bridge-interface",
        S,
        "",
        Config,
        "With --detect-local-mode BridgeInterface: the pods' bridge.",
    ),
    flag(
        "pod-interface-name-prefix",
        S,
        "",
        Config,
        "With --detect-local-mode InterfaceNamePrefix: the prefix of pods' interfaces.",
    ),
    flag(
        "cluster-cidr",
        S,
        "",
        Config,
        "The pods' CIDRs (comma-separated, one per family), for --detect-local-mode ClusterCIDR.",
    ),
    flag(
        "nodeport-addresses",
        Some("strings"),
        "[]",
        Config,
        "Where NodePorts are accepted: CIDRs, or `primary` (default: every local address in iptables mode, primary in nftables mode).",
    ),
    flag("oom-score-adj", I, "-999", Config, "The process's oom_score_adj (-1000 to 1000)."),
    flag(
        "conntrack-max-per-core",
        I,
        "32768",
        Config,
        "Conntrack entries per CPU (0: leave the table's size alone).",
    ),
    flag("conntrack-min", I, "131072", Config, "The least conntrack table size."),
    flag(
        "conntrack-tcp-timeout-established",
        D,
        "24h0m0s",
        Config,
        "Idle timeout of established TCP connections (0: leave it).",
    ),
    flag(
        "conntrack-tcp-timeout-close-wait",
        D,
        "1h0m0s",
        Config,
        "Timeout of TCP connections in CLOSE_WAIT.",
    ),
    flag("conntrack-tcp-be-liberal", B, "false", Config, "Accept TCP packets outside the window."),
    flag("conntrack-udp-timeout", D, "0s", Config, "Timeout of unreplied UDP flows (0: leave it)."),
    flag(
        "conntrack-udp-timeout-stream",
        D,
        "0s",
        Config,
        "Timeout of assured UDP flows (0: leave it).",
    ),
    flag(
        "config-sync-period",
        D,
        "15m0s",
        Config,
        "Informer resync: accepted and ignored (kpng's watches need none).",
    ),
    Flag {
        hidden: true,
        ..flag("healthz-port", I, "10256", Config, "Deprecated: use --healthz-bind-address.")
    },
    Flag {
        hidden: true,
        ..flag("metrics-port", I, "10249", Config, "Deprecated: use --metrics-bind-address.")
    },
    flag("logging-format", S, "text", Always, "text or json."),
    flag(
        "log-flush-frequency",
        D,
        "5s",
        Always,
        "Accepted and ignored: kpng writes each line at once.",
    ),
    flag("v", Some("Level"), "0", Always, "Log verbosity: 0-3 info, 4-5 debug, 6 and more trace."),
    flag(
        "vmodule",
        Some("pattern=N,..."),
        "",
        Always,
        "Per-file verbosity: accepted and ignored (kpng's filter is per module: KPNG_LOG).",
    ),
    flag(
        "log-text-split-stream",
        B,
        "false",
        Always,
        "Accepted and ignored: every line goes to standard error.",
    ),
    flag("log-text-info-buffer-size", Some("quantity"), "0", Always, "Accepted and ignored."),
    flag("add-dir-header", B, "false", Ignored, "klog: accepted and ignored."),
    flag("alsologtostderr", B, "false", Ignored, "klog: accepted and ignored."),
    flag("log-backtrace-at", Some("file:N"), ":0", Ignored, "klog: accepted and ignored."),
    flag("log-dir", S, "", Ignored, "klog: accepted and ignored (kpng logs on standard error)."),
    flag("log-file", S, "", Ignored, "klog: accepted and ignored (kpng logs on standard error)."),
    flag("log-file-max-size", Some("uint"), "1800", Ignored, "klog: accepted and ignored."),
    flag("logtostderr", B, "true", Ignored, "klog: kpng always logs on standard error."),
    flag("one-output", B, "false", Ignored, "klog: accepted and ignored."),
    flag("skip-headers", B, "false", Ignored, "klog: accepted and ignored."),
    flag("skip-log-headers", B, "false", Ignored, "klog: accepted and ignored."),
    flag("stderrthreshold", Some("severity"), "2", Ignored, "klog: accepted and ignored."),
    flag("boot-id-file", S, "/proc/sys/kernel/random/boot_id", Ignored, "Accepted and ignored."),
    flag(
        "machine-id-file",
        S,
        "/etc/machine-id,/var/lib/dbus/machine-id",
        Ignored,
        "Accepted and ignored.",
    ),
    flag("version", Some("version[=true]"), "false", Action, "Print kpng's version and exit."),
    flag("help", B, "false", Action, "This help."),
];

/// The flags given, in order, with their values (`true`/`false` for booleans).
#[derive(Debug, Default)]
pub struct Given(pub Vec<(&'static Flag, String)>);

impl Given {
    /// The last value given for `name`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.iter().rev().find(|(f, _)| f.name == name).map(|(_, v)| v.as_str())
    }

    /// Whether boolean `name` was given as true.
    pub fn is_set(&self, name: &str) -> bool {
        self.get(name).is_some_and(|v| v == "true")
    }
}

fn lookup(name: &str) -> Option<&'static Flag> {
    let name = name.replace('_', "-");
    FLAGS.iter().find(|f| f.name == name)
}

fn parse_bool(flag: &str, text: &str) -> Result<String, String> {
    match text {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok("true".into()),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok("false".into()),
        _ => Err(format!("invalid argument {text:?} for --{flag}: expected true or false")),
    }
}

/// Parses kube-proxy's arguments (without the program name).
pub fn parse(args: &[String]) -> Result<Given, String> {
    let mut given = Given::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (name, inline) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (long.to_string(), None),
            }
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let (letter, rest) = short.split_at(1);
            let name = match letter {
                "v" => "v",
                "h" => "help",
                _ => return Err(format!("unknown shorthand flag: {letter:?} in {arg}")),
            };
            let rest = rest.strip_prefix('=').unwrap_or(rest);
            (name.to_string(), (!rest.is_empty()).then(|| rest.to_string()))
        } else {
            return Err(format!(
                "kube-proxy does not take any arguments, got {arg:?} (flags start with --)"
            ));
        };
        let flag = lookup(&name).ok_or_else(|| format!("unknown flag: --{name}"))?;
        let value = match (flag.value, inline) {
            (None, None) => "true".to_string(),
            (None, Some(text)) => parse_bool(flag.name, &text)?,
            // `--version` alone means true, as its flag library has it.
            (Some(_), None) if flag.name == "version" => "true".to_string(),
            (Some(_), Some(text)) => text,
            (Some(_), None) => iter
                .next()
                .cloned()
                .ok_or_else(|| format!("flag needs an argument: --{}", flag.name))?,
        };
        given.0.push((flag, value));
    }
    Ok(given)
}

fn duration(flag: &str, text: &str) -> Result<GoDuration, String> {
    parse_go_duration(text).map(GoDuration).map_err(|e| format!("--{flag}: {e}"))
}

fn number<T: std::str::FromStr>(flag: &str, text: &str) -> Result<T, String> {
    text.trim().parse().map_err(|_| format!("--{flag}: {text:?} is not a number"))
}

/// The configuration kube-proxy's flags describe (upstream's `processV1Alpha1Flags`): the
/// sync periods and `--masquerade-all` go to the section of the mode in use.
pub fn configuration(given: &Given) -> Result<Configuration, String> {
    let mut c = Configuration::default();
    let mode = given.get("proxy-mode").unwrap_or_default().to_string();
    let nft = mode == "nftables";
    let mut iptables = Iptables::default();
    let mut nftables = Nftables::default();
    let mut ipvs = Ipvs::default();
    let mut client = ClientConnection::default();
    let mut conntrack = Conntrack::default();
    let mut detect = DetectLocal::default();
    let mut healthz_port = None;
    let mut metrics_port = None;
    for (flag, v) in &given.0 {
        let name = flag.name;
        let text = v.clone();
        match name {
            "feature-gates" => {
                let mut gates = c.feature_gates.take().unwrap_or_default();
                for pair in text.split(',').filter(|p| !p.trim().is_empty()) {
                    let (key, value) = pair.split_once('=').ok_or_else(|| {
                        format!("--feature-gates: {pair:?} is not key=true|false")
                    })?;
                    gates.insert(key.trim().to_string(), parse_bool(name, value.trim())? == "true");
                }
                c.feature_gates = Some(gates);
            }
            "kubeconfig" => client.kubeconfig = Some(text),
            "kube-api-content-type" => client.content_type = Some(text),
            "kube-api-burst" => client.burst = Some(number(name, &text)?),
            "kube-api-qps" => client.qps = Some(number(name, &text)?),
            "bind-address" => c.bind_address = Some(text),
            // Empty on the command line: not served (in a file, empty is the default).
            "healthz-bind-address" => c.healthz_bind_address = Some(or_unserved(text, "0.0.0.0")),
            "metrics-bind-address" => c.metrics_bind_address = Some(or_unserved(text, "127.0.0.1")),
            "healthz-port" => healthz_port = Some(number::<u16>(name, &text)?),
            "metrics-port" => metrics_port = Some(number::<u16>(name, &text)?),
            "bind-address-hard-fail" => c.bind_address_hard_fail = Some(text == "true"),
            "profiling" => c.enable_profiling = Some(text == "true"),
            "show-hidden-metrics-for-version" => c.show_hidden_metrics_for_version = Some(text),
            "proxy-mode" => c.mode = Some(text),
            "iptables-masquerade-bit" => iptables.masquerade_bit = Some(number(name, &text)?),
            "masquerade-all" if nft => nftables.masquerade_all = Some(text == "true"),
            "masquerade-all" => iptables.masquerade_all = Some(text == "true"),
            "iptables-localhost-nodeports" => iptables.localhost_node_ports = Some(text == "true"),
            "iptables-sync-period" if nft => nftables.sync_period = Some(duration(name, &text)?),
            "iptables-sync-period" => iptables.sync_period = Some(duration(name, &text)?),
            "iptables-min-sync-period" if nft => {
                nftables.min_sync_period = Some(duration(name, &text)?)
            }
            "iptables-min-sync-period" => iptables.min_sync_period = Some(duration(name, &text)?),
            "ipvs-sync-period" => ipvs.sync_period = Some(duration(name, &text)?),
            "ipvs-min-sync-period" => ipvs.min_sync_period = Some(duration(name, &text)?),
            "ipvs-scheduler" => ipvs.scheduler = Some(text),
            "ipvs-exclude-cidrs" => ipvs.exclude_cidrs = Some(list(&text)),
            "ipvs-strict-arp" => ipvs.strict_arp = Some(text == "true"),
            "ipvs-tcp-timeout" => ipvs.tcp_timeout = Some(duration(name, &text)?),
            "ipvs-tcpfin-timeout" => ipvs.tcp_fin_timeout = Some(duration(name, &text)?),
            "ipvs-udp-timeout" => ipvs.udp_timeout = Some(duration(name, &text)?),
            "detect-local-mode" => c.detect_local_mode = Some(text),
            "pod-bridge-interface" => detect.bridge_interface = Some(text),
            "pod-interface-name-prefix" => detect.interface_name_prefix = Some(text),
            "cluster-cidr" => c.cluster_cidr = Some(text),
            "nodeport-addresses" => c.node_port_addresses = Some(list(&text)),
            "oom-score-adj" => c.oom_score_adj = Some(number(name, &text)?),
            "conntrack-max-per-core" => conntrack.max_per_core = Some(number(name, &text)?),
            "conntrack-min" => conntrack.min = Some(number(name, &text)?),
            "conntrack-tcp-timeout-established" => {
                conntrack.tcp_established_timeout = Some(duration(name, &text)?)
            }
            "conntrack-tcp-timeout-close-wait" => {
                conntrack.tcp_close_wait_timeout = Some(duration(name, &text)?)
            }
            "conntrack-tcp-be-liberal" => conntrack.tcp_be_liberal = Some(text == "true"),
            "conntrack-udp-timeout" => conntrack.udp_timeout = Some(duration(name, &text)?),
            "conntrack-udp-timeout-stream" => {
                conntrack.udp_stream_timeout = Some(duration(name, &text)?)
            }
            "config-sync-period" => c.config_sync_period = Some(duration(name, &text)?),
            _ => {}
        }
    }
    // The deprecated port flags fold into the addresses (port 0: not served).
    for (address, port, default_ip) in [
        (&mut c.healthz_bind_address, healthz_port, "0.0.0.0"),
        (&mut c.metrics_bind_address, metrics_port, "127.0.0.1"),
    ] {
        if let Some(port) = port {
            let ip = address.as_deref().map(host_of).unwrap_or(default_ip.to_string());
            *address = Some(join_host_port(&ip, port));
        }
    }
    c.client_connection = Some(client);
    c.iptables = Some(iptables);
    c.nftables = Some(nftables);
    c.ipvs = Some(ipvs);
    c.conntrack = Some(conntrack);
    c.detect_local = Some(detect);
    c.logging = Some(Logging::default());
    Ok(c)
}

/// What upstream still applies over a `--config` file: the logging flags given.
pub fn apply_logging(given: &Given, logging: &mut Logging) -> Result<(), String> {
    for (flag, value) in &given.0 {
        match flag.name {
            "logging-format" => logging.format = Some(value.clone()),
            "v" => logging.verbosity = Some(number("v", value)?),
            _ => {}
        }
    }
    Ok(())
}

/// `text`, or an address on port 0 (not served) when it is empty.
fn or_unserved(text: String, ip: &str) -> String {
    match text.trim().is_empty() {
        true => join_host_port(ip, 0),
        false => text,
    }
}

fn list(text: &str) -> Vec<String> {
    text.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}

/// kube-proxy's `--help`, with what kpng does with each flag.
pub fn help() -> String {
    let mut text = String::from(
        "kube-proxy (kpng): kpng started as kube-proxy, with kube-proxy v1.33's command line and\n\
         KubeProxyConfiguration. It watches the API server and programs this node with\n\
         to-iptables (mode iptables, the default) or to-nft (mode nftables), after removing\n\
         kube-proxy's own rules. Every flag below is accepted; those kpng does not act on are\n\
         logged as ignored at start. `kpng kube-proxy --help` shows the same.\n\nUsage:\n  kube-proxy [flags]\n\nFlags:\n",
    );
    for f in FLAGS.iter().filter(|f| !f.hidden) {
        let dashes = if f.name.len() == 1 { "-" } else { "--" };
        let short = match f.name {
            "v" => "-v, ",
            "help" => "-h, ",
            _ => "    ",
        };
        let value = f.value.map(|v| format!(" {v}")).unwrap_or_default();
        let default = match f.default {
            "" | "false" | "[]" => String::new(),
            d => format!(" (default {d})"),
        };
        text.push_str(&format!(
            "  {short}{dashes}{}{value}\n        {}{default}\n",
            f.name, f.help
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn flags_parse_as_kube_proxys_flag_library_parses_them() {
        let given = parse(&args(&[
            "--config=/var/lib/kube-proxy/config.conf",
            "--hostname-override",
            "node-a",
            "--masquerade-all",
            "--iptables-localhost-nodeports=false",
            "-v=4",
            "--log_dir=/var/log",
            "--v",
            "2",
        ]))
        .unwrap();
        assert_eq!(given.get("config"), Some("/var/lib/kube-proxy/config.conf"));
        assert_eq!(given.get("hostname-override"), Some("node-a"));
        assert!(given.is_set("masquerade-all"));
        assert_eq!(given.get("iptables-localhost-nodeports"), Some("false"));
        assert_eq!(given.get("v"), Some("2"), "the last one wins");
        assert_eq!(given.get("log-dir"), Some("/var/log"), "_ is -");
    }

    #[test]
    fn unknown_flags_and_arguments_are_errors_naming_them() {
        assert_eq!(
            parse(&args(&["--proxy-port-range=1-2"])).unwrap_err(),
            "unknown flag: --proxy-port-range"
        );
        assert!(parse(&args(&["iptables"])).unwrap_err().contains("\"iptables\""));
        assert!(
            parse(&args(&["--masquerade-all=maybe"])).unwrap_err().contains("--masquerade-all")
        );
        assert!(parse(&args(&["--kubeconfig"])).unwrap_err().contains("--kubeconfig"));
    }

    #[test]
    fn flags_fill_the_section_of_the_mode_in_use() {
        let given = parse(&args(&[
            "--iptables-min-sync-period=0s",
            "--masquerade-all",
            "--proxy-mode=nftables",
            "--healthz-port=0",
            "--metrics-port=9999",
            "--feature-gates=A=true,B=false",
        ]))
        .unwrap();
        let c = configuration(&given).unwrap();
        let nft = c.nftables.unwrap();
        assert_eq!(nft.min_sync_period, Some(GoDuration(std::time::Duration::ZERO)));
        assert_eq!(nft.masquerade_all, Some(true));
        assert_eq!(c.iptables.unwrap().masquerade_all, None);
        assert_eq!(c.healthz_bind_address.as_deref(), Some("0.0.0.0:0"), "port 0: not served");
        assert_eq!(c.metrics_bind_address.as_deref(), Some("127.0.0.1:9999"));
        assert_eq!(c.feature_gates.unwrap().get("B"), Some(&false));
    }

    #[test]
    fn help_lists_every_flag_but_the_hidden_ones() {
        let help = help();
        for f in FLAGS {
            assert_eq!(
                help.contains(&format!("-{} ", f.name)) || help.contains(&format!("-{}\n", f.name)),
                !f.hidden,
                "{}",
                f.name
            );
        }
    }
}
