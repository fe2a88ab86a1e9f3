//! Network namespaces for real-kernel tests.
//!
//! [`Netns`] creates a uniquely named namespace and deletes it when dropped, so a failing
//! test still cleans up. Links are created inside a namespace and their peer moved straight
//! into another, so interface names only need to be unique within a namespace and tests
//! can run in parallel.

use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A network namespace, deleted on drop (with every process still running in it).
#[derive(Debug)]
pub struct Netns {
    name: String,
}

/// Runs a command and fails with its output when it fails.
pub fn run(program: &str, args: &[&str]) -> Output {
    let out = Command::new(program)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {} failed: {}{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

impl Netns {
    /// A new namespace named after `role`, unique in this machine.
    pub fn new(role: &str) -> Netns {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("kt{}-{n}-{role}", std::process::id());
        run("ip", &["netns", "add", &name]);
        let ns = Netns { name };
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Runs `ip -n <ns> args...`, failing on error.
    pub fn ip(&self, args: &[&str]) {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        run("ip", &full);
    }

    /// A command that runs inside the namespace.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]).args(args);
        cmd
    }

    /// Runs a program inside the namespace and returns its output, whatever its status.
    pub fn output(&self, program: &str, args: &[&str]) -> Output {
        self.command(program, args)
            .output()
            .unwrap_or_else(|e| panic!("cannot run {program} in {}: {e}", self.name))
    }

    /// Runs a program inside the namespace, failing on error.
    pub fn exec(&self, program: &str, args: &[&str]) -> Output {
        let out = self.output(program, args);
        assert!(
            out.status.success(),
            "{program} {} in {} failed: {}{}",
            args.join(" "),
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// Starts a program in the namespace with its output discarded.
    pub fn spawn(&self, program: &str, args: &[&str]) -> Child {
        self.command(program, args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {program} in {}: {e}", self.name))
    }

    /// Sets a sysctl inside the namespace.
    pub fn sysctl(&self, key: &str, value: &str) {
        self.exec("sysctl", &["-qw", &format!("{key}={value}")]);
    }

    /// Creates a veth pair: `local` here, `peer` in `other`.
    pub fn veth(&self, local: &str, other: &Netns, peer: &str) {
        self.ip(&[
            "link",
            "add",
            local,
            "type",
            "veth",
            "peer",
            "name",
            peer,
            "netns",
            other.name(),
        ]);
        self.ip(&["link", "set", local, "up"]);
        other.ip(&["link", "set", peer, "up"]);
    }

    /// Every process id running in the namespace.
    fn pids(&self) -> Vec<String> {
        Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .map(|o| {
                String::from_utf8_lossy(&o.stdout).split_whitespace().map(str::to_string).collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for pid in self.pids() {
            let _ = Command::new("kill").args(["-9", &pid]).output();
        }
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}
