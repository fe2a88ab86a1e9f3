//! `to-nft --aggregator`'s share of a test: a `kpng aggregate` of its own in the node's
//! namespace, started the first time kpng runs there, and killed when the scenario ends,
//! even when it fails.

use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use kpng_testkit::topology::Cluster;

static AGGREGATIONS: AtomicU32 = AtomicU32::new(0);

/// The aggregators running: the aggregation, the node namespace, the process.
static RUNNING: Mutex<Vec<(u32, String, Child)>> = Mutex::new(Vec::new());

/// One scenario's aggregator: its socket, and its process once started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aggregation(u32);

impl Aggregation {
    pub fn next() -> Aggregation {
        Aggregation(AGGREGATIONS.fetch_add(1, Ordering::Relaxed))
    }

    fn socket(self) -> PathBuf {
        PathBuf::from(format!("/tmp/kpng-test-aggregator-{}-{}.sock", std::process::id(), self.0))
    }

    /// The address `to-nft --aggregator` publishes to.
    pub fn address(self) -> String {
        format!("unix://{}", self.socket().display())
    }

    /// Starts the aggregator in `cluster`'s node namespace unless it already runs there
    /// (one left in another node's namespace is stopped first). Producers keep their
    /// tables for ten minutes after they exit: kpng runs with --once between a scenario's
    /// steps.
    pub fn ensure(self, cluster: &Cluster) {
        let node = cluster.node.name().to_string();
        let mut running = RUNNING.lock().unwrap_or_else(|e| e.into_inner());
        if running.iter().any(|(id, n, _)| *id == self.0 && *n == node) {
            return;
        }
        stop(&mut running, self.0);
        let _ = std::fs::remove_file(self.socket());
        let log_path = self.socket().with_extension("log");
        let log = std::fs::File::create(&log_path).expect("creating the aggregator's log");
        let address = self.address();
        let bindings = self.socket().with_extension("bindings.json");
        let args = [
            "aggregate",
            "--listen",
            &address,
            "--producer-bindings",
            bindings.to_str().unwrap(),
            "--producer-lease",
            "10m",
            "--metrics-bind-address",
            "127.0.0.1:0",
        ];
        let child = cluster
            .node
            .command(env!("CARGO_BIN_EXE_kpng"), &args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("starting kpng aggregate");
        running.push((self.0, node, child));
        let started = Instant::now();
        while !self.socket().exists() {
            if started.elapsed() > Duration::from_secs(20) {
                let log = std::fs::read_to_string(&log_path).unwrap_or_default();
                panic!("kpng aggregate did not listen on {address} within 20 s: {log}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What the aggregator logged so far.
    pub fn log(self) -> String {
        std::fs::read_to_string(self.socket().with_extension("log")).unwrap_or_default()
    }

    pub fn guard(self) -> Aggregated {
        Aggregated(self)
    }
}

fn stop(running: &mut Vec<(u32, String, Child)>, id: u32) {
    running.retain_mut(|(i, _, child)| {
        if *i != id {
            return true;
        }
        let _ = child.kill();
        let _ = child.wait();
        false
    });
}

/// While a scenario runs; on drop its aggregator is stopped and its socket and log removed.
pub struct Aggregated(Aggregation);

impl Drop for Aggregated {
    fn drop(&mut self) {
        stop(&mut RUNNING.lock().unwrap_or_else(|e| e.into_inner()), self.0.0);
        let _ = std::fs::remove_file(self.0.socket());
        let _ = std::fs::remove_file(self.0.socket().with_extension("log"));
        let _ = std::fs::remove_file(self.0.socket().with_extension("bindings.json"));
    }
}
