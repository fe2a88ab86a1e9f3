//! The example producer against the real `kpng aggregate` (the workspace's `kpng` binary,
//! built beside this one by `cargo test --workspace`), programming a network namespace of
//! the test's own: a commit acknowledged, and a refusal reported with exit status 1.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kpng_testkit::netns::Netns;
use kpng_testkit::privileged::require;

/// A process killed when the test ends, however it ends.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `kpng` binary beside this package's binary.
fn kpng() -> PathBuf {
    let producer = PathBuf::from(env!("CARGO_BIN_EXE_kpng-example-producer"));
    let kpng = producer.with_file_name("kpng");
    assert!(kpng.exists(), "{} not built: run `cargo test --workspace`", kpng.display());
    kpng
}

fn producer(socket: &str, name: &str, table: &str) -> std::process::Output {
    let args = ["--aggregator", socket, "--producer", name, "--table", table];
    Command::new(env!("CARGO_BIN_EXE_kpng-example-producer"))
        .args(args)
        .args(["--allow", "10.1.0.0/16", "--allow", "192.168.1.5"])
        .output()
        .expect("running the example producer")
}

#[test]
fn the_example_producer_publishes_through_the_aggregator() {
    if !require("the_example_producer_publishes_through_the_aggregator", &["nft", "ip"]) {
        return;
    }
    let netns = Netns::new("aggex");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("aggregator.sock");
    let socket = format!("unix://{}", path.display());
    let aggregate = Command::new(kpng())
        .args(["aggregate", "--listen", &socket, "--netns", netns.name()])
        .arg("--producer-bindings")
        .arg(dir.path().join("producers.json"))
        .env("KPNG_HEALTHZ_BIND_ADDRESS", "127.0.0.1:0")
        .env("KPNG_METRICS_BIND_ADDRESS", "127.0.0.1:0")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting kpng aggregate");
    let _aggregate = Running(aggregate);
    let start = Instant::now();
    while !path.exists() {
        assert!(start.elapsed() < Duration::from_secs(20), "the aggregator's socket never came");
        std::thread::sleep(Duration::from_millis(50));
    }

    let out = producer(&socket, "allowlist", "allowlist");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout.trim(), "committed revision 1");
    let listed = netns.output("nft", &["list", "table", "inet", "allowlist"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("kpng-aggregator producer=allowlist"), "{listed}");
    assert!(listed.contains("10.1.0.0/16") && listed.contains("192.168.1.5"), "{listed}");

    // The table stays its producer's for the lease: another producer is refused.
    let out = producer(&socket, "intruder", "allowlist");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("belongs to producer allowlist"), "{stderr}");
}
