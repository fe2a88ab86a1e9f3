//! The admin HTTP servers of the real binary: health, liveness, readiness, metrics, state.

#[path = "support/mod.rs"]
mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Kpng, example, replace_file, run};

const STUCK: Duration = Duration::from_secs(20);

/// A port free on loopback now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

use support::http_get as get;

/// Polls `path` until `check` accepts the answer.
fn wait_get(port: u16, path: &str, check: impl Fn(u16, &str) -> bool) -> (u16, String) {
    let start = Instant::now();
    loop {
        if let Some((code, body)) = get(port, path) {
            if check(code, &body) {
                return (code, body);
            }
            assert!(start.elapsed() < STUCK, "{path}: last answer {code} {body}");
        }
        assert!(start.elapsed() < STUCK, "{path} never answered");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The value of an unlabelled metric in Prometheus text.
fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|rest| rest.strip_prefix(' ')))
        .unwrap_or_else(|| panic!("no {name} in:\n{text}"))
        .trim()
        .parse()
        .unwrap()
}

/// Checks the exposition format line by line: `# TYPE/HELP/UNIT/EOF` or `name{labels} value`.
fn assert_exposition(text: &str) {
    assert!(text.ends_with("# EOF\n"), "{text}");
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
        assert!(value.parse::<f64>().is_ok(), "bad value in {line:?}");
        let name = series.split('{').next().unwrap();
        assert!(
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
            "bad name in {line:?}"
        );
    }
}

