//! `kpng aggregate` and `kpng publish` end to end with the real binary, over a Unix socket in
//! a temporary directory, programming a network namespace of the test's own.

#[path = "support/mod.rs"]
mod support;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kpng_testkit::netns::Netns;
use kpng_testkit::privileged::require;
use support::{binary, http_get, replace_file};

const STUCK: Duration = Duration::from_secs(20);

const FIREWALL: &str = "table inet fw {
    set allowed { type ipv4_addr . inet_service; flags interval; elements = { 10.0.0.0/8 . 22 } }
    chain input { type filter hook input priority 0; policy accept; ip saddr . tcp dport @allowed counter accept }
}
";

/// A process killed when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn kpng(args: &[&str]) -> Command {
    let mut command = Command::new(binary());
    command
        .args(args)
        .env("KPNG_HEALTHZ_BIND_ADDRESS", "127.0.0.1:0")
        .env("KPNG_METRICS_BIND_ADDRESS", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    command
}

fn publish_once(socket: &str, producer: &str, file: &Path) -> std::process::Output {
    let file = file.to_str().unwrap();
    let args =
        ["publish", "--producer", producer, "--file", file, "--aggregator", socket, "--once"];
    kpng(&args).output().unwrap()
}

fn ruleset(netns: &Netns) -> String {
    String::from_utf8_lossy(&netns.output("nft", &["list", "ruleset"]).stdout).into_owned()
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < STUCK, "stuck waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `kpng aggregate` programming `netns`, on a socket in `dir` with its producer bindings
/// there, plus `extra`: the command, and the socket's address once told to listen.
fn aggregate(netns: &Netns, dir: &Path, extra: &[&str]) -> (Command, String) {
    let socket = format!("unix://{}", dir.join("aggregator.sock").display());
    let bindings = dir.join("producers.json");
    let args = ["aggregate", "--listen", &socket, "--netns", netns.name(), "--producer-bindings"];
    let mut command = kpng(&args);
    command.arg(bindings).args(extra);
    (command, socket)
}

#[test]
fn aggregate_and_publish_through_the_binary() {
    if !require("aggregate_and_publish_through_the_binary", &["nft", "ip"]) {
        return;
    }
    let netns = Netns::new("aggbin");
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("aggregator.sock");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let metrics = format!("127.0.0.1:{port}");
    let extra = ["--producer-lease", "2s", "--metrics-bind-address", &metrics];
    let (mut command, socket) = aggregate(&netns, dir.path(), &extra);
    let _aggregator = Running(command.spawn().unwrap());
    wait_for("the socket", || socket_path.exists());

    // A whole ruleset, committed before --once exits.
    let fw = dir.path().join("fw.nft");
    std::fs::write(&fw, FIREWALL).unwrap();
    let out = publish_once(&socket, "fw", &fw);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let listed = ruleset(&netns);
    assert!(listed.contains("comment \"kpng-aggregator producer=fw\""), "{listed}");
    assert!(listed.contains("10.0.0.0/8 . 22"), "{listed}");
    // /state lists the producer with what it committed; /metrics counts its publications.
    let (code, state) = http_get(port, "/state").expect("/state answers");
    assert_eq!(code, 200, "{state}");
    let state: serde_json::Value = serde_json::from_str(&state).unwrap();
    let fw_state = &state["producers"]["fw"];
    assert_eq!(fw_state["committed_revision"], 1, "{state}");
    let elements = &fw_state["committed"]["tables"]["inet fw"]["sets"]["allowed"]["elements"];
    assert_eq!(elements, &serde_json::json!(["10.0.0.0/8 . 22"]), "{state}");
    let (_, metrics) = http_get(port, "/metrics").expect("/metrics answers");
    let line = "kpng_aggregator_producer_publications_total{producer=\"fw\"} 1";
    assert!(metrics.contains(line), "{metrics}");

    // Another producer may not take that table; a malformed file names its line.
    let thief = dir.path().join("thief.nft");
    std::fs::write(&thief, "table inet fw {\n}\n").unwrap();
    let out = publish_once(&socket, "thief", &thief);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("belongs to producer fw"), "{stderr}");
    std::fs::write(&thief, "table inet other {\n  chain c {\n").unwrap();
    let out = publish_once(&socket, "thief", &thief);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("line 3: table inet other chain c"),
        "{stderr}"
    );

    // A watching producer publishes each edit.
    let file = fw.to_str().unwrap();
    let args = ["publish", "--producer", "fw", "--file", file, "--aggregator", &socket];
    let watching = Running(kpng(&args).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(700));
    replace_file(
        &fw,
        &FIREWALL.replace("10.0.0.0/8 . 22", "10.0.0.0/8 . 22, 192.168.0.0/16 . 443"),
    );
    wait_for("the edit in the kernel", || ruleset(&netns).contains("192.168.0.0/16 . 443"));

    // Once the producer is gone, its tables go when the lease ends.
    drop(watching);
    wait_for("the lease to end", || !ruleset(&netns).contains("table inet fw"));
}

