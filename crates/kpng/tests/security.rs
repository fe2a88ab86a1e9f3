//! What an unprivileged local user can and cannot do to a kpng running as root, tried as
//! that user would (`setpriv` to uid and gid 65534, no groups), with the real binary:
//! - plaintext TCP is refused unless asked for, loopback included;
//! - the aggregator's socket admits only root and the users and groups allowed, and tells
//!   a refused client why;
//! - a producer name stays with the identity that first published it (a Unix user or a
//!   certificate's names), through a lease that runs out and a restart;
//! - a client does not believe a server that another user started in its server's place;
//! - a server refuses a socket in a directory another user could write.

#[path = "support/mod.rs"]
mod support;

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use kpng_testkit::netns::Netns;
use kpng_testkit::privileged::require;
use support::{Kpng, Pki, binary, example, run};

const NOBODY: u32 = 65534;
const STUCK: Duration = Duration::from_secs(20);

/// `kpng args` as uid and gid 65534 without supplementary groups.
fn as_nobody<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Command {
    let mut command = Command::new("setpriv");
    command
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", binary()])
        .args(args)
        .env_remove("NODE_NAME")
        .env("KPNG_HEALTHZ_BIND_ADDRESS", "127.0.0.1:0")
        .env("KPNG_METRICS_BIND_ADDRESS", "127.0.0.1:0");
    command
}

fn output(command: &mut Command) -> (bool, String, String) {
    let out = command.output().expect("running kpng");
    let text = |bytes: &[u8]| String::from_utf8_lossy(bytes).into_owned();
    (out.status.success(), text(&out.stdout), text(&out.stderr))
}

/// A directory every user may enter (and read), owned by root.
fn shared_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    dir
}

fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < STUCK, "stuck waiting for {what}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A `kpng aggregate` programming `netns`, killed when dropped.
struct Aggregate {
    child: Child,
    log: PathBuf,
}

