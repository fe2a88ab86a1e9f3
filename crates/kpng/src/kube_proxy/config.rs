//! `KubeProxyConfiguration` (kubeproxy.config.k8s.io/v1alpha1), decoded as kube-proxy
//! decodes it: strictly first (an unknown or repeated field is an error); when only that
//! fails, leniently (the field is dropped, a repeated key keeps its last value) with a
//! warning naming what was wrong. Every field may be `null` or absent, as in the file
//! kubeadm writes, where every field is present with its zero value.
//!
//! The fields are kube-proxy v1.33's (`staging/src/k8s.io/kube-proxy/config/v1alpha1/
//! types.go` upstream); their defaults are applied where they are read
//! ([`super::translate`]), as `SetDefaults_KubeProxyConfiguration` and the Linux platform
//! defaults would.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The API group and version of the file.
pub const API_VERSION: &str = "kubeproxy.config.k8s.io/v1alpha1";
/// Its kind.
pub const KIND: &str = "KubeProxyConfiguration";

/// A kube-proxy configuration file.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Configuration {
    pub api_version: Option<String>,
    pub kind: Option<String>,
    pub feature_gates: Option<BTreeMap<String, bool>>,
    pub client_connection: Option<ClientConnection>,
    pub logging: Option<Logging>,
    pub hostname_override: Option<String>,
    pub bind_address: Option<String>,
    pub healthz_bind_address: Option<String>,
    pub metrics_bind_address: Option<String>,
    pub bind_address_hard_fail: Option<bool>,
    pub enable_profiling: Option<bool>,
    pub show_hidden_metrics_for_version: Option<String>,
    pub mode: Option<String>,
    pub iptables: Option<Iptables>,
    pub ipvs: Option<Ipvs>,
    pub nftables: Option<Nftables>,
    pub winkernel: Option<Winkernel>,
    pub detect_local_mode: Option<String>,
    pub detect_local: Option<DetectLocal>,
    #[serde(rename = "clusterCIDR")]
    pub cluster_cidr: Option<String>,
    pub node_port_addresses: Option<Vec<String>>,
    pub oom_score_adj: Option<i32>,
    pub conntrack: Option<Conntrack>,
    pub config_sync_period: Option<GoDuration>,
    pub port_range: Option<String>,
    pub windows_run_as_service: Option<bool>,
}

/// `clientConnection`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ClientConnection {
    pub kubeconfig: Option<String>,
    pub accept_content_types: Option<String>,
    pub content_type: Option<String>,
    pub qps: Option<f64>,
    pub burst: Option<i64>,
}

/// `logging`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Logging {
    pub format: Option<String>,
    /// A duration string or integer nanoseconds.
    pub flush_frequency: Option<serde_json::Value>,
    pub verbosity: Option<u32>,
    pub vmodule: Option<Vec<VModule>>,
    pub options: Option<serde_json::Value>,
}

/// One `logging.vmodule` entry.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct VModule {
    pub file_pattern: Option<String>,
    pub verbosity: Option<u32>,
}

/// `iptables`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Iptables {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub localhost_node_ports: Option<bool>,
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
}

/// `ipvs`: read, never acted on (kpng has no IPVS dataplane).
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Ipvs {
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
    pub scheduler: Option<String>,
    #[serde(rename = "excludeCIDRs")]
    pub exclude_cidrs: Option<Vec<String>>,
    #[serde(rename = "strictARP")]
    pub strict_arp: Option<bool>,
    pub tcp_timeout: Option<GoDuration>,
    pub tcp_fin_timeout: Option<GoDuration>,
    pub udp_timeout: Option<GoDuration>,
}

/// `nftables`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Nftables {
    pub masquerade_bit: Option<i32>,
    pub masquerade_all: Option<bool>,
    pub sync_period: Option<GoDuration>,
    pub min_sync_period: Option<GoDuration>,
}

/// `winkernel`: Windows only, read and never acted on.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Winkernel {
    pub network_name: Option<String>,
    pub source_vip: Option<String>,
    #[serde(rename = "enableDSR")]
    pub enable_dsr: Option<bool>,
    pub root_hns_endpoint_name: Option<String>,
    pub forward_health_check_vip: Option<bool>,
}

/// `detectLocal`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DetectLocal {
    pub bridge_interface: Option<String>,
    pub interface_name_prefix: Option<String>,
}

/// `conntrack`.
#[derive(Debug, Default, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct Conntrack {
    pub max_per_core: Option<i32>,
    pub min: Option<i32>,
    pub tcp_established_timeout: Option<GoDuration>,
    pub tcp_close_wait_timeout: Option<GoDuration>,
    pub tcp_be_liberal: Option<bool>,
    pub udp_timeout: Option<GoDuration>,
    pub udp_stream_timeout: Option<GoDuration>,
}