#[test]
fn health_readiness_metrics_and_state_follow_the_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cluster.yaml");
    std::fs::copy(example(), &input).unwrap();
    let input = input.to_str().unwrap().to_string();
    let (health, metrics) = (free_port(), free_port());
    let (h, m) = (format!("127.0.0.1:{health}"), format!("127.0.0.1:{metrics}"));
    let args = ["file", "--input", &input, "--watch", "to-local", "--node", "node-a", "to-json"];
    let mut args = args.to_vec();
    args.extend(["--healthz-bind-address", &h, "--metrics-bind-address", &m]);
    let mut kpng = Kpng::spawn(&args);
    kpng.next_change_set();

    let (code, _) = wait_get(health, "/readyz", |code, _| code == 200);
    assert_eq!(code, 200);
    let (_, body) = wait_get(health, "/healthz", |code, _| code == 200);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["healthy"], true);
    assert_eq!(body["nodeEligible"], true);
    assert!(body["lastUpdated"].as_str().unwrap().ends_with('Z'), "{body}");
    assert!(body["currentTime"].as_str().unwrap() >= body["lastUpdated"].as_str().unwrap());

    let (_, text) = wait_get(metrics, "/metrics", |code, _| code == 200);
    assert_exposition(&text);
    assert_eq!(metric(&text, "kpng_enls_revisions_total"), 1.0);
    let revision = metric(&text, "kpng_store_revision");
    // The example has 3 nodes and 6 EndpointSlices (some of them not proxied).
    assert_eq!(metric(&text, "kpng_source_events_total{kind=\"node\"}"), 3.0, "{text}");
    assert!(metric(&text, "kpng_source_events_total{kind=\"endpointslice\"}") >= 5.0, "{text}");
    let endpoint_changes = metric(&text, "kubeproxy_sync_proxy_rules_endpoint_changes_total");
    assert!(text.contains("kubeproxy_sync_proxy_rules_duration_seconds_bucket"), "{text}");
    assert!(text.contains("kubeproxy_proxy_healthz_total{code=\"200\"} 1"), "{text}");
    assert!(text.contains("kubeproxy_network_programming_duration_seconds_count"), "{text}");
    let no_local = "kubeproxy_sync_proxy_rules_no_local_endpoints_total{traffic_policy=\"internal\",ip_family=\"IPv4\"}";
    assert!(metric(&text, no_local) >= 0.0, "{text}");

    // An edit moves the counters.
    let text = std::fs::read_to_string(&input).unwrap();
    replace_file(Path::new(&input), &text.replace("10.244.0.10", "10.244.0.99"));
    kpng.next_change_set();
    let (_, text) = wait_get(metrics, "/metrics", |_, t| t.contains("kpng_enls_revisions_total 2"));
    assert_eq!(metric(&text, "kpng_store_revision"), revision + 1.0);
    assert_eq!(
        metric(&text, "kubeproxy_sync_proxy_rules_endpoint_changes_total"),
        endpoint_changes + 1.0
    );

    // /state holds what to-file writes, and this node's state.
    let (_, state) = wait_get(metrics, "/state", |code, _| code == 200);
    let state: Value = serde_json::from_str(&state).unwrap();
    let out = dir.path().join("model.json");
    let file = run(&[
        "file",
        "--input",
        &input,
        "to-file",
        "--output",
        out.to_str().unwrap(),
        "--format",
        "json",
        "--once",
    ]);
    assert!(file.status.success(), "{}", file.stderr);
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(state["model"], written);
    assert_eq!(state["node"]["name"], "node-a");
    assert!(state["node"]["state"]["services"]["shop/cart"].is_object(), "{state}");

    // A load-balancing annotation with a value kpng does not know is named in the log and
    // counted; the service is proxied as before, so no change set follows.
    let (_, text) = wait_get(metrics, "/metrics", |code, _| code == 200);
    assert_eq!(metric(&text, "kpng_rejected_annotations_total"), 0.0, "{text}");
    let text = std::fs::read_to_string(&input).unwrap();
    let annotated = text.replace(
        "    service.kubernetes.io/topology-mode: Auto\n",
        "    service.kubernetes.io/topology-mode: Auto\n    \
         service.kubernetes.io/kube-nftlb-load-balancer-scheduler: fastest\n",
    );
    assert_ne!(annotated, text, "the example's kube-dns annotations moved");
    replace_file(Path::new(&input), &annotated);
    let (_, text) =
        wait_get(metrics, "/metrics", |_, t| !t.contains("kpng_rejected_annotations_total 0"));
    assert!(metric(&text, "kpng_rejected_annotations_total") >= 1.0, "{text}");
    kpng.wait_stderr("unknown scheduler \"fastest\"");
    assert!(kpng.stderr().contains("kube-system/kube-dns"), "{}", kpng.stderr());
    assert!(kpng.try_line().is_none(), "no change set for a rejected annotation");
}