/// A process's peak resident memory (VmHWM), in KiB.
fn peak_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn refused_publications_cost_a_bounded_log_and_memory() {
    use kpng_aggregator::client::Publisher;
    use kpng_aggregator::{Family, Publication, TableKey, Update};
    if !require("refused_publications_cost_a_bounded_log_and_memory", &["nft", "ip"]) {
        return;
    }
    let netns = Netns::new("aggflood");
    let dir = tempfile::tempdir().unwrap();
    let socket_path = dir.path().join("aggregator.sock");
    let log = dir.path().join("aggregator.log");
    let (mut command, socket) = aggregate(&netns, dir.path(), &[]);
    command.stderr(std::fs::File::create(&log).unwrap());
    let aggregator = Running(command.spawn().unwrap());
    wait_for("the socket", || socket_path.exists());
    let before = peak_kib(aggregator.0.id());

    // 150 publications of 1 MiB each whose one element holds a ',' (refused, quoting the
    // element), sent without reading a single acknowledgement.
    let address = socket.parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let ending = runtime.block_on(async {
        let table = TableKey::new(Family::Ip, "flood");
        let first = Publication { revision: 1, updates: vec![] };
        let security = kpng_api::Security::default();
        let mut publisher = Publisher::connect(&address, &security, "flood", first).await.unwrap();
        let sender = publisher.sender();
        let mut sent = 0;
        for revision in 2..152 {
            let element = format!("10.0.0.1,{}", "x".repeat(1 << 20));
            let update = Update::AddElements {
                table: table.clone(),
                set: "s".into(),
                elements: vec![element],
            };
            if sender.publish(Publication { revision, updates: vec![update] }).await.is_err() {
                break;
            }
            sent += 1;
        }
        // Now read what came back: some refusals, then the end of the stream and why.
        let mut refused = 0;
        loop {
            let next = tokio::time::timeout(STUCK, publisher.next_ack()).await;
            let Ok(next) = next else {
                return (sent, refused, "the stream stayed open".to_string());
            };
            match next {
                Ok(Some(kpng_aggregator::client::Ack::Rejected(r))) => {
                    assert!(
                        r.message.len() < 400,
                        "an excerpt, not the element: {}",
                        r.message.len()
                    );
                    refused += 1;
                }
                Ok(Some(_)) => {}
                Ok(None) => {
                    return (sent, refused, "the stream ended without a reason".to_string());
                }
                Err(error) => return (sent, refused, error.to_string()),
            }
        }
    });
    let (sent, refused, why) = ending;
    assert!(why.contains("cut off: 10 publications in a row were refused"), "{why}");
    assert!(refused <= 10, "{refused} refusals after the cut");
    assert!(sent < 150, "the stream was closed before everything was sent ({sent})");
    let after = peak_kib(aggregator.0.id());
    let grown = after.saturating_sub(before);
    assert!(grown < 64 * 1024, "peak memory grew by {grown} KiB (from {before} KiB)");
    let logged = std::fs::metadata(&log).unwrap().len();
    eprintln!(
        "{sent} sent, {refused} refused; peak {before} -> {after} KiB; {logged} bytes logged"
    );
    assert!(logged < 256 * 1024, "the aggregator logged {logged} bytes");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("in_a_row=10") && text.contains("producer cut off"), "{text}");
}