/// A duration as Kubernetes writes one (`24h0m0s`, `1.5s`, `300ms`, `0s`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct GoDuration(pub Duration);

impl Serialize for GoDuration {
    /// As Go writes one: `24h0m0s`, `1m30s`, `1.5s`, `0s`.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let total = self.0.as_secs();
        let (h, m, s) = (total / 3600, total / 60 % 60, total % 60);
        let nanos = self.0.subsec_nanos();
        let seconds = match nanos {
            0 => format!("{s}s"),
            n => format!("{}s", format!("{s}.{n:09}").trim_end_matches('0')),
        };
        let text = match (h, m) {
            (0, 0) => seconds,
            (0, m) => format!("{m}m{seconds}"),
            (h, m) => format!("{h}h{m}m{seconds}"),
        };
        serializer.serialize_str(&text)
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        parse_go_duration(&text).map(GoDuration).map_err(serde::de::Error::custom)
    }
}

/// A Go duration: `0`, or numbers each followed by a unit (`ns`, `us`, `µs`, `ms`, `s`,
/// `m`, `h`), as in `1h30m` or `1.5s`. Negative durations are refused (no field takes one).
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    let bad = || format!("{text:?} is not a duration like 30s, 1m30s or 24h0m0s");
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    if text.is_empty() || text.starts_with('-') {
        return Err(bad());
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    let mut total = 0f64;
    while !rest.is_empty() {
        let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
        let (number, after) = rest.split_at(digits);
        let value: f64 = number.parse().map_err(|_| bad())?;
        let unit_len = after.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(after.len());
        let (unit, next) = after.split_at(unit_len);
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            _ => return Err(bad()),
        };
        total += value * seconds;
        rest = next;
    }
    Duration::try_from_secs_f64(total).map_err(|_| bad())
}

/// `c` with kube-proxy's defaults (`SetDefaults_KubeProxyConfiguration`) and Linux's
/// platform defaults (the mode, the NodePort addresses of nftables mode, the local traffic
/// detection) filled in, as kube-proxy runs with it.
pub fn defaulted(c: &Configuration) -> Configuration {
    let mut c = c.clone();
    let zero = |d: &Option<GoDuration>| d.is_none_or(|GoDuration(d)| d.is_zero());
    let secs = |s: u64| Some(GoDuration(Duration::from_secs(s)));
    c.api_version = Some(API_VERSION.into());
    c.kind = Some(KIND.into());
    let bind = c.bind_address.clone().filter(|b| !b.trim().is_empty()).unwrap_or("0.0.0.0".into());
    let v6 = bind.contains(':');
    for (address, ip, port) in [
        (&mut c.healthz_bind_address, if v6 { "[::]" } else { "0.0.0.0" }, 10256),
        (&mut c.metrics_bind_address, if v6 { "[::1]" } else { "127.0.0.1" }, 10249),
    ] {
        let text = address.clone().unwrap_or_default();
        *address = Some(match text.trim() {
            "" => format!("{ip}:{port}"),
            t if t.parse::<std::net::SocketAddr>().is_ok() => t.to_string(),
            t => join_host_port(&host_of(t), port),
        });
    }
    c.bind_address = Some(bind);
    c.oom_score_adj.get_or_insert(-999);
    if zero(&c.config_sync_period) {
        c.config_sync_period = secs(15 * 60);
    }
    let client = c.client_connection.get_or_insert_with(Default::default);
    if client.content_type.as_deref().is_none_or(str::is_empty) {
        client.content_type = Some("application/vnd.kubernetes.protobuf".into());
    }
    if client.qps.is_none_or(|q| q == 0.0) {
        client.qps = Some(5.0);
    }
    if client.burst.is_none_or(|b| b == 0) {
        client.burst = Some(10);
    }
    let iptables = c.iptables.get_or_insert_with(Default::default);
    iptables.masquerade_bit.get_or_insert(14);
    iptables.localhost_node_ports.get_or_insert(true);
    if zero(&iptables.sync_period) {
        iptables.sync_period = secs(30);
    }
    if zero(&iptables.min_sync_period) {
        iptables.min_sync_period = secs(1);
    }
    let nftables = c.nftables.get_or_insert_with(Default::default);
    nftables.masquerade_bit.get_or_insert(14);
    if zero(&nftables.sync_period) {
        nftables.sync_period = secs(30);
    }
    if zero(&nftables.min_sync_period) {
        nftables.min_sync_period = secs(1);
    }
    let ipvs = c.ipvs.get_or_insert_with(Default::default);
    if zero(&ipvs.sync_period) {
        ipvs.sync_period = secs(30);
    }
    let ct = c.conntrack.get_or_insert_with(Default::default);
    ct.max_per_core.get_or_insert(32_768);
    ct.min.get_or_insert(131_072);
    ct.tcp_established_timeout.get_or_insert(GoDuration(Duration::from_secs(86_400)));
    ct.tcp_close_wait_timeout.get_or_insert(GoDuration(Duration::from_secs(3600)));
    let logging = c.logging.get_or_insert_with(Default::default);
    if logging.format.as_deref().is_none_or(str::is_empty) {
        logging.format = Some("text".into());
    }
    if c.mode.as_deref().is_none_or(str::is_empty) {
        c.mode = Some("iptables".into());
    }
    if c.mode.as_deref() == Some("nftables")
        && c.node_port_addresses.as_ref().is_none_or(Vec::is_empty)
    {
        c.node_port_addresses = Some(vec!["primary".into()]);
    }
    if c.detect_local_mode.as_deref().is_none_or(str::is_empty) {
        c.detect_local_mode = Some("ClusterCIDR".into());
    }
    c
}

