//! End-to-end tests of the built `kpng` binary on manifests files.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use serde_json::Value;
use support::{Kpng, example, run};

fn ops_of(stdout: &str) -> Vec<Value> {
    stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad JSON line {l:?}: {e}")))
        .collect()
}

fn endpoint_ips(ops: &[Value], service: &str) -> Vec<String> {
    ops.iter()
        .filter(|op| op["op"] == "set" && op["endpoint"]["service"] == service)
        .filter(|op| {
            let ports = op["endpoint"]["endpoint"]["ports"].as_array().unwrap();
            ports.iter().any(|p| p["cluster"] == true || p["local"] == true)
        })
        .map(|op| op["endpoint"]["endpoint"]["ip"].as_str().unwrap().to_string())
        .collect()
}

/// Endpoints of `service` listed only because they still serve a UDP port (kept so that
/// conntrack entries towards them survive).
fn serving_only_ips(ops: &[Value], service: &str) -> Vec<String> {
    ops.iter()
        .filter(|op| op["op"] == "set" && op["endpoint"]["service"] == service)
        .filter(|op| {
            let ports = op["endpoint"]["endpoint"]["ports"].as_array().unwrap();
            ports
                .iter()
                .all(|p| p["cluster"] == false && p["local"] == false && p["protocol"] == "UDP")
        })
        .map(|op| op["endpoint"]["endpoint"]["ip"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn example_op_stream_for_node_a() {
    let out =
        run(&["file", "--input", &example(), "to-local", "--node", "node-a", "to-json", "--once"]);
    assert!(out.status.success(), "{}", out.stderr);
    let ops = ops_of(&out.stdout);
    assert_eq!(ops.first().unwrap()["op"], "reset");
    assert_eq!(ops.last().unwrap()["op"], "sync");
    assert_eq!(ops.iter().filter(|o| o["op"] == "sync").count(), 1);
    let services: Vec<&str> = ops.iter().filter_map(|o| o["service"]["key"].as_str()).collect();
    assert_eq!(
        services,
        [
            "kube-system/kube-dns",
            "shop/cart",
            "shop/checkout",
            "shop/empty",
            "shop/legacy",
            "shop/web"
        ]
    );
    // Zone hints: node-a (zone-1) uses the zone-1 DNS pod only; the other zone's pod still
    // serves, so it is listed for its UDP port without being picked.
    assert_eq!(endpoint_ips(&ops, "kube-system/kube-dns"), ["10.244.0.5"]);
    assert_eq!(serving_only_ips(&ops, "kube-system/kube-dns"), ["10.244.2.7"]);
    // internalTrafficPolicy Local: only the local cart pod.
    assert_eq!(endpoint_ips(&ops, "shop/cart"), ["10.244.0.30"]);
    // The terminating web pod is not used while others are ready; both families are present.
    assert_eq!(
        endpoint_ips(&ops, "shop/web"),
        ["10.244.0.10", "10.244.2.10", "fd00:244::10", "fd00:244:0:2::10"]
    );
    let empty = ops.iter().find(|o| o["service"]["key"] == "shop/empty").unwrap();
    assert_eq!(empty["service"]["ports"][0]["has_endpoints"]["v4"], false);
}

#[test]
fn node_c_sees_its_own_local_endpoints() {
    let out =
        run(&["file", "--input", &example(), "to-local", "to-json", "--once", "--node", "node-c"]);
    assert!(out.status.success(), "{}", out.stderr);
    let ops = ops_of(&out.stdout);
    assert_eq!(endpoint_ips(&ops, "kube-system/kube-dns"), ["10.244.2.7"]);
    assert_eq!(endpoint_ips(&ops, "shop/cart"), Vec::<String>::new());
    let checkout = ops
        .iter()
        .find(|o| o["endpoint"]["endpoint"]["ip"] == "10.244.2.20")
        .expect("local checkout endpoint");
    assert_eq!(checkout["endpoint"]["endpoint"]["ports"][0]["local"], true);
}

#[test]
fn watch_applies_exactly_the_difference() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    let original = std::fs::read_to_string(example()).unwrap();
    std::fs::write(&path, &original).unwrap();
    let mut kpng = Kpng::spawn(&[
        "file",
        "--input",
        path.to_str().unwrap(),
        "--watch",
        "to-local",
        "--node",
        "node-a",
        "to-json",
    ]);
    let first = kpng.next_change_set();
    assert_eq!(first.first().unwrap()["op"], "reset");

    // One endpoint of checkout changes address.
    let moved = original.replace("addresses: [10.244.2.20]", "addresses: [10.244.2.21]");
    support::replace_file(&path, &moved);
    let change = kpng.next_change_set();
    let summary: Vec<String> = change.iter().map(support::summarize).collect();
    assert_eq!(
        summary,
        [
            "delete endpoint shop/checkout 10.244.2.20",
            "set endpoint shop/checkout 10.244.2.21",
            "sync"
        ]
    );

    // A no-op edit: a resourceVersion, an annotation nobody reads, and an endpoint of
    // another node that stays out of this node's sets (zone hints). Then a real change:
    // the next change set must be that change alone.
    let noop = moved
        .replace("  name: legacy\n  namespace: shop\n", "  name: legacy\n  namespace: shop\n  resourceVersion: \"99\"\n  annotations: {note: hello}\n")
        .replace("name: coredns-5d78c9869d-fghij}", "name: coredns-5d78c9869d-fghij, uid: abc}");
    assert_ne!(noop, moved);
    std::fs::write(&path, &noop).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let real = noop.replace("port: 9000, targetPort: 9000", "port: 9001, targetPort: 9000");
    std::fs::write(&path, &real).unwrap();
    let change = kpng.next_change_set();
    let summary: Vec<String> = change.iter().map(support::summarize).collect();
    assert_eq!(summary, ["set service shop/cart", "sync"]);

    // A malformed edit keeps the last good state and logs the object and field.
    let broken = real.replace("addresses: [10.244.0.30]", "addresses: [10.244.0.300]");
    std::fs::write(&path, &broken).unwrap();
    kpng.wait_stderr("10.244.0.300");
    let stderr = kpng.stderr();
    assert!(
        stderr.contains("shop/cart-z1x2c") && stderr.contains("endpoints[0].addresses[0]"),
        "{stderr}"
    );
    // Fixing it differently applies only the difference from the last good state.
    let fixed = real.replace("addresses: [10.244.2.40]", "addresses: [10.244.2.41]");
    std::fs::write(&path, &fixed).unwrap();
    let change = kpng.next_change_set();
    let summary: Vec<String> = change.iter().map(support::summarize).collect();
    assert_eq!(
        summary,
        ["delete endpoint shop/legacy 10.244.2.40", "set endpoint shop/legacy 10.244.2.41", "sync"]
    );
}

#[test]
fn malformed_input_without_watch_fails_with_the_object_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.yaml");
    let text = std::fs::read_to_string(example())
        .unwrap()
        .replace("protocol: UDP, port: 53, targetPort: 53", "protocol: QUIC, port: 53");
    std::fs::write(&path, text).unwrap();
    let out = run(&[
        "file",
        "--input",
        path.to_str().unwrap(),
        "to-local",
        "--node",
        "node-a",
        "to-json",
        "--once",
    ]);
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "nothing applied: {}", out.stdout);
    for needle in
        ["document 4 (line 57)", "Service kube-system/kube-dns", "spec.ports[0].protocol", "QUIC"]
    {
        assert!(out.stderr.contains(needle), "missing {needle:?} in {}", out.stderr);
    }
}

