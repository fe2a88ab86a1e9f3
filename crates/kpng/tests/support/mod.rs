//! Helpers to run the built binary.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{Receiver, channel};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

/// How long to wait for the process before declaring the test stuck.
const STUCK: Duration = Duration::from_secs(30);

pub fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_kpng")
}

pub fn example() -> String {
    format!("{}/../../examples/cluster.yaml", env!("CARGO_MANIFEST_DIR"))
}

pub struct Output {
    pub status: std::process::ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

pub fn run(args: &[&str]) -> Output {
    let out = Command::new(binary())
        .args(args)
        .env_remove("NODE_NAME")
        .env("KPNG_HEALTHZ_BIND_ADDRESS", "127.0.0.1:0")
        .env("KPNG_METRICS_BIND_ADDRESS", "127.0.0.1:0")
        .output()
        .expect("run kpng");
    Output {
        status: out.status,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Replaces a file by rename, as editors do.
pub fn replace_file(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp-edit");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// One op as `set endpoint ns/svc ip`, `delete service ns/svc`, `sync`...
pub fn summarize(op: &Value) -> String {
    let kind = op["op"].as_str().unwrap();
    if let Some(s) = op.get("service") {
        let key = s.get("key").unwrap_or(s);
        return format!("{kind} service {}", key.as_str().unwrap());
    }
    if let Some(e) = op.get("endpoint") {
        let ip = e.get("endpoint").map(|ep| &ep["ip"]).unwrap_or(&e["ip"]);
        return format!(
            "{kind} endpoint {} {}",
            e["service"].as_str().unwrap(),
            ip.as_str().unwrap()
        );
    }
    if op.get("node").is_some() {
        return format!("{kind} node");
    }
    kind.to_string()
}

/// A running kpng whose stdout is read line by line.
pub struct Kpng {
    child: Child,
    lines: Receiver<String>,
    stderr: Arc<Mutex<String>>,
}

/// Writes a generated cluster of `services` services (4 endpoints each, nodes `node-0` to
/// `node-2`) to `path`.
pub fn write_cluster(path: &Path, services: usize) {
    use kpng_testkit::generate::{ClusterSpec, generate, to_yaml};
    let spec = ClusterSpec { services, endpoints: 4, nodes: 3, zones: 2 };
    std::fs::write(path, to_yaml(&generate(&spec)).unwrap()).unwrap();
}

impl Kpng {
    pub fn spawn(args: &[&str]) -> Kpng {
        let mut command = Command::new(binary());
        command.args(args);
        Kpng::spawn_with(&mut command)
    }

    /// Runs `command` (kpng itself, or a shell that ends by running it).
    pub fn spawn_with(command: &mut Command) -> Kpng {
        let mut child = command
            .env_remove("NODE_NAME")
            // No admin servers unless a test asks: tests run in parallel.
            .env("KPNG_HEALTHZ_BIND_ADDRESS", "127.0.0.1:0")
            .env("KPNG_METRICS_BIND_ADDRESS", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn kpng");
        let (tx, lines) = channel();
        let stdout = child.stdout.take().unwrap();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let stderr = Arc::new(Mutex::new(String::new()));
        let sink = stderr.clone();
        let mut err = child.stderr.take().unwrap();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = err.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().push_str(&String::from_utf8_lossy(&buf[..n]));
            }
        });
        Kpng { child, lines, stderr }
    }

    /// The next line of output, if one has arrived.
    pub fn try_line(&self) -> Option<String> {
        self.lines.try_recv().ok()
    }

    /// The ops up to and including the next `sync`.
    pub fn next_change_set(&mut self) -> Vec<Value> {
        let mut ops = Vec::new();
        loop {
            let line = self
                .lines
                .recv_timeout(STUCK)
                .unwrap_or_else(|_| panic!("no sync; stderr:\n{}", self.stderr()));
            let op: Value = serde_json::from_str(&line).unwrap();
            let done = op["op"] == "sync";
            ops.push(op);
            if done {
                return ops;
            }
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the process to exit, at most `limit`.
    pub fn wait_exit(&mut self, limit: Duration) -> std::process::ExitStatus {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(start.elapsed() < limit, "still running; stderr:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    pub fn wait_stderr(&self, needle: &str) {
        let start = Instant::now();
        while !self.stderr().contains(needle) {
            assert!(start.elapsed() < STUCK, "{needle:?} never logged; stderr:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Kpng {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` over HTTP/1.0 on loopback: the status code and the body.
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut response = String::new();
    stream.read_to_string(&mut response).ok()?;
    let code = response.split(' ').nth(1)?.parse().ok()?;
    let body = response.split_once("\r\n\r\n").map(|(_, b)| b.to_string())?;
    Some((code, body))
}

/// A CA and certificates it signed, for mutual TLS on loopback.
pub struct Pki {
    pub dir: tempfile::TempDir,
    ca: rcgen::Certificate,
    ca_key: rcgen::KeyPair,
}

impl Pki {
    /// A CA and, signed by it, `cert.pem` for 127.0.0.1, ::1 and localhost (server and
    /// client use).
    pub fn new(name: &str) -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name.push(DnType::CommonName, format!("{name} CA"));
        let ca = ca.self_signed(&ca_key).unwrap();
        std::fs::write(dir.path().join("ca.pem"), ca.pem()).unwrap();
        let pki = Pki { dir, ca, ca_key };
        pki.issue("cert", &["127.0.0.1", "::1", "localhost"]);
        pki
    }

    /// Issues `<stem>.pem` and `<stem>-key.pem` with these subject alternative names (IP
    /// addresses or DNS names), and returns the flags that use it.
    pub fn issue(&self, stem: &str, names: &[&str]) -> Vec<String> {
        use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
        let key = KeyPair::generate().unwrap();
        let names = names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
        let mut leaf = CertificateParams::new(names).unwrap();
        leaf.distinguished_name.push(DnType::CommonName, format!("kpng {stem}"));
        leaf.extended_key_usages =
            vec![ExtendedKeyUsagePurpose::ServerAuth, ExtendedKeyUsagePurpose::ClientAuth];
        let leaf = leaf.signed_by(&key, &self.ca, &self.ca_key).unwrap();
        let (cert, key_path) =
            (self.path(&format!("{stem}.pem")), self.path(&format!("{stem}-key.pem")));
        std::fs::write(&cert, leaf.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        [
            "--tls-cert".into(),
            cert,
            "--tls-key".into(),
            key_path,
            "--tls-ca".into(),
            self.path("ca.pem"),
        ]
        .to_vec()
    }

    /// The flags that use `cert.pem`.
    pub fn args(&self) -> Vec<String> {
        [
            "--tls-cert".into(),
            self.path("cert.pem"),
            "--tls-key".into(),
            self.path("cert-key.pem"),
            "--tls-ca".into(),
            self.path("ca.pem"),
        ]
        .to_vec()
    }

    fn path(&self, file: &str) -> String {
        self.dir.path().join(file).to_str().unwrap().to_string()
    }
}