/// A decoded file, and what strict decoding refused (each named), if anything.
#[derive(Debug)]
pub struct Decoded {
    pub configuration: Configuration,
    pub lenient: Vec<String>,
}

/// Whether `text` is a `KubeProxyConfiguration` (any version): what `--config` reads as
/// kube-proxy's rather than kpng's own.
pub fn is_kube_proxy_configuration(text: &str) -> bool {
    text.lines().any(|line| {
        line.split_once(':').is_some_and(|(key, value)| {
            key.trim() == "kind" && value.trim().trim_matches(['"', '\'']) == KIND
        })
    })
}

/// Decodes a file as kube-proxy does: strictly, else leniently for v1alpha1 (the refusals
/// are in [`Decoded::lenient`]). A wrong apiVersion or kind, a value of the wrong type or a
/// malformed document is an error naming the field.
pub fn decode(text: &str) -> Result<Decoded, String> {
    use serde_saphyr::options::DuplicateKeyPolicy;
    let mut lenient = Vec::new();
    let strict = serde_saphyr::options! { duplicate_keys: DuplicateKeyPolicy::Error };
    let mut value: serde_json::Value = match serde_saphyr::from_str_with_options(text, strict) {
        Ok(value) => value,
        Err(error) if error.to_string().to_lowercase().contains("duplicate") => {
            lenient.push(first_line(&error.to_string()));
            let last_wins = serde_saphyr::options! { duplicate_keys: DuplicateKeyPolicy::LastWins };
            serde_saphyr::from_str_with_options(text, last_wins)
                .map_err(|e| format!("not YAML: {}", first_line(&e.to_string())))?
        }
        Err(error) => return Err(format!("not YAML: {}", first_line(&error.to_string()))),
    };
    let api_version = value.get("apiVersion").and_then(|v| v.as_str()).unwrap_or_default();
    let kind = value.get("kind").and_then(|v| v.as_str()).unwrap_or_default();
    if kind != KIND {
        return Err(format!("kind {kind:?}: expected {KIND}"));
    }
    if api_version != API_VERSION {
        return Err(format!("apiVersion {api_version:?}: kpng reads {API_VERSION}"));
    }
    // An unknown field is dropped and named, then the rest decoded again (a file has few).
    for _ in 0..256 {
        let error = match serde_path_to_error::deserialize::<_, Configuration>(&value) {
            Ok(configuration) => return Ok(Decoded { configuration, lenient }),
            Err(error) => error,
        };
        let message = error.inner().to_string();
        let path = error.path().to_string();
        let unknown = message
            .strip_prefix("unknown field `")
            .and_then(|rest| rest.split_once('`'))
            .map(|(field, _)| field.to_string());
        let Some(field) = unknown else {
            let at = if path == "." { String::new() } else { format!("{path}: ") };
            return Err(format!("{at}{}", message.split(", expected").next().unwrap_or_default()));
        };
        // The path ends with the unknown field itself.
        let parent = path.strip_suffix(field.as_str()).unwrap_or(&path).trim_end_matches('.');
        let removed = object_at(&mut value, parent).and_then(|object| object.remove(&field));
        if removed.is_none() {
            return Err(format!("{path}: {message}"));
        }
        lenient.push(format!("unknown field {path:?}"));
    }
    Err("too many unknown fields".into())
}

/// The object at a dotted `path` (`.` for the top) of `value`.
fn object_at<'a>(
    value: &'a mut serde_json::Value,
    path: &str,
) -> Option<&'a mut serde_json::Map<String, serde_json::Value>> {
    let mut at = value;
    for part in path.split('.').filter(|p| !p.is_empty()) {
        at = match part.parse::<usize>() {
            Ok(index) if at.is_array() => at.get_mut(index)?,
            _ => at.get_mut(part)?,
        };
    }
    at.as_object_mut()
}