impl Aggregate {
    fn start(netns: &Netns, listen: &str, bindings: &Path, extra: &[&str]) -> Aggregate {
        let log = bindings.with_extension(format!("log{}", extra.len()));
        let args = [
            "aggregate",
            "--listen",
            listen,
            "--netns",
            netns.name(),
            "--producer-bindings",
            bindings.to_str().unwrap(),
            "--producer-lease",
            "1s",
        ];
        let child = Command::new(binary())
            .args(args)
            .args(extra)
            .env("KPNG_HEALTHZ_BIND_ADDRESS", "127.0.0.1:0")
            .env("KPNG_METRICS_BIND_ADDRESS", "127.0.0.1:0")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let aggregate = Aggregate { child, log };
        wait_for("the aggregator to serve", || aggregate.log().contains("serving"));
        aggregate
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Aggregate {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A child process, killed when dropped.
struct Kill(Child);

impl Drop for Kill {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A ruleset that would take a service's traffic.
const EVIL: &str = "table ip evil {
    chain pre { type nat hook prerouting priority -100; policy accept; ip daddr 10.96.0.10 dnat to 192.0.2.66 }
}
";

fn publish(socket: &str, producer: &str, file: &Path) -> Vec<String> {
    let file = file.to_str().unwrap().to_string();
    ["publish", "--producer", producer, "--file", &file, "--aggregator", socket, "--once"]
        .map(String::from)
        .to_vec()
}

fn strs(args: &[String]) -> Vec<&str> {
    args.iter().map(String::as_str).collect()
}

fn ruleset(netns: &Netns) -> String {
    String::from_utf8_lossy(&netns.output("nft", &["list", "ruleset"]).stdout).into_owned()
}

#[test]
fn plaintext_tcp_needs_insecure_on_loopback_too() {
    let refused = [
        vec!["aggregate", "--listen", "tcp://127.0.0.1:0"],
        vec!["file", "--input", "/nonexistent", "to-api", "--listen", "tcp://127.0.0.1:0"],
        vec!["local", "--server", "tcp://127.0.0.1:1", "--once", "to-json"],
        vec!["publish", "--producer", "p", "--file", "/f", "--aggregator", "tcp://[::1]:1"],
    ];
    for args in refused {
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} started");
        assert!(
            out.stderr.contains("plaintext TCP authenticates nobody")
                && out.stderr.contains("--insecure"),
            "{args:?}: {}",
            out.stderr
        );
    }
    // Asked for, it works and says so.
    let example = example();
    let args = ["file", "--input", &example, "to-api", "--listen", "tcp://127.0.0.1:0"];
    let server = Kpng::spawn(&[&args[..], &["--insecure"]].concat());
    server.wait_stderr("serving the kpng API");
    assert!(server.stderr().contains("--insecure: plaintext TCP"), "{}", server.stderr());
    // Users and groups are for Unix sockets; a client has no use for groups.
    let out = run(&[&args[..], &["--insecure", "--allow-uid", "1000"]].concat());
    assert!(out.stderr.contains("unix:// addresses only"), "{}", out.stderr);
    let out = run(&["local", "--server", "unix:///run/x.sock", "--allow-gid", "5", "to-json"]);
    assert!(!out.status.success() && out.stderr.contains("--allow-gid admits clients"));
}

#[test]
fn an_unprivileged_user_cannot_publish_to_the_aggregator_or_take_a_name() {
    let test = "an_unprivileged_user_cannot_publish_to_the_aggregator_or_take_a_name";
    if !require(test, &["nft", "ip", "setpriv"]) {
        return;
    }
    let netns = Netns::new("secagg");
    let dir = shared_dir();
    let socket_path = dir.path().join("aggregator.sock");
    let socket = format!("unix://{}", socket_path.display());
    let bindings = dir.path().join("producers.json");
    let evil = dir.path().join("evil.nft");
    std::fs::write(&evil, EVIL).unwrap();
    let empty = dir.path().join("empty.nft");
    std::fs::write(&empty, "").unwrap();
    let ours = dir.path().join("ours.nft");
    std::fs::write(&ours, "table ip ours {\n  set s { type ipv4_addr; }\n}\n").unwrap();

    let aggregate = Aggregate::start(&netns, &socket, &bindings, &[]);
    let mode = std::fs::metadata(&socket_path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    // The socket's mode keeps nobody out.
    let (ok, _, stderr) = output(&mut as_nobody(&publish(&socket, "evil", &evil)));
    assert!(!ok && stderr.contains("ermission denied"), "{stderr}");
    // Opened by mistake, the credentials check still does, and the client is told why.
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (ok, _, stderr) = output(&mut as_nobody(&publish(&socket, "evil", &evil)));
    assert!(!ok && stderr.contains("refused uid 65534 gid 65534"), "{stderr}");
    wait_for("the refusal in the log", || aggregate.log().contains("client refused"));
    assert!(!ruleset(&netns).contains("evil"), "nothing committed");

    // Root publishes `ours` as producer `kpng`, which binds the name to uid 0.
    let (ok, _, stderr) = output(Command::new(binary()).args(publish(&socket, "kpng", &ours)));
    assert!(ok, "{stderr}");
    assert!(std::fs::read_to_string(&bindings).unwrap().contains("\"kpng\": \"uid:0\""));
    drop(aggregate);

    // Restarted with nobody allowed: its own name works, root's does not, before and
    // after the lease of the adopted tables runs out.
    let allowed = ["--allow-uid", "65534"];
    let aggregate = Aggregate::start(&netns, &socket, &bindings, &allowed);
    let (ok, stdout, stderr) = output(&mut as_nobody(&publish(&socket, "evil", &evil)));
    assert!(ok, "allowed uid refused: {stdout}{stderr}");
    assert!(ruleset(&netns).contains("table ip evil"));
    let (ok, _, stderr) = output(&mut as_nobody(&publish(&socket, "kpng", &empty)));
    assert!(!ok && stderr.contains("producer kpng belongs to uid:0"), "{stderr}");
    assert!(ruleset(&netns).contains("table ip ours"), "root's table untouched");
    wait_for("the lease to end", || !ruleset(&netns).contains("table ip ours"));
    let (ok, _, stderr) = output(&mut as_nobody(&publish(&socket, "kpng", &ours)));
    assert!(!ok && stderr.contains("belongs to uid:0"), "{stderr}");
    assert!(aggregate.log().contains("producer refused"), "{}", aggregate.log());
}

#[test]
fn a_producer_name_is_bound_to_a_certificate() {
    if !require("a_producer_name_is_bound_to_a_certificate", &["nft", "ip"]) {
        return;
    }
    let netns = Netns::new("seccert");
    let dir = shared_dir();
    let pki = Pki::new("aggregator");
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let address = format!("tcp://127.0.0.1:{port}");
    let bindings = dir.path().join("producers.json");
    let server = pki.args();
    let server: Vec<&str> = server.iter().map(String::as_str).collect();
    let _aggregate = Aggregate::start(&netns, &address, &bindings, &server);
    let file = dir.path().join("fw.nft");
    std::fs::write(&file, "table inet fw {\n  set s { type ipv4_addr; }\n}\n").unwrap();
    let publish_as = |cert: &[String]| {
        let mut args = publish(&address, "fw", &file);
        args.extend(cert.iter().cloned());
        output(Command::new(binary()).args(args))
    };
    let first = pki.issue("first", &["first.producers.example"]);
    let other = pki.issue("other", &["other.producers.example"]);
    let (ok, _, stderr) = publish_as(&first);
    assert!(ok, "{stderr}");
    let (ok, _, stderr) = publish_as(&other);
    assert!(!ok, "another certificate took the name");
    assert!(
        stderr.contains("PermissionDenied")
            && stderr.contains("belongs to cert:DNS:first.producers.example")
            && stderr.contains("cert:DNS:other.producers.example may not publish"),
        "{stderr}"
    );
    let (ok, _, stderr) = publish_as(&first);
    assert!(ok, "{stderr}");
    let saved = std::fs::read_to_string(&bindings).unwrap();
    assert!(saved.contains("cert:DNS:first.producers.example"), "{saved}");
}

#[test]
fn a_client_does_not_believe_a_server_another_user_started() {
    if !require("a_client_does_not_believe_a_server_another_user_started", &["setpriv"]) {
        return;
    }
    let dir = shared_dir();
    // A directory the other user owns: it may bind a socket there.
    let theirs = dir.path().join("theirs");
    std::fs::create_dir(&theirs).unwrap();
    std::os::unix::fs::chown(&theirs, Some(NOBODY), Some(NOBODY)).unwrap();
    let socket_path = theirs.join("kpng.sock");
    let socket = format!("unix://{}", socket_path.display());
    let example = example();
    let squatter_args = ["file", "--input", &example, "to-api", "--listen", &socket];
    let squatter = Kpng::spawn_with(as_nobody(&squatter_args).stdin(Stdio::null()));
    squatter.wait_stderr("serving the kpng API");

    // With --once: a clear error, nothing applied.
    let client = |extra: &[&str]| {
        let mut args = vec!["local", "--server", &socket, "--node", "node-a"];
        args.extend(extra);
        args.push("to-json");
        args.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let out = run(&strs(&client(&["--once"])));
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "the squatter's state was used: {}", out.stdout);
    assert!(
        out.stderr.contains("refusing the server at") && out.stderr.contains("uid 65534"),
        "{}",
        out.stderr
    );
    // Running on: said once while it keeps refusing.
    let follower = Kpng::spawn(&strs(&client(&[])));
    follower.wait_stderr("refusing the server at");
    std::thread::sleep(Duration::from_millis(2_500));
    assert_eq!(
        follower.stderr().matches("refusing the server at").count(),
        1,
        "{}",
        follower.stderr()
    );
    assert!(follower.try_line().is_none(), "nothing applied");
    // Trusted when the operator says so.
    let out = run(&strs(&client(&["--once", "--allow-uid", "65534"])));
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.contains("\"op\":\"sync\""), "{}", out.stdout);
}

#[test]
fn a_client_with_tls_does_not_believe_a_plaintext_squatter() {
    let pki = Pki::new("cluster");
    let example = example();
    let squatter = Kpng::spawn(&[
        "file",
        "--input",
        &example,
        "to-api",
        "--listen",
        "tcp://127.0.0.1:0",
        "--insecure",
    ]);
    squatter.wait_stderr("serving the kpng API");
    let stderr = squatter.stderr();
    let line = stderr.lines().find(|l| l.contains("serving the kpng API")).unwrap();
    let at = line.find("tcp://127.0.0.1:").unwrap();
    let address: String = line[at..].chars().take_while(|c| !c.is_whitespace()).collect();
    let mut args: Vec<String> =
        ["local", "--server", &address, "--node", "node-a", "--once"].map(String::from).to_vec();
    args.extend(pki.args());
    args.push("to-json".into());
    let out = run(&args.iter().map(String::as_str).collect::<Vec<_>>());
    assert!(!out.status.success());
    assert!(out.stdout.is_empty(), "{}", out.stdout);
}

#[test]
fn a_socket_directory_others_can_write_is_refused() {
    if !require("a_socket_directory_others_can_write_is_refused", &[]) {
        return;
    }
    let dir = shared_dir();
    let open = dir.path().join("open");
    std::fs::create_dir(&open).unwrap();
    std::os::unix::fs::chown(&open, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let socket = format!("unix://{}", open.join("agg.sock").display());
    let bindings = dir.path().join("producers.json");
    let bindings = bindings.to_str().unwrap();
    let example = example();
    for args in [
        vec!["aggregate", "--listen", &socket, "--producer-bindings", bindings],
        vec!["file", "--input", &example, "to-api", "--listen", &socket],
    ] {
        let out = run(&args);
        assert!(!out.status.success(), "{args:?} started");
        let named = format!("directory {} is owned by uid 65534 with mode 0777", open.display());
        assert!(out.stderr.contains(&named), "{args:?}: {}", out.stderr);
        assert!(!open.join("agg.sock").exists(), "nothing bound there");
    }
    // A root-owned directory others may write is refused too; with the sticky bit (as
    // /tmp) nobody can move another's socket, and it is accepted.
    std::os::unix::fs::chown(&open, Some(0), Some(0)).unwrap();
    let out = run(&["file", "--input", &example, "to-api", "--listen", &socket]);
    assert!(out.stderr.contains("owned by uid 0 with mode 0777"), "{}", out.stderr);
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let server = Kpng::spawn(&["file", "--input", &example, "to-api", "--listen", &socket]);
    server.wait_stderr("serving the kpng API");
}

#[test]
fn the_nftlb_key_goes_only_to_a_listener_root_owns() {
    if !require("the_nftlb_key_goes_only_to_a_listener_root_owns", &["ip", "setpriv"]) {
        return;
    }
    let netns = Netns::new("secnftlb");
    let dir = shared_dir();
    let key = dir.path().join("nftlb.key");
    std::fs::write(&key, "secret\n").unwrap();
    let example = example();
    // Another user holds nftlb's port (as it could while nftlb restarts).
    let squat = [
        "--reuid=65534",
        "--regid=65534",
        "--clear-groups",
        binary(),
        "file",
        "--input",
        &example,
        "to-api",
        "--listen",
        "tcp://127.0.0.1:5555",
        "--insecure",
        "--healthz-bind-address",
        "127.0.0.1:0",
        "--metrics-bind-address",
        "127.0.0.1:0",
    ];
    let log = dir.path().join("squatter.log");
    let squatter = netns
        .command("setpriv", &squat)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _squatter = Kill(squatter);
    wait_for("the squatter to listen", || {
        std::fs::read_to_string(&log).unwrap_or_default().contains("serving the kpng API")
    });
    let args = [
        "file",
        "--input",
        &example,
        "to-local",
        "--node",
        "node-a",
        "to-nftlb",
        "--nftlb-key-file",
        key.to_str().unwrap(),
        "--once",
        "--healthz-bind-address",
        "127.0.0.1:0",
        "--metrics-bind-address",
        "127.0.0.1:0",
    ];
    let out = netns.output(binary(), &args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("refusing to send the nftlb key to 127.0.0.1:5555")
            && stderr.contains("belongs to uid 65534"),
        "{stderr}"
    );
}

#[test]
fn a_to_api_client_another_user_runs_is_refused_and_counted() {
    if !require("a_to_api_client_another_user_runs_is_refused_and_counted", &["setpriv"]) {
        return;
    }
    let dir = shared_dir();
    let socket_path = dir.path().join("api.sock");
    let socket = format!("unix://{}", socket_path.display());
    let metrics = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let example = example();
    let metrics_address = metrics.to_string();
    let args = [
        "file",
        "--input",
        &example,
        "to-api",
        "--listen",
        &socket,
        "--healthz-bind-address",
        "127.0.0.1:0",
        "--metrics-bind-address",
        &metrics_address,
    ];
    let log = dir.path().join("api.log");
    let server = Command::new(binary())
        .args(args)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let _server = Kill(server);
    let unauthorized = || {
        support::http_get(metrics.port(), "/metrics").and_then(|(_, body)| {
            let line =
                body.lines().find(|l| l.starts_with("kpng_api_clients_unauthorized_total"))?;
            line.rsplit(' ').next()?.parse::<u64>().ok()
        })
    };
    wait_for("the server and its metrics", || socket_path.exists() && unauthorized().is_some());
    assert_eq!(unauthorized(), Some(0));
    // Opened by mistake: the credentials check refuses nobody, and counts it.
    std::fs::set_permissions(&socket_path, std::fs::Permissions::from_mode(0o666)).unwrap();
    let client = ["local", "--server", &socket, "--once", "--node", "node-a", "to-json"];
    let (ok, _, stderr) = output(&mut as_nobody(&client));
    assert!(!ok && stderr.contains("refused uid 65534 gid 65534"), "{stderr}");
    wait_for("the refusal counted", || unauthorized() == Some(1));
}
