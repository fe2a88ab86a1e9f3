//! `to-ebpf`'s share of a test: a cgroup and a pin directory of its own, removed with
//! everything in them when the scenario ends, even when it fails.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Whether this build has the BPF programs (a build without clang has none): skips the
/// test with a message, or fails it under CI=true.
pub fn ebpf_programs_built(test: &str) -> bool {
    if kpng_ebpf::support::available() {
        return true;
    }
    let reason = kpng_ebpf::support::UNAVAILABLE.trim();
    kpng_testkit::privileged::skip(&format!("{test} needs to-ebpf: {reason}"))
}

static ATTACHMENTS: AtomicU32 = AtomicU32::new(0);

/// A cgroup v2 and a bpffs pin directory of one test's own for `to-ebpf`: its programs see
/// only the sockets of processes in that cgroup, and its maps are its own, so tests run in
/// parallel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attachment(u32);

impl Attachment {
    pub fn next() -> Attachment {
        Attachment(ATTACHMENTS.fetch_add(1, Ordering::Relaxed))
    }

    fn name(self) -> String {
        format!("kpng-test-{}-{}", std::process::id(), self.0)
    }

    /// The cgroup.
    pub fn cgroup(self) -> PathBuf {
        kpng_ebpf::support::cgroup2_root().expect("a cgroup2 mount").join(self.name())
    }

    /// The pin directory.
    pub fn pins(self) -> PathBuf {
        PathBuf::from("/sys/fs/bpf").join(self.name())
    }

    /// What `bpftool` lists as attached to the cgroup.
    pub fn attached(self) -> String {
        let out = Command::new("bpftool").args(["cgroup", "show"]).arg(self.cgroup()).output();
        out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_default()
    }

    pub fn create(self) -> Attached {
        std::fs::create_dir(self.cgroup()).expect("creating the test's cgroup");
        Attached(self)
    }
}

/// An attachment's cgroup while a scenario runs; on drop, its processes are killed, its
/// programs detached and maps unpinned, and the cgroup removed.
pub struct Attached(Attachment);

impl Drop for Attached {
    fn drop(&mut self) {
        let (cgroup, pins) = (self.0.cgroup(), self.0.pins());
        let _ = kpng_ebpf::pins::cleanup(&pins);
        let _ = std::fs::remove_dir(&pins);
        if let Ok(procs) = std::fs::read_to_string(cgroup.join("cgroup.procs")) {
            for pid in procs.split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).output();
            }
        }
        // A killed process leaves its cgroup a moment later.
        for _ in 0..100 {
            if std::fs::remove_dir(&cgroup).is_ok() || !cgroup.exists() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        eprintln!("cannot remove the test cgroup {}", cgroup.display());
    }
}