#[test]
fn healthz_fails_when_updates_wait_and_when_the_node_drains() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cluster.yaml");
    let text = std::fs::read_to_string(example()).unwrap();
    // A backend whose output nobody reads is stuck in its first write: the update waits.
    // The state must be larger than a pipe holds.
    let big = dir.path().join("big.yaml");
    support::write_cluster(&big, 2000);
    let health = free_port();
    let h = format!("127.0.0.1:{health}");
    let mut child = Command::new(support::binary())
        .args(["file", "--input", big.to_str().unwrap(), "--watch", "to-local"])
        .args(["--node", "node-0", "to-json", "--sync-period", "100ms"])
        .args(["--healthz-bind-address", &h, "--metrics-bind-address", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _unread = child.stdout.take();
    let (_, body) = wait_get(health, "/healthz", |code, _| code == 503);
    assert_eq!(serde_json::from_str::<Value>(&body).unwrap()["healthy"], false);
    let (code, _) = wait_get(health, "/livez", |_, _| true);
    assert_eq!(code, 503, "a stuck update fails liveness too");
    let (code, _) = wait_get(health, "/readyz", |_, _| true);
    assert_eq!(code, 503, "never synced: not ready");
    let _ = child.kill();
    let _ = child.wait();

    // A node tainted for deletion: /healthz fails (load balancers drain it), /livez passes.
    let tainted = text.replacen(
        "  podCIDRs: [10.244.0.0/24, \"fd00:244::/64\"]",
        "  podCIDRs: [10.244.0.0/24, \"fd00:244::/64\"]\n  taints:\n  - {key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}",
        1,
    );
    assert_ne!(tainted, text, "the example's node-a has the podCIDRs line this test extends");
    std::fs::write(&input, tainted).unwrap();
    let health = free_port();
    let h = format!("127.0.0.1:{health}");
    let args =
        ["file", "--input", input.to_str().unwrap(), "to-local", "--node", "node-a", "to-json"];
    let mut args = args.to_vec();
    args.extend(["--healthz-bind-address", &h, "--metrics-bind-address", "127.0.0.1:0"]);
    let mut kpng = Kpng::spawn(&args);
    kpng.next_change_set();
    let (_, body) = wait_get(health, "/healthz", |code, _| code == 503);
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(body["nodeEligible"], false);
    let (code, body) = wait_get(health, "/livez", |_, _| true);
    assert_eq!(code, 200, "{body}");
    assert!(serde_json::from_str::<Value>(&body).unwrap().get("nodeEligible").is_none());
}

#[test]
fn a_config_file_sets_options_and_flags_win() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("kpng.yaml");
    let defaults = run(&["config", "print-defaults"]);
    assert!(defaults.status.success(), "{}", defaults.stderr);
    let (from_file, from_flag) = (free_port(), free_port());
    let text = defaults.stdout.replace(
        "healthz-bind-address: \"0.0.0.0:10256\"",
        &format!("healthz-bind-address: \"127.0.0.1:{from_file}\""),
    );
    assert_ne!(text, defaults.stdout, "print-defaults lists healthz-bind-address");
    std::fs::write(&config, &text).unwrap();
    let config = config.to_str().unwrap();
    let base = ["--config", config, "file", "--input", &example(), "to-local", "--node", "node-a"];

    let mut args = base.to_vec();
    args.push("to-json");
    let mut kpng = Kpng::spawn(&args);
    kpng.next_change_set();
    let (code, _) = wait_get(from_file, "/livez", |_, _| true);
    assert_eq!(code, 200);
    drop(kpng);

    let flag = format!("127.0.0.1:{from_flag}");
    args.extend(["--healthz-bind-address", &flag]);
    let mut kpng = Kpng::spawn(&args);
    kpng.next_change_set();
    wait_get(from_flag, "/livez", |code, _| code == 200);
    assert!(get(from_file, "/livez").is_none(), "the flag replaced the file's address");

    std::fs::write(dir.path().join("bad.yaml"), "min-sync-period: 1s\nhealthz-port: 1\n").unwrap();
    let bad = dir.path().join("bad.yaml");
    let out = run(&[
        "--config",
        bad.to_str().unwrap(),
        "file",
        "--input",
        &example(),
        "to-file",
        "-o",
        "/dev/null",
    ]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("healthz-port"), "{}", out.stderr);
}

/// Raises this test process's soft open-file limit to its hard one: it holds many sockets.
fn raise_own_file_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    }
    hard
}

