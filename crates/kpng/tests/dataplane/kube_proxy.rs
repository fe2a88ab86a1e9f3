//! kpng in kube-proxy's place, as kubeadm's DaemonSet would start it once its image is
//! swapped: the binary under the name `kube-proxy`, kubeadm's command line and its whole
//! `KubeProxyConfiguration`, an API server, and a node that still holds kube-proxy's rules.

use std::path::Path;
use std::process::{Command, Stdio};

use kpng_testkit::apiserver::FakeApiServer;
use kpng_testkit::netns::Netns;
use kpng_testkit::privileged::require;
use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::{Cluster, spawn_in_netns};

use crate::harness::*;

const CONFIG: &str = include_str!("../../src/kube_proxy/kubeadm-config.conf");
/// kube-proxy v1.33's metrics, with their types, labels, buckets and modes.
const UPSTREAM_METRICS: &str = include_str!("kube-proxy-metrics.tsv");

/// A fake API server listening on 127.0.0.1 inside `ns`, serving `manifests`.
fn api_server_in(ns: &Netns, manifests: &str) -> (FakeApiServer, std::sync::mpsc::Sender<()>) {
    let (ready, server) = std::sync::mpsc::channel();
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    spawn_in_netns(ns, move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(async move {
            let api = FakeApiServer::start(std::time::Duration::from_secs(1)).await.unwrap();
            ready.send(api).unwrap();
            // Serves until the test says stop (or ends).
            let _ = tokio::task::spawn_blocking(move || stopped.recv()).await;
        });
    });
    let api = server.recv().unwrap();
    for document in manifests.split("\n---\n") {
        if let Ok(object) = serde_saphyr::from_str::<serde_json::Value>(document)
            && object.get("kind").is_some()
        {
            api.apply(object);
        }
    }
    (api, stop)
}

