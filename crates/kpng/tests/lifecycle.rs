//! How the process ends, or does not: signals during a long apply, SIGHUP, an output
//! nobody reads any more, `--once` clients facing an error that will not go away, and the
//! file given to `--exit-on-change` changing.

#[path = "support/mod.rs"]
mod support;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::{Kpng, binary, example, write_cluster};

const STUCK: Duration = Duration::from_secs(30);

fn signal(pid: u32, signal: Signal) {
    kill(Pid::from_raw(pid as i32), signal).unwrap();
}

/// Waits for `child` to exit; its status and standard error.
fn wait_exit(child: &mut Child, limit: Duration) -> (std::process::ExitStatus, String) {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut stderr = String::new();
            if let Some(mut err) = child.stderr.take() {
                err.read_to_string(&mut stderr).unwrap();
            }
            return (status, stderr);
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether a thread of process `pid` is blocked writing to a pipe.
fn writing_to_a_full_pipe(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
    tasks.filter_map(Result::ok).any(|task| {
        std::fs::read_to_string(task.path().join("wchan")).is_ok_and(|w| w.contains("pipe_write"))
    })
}

#[test]
fn sigterm_during_a_long_apply_exits_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("big.yaml");
    write_cluster(&input, 2000);
    // to-json into a pipe nobody reads: the backend's first apply blocks for good, as a
    // large kernel load would for seconds.
    let mut child = Command::new(binary())
        .args(["file", "--input", input.to_str().unwrap(), "to-local", "--node", "node-0"])
        .args(["to-json", "--healthz-bind-address", "127.0.0.1:0"])
        .args(["--metrics-bind-address", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let _unread = child.stdout.take();
    let start = Instant::now();
    while !writing_to_a_full_pipe(child.id()) {
        assert!(start.elapsed() < STUCK, "the backend never blocked");
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(child.id(), Signal::SIGTERM);
    let (status, stderr) = wait_exit(&mut child, Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("signal received"), "{stderr}");
}

#[test]
fn sighup_is_logged_and_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kpng.sock");
    let address = format!("unix://{}", socket.display());
    let server = Kpng::spawn(&["file", "--input", &example(), "to-api", "--listen", &address]);
    server.wait_stderr("serving the kpng API");
    signal(server.pid(), Signal::SIGHUP);
    server.wait_stderr("SIGHUP received and ignored");
    // Still serving, on the same socket.
    let mut client = Kpng::spawn(&["local", "--server", &address, "--node", "node-a", "to-json"]);
    let ops = client.next_change_set();
    assert_eq!(ops.first().unwrap()["op"], "reset");
    assert!(socket.exists());
    let mut server = server;
    signal(server.pid(), Signal::SIGTERM);
    let status = server.wait_exit(Duration::from_secs(10));
    assert_eq!(status.code(), Some(0), "{}", server.stderr());
    assert!(!socket.exists(), "the socket is removed at exit");
}

#[test]
fn to_json_exits_when_its_output_is_closed() {
    let mut child = Command::new(binary())
        .args(["file", "--input", &example(), "to-local", "--node", "node-a", "to-json"])
        .args(["--healthz-bind-address", "127.0.0.1:0", "--metrics-bind-address", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let (status, stderr) = wait_exit(&mut child, STUCK);
    assert!(!status.success(), "{stderr}");
    assert!(stderr.to_lowercase().contains("broken pipe"), "{stderr}");
    assert!(stderr.contains("to-json"), "names the backend: {stderr}");
}

/// Runs `kpng --once local` against a socket it may not use: as an unprivileged user when
/// the test runs as root (root may use any socket), else through a directory it may not
/// search.
#[test]
fn once_clients_exit_on_a_permanent_error() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let dir = tempfile::tempdir().unwrap();
    let private = dir.path().join("private");
    std::fs::create_dir(&private).unwrap();
    let socket = private.join("kpng.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let root = kpng_testkit::privileged::is_root();
    let mode = if root { 0o700 } else { 0o000 };
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(mode)).unwrap();
    // Whatever happens, the directory can be removed afterwards.
    struct Restore<'a>(&'a Path);
    impl Drop for Restore<'_> {
        fn drop(&mut self) {
            let _ = std::fs::set_permissions(self.0, std::fs::Permissions::from_mode(0o700));
        }
    }
    let _restore = Restore(&private);
    let address = format!("unix://{}", socket.display());
    let mut command = Command::new(binary());
    command
        .args(["--once", "local", "--server", &address, "--node", "n1", "to-json"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if root {
        command.uid(65534).gid(65534).current_dir("/");
    }
    let mut child = command.spawn().unwrap();
    let (status, stderr) = wait_exit(&mut child, STUCK);
    assert!(!status.success(), "{stderr}");
    assert!(stderr.contains("ermission denied"), "{stderr}");
    assert!(stderr.contains(&address), "names the server: {stderr}");
}

#[test]
fn once_gives_up_when_the_source_cannot_connect() {
    let dir = tempfile::tempdir().unwrap();
    let missing = format!("unix://{}", dir.path().join("missing.sock").display());
    let cases = [
        (
            vec!["local", "--server", missing.as_str(), "--node", "n1", "to-json"],
            "the server did not deliver this node's state within 2s",
            "missing.sock: transport error: No such file or directory",
        ),
        (
            vec!["kube", "--server", "http://127.0.0.1:1", "--node", "n1", "to-local", "to-json"],
            "the source did not connect and complete its initial list within 2s",
            "Connection refused",
        ),
    ];
    for (args, what, named) in cases {
        let mut command = Command::new(binary());
        command
            .args(&args)
            .args(["--once", "--once-timeout", "2s"])
            .env("KPNG_HEALTHZ_BIND_ADDRESS", "127.0.0.1:0")
            .env("KPNG_METRICS_BIND_ADDRESS", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = command.spawn().unwrap();
        let (status, stderr) = wait_exit(&mut child, STUCK);
        assert!(!status.success(), "{args:?}: {stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(last.contains(what) && last.contains("the last error"), "{args:?}: {stderr}");
        assert!(last.contains(named), "the last error says what failed: {last}");
    }
}

#[test]
fn a_changed_configuration_file_ends_the_process_for_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.conf");
    std::fs::write(&config, "mode: iptables\n").unwrap();
    let example = example();
    let watched = config.to_str().unwrap();
    let args = ["file", "--input", &example, "to-local", "--node", "node-a", "to-json"];
    let mut kpng = Kpng::spawn(&[&args[..], &["--exit-on-change", watched]].concat());
    kpng.next_change_set();
    // Touched, same content: nothing happens.
    std::fs::write(&config, "mode: iptables\n").unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    assert!(kpng.try_line().is_none() && !kpng.stderr().contains("changed"), "{}", kpng.stderr());
    // A ConfigMap update swaps the file: the process ends, non-zero, saying why.
    let next = dir.path().join("config.new");
    std::fs::write(&next, "mode: nftables\n").unwrap();
    std::fs::rename(&next, &config).unwrap();
    let status = kpng.wait_exit(STUCK);
    assert_eq!(status.code(), Some(1), "{}", kpng.stderr());
    assert!(kpng.stderr().contains("configuration file changed"), "{}", kpng.stderr());
}
