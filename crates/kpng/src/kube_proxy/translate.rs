//! From kube-proxy's configuration to kpng's command line: defaults applied as kube-proxy
//! applies them (`SetDefaults_KubeProxyConfiguration`, then Linux's platform defaults),
//! then each field turned into the kpng option with the same meaning, and every field kpng
//! does not act on, or acts on differently, said in a [`Notice`].

use std::time::Duration;

use super::config::{Configuration, GoDuration};

/// Something to say at start, once logging is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// A choice made for the user (a default applied).
    Chose(String),
    /// Accepted, and not acted on.
    Ignored(String),
    /// Acted on, differently from kube-proxy.
    Differs(String),
}

/// The dataplane a mode asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    Iptables,
    Nftables,
}

/// kube-proxy's mode, as Linux defaults it; ipvs and Windows' kernelspace are errors.
pub fn mode(c: &Configuration, notices: &mut Vec<Notice>) -> Result<Mode, String> {
    match c.mode.as_deref().unwrap_or_default() {
        "" => {
            notices.push(Notice::Chose(
                "mode \"\": kube-proxy's default on Linux is iptables; programming with to-iptables"
                    .into(),
            ));
            Ok(Mode::Iptables)
        }
        "iptables" => Ok(Mode::Iptables),
        "nftables" => Ok(Mode::Nftables),
        "ipvs" => Err("mode \"ipvs\": kpng has no IPVS dataplane; use mode \"nftables\" (kpng's to-nft, incremental) or \"iptables\" (to-iptables)".into()),
        "kernelspace" => Err("mode \"kernelspace\" is Windows' (HNS); kpng runs on Linux: use \"nftables\" or \"iptables\"".into()),
        other => Err(format!("mode {other:?}: expected \"iptables\", \"nftables\" or \"\" (ipvs is not supported)")),
    }
}

