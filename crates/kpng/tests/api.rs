//! The gRPC API end to end with the real binary: `to-api` and `local` in two processes,
//! `api` chaining, restarts on either side, and mutual TLS.

#[path = "support/mod.rs"]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{Kpng, Pki, example, replace_file, run};

const STUCK: Duration = Duration::from_secs(20);

/// The in-process reference: `to-local` on the same manifests.
fn reference(input: &str, node: &str) -> Vec<Value> {
    let out = run(&["file", "--input", input, "to-local", "--node", node, "to-json", "--once"]);
    assert!(out.status.success(), "{}", out.stderr);
    out.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn socket(dir: &Path, name: &str) -> String {
    format!("unix://{}", dir.join(name).display())
}

/// Waits until `path` exists (a server's socket).
fn wait_for(path: &Path, server: &Kpng) {
    let start = Instant::now();
    while !path.exists() {
        assert!(
            start.elapsed() < STUCK,
            "{} never created; stderr:\n{}",
            path.display(),
            server.stderr()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// No further output for a while.
fn quiet(kpng: &Kpng) {
    std::thread::sleep(Duration::from_millis(700));
    if let Some(line) = kpng.try_line() {
        panic!("unexpected output {line}; stderr:\n{}", kpng.stderr());
    }
}

fn endpoint_ips(ops: &[Value]) -> Vec<String> {
    let mut ips: Vec<String> = ops
        .iter()
        .filter_map(|op| {
            op["endpoint"]["endpoint"]["ip"].as_str().or(op["endpoint"]["ip"].as_str())
        })
        .map(str::to_string)
        .collect();
    ips.sort();
    ips
}

#[test]
fn a_backend_process_gets_the_same_stream_and_follows_edits_and_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("cluster.yaml");
    std::fs::copy(example(), &input).unwrap();
    let input = input.to_str().unwrap().to_string();
    let address = socket(dir.path(), "run/kpng.sock");
    let server_args = ["file", "--input", &input, "--watch", "to-api", "--listen", &address];
    let server = Kpng::spawn(&server_args);
    wait_for(&dir.path().join("run/kpng.sock"), &server);

    let local_args = ["local", "--server", &address, "--node", "node-a", "to-json"];
    let mut local = Kpng::spawn(&local_args);
    assert_eq!(local.next_change_set(), reference(&input, "node-a"));

    // An edit reaches the backend process as only its difference.
    let text = std::fs::read_to_string(&input).unwrap();
    assert!(text.contains("10.244.0.10"), "the example has the endpoint this test moves");
    replace_file(Path::new(&input), &text.replace("10.244.0.10", "10.244.0.99"));
    let ops = local.next_change_set();
    assert_eq!(endpoint_ips(&ops), ["10.244.0.10", "10.244.0.99"], "{ops:?}");
    assert!(ops.len() <= 3, "one delete and one set, then sync: {ops:?}");

    // The server restarts with the same state: the backend reconnects and changes nothing.
    drop(server);
    let server = Kpng::spawn(&server_args);
    local.wait_stderr("node stream failed");
    wait_for(&dir.path().join("run/kpng.sock"), &server);
    quiet(&local);
    // ...and a real change afterwards still arrives.
    let text = std::fs::read_to_string(&input).unwrap();
    replace_file(Path::new(&input), &text.replace("10.244.0.99", "10.244.0.98"));
    let ops = local.next_change_set();
    assert_eq!(endpoint_ips(&ops), ["10.244.0.98", "10.244.0.99"], "{ops:?}");

    // The backend process restarts: it gets the whole state again.
    drop(local);
    let mut local = Kpng::spawn(&local_args);
    assert_eq!(local.next_change_set(), reference(&input, "node-a"));
    drop(server);
}

#[test]
fn kpng_instances_chain_through_the_global_stream() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (socket(dir.path(), "a.sock"), socket(dir.path(), "b.sock"));
    let first = Kpng::spawn(&["file", "--input", &example(), "to-api", "--listen", &a]);
    wait_for(&dir.path().join("a.sock"), &first);
    let relay = Kpng::spawn(&["api", "--server", &a, "to-api", "--listen", &b]);
    wait_for(&dir.path().join("b.sock"), &relay);
    for node in ["node-a", "node-b"] {
        let mut last = Kpng::spawn(&["local", "--server", &b, "--node", node, "to-json"]);
        assert_eq!(last.next_change_set(), reference(&example(), node), "node {node}");
    }
    // The relay's own model, written out, is the first instance's.
    let out_a = dir.path().join("a.json");
    let out_b = dir.path().join("b.json");
    let direct = run(&[
        "file",
        "--input",
        &example(),
        "to-file",
        "--output",
        out_a.to_str().unwrap(),
        "--format",
        "json",
        "--once",
    ]);
    assert!(direct.status.success(), "{}", direct.stderr);
    let replica = run(&[
        "api",
        "--server",
        &a,
        "to-file",
        "--output",
        out_b.to_str().unwrap(),
        "--format",
        "json",
        "--once",
    ]);
    assert!(replica.status.success(), "{}", replica.stderr);
    let read =
        |p: &Path| -> Value { serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap() };
    assert_eq!(read(&out_b), read(&out_a));
}

/// The port a `to-api` on tcp://127.0.0.1:0 logged.
fn logged_port(server: &Kpng) -> String {
    server.wait_stderr("serving the kpng API");
    let stderr = server.stderr();
    let line = stderr.lines().find(|l| l.contains("serving the kpng API")).unwrap();
    let at = line.find("tcp://127.0.0.1:").unwrap() + "tcp://127.0.0.1:".len();
    line[at..].chars().take_while(char::is_ascii_digit).collect()
}

#[test]
fn mutual_tls_admits_the_right_certificate_only() {
    let (good, other) = (Pki::new("cluster"), Pki::new("stranger"));
    let mut args: Vec<String> =
        ["file", "--input", &example(), "to-api", "--listen", "tcp://127.0.0.1:0"]
            .map(String::from)
            .to_vec();
    args.extend(good.args());
    let server = Kpng::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let address = format!("tcp://127.0.0.1:{}", logged_port(&server));

    let client = |pki: &Pki| {
        let mut args: Vec<String> =
            ["local", "--server", &address, "--node", "node-a"].map(String::from).to_vec();
        args.extend(pki.args());
        args.push("to-json".into());
        Kpng::spawn(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    let mut admitted = client(&good);
    assert_eq!(admitted.next_change_set(), reference(&example(), "node-a"));
    let refused = client(&other);
    refused.wait_stderr("node stream failed");
    quiet(&refused);
    assert!(refused.stderr().contains("certificate"), "{}", refused.stderr());

    // Unusable files are fatal at start, naming the file.
    let out = run(&[
        "local",
        "--server",
        &address,
        "--tls-cert",
        "/nonexistent.pem",
        "--tls-key",
        "/k",
        "--tls-ca",
        "/c",
        "to-json",
    ]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("certificate /nonexistent.pem"), "{}", out.stderr);
    drop(server);
}

#[test]
fn plaintext_is_refused_without_insecure() {
    let out = run(&["file", "--input", &example(), "to-api", "--listen", "tcp://192.0.2.1:9000"]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("--insecure"), "{}", out.stderr);
    let out = run(&["local", "--server", "tcp://192.0.2.1:9000", "--node", "n", "to-json"]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("plaintext TCP authenticates nobody"), "{}", out.stderr);
    let out = run(&["local", "--server", "unix://relative.sock", "to-json"]);
    assert!(!out.status.success());
    assert!(out.stderr.contains("must be absolute"), "{}", out.stderr);
}

#[test]
fn a_request_refused_for_its_authority_is_logged() {
    if !kpng_testkit::privileged::has_tool("curl") {
        kpng_testkit::privileged::skip("a_request_refused_for_its_authority_is_logged needs curl");
        return;
    }
    let args = ["file", "--input", &example(), "to-api", "--listen", "tcp://127.0.0.1:0"];
    let server = Kpng::spawn(&[&args[..], &["--insecure"]].concat());
    let address = format!("127.0.0.1:{}", logged_port(&server));
    // An HTTP/2 request whose :authority is not one: the HTTP/2 layer resets it.
    let url = format!("http://{address}/localv1.Sets/Watch");
    let refused = std::process::Command::new("curl")
        .args(["-s", "--http2-prior-knowledge", "-X", "POST", "--data-binary", ""])
        .args(["-H", "content-type: application/grpc", "-H", "Host: bad host name", &url])
        .output()
        .expect("running curl");
    assert!(!refused.status.success(), "the request was refused");
    server.wait_stderr("request was refused before reaching kpng");
    assert!(server.stderr().contains("malformed authority"), "{}", server.stderr());
}
