//! Counting system calls: a perf counter on the `raw_syscalls:sys_enter` tracepoint for
//! this thread and every thread and process it starts afterwards (their counts join it as
//! they exit). Needs root and tracefs; where it is not mounted, it is mounted in a mount
//! namespace of the bench's own, so the host sees nothing.
//!
//! The bench's only unsafe code: `perf_event_open`, which has no safe wrapper, with a plain
//! struct read for the call's duration, and `read` of the counter's eight bytes.
#![allow(unsafe_code)]

use std::fs::File;
use std::io::Read;
use std::os::fd::FromRawFd;
use std::path::Path;

use anyhow::Context;

const TRACEFS: &str = "/sys/kernel/tracing";
const PERF_TYPE_TRACEPOINT: u32 = 2;
/// `inherit`: children and threads created later are counted too.
const INHERIT: u64 = 1 << 1;

/// `struct perf_event_attr` up to `config1` (`PERF_ATTR_SIZE_VER0`, 64 bytes), which every
/// kernel accepts.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
}

/// A running count of system calls.
pub struct SyscallCounter(File);

impl SyscallCounter {
    /// Starts counting this thread's system calls and those of every thread and process
    /// it starts from now on.
    pub fn start() -> anyhow::Result<SyscallCounter> {
        let id_path = format!("{TRACEFS}/events/raw_syscalls/sys_enter/id");
        if !Path::new(&id_path).exists() {
            mount_tracefs()?;
        }
        let id: u64 = std::fs::read_to_string(&id_path)
            .with_context(|| format!("reading {id_path}"))?
            .trim()
            .parse()
            .context("the tracepoint id")?;
        let attr = PerfEventAttr {
            kind: PERF_TYPE_TRACEPOINT,
            size: std::mem::size_of::<PerfEventAttr>() as u32,
            config: id,
            flags: INHERIT,
            ..PerfEventAttr::default()
        };
        // SAFETY: `attr` is a valid, fully initialized `perf_event_attr` of the size it
        // states, alive for the call; pid 0 and cpu -1 count this thread on every CPU.
        let fd = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_perf_event_open,
                &attr as *const PerfEventAttr,
                0,
                -1,
                -1,
                0u64,
            )
        };
        if fd < 0 {
            let error = std::io::Error::last_os_error();
            anyhow::bail!("perf_event_open on raw_syscalls:sys_enter: {error}");
        }
        // SAFETY: the kernel just returned this descriptor, owned by nobody else.
        Ok(SyscallCounter(unsafe { File::from_raw_fd(fd as i32) }))
    }

    /// System calls counted so far (of processes that have exited, and of live threads).
    pub fn read(&mut self) -> anyhow::Result<u64> {
        let mut bytes = [0u8; 8];
        self.0.read_exact(&mut bytes).context("reading the syscall counter")?;
        Ok(u64::from_ne_bytes(bytes))
    }
}

/// Mounts tracefs in a mount namespace of this thread's own (private propagation).
fn mount_tracefs() -> anyhow::Result<()> {
    use nix::mount::{MsFlags, mount};
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .context("a mount namespace for tracefs")?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .context("making the bench's mounts private")?;
    mount(Some("tracefs"), TRACEFS, Some("tracefs"), MsFlags::empty(), None::<&str>)
        .context("mounting tracefs")?;
    Ok(())
}