#[test]
fn slow_clients_are_cut_and_healthz_answers_under_a_low_descriptor_limit() {
    const SLOW: usize = 1000;
    assert!(raise_own_file_limit() > SLOW as u64 + 100, "this test needs more open files");
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cluster.yaml");
    std::fs::copy(example(), &input).unwrap();
    let health = free_port();
    let h = format!("127.0.0.1:{health}");
    // 256 descriptors in all (soft and hard): fewer than the slow clients.
    let script = "ulimit -n 256 && exec \"$0\" \"$@\"";
    let input_arg = input.to_str().unwrap();
    let args = ["file", "--input", input_arg, "--watch", "to-local", "--node", "node-a", "to-json"];
    let mut kpng = Kpng::spawn_with(
        Command::new("sh").args(["-c", script, support::binary()]).args(args).args([
            "--healthz-bind-address",
            &h,
            "--metrics-bind-address",
            "127.0.0.1:0",
        ]),
    );
    kpng.next_change_set();
    wait_get(health, "/readyz", |code, _| code == 200);

    // Clients that send part of a request head, then nothing.
    let slow: Vec<TcpStream> = (0..SLOW)
        .map(|_| {
            let mut stream = TcpStream::connect(("127.0.0.1", health)).unwrap();
            let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n");
            stream
        })
        .collect();
    // While they are all connected, a prompt client is answered...
    let (code, _) = get(health, "/healthz").expect("an answer while 1,000 slow clients wait");
    assert_eq!(code, 200);
    // ...and kpng's own work still gets descriptors: an edit of its input is read.
    let text = std::fs::read_to_string(&input).unwrap();
    replace_file(&input, &text.replace("10.244.0.10", "10.244.0.99"));
    let ops = kpng.next_change_set();
    assert!(ops.iter().any(|op| op.to_string().contains("10.244.0.99")), "{ops:?}");
    assert!(!kpng.stderr().contains("Too many open files"), "{}", kpng.stderr());

    // A slow client alone is cut by the header timeout.
    drop(slow);
    let mut last = TcpStream::connect(("127.0.0.1", health)).unwrap();
    last.write_all(b"GET /healthz HTTP/1.1\r\n").unwrap();
    last.set_read_timeout(Some(STUCK)).unwrap();
    let mut buffer = Vec::new();
    match last.read_to_end(&mut buffer) {
        Ok(_) => assert!(buffer.is_empty(), "no answer to an unfinished request"),
        Err(e) => assert!(
            !matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut),
            "the server never cut the slow client"
        ),
    }
}

#[test]
fn an_admin_address_in_use_is_named_by_readyz_until_it_is_free() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let metrics = taken.local_addr().unwrap().port();
    let health = free_port();
    let (h, m) = (format!("127.0.0.1:{health}"), format!("127.0.0.1:{metrics}"));
    let args = ["file", "--input", &example(), "to-local", "--node", "node-a", "to-json"];
    let mut args = args.to_vec();
    args.extend(["--healthz-bind-address", &h, "--metrics-bind-address", &m]);
    let mut kpng = Kpng::spawn(&args);
    kpng.next_change_set();
    let (code, body) = wait_get(health, "/readyz", |_, body| body.contains(&m));
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("metrics"), "names the server: {body}");
    kpng.wait_stderr(&m);
    // The rest keeps working.
    let (code, _) = wait_get(health, "/healthz", |_, _| true);
    assert_eq!(code, 200);
    // Once the address is free, it is bound and readiness comes back.
    drop(taken);
    wait_get(health, "/readyz", |code, _| code == 200);
    let (code, _) = wait_get(metrics, "/metrics", |_, _| true);
    assert_eq!(code, 200);
}

#[test]
fn a_node_missing_from_the_source_is_named_until_it_appears() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::copy(example(), &path).unwrap();
    let health = free_port();
    let h = format!("127.0.0.1:{health}");
    let input = path.to_str().unwrap();
    let args = ["file", "--input", input, "--watch", "to-local", "--node", "node-x", "to-json"];
    let mut args = args.to_vec();
    args.extend(["--healthz-bind-address", &h]);
    let mut kpng = Kpng::spawn(&args);
    kpng.next_change_set();
    kpng.wait_stderr("node node-x is not in the source");
    let (code, body) = wait_get(health, "/readyz", |_, body| body.contains("node-x"));
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("node node-x is not in the source (--node)"), "{body}");
    // The node appears: readiness comes back.
    let text = std::fs::read_to_string(example()).unwrap();
    let node = "---\napiVersion: v1\nkind: Node\nmetadata:\n  name: node-x\n";
    support::replace_file(&path, &format!("{text}\n{node}"));
    wait_get(health, "/readyz", |code, _| code == 200);
    kpng.wait_stderr("node node-x is in the source now");
}