fn first_line(text: &str) -> String {
    text.lines().next().unwrap_or_default().to_string()
}

/// The host part of `ip` or `ip:port` (`[v6]:port` too).
pub fn host_of(address: &str) -> String {
    if let Ok(socket) = address.parse::<std::net::SocketAddr>() {
        return socket.ip().to_string();
    }
    address.trim_matches(['[', ']']).to_string()
}

/// `ip:port`, with brackets for IPv6.
pub fn join_host_port(ip: &str, port: u16) -> String {
    match ip.contains(':') {
        true => format!("[{ip}]:{port}"),
        false => format!("{ip}:{port}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The file kubeadm writes for a plain `kubeadm init`: every field, most of them null,
    /// empty or zero.
    pub const KUBEADM: &str = include_str!("kubeadm-config.conf");

    #[test]
    fn kubeadms_file_decodes_strictly() {
        let decoded = decode(KUBEADM).unwrap();
        assert_eq!(decoded.lenient, Vec::<String>::new());
        let c = decoded.configuration;
        assert_eq!(c.mode.as_deref(), Some(""));
        assert_eq!(
            c.client_connection.unwrap().kubeconfig.as_deref(),
            Some("/var/lib/kube-proxy/kubeconfig.conf")
        );
        assert_eq!(c.node_port_addresses, None, "null");
        assert_eq!(c.conntrack.unwrap().udp_timeout, Some(GoDuration(Duration::ZERO)));
    }

    #[test]
    fn unknown_and_repeated_fields_fall_back_to_lenient_decoding() {
        let text = format!("{KUBEADM}\nfancyNewField: 3\nmode: nftables\n");
        let text =
            text.replacen("  masqueradeAll: false\n", "  masqueradeAll: false\n  shiny: 1\n", 1);
        let decoded = decode(&text).unwrap();
        assert_eq!(decoded.configuration.mode.as_deref(), Some("nftables"), "the last one wins");
        let said = decoded.lenient.join("; ");
        assert!(said.contains("duplicate"), "{said}");
        assert!(said.contains("\"fancyNewField\""), "{said}");
        assert!(said.contains("\"iptables.shiny\""), "{said}");
    }

    #[test]
    fn wrong_types_and_kinds_are_errors_naming_the_field() {
        let text = KUBEADM.replace(
            "  masqueradeBit: null\n  minSyncPeriod",
            "  masqueradeBit: lots\n  minSyncPeriod",
        );
        let error = decode(&text).unwrap_err();
        assert!(error.contains("iptables.masqueradeBit"), "{error}");
        let error =
            decode(&KUBEADM.replace("configSyncPeriod: 0s", "configSyncPeriod: soon")).unwrap_err();
        assert!(error.contains("configSyncPeriod") && error.contains("soon"), "{error}");
        let error = decode("apiVersion: v1\nkind: ConfigMap\n").unwrap_err();
        assert!(error.contains("KubeProxyConfiguration"), "{error}");
        let error = decode(&KUBEADM.replace("v1alpha1", "v1beta9")).unwrap_err();
        assert!(error.contains("v1beta9"), "{error}");
    }

    #[test]
    fn go_durations() {
        let cases = [
            ("0", 0.0),
            ("0s", 0.0),
            ("24h0m0s", 86_400.0),
            ("1m30s", 90.0),
            ("1.5s", 1.5),
            ("300ms", 0.3),
            ("2h22m", 8520.0),
        ];
        for (text, seconds) in cases {
            assert_eq!(parse_go_duration(text), Ok(Duration::from_secs_f64(seconds)), "{text}");
        }
        for bad in ["", "5", "1x", "-1s", "s"] {
            assert!(parse_go_duration(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn defaults_are_kube_proxys_and_survive_a_round_trip() {
        let c = defaulted(&decode(KUBEADM).unwrap().configuration);
        assert_eq!(c.mode.as_deref(), Some("iptables"));
        assert_eq!(c.healthz_bind_address.as_deref(), Some("0.0.0.0:10256"));
        assert_eq!(c.metrics_bind_address.as_deref(), Some("127.0.0.1:10249"));
        assert_eq!(
            c.iptables.as_ref().unwrap().min_sync_period,
            Some(GoDuration(Duration::from_secs(1)))
        );
        let written = serde_saphyr::to_string(&c).unwrap();
        assert!(written.contains("tcpEstablishedTimeout: 24h0m0s"), "{written}");
        assert_eq!(decode(&written).unwrap().configuration, c);
    }

    #[test]
    fn the_kind_tells_the_formats_apart() {
        assert!(is_kube_proxy_configuration(KUBEADM));
        assert!(!is_kube_proxy_configuration("sync-period: 1m\nnode: a\n"));
    }
}