/// What kube-proxy would have left on the node: its nftables table, a service chain whose
/// DNAT sends 10.96.0.10:80 nowhere, its jump from PREROUTING; and the kubelet's chains.
fn leave_kube_proxys_rules(node: &Netns) {
    let run = |program: &str, args: &[&str]| {
        let out = node.output(program, args);
        assert!(
            out.status.success(),
            "{program} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run("nft", &["add table ip kube-proxy"]);
    run("nft", &["add chain ip kube-proxy services"]);
    run("iptables", &["-t", "nat", "-N", "KUBE-SERVICES"]);
    run("iptables", &["-t", "nat", "-N", "KUBE-SVC-WEB"]);
    run(
        "iptables",
        &[
            "-t",
            "nat",
            "-A",
            "PREROUTING",
            "-m",
            "comment",
            "--comment",
            "kubernetes service portals",
            "-j",
            "KUBE-SERVICES",
        ],
    );
    run(
        "iptables",
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SERVICES",
            "-d",
            "10.96.0.10/32",
            "-p",
            "tcp",
            "--dport",
            "80",
            "-j",
            "KUBE-SVC-WEB",
        ],
    );
    run(
        "iptables",
        &[
            "-t",
            "nat",
            "-A",
            "KUBE-SVC-WEB",
            "-p",
            "tcp",
            "-j",
            "DNAT",
            "--to-destination",
            "192.0.2.66:8080",
        ],
    );
    run("iptables", &["-t", "mangle", "-N", "KUBE-KUBELET-CANARY"]);
    run("iptables", &["-t", "filter", "-N", "KUBE-FIREWALL"]);
}

fn rules(node: &Netns) -> String {
    let nft = node.output("nft", &["list", "tables"]);
    let save = node.output("iptables-save", &[]);
    format!("{}{}", String::from_utf8_lossy(&nft.stdout), String::from_utf8_lossy(&save.stdout))
}

/// The binary under kube-proxy's name, as the image ships it.
fn kube_proxy_binary(dir: &Path) -> std::path::PathBuf {
    let path = dir.join("kube-proxy");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_kpng"), &path).unwrap();
    path
}

/// kubeadm's config file for `mode`, with a kubeconfig for `api`.
fn write_config(dir: &Path, api: &FakeApiServer, mode: &str) -> std::path::PathBuf {
    let kubeconfig = dir.join("kubeconfig.conf");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- cluster: {{server: \"{}\"}}\n  name: default\ncontexts:\n- context: {{cluster: default, user: default}}\n  name: default\ncurrent-context: default\nusers:\n- name: default\n  user: {{}}\n",
            api.url()
        ),
    )
    .unwrap();
    let config = CONFIG
        .replace("/var/lib/kube-proxy/kubeconfig.conf", kubeconfig.to_str().unwrap())
        .replace("mode: \"\"", &format!("mode: \"{mode}\""));
    let path = dir.join("config.conf");
    std::fs::write(&path, config).unwrap();
    path
}

fn kube_proxy(node: &Netns, binary: &Path, config: &Path, extra: &[&str]) -> Command {
    let config = format!("--config={}", config.display());
    let mut args = vec![config.as_str(), "--hostname-override=node-a"];
    args.extend(extra);
    let mut command = node.command(binary.to_str().unwrap(), &args);
    command.env_remove("NODE_NAME").env_remove("KUBECONFIG");
    command
}

fn http(ns: &Netns, url: &str) -> String {
    let out = ns.output("curl", &["-s", "-i", "--max-time", "2", url]);
    String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n")
}

fn replaces_kube_proxy(mode: &str) {
    let test = format!("kube_proxy_is_replaced_by_swapping_the_image ({mode})");
    if !require(&test, &["nft", "iptables", "iptables-save", "ip", "curl"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    leave_kube_proxys_rules(&cluster.node);
    let web = [
        NODE_A.to_string(),
        service("web", "  clusterIP: 10.96.0.10\n", PORT_HTTP),
        slice("web-1", "web", "IPv4", SLICE_HTTP, &[WEB_A]),
    ]
    .concat();
    let (api, _stop) = api_server_in(&cluster.node, &web);
    let dir = tempfile::tempdir().unwrap();
    let binary = kube_proxy_binary(dir.path());
    let config = write_config(dir.path(), &api, mode);
    let log = dir.path().join("kube-proxy.log");
    let mut child = kube_proxy(&cluster.node, &binary, &config, &[])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let logged = || std::fs::read_to_string(&log).unwrap_or_default();
    let reached = eventually(
        || Cluster::tcp(&cluster.client, "10.96.0.10:80"),
        |o| matches!(o, Outcome::Answer { name, .. } if name == "web-a"),
    );
    let left = rules(&cluster.node);
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        matches!(&reached, Outcome::Answer { name, .. } if name == "web-a"),
        "{reached}\n{left}\n{}",
        logged()
    );
    assert!(
        !left.contains("kube-proxy")
            && !left.contains("KUBE-SERVICES")
            && !left.contains("KUBE-SVC-WEB"),
        "kube-proxy's rules stayed:\n{left}"
    );
    assert!(
        left.contains("KUBE-KUBELET-CANARY") && left.contains("KUBE-FIREWALL"),
        "the kubelet's chains went:\n{left}"
    );
    let expected = match mode {
        "nftables" => "table ip kpng",
        _ => "KPNG-SERVICES",
    };
    assert!(left.contains(expected), "{left}");

    // Health and metrics, where kubeadm's (defaulted) configuration puts them.
    let mut child = kube_proxy(&cluster.node, &binary, &config, &[])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_until("/healthz answers 200", || {
        http(&cluster.client, "http://192.168.10.1:10256/healthz").starts_with("HTTP/1.1 200")
    });
    let livez = http(&cluster.client, "http://192.168.10.1:10256/livez");
    let metrics = http(&cluster.node, "http://127.0.0.1:10249/metrics");
    let _ = child.kill();
    let _ = child.wait();
    assert!(livez.starts_with("HTTP/1.1 200"), "{livez}");
    let problems = compare_metrics(&metrics, mode);
    assert!(problems.is_empty(), "{}\n\n{metrics}", problems.join("\n"));
    assert!(logged().contains("kube-proxy: "), "the choices made are logged:\n{}", logged());

    // --init-only: the privileged start-up work, then exit 0.
    cluster.node.output("nft", &["add table ip kube-proxy"]);
    let out = kube_proxy(&cluster.node, &binary, &config, &["--init-only"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!rules(&cluster.node).contains("kube-proxy"), "{}", rules(&cluster.node));

    // --cleanup: neither kube-proxy's nor kpng's rules stay.
    leave_kube_proxys_rules_again(&cluster.node);
    let out = kube_proxy(&cluster.node, &binary, &config, &["--cleanup"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let left = rules(&cluster.node);
    for gone in ["kube-proxy", "KUBE-SERVICES", "table ip kpng", "KPNG-"] {
        assert!(!left.contains(gone), "{gone} stayed after --cleanup:\n{left}");
    }
    drop(api);
}

/// kube-proxy's table and jump, once more (its chains' names were freed by the removal).
fn leave_kube_proxys_rules_again(node: &Netns) {
    node.output("nft", &["add table ip kube-proxy"]);
    node.output("iptables", &["-t", "nat", "-N", "KUBE-SERVICES"]);
    node.output("iptables", &["-t", "nat", "-A", "PREROUTING", "-j", "KUBE-SERVICES"]);
}

pub fn kube_proxy_is_replaced_in_nftables_mode() {
    replaces_kube_proxy("nftables");
}

pub fn kube_proxy_is_replaced_in_iptables_mode() {
    replaces_kube_proxy("iptables");
}

pub fn ipvs_mode_is_refused_by_name() {
    if !require("ipvs_mode_is_refused_by_name", &["ip"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let binary = kube_proxy_binary(dir.path());
    let path = dir.path().join("config.conf");
    std::fs::write(&path, CONFIG.replace("mode: \"\"", "mode: ipvs")).unwrap();
    let out = Command::new(&binary)
        .args([&format!("--config={}", path.display()), "--hostname-override=node-a"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("\"ipvs\""), "{stderr}");
}

/// The label names and value of each sample line of an exposition.
fn samples(exposition: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    for line in exposition.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let (name, rest) = match line.find('{') {
            Some(at) => (&line[..at], &line[at + 1..]),
            None => (line.split(' ').next().unwrap_or_default(), ""),
        };
        let mut labels = Vec::new();
        let mut rest = rest;
        while let Some((key, after)) = rest.split_once("=\"") {
            let Some(end) = after.find('"') else { break };
            labels.push((key.trim_start_matches(',').to_string(), after[..end].to_string()));
            rest = &after[end + 1..];
            if rest.starts_with('}') {
                break;
            }
        }
        out.push((name.to_string(), labels));
    }
    out
}

/// What differs between `exposition` and upstream's list for `mode`: a missing metric, a
/// wrong type, other label names, other buckets, or another mode's metric.
fn compare_metrics(exposition: &str, mode: &str) -> Vec<String> {
    let samples = samples(exposition);
    let types: std::collections::HashMap<&str, &str> = exposition
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .collect();
    let mut problems = Vec::new();
    for line in UPSTREAM_METRICS.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let fields: Vec<&str> = line.split('\t').collect();
        let [name, kind, labels, buckets, modes] = fields[..] else { panic!("bad line {line}") };
        let ours = modes.split(',').any(|m| m == mode);
        // OpenMetrics names a counter's family without `_total`.
        let family = match kind {
            "counter" => name.strip_suffix("_total").unwrap_or(name),
            _ => name,
        };
        let sample_name = match kind {
            "histogram" => format!("{name}_bucket"),
            _ => name.to_string(),
        };
        let found: Vec<&Vec<(String, String)>> =
            samples.iter().filter(|(n, _)| *n == sample_name).map(|(_, l)| l).collect();
        if !ours {
            if !found.is_empty() {
                problems.push(format!("{name}: served in {mode} mode, where kube-proxy has none"));
            }
            continue;
        }
        match types.get(family) {
            None => problems.push(format!("{name}: missing")),
            Some(t) if *t != kind => problems.push(format!("{name}: type {t}, upstream {kind}")),
            Some(_) => {}
        }
        if found.is_empty() {
            problems.push(format!("{name}: no sample"));
            continue;
        }
        let want: Vec<&str> = labels.split(',').filter(|l| *l != "-").collect();
        for labels in &found {
            let mut got: Vec<&str> =
                labels.iter().map(|(k, _)| k.as_str()).filter(|k| *k != "le").collect();
            let mut expected = want.clone();
            got.sort_unstable();
            expected.sort_unstable();
            if got != expected {
                problems.push(format!("{name}: labels {got:?}, upstream {expected:?}"));
                break;
            }
        }
        if kind == "histogram" {
            let mut bounds: Vec<f64> = found
                .iter()
                .flat_map(|l| l.iter().filter(|(k, _)| k == "le").map(|(_, v)| v.clone()))
                .filter(|v| v != "+Inf")
                .map(|v| v.parse().unwrap())
                .collect();
            bounds.sort_by(f64::total_cmp);
            bounds.dedup();
            let expected = upstream_buckets(buckets);
            let same = bounds.len() == expected.len()
                && bounds.iter().zip(&expected).all(|(a, b)| (a - b).abs() < 1e-9);
            if !same {
                problems.push(format!("{name}: buckets {bounds:?}, upstream {expected:?}"));
            }
        }
    }
    problems
}

/// The bucket bounds a list entry names.
fn upstream_buckets(spec: &str) -> Vec<f64> {
    if spec == "programming" {
        let mut b = vec![0.0, 0.25, 0.5];
        b.extend((1..=59).map(f64::from));
        b.extend((0..12).map(|i| 60.0 + 5.0 * f64::from(i)));
        b.extend((0..7).map(|i| 120.0 + 30.0 * f64::from(i)));
        return b;
    }
    let args: Vec<f64> =
        spec.strip_prefix("exp:").unwrap().split(',').map(|a| a.parse().unwrap()).collect();
    (0..args[2] as i32).map(|i| args[0] * args[1].powi(i)).collect()
}