fn seconds(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn go(d: Option<GoDuration>) -> Option<Duration> {
    d.map(|GoDuration(d)| d)
}

/// The arguments of kpng's own command line that run what `c` describes on node `node`,
/// and what to say about it.
pub fn kpng_args(
    c: &Configuration,
    node: &str,
    master: Option<&str>,
    notices: &mut Vec<Notice>,
) -> Result<Vec<String>, String> {
    let mode = mode(c, notices)?;
    let raw = c;
    let c = &super::config::defaulted(raw);
    let mut source = vec!["kube".to_string()];
    let client = c.client_connection.clone().unwrap_or_default();
    if let Some(kubeconfig) = client.kubeconfig.filter(|k| !k.is_empty()) {
        source.extend(["--kubeconfig".into(), kubeconfig]);
    }
    if let Some(master) = master.filter(|m| !m.is_empty()) {
        source.extend(["--server".into(), master.to_string()]);
    }
    let paced = c.client_connection.clone().unwrap_or_default();
    source.extend(["--kube-api-qps".into(), paced.qps.unwrap_or_default().to_string()]);
    let burst = paced.burst.unwrap_or_default();
    if burst < 1 {
        return Err(format!("clientConnection.burst {burst}: must be at least 1"));
    }
    source.extend(["--kube-api-burst".into(), burst.to_string()]);
    let mut args = source;
    args.push("to-local".into());
    args.push(match mode {
        Mode::Iptables => "to-iptables".into(),
        Mode::Nftables => "to-nft".into(),
    });
    args.extend(["--node".into(), node.to_string()]);

    // Addresses (defaulted from bindAddress's family).
    // bindAddress, when it names an address, is the node's primary IP of its family.
    let bind_address = c.bind_address.clone().unwrap_or_default();
    match bind_address.trim().parse::<std::net::IpAddr>() {
        Ok(ip) if ip.is_unspecified() => {}
        Ok(ip) => args.extend(["--node-ip".into(), ip.to_string()]),
        Err(_) => return Err(format!("bindAddress {bind_address:?}: not an IP address")),
    }
    for (flag, field, text) in [
        ("--healthz-bind-address", "healthzBindAddress", &c.healthz_bind_address),
        ("--metrics-bind-address", "metricsBindAddress", &c.metrics_bind_address),
    ] {
        let text = text.clone().unwrap_or_default();
        let address: std::net::SocketAddr =
            text.parse().map_err(|_| format!("{field} {text:?}: expected an IP or IP:port"))?;
        args.extend([flag.to_string(), address.to_string()]);
    }

    // The mode's section: sync periods and masquerading.
    let iptables = c.iptables.clone().unwrap_or_default();
    let nftables = c.nftables.clone().unwrap_or_default();
    // minSyncPeriod as written: kube-proxy's default (1s) is not kpng's (0).
    let raw_min_sync = match mode {
        Mode::Iptables => raw.iptables.as_ref().and_then(|s| go(s.min_sync_period)),
        Mode::Nftables => raw.nftables.as_ref().and_then(|s| go(s.min_sync_period)),
    };
    let (masquerade_all, masquerade_bit, sync, min_sync) = match mode {
        Mode::Iptables => (
            iptables.masquerade_all,
            iptables.masquerade_bit,
            go(iptables.sync_period),
            raw_min_sync,
        ),
        Mode::Nftables => (
            nftables.masquerade_all,
            nftables.masquerade_bit,
            go(nftables.sync_period),
            raw_min_sync,
        ),
    };
    let section = match mode {
        Mode::Iptables => "iptables",
        Mode::Nftables => "nftables",
    };
    if masquerade_all == Some(true) {
        args.push("--masquerade-all".into());
    }
    let bit = masquerade_bit.unwrap_or_default();
    if !(0..=31).contains(&bit) {
        return Err(format!("{section}.masqueradeBit {bit}: must be within 0-31"));
    }
    args.extend(["--masquerade-bit".into(), bit.to_string()]);
    let sync = sync.unwrap_or_default();
    args.extend(["--sync-period".into(), seconds(sync)]);
    match min_sync {
        Some(d) if !d.is_zero() => args.extend(["--min-sync-period".into(), seconds(d)]),
        _ => notices.push(Notice::Differs(format!(
            "{section}.minSyncPeriod 0s: kube-proxy would pace its syncs 1s apart; kpng applies each change set as soon as the previous one is committed (its changes are incremental)"
        ))),
    }
    if mode == Mode::Iptables && iptables.localhost_node_ports == Some(true) {
        // A backend option: right after the backend's name.
        let at = args.iter().position(|a| a == "to-iptables").map_or(args.len(), |i| i + 1);
        args.insert(at, "--localhost-nodeports".into());
    }

    // Local traffic.
    let cluster_cidr = c.cluster_cidr.clone().unwrap_or_default();
    if !cluster_cidr.trim().is_empty() {
        args.extend(["--cluster-cidr".into(), cluster_cidr.replace(' ', "")]);
    }
    let detect = c.detect_local.clone().unwrap_or_default();
    match c.detect_local_mode.as_deref().unwrap_or_default() {
        "ClusterCIDR" if cluster_cidr.trim().is_empty() => notices.push(Notice::Differs(
            "detectLocalMode ClusterCIDR without clusterCIDR: kube-proxy would recognise no traffic as local; kpng recognises the Node's podCIDRs (NodeCIDR)".into(),
        )),
        "ClusterCIDR" => args.extend(["--detect-local-mode".into(), "ClusterCIDR".into()]),
        mode @ ("NodeCIDR" | "BridgeInterface" | "InterfaceNamePrefix") => {
            args.extend(["--detect-local-mode".into(), mode.into()])
        }
        other => return Err(format!("detectLocalMode {other:?}: expected ClusterCIDR, NodeCIDR, BridgeInterface or InterfaceNamePrefix")),
    }
    if let Some(bridge) = detect.bridge_interface.filter(|b| !b.is_empty()) {
        args.extend(["--pod-bridge-interface".into(), bridge]);
    }
    if let Some(prefix) = detect.interface_name_prefix.filter(|p| !p.is_empty()) {
        args.extend(["--pod-interface-name-prefix".into(), prefix]);
    }

    // NodePorts: unset means every local address (nftables mode defaults to primary).
    let nodeports = c.node_port_addresses.clone().unwrap_or_default();
    let nodeports = match nodeports.is_empty() {
        true => "0.0.0.0/0,::/0".to_string(),
        false => nodeports.join(","),
    };
    if raw.node_port_addresses.as_ref().is_none_or(Vec::is_empty) {
        let (mode_name, chosen) = match mode {
            Mode::Iptables => ("iptables", "every local address"),
            Mode::Nftables => ("nftables", "the node's primary IPs"),
        };
        notices.push(Notice::Chose(format!(
            "nodePortAddresses unset: kube-proxy's default in {mode_name} mode, NodePorts on {chosen}"
        )));
    }
    args.extend(["--nodeport-addresses".into(), nodeports]);

    // Conntrack, with kube-proxy's defaults.
    let ct = c.conntrack.clone().unwrap_or_default();
    let max_per_core = ct.max_per_core.unwrap_or_default();
    let min = ct.min.unwrap_or_default();
    if max_per_core < 0 || min < 0 {
        return Err("conntrack.maxPerCore and conntrack.min must not be negative".into());
    }
    args.extend(["--conntrack-max-per-core".into(), max_per_core.to_string()]);
    args.extend(["--conntrack-min".into(), min.to_string()]);
    let established = go(ct.tcp_established_timeout).unwrap_or_default();
    let close_wait = go(ct.tcp_close_wait_timeout).unwrap_or_default();
    args.extend(["--conntrack-tcp-timeout-established".into(), seconds(established)]);
    args.extend(["--conntrack-tcp-timeout-close-wait".into(), seconds(close_wait)]);
    if ct.tcp_be_liberal == Some(true) {
        args.push("--conntrack-tcp-be-liberal".into());
    }
    let udp = go(ct.udp_timeout).unwrap_or_default();
    let udp_stream = go(ct.udp_stream_timeout).unwrap_or_default();
    args.extend(["--conntrack-udp-timeout".into(), seconds(udp)]);
    args.extend(["--conntrack-udp-timeout-stream".into(), seconds(udp_stream)]);

    args.extend(["--oom-score-adj".into(), c.oom_score_adj.unwrap_or_default().to_string()]);
    logging(c, &mut args, notices)?;
    ignored(raw, notices);
    Ok(args)
}

/// `logging`: the format and the verbosity.
fn logging(
    c: &Configuration,
    args: &mut Vec<String>,
    notices: &mut Vec<Notice>,
) -> Result<(), String> {
    let logging = c.logging.clone().unwrap_or_default();
    match logging.format.as_deref().unwrap_or_default() {
        "" | "text" => {}
        "json" => args.extend(["--logging-format".into(), "json".into()]),
        other => return Err(format!("logging.format {other:?}: expected text or json")),
    }
    // Crates below kpng stay at info: their debug lines are per frame.
    let quiet = "h2=info,hyper=info,hyper_util=info,tower=info,rustls=info,tonic=info";
    let filter = match logging.verbosity.unwrap_or(0) {
        0..=3 => "info".to_string(),
        4..=5 => format!("debug,{quiet}"),
        _ => format!("trace,{quiet}"),
    };
    args.extend(["--log".into(), filter]);
    if logging.vmodule.is_some_and(|v| !v.is_empty()) {
        notices.push(Notice::Ignored(
            "logging.vmodule (--vmodule): kpng filters by module (KPNG_LOG), not by file".into(),
        ));
    }
    Ok(())
}

/// Fields kpng does not act on, said when they differ from their zero value.
fn ignored(c: &Configuration, notices: &mut Vec<Notice>) {
    let mut say = |what: String| notices.push(Notice::Ignored(what));
    if let Some(gates) = c.feature_gates.as_ref().filter(|g| !g.is_empty()) {
        let names: Vec<&str> = gates.keys().map(String::as_str).collect();
        say(format!(
            "featureGates {}: kpng has none of kube-proxy's feature gates",
            names.join(",")
        ));
    }
    let client = c.client_connection.clone().unwrap_or_default();
    if client.content_type.as_deref().is_some_and(|t| !t.is_empty())
        || client.accept_content_types.as_deref().is_some_and(|t| !t.is_empty())
    {
        say("clientConnection.contentType and acceptContentTypes: kpng speaks JSON to the API server".into());
    }
    if c.enable_profiling == Some(true) {
        say("enableProfiling: kpng serves no /debug/pprof".into());
    }
    if c.show_hidden_metrics_for_version.as_deref().is_some_and(|v| !v.is_empty()) {
        say("showHiddenMetricsForVersion: kpng hides no metric".into());
    }
    if go(c.config_sync_period).is_some_and(|d| !d.is_zero()) {
        say("configSyncPeriod: kpng's watches need no resync".into());
    }
    if c.port_range.as_deref().is_some_and(|p| !p.is_empty()) {
        say("portRange: unused (as in kube-proxy)".into());
    }
    let winkernel = c.winkernel.clone().unwrap_or_default();
    if winkernel != Default::default() && winkernel != zero_winkernel() {
        say("winkernel: Windows only".into());
    }
    if c.windows_run_as_service == Some(true) {
        say("windowsRunAsService: Windows only".into());
    }
}

/// The `winkernel` section as kubeadm writes it: every field present and empty.
fn zero_winkernel() -> super::config::Winkernel {
    super::config::Winkernel {
        network_name: Some(String::new()),
        source_vip: Some(String::new()),
        enable_dsr: Some(false),
        root_hns_endpoint_name: Some(String::new()),
        forward_health_check_vip: Some(false),
    }
}