#[test]
fn missing_file_and_unavailable_parts_are_clear_errors() {
    let out = run(&[
        "file",
        "--input",
        "/nonexistent/cluster.yaml",
        "to-local",
        "--node",
        "n",
        "to-json",
        "--once",
    ]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("/nonexistent/cluster.yaml"), "{}", out.stderr);

    // `to-iptables --dry-run` prints the restore input of each family and touches nothing.
    let out = run(&[
        "file",
        "--input",
        &example(),
        "to-local",
        "--node",
        "node-a",
        "to-iptables",
        "--iptables-mode",
        "legacy",
        "--once",
        "--dry-run",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("# iptables-restore --noflush\n*nat\n"), "{}", out.stdout);
    assert!(
        out.stdout.contains("\n-I PREROUTING 1 -m comment --comment kpng -j KPNG-SERVICES\n"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("\n-A KPNG-SERVICES -d "), "{}", out.stdout);
    let out =
        run(&["file", "--input", &example(), "to-local", "to-iptables", "--iptables-mode", "old"]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("--iptables-mode"), "{}", out.stderr);

    // `to-nft --aggregator` with what cannot go with it: refused before anything is touched.
    let to_nft = |extra: &[&str]| {
        let mut args = vec!["file", "--input", "/nonexistent.yaml", "to-local", "--once"];
        args.extend(extra);
        run(&args)
    };
    let out = to_nft(&["--dry-run", "to-nft", "--aggregator", "unix:///tmp/kpng-none.sock"]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("--dry-run prints the transactions"), "{}", out.stderr);
    let out =
        to_nft(&["to-nft", "--aggregator", "unix:///tmp/kpng-none.sock", "--producer", "a b"]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("--producer: invalid producer name \"a b\""), "{}", out.stderr);
    let out = to_nft(&["to-nft", "--producer", "p"]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("--aggregator <ADDR>"), "{}", out.stderr);

    // A rate that is not one is refused with the flag named, before any connection.
    let out = run(&[
        "kube",
        "--server",
        "http://127.0.0.1:1",
        "--kube-api-qps",
        "-1",
        "to-local",
        "--node",
        "n",
        "to-json",
    ]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("--kube-api-qps"), "{}", out.stderr);
    assert!(out.stderr.contains("not a rate"), "{}", out.stderr);

    // A server address that is not one names the flag and the expected forms.
    let out = run(&["api", "--server", "x", "to-local", "to-json"]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("--server"), "{}", out.stderr);
    assert!(out.stderr.contains("expected unix:///path or tcp://host:port"), "{}", out.stderr);

    // The kube source without any configuration says what to pass.
    let out = std::process::Command::new(support::binary())
        .args(["kube", "to-local", "--node", "n", "to-json", "--once"])
        .env_remove("KUBECONFIG")
        .env("HOME", "/nonexistent")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--kubeconfig or --server"), "{stderr}");
}

#[test]
fn to_file_writes_the_global_model() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("model.json");
    let out = run(&[
        "file",
        "--input",
        &example(),
        "to-file",
        "--output",
        out_path.to_str().unwrap(),
        "--format",
        "json",
        "--once",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let model: Value = serde_json::from_str(&std::fs::read_to_string(&out_path).unwrap()).unwrap();
    assert_eq!(model["nodes"].as_array().unwrap().len(), 3);
    assert_eq!(model["services"].as_array().unwrap().len(), 6, "ExternalName is not proxied");
    assert_eq!(model["endpointSlices"].as_array().unwrap().len(), 6);

    let yaml_path = dir.path().join("model.yaml");
    let out = run(&[
        "--once",
        "file",
        "--input",
        &example(),
        "to-file",
        "--output",
        yaml_path.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(std::fs::read_to_string(&yaml_path).unwrap().contains("shop"));
}

#[test]
fn stats_line_counts_events_and_revisions() {
    let out = run(&[
        "--stats",
        "file",
        "--input",
        &example(),
        "to-local",
        "--node",
        "node-a",
        "to-json",
        "--once",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    let line = out.stderr.lines().rfind(|l| l.split('\t').count() == 9).expect("a stats line");
    let fields: Vec<&str> = line.split('\t').collect();
    assert!(out.stderr.contains("time(ms)\tevents\trevisions"), "{}", out.stderr);
    assert_eq!(fields[1], "15", "15 objects read");
    assert_eq!(fields[2], "1", "one revision for the whole file");
    assert_eq!(fields[3], "1", "one node-state revision");
}

#[test]
fn nft_dry_run_is_a_ruleset_nft_accepts() {
    let out = run(&[
        "file",
        "--input",
        &example(),
        "to-local",
        "--node",
        "node-a",
        "to-nft",
        "--dry-run",
        "--once",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    for needle in [
        "add table ip kpng\n",
        "add table ip6 kpng\n",
        "add element ip kpng cluster_bit_0 { 10.96.1.20 . tcp . 443 }",
        "add element ip kpng external_local_dests { 203.0.113.10 . tcp . 443 }",
        "add element ip kpng reject_dests { 10.96.1.60 . tcp . 80 }",
    ] {
        assert!(out.stdout.contains(needle), "missing {needle:?}");
    }
    if !kpng_testkit::privileged::require(
        "nft_dry_run_is_a_ruleset_nft_accepts",
        &["nft", "unshare"],
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ruleset.nft");
    std::fs::write(&path, &out.stdout).unwrap();
    // A fresh network namespace that dies with the command: nothing on the host is touched.
    let check = std::process::Command::new("unshare")
        .args(["--net", "nft", "-c", "-f"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "nft rejected the dry run: {}",
        String::from_utf8_lossy(&check.stderr)
    );
}

#[test]
fn version_names_the_build() {
    let out = run(&["version"]);
    assert!(out.status.success(), "{}", out.stderr);
    let first = out.stdout.lines().next().unwrap();
    assert_eq!(first, format!("kpng {}", env!("CARGO_PKG_VERSION")));
    let commit = out.stdout.lines().find_map(|l| l.strip_prefix("commit: ")).unwrap();
    assert!(
        commit == "unknown" || commit.chars().take(12).all(|c| c.is_ascii_hexdigit()),
        "{commit}"
    );
    let backends = out.stdout.lines().find_map(|l| l.strip_prefix("backends: ")).unwrap();
    assert!(backends.starts_with("to-nft"), "{backends}");
    assert!(backends.contains("to-json") && backends.contains("to-ebpf"), "{backends}");
}

#[test]
fn ebpf_dry_run_prints_the_map_writes() {
    let out = run(&[
        "file",
        "--input",
        &example(),
        "to-local",
        "--node",
        "node-a",
        "to-ebpf",
        "--dry-run",
        "--once",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("# maps created with capacities"), "{}", out.stdout);
    assert!(
        out.stdout.contains("update kpng_frontends TCP 10.96.1.10:80 => group"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("update kpng_cluster_ips fd00:96::10 => 1"), "{}", out.stdout);
}

#[test]
fn sigterm_ends_a_running_pipeline_cleanly() {
    let mut kpng = Kpng::spawn(&[
        "file",
        "--input",
        &example(),
        "--watch",
        "to-local",
        "--node",
        "node-a",
        "to-json",
    ]);
    kpng.next_change_set();
    let pid = nix::unistd::Pid::from_raw(kpng.pid() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = kpng.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", kpng.stderr());
    assert!(kpng.stderr().contains("signal received"), "{}", kpng.stderr());
}

#[test]
fn logs_fit_a_node_agent() {
    let example = example();
    let args =
        vec!["file", "--input", &example, "to-local", "--node", "node-a", "to-json", "--once"];

    // Standard error is a pipe here: plain text, no colour codes.
    let out = run(&args);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stderr.contains("INFO"), "{}", out.stderr);
    assert!(!out.stderr.contains('\u{1b}'), "colour codes in {:?}", out.stderr);

    // JSON: one object per line, with the time, the level, the message and the fields.
    let mut json = args.clone();
    json.extend(["--logging-format", "json"]);
    let out = run(&json);
    assert!(out.status.success(), "{}", out.stderr);
    let lines: Vec<Value> = out
        .stderr
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON: {l:?}: {e}")))
        .collect();
    assert!(!lines.is_empty());
    for line in &lines {
        for key in ["timestamp", "level", "message"] {
            assert!(line.get(key).is_some(), "no {key} in {line}");
        }
    }
    let computing = lines.iter().find(|l| l["message"] == "computing the node-local state");
    assert_eq!(computing.expect("the start-up line")["node"], "node-a");
}

#[test]
fn command_line_mistakes_are_reported_once_and_plainly() {
    let example = example();
    for args in [
        vec!["file", "--input", &example, "to-local", "to-json", "--x"],
        vec!["file", "--input", &example, "to-local", "to-json", "to-json", "--x"],
        vec!["--x", "file", "--input", &example, "to-local", "to-json"],
    ] {
        let out = run(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.stderr);
        assert_eq!(out.stderr.matches("error:").count(), 1, "{args:?}: {}", out.stderr);
        assert!(out.stderr.contains("unexpected argument '--x'"), "{}", out.stderr);
        // The usage line shows what the user can type, not options they never typed.
        let usage = out.stderr.lines().find(|l| l.starts_with("Usage:")).expect("a usage line");
        assert!(!usage.contains("--cluster-cidr"), "{usage}");
        assert!(out.stdout.is_empty());
    }

    // Options that need one another are checked before anything starts.
    let out = run(&[
        "file",
        "--input",
        &example,
        "to-local",
        "--node",
        "n",
        "to-json",
        "--once",
        "--detect-local-mode",
        "BridgeInterface",
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("needs --pod-bridge-interface"), "{}", out.stderr);
    assert!(out.stdout.is_empty());
}

#[test]
fn a_file_others_can_write_is_warned_about() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::copy(example(), &path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let input = path.to_str().unwrap();
    let out = run(&["file", "--input", input, "to-local", "--node", "node-a", "to-json", "--once"]);
    assert!(out.status.success(), "a warning, not a refusal: {}", out.stderr);
    assert!(
        out.stderr.contains("--input: the file is writable by group or others (mode 0666)"),
        "{}",
        out.stderr
    );
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = run(&["file", "--input", input, "to-local", "--node", "node-a", "to-json", "--once"]);
    assert!(!out.stderr.contains("--input:"), "{}", out.stderr);
}

#[test]
fn a_dry_run_never_says_it_committed() {
    let example = example();
    for backend in ["to-nft", "to-iptables", "to-ebpf"] {
        let args = ["file", "--input", &example, "to-local", "--node", "node-a", backend];
        let out = run(&[&args[..], &["--dry-run", "--once"]].concat());
        assert!(out.status.success(), "{backend}: {}", out.stderr);
        assert!(out.stderr.contains("printed (dry run: nothing applied)"), "{}", out.stderr);
        for claim in ["committed", "restored", "maps written"] {
            assert!(!out.stderr.contains(claim), "{backend} says {claim:?}: {}", out.stderr);
        }
    }
    // A dataplane backend given twice is refused before anything starts.
    let out = run(&["file", "--input", &example, "to-local", "to-nft", "--dry-run", "to-nft"]);
    assert_eq!(out.status.code(), Some(2), "{}", out.stderr);
    assert!(out.stderr.contains("to-nft is given twice"), "{}", out.stderr);
}
