//! What the backend needs from the machine, checked at start with a message naming what
//! is missing: the BPF object in this build, the `bpf()` system call, a cgroup v2
//! hierarchy, and bpffs (mounted here when it is not).

use std::path::{Path, PathBuf};

use crate::error::EbpfError;

/// The BPF object compiled by the build, empty when the build had no clang.
pub const OBJECT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kpng_sock.o"));

/// Why [`OBJECT`] is empty (empty when it is not).
pub const UNAVAILABLE: &str = include_str!(concat!(env!("OUT_DIR"), "/reason.txt"));

/// Where kpng pins its programs' links and maps by default.
pub const DEFAULT_PIN_ROOT: &str = "/sys/fs/bpf/kpng";

/// Where bpffs is mounted when it is missing.
const BPFFS: &str = "/sys/fs/bpf";

/// The BPF object, or why this build has none.
pub fn object() -> Result<&'static [u8], EbpfError> {
    match OBJECT.is_empty() {
        false => Ok(OBJECT),
        true => Err(EbpfError::Unavailable { reason: UNAVAILABLE.trim().to_string() }),
    }
}

/// Whether this build can run `to-ebpf` (it has the BPF object).
pub fn available() -> bool {
    !OBJECT.is_empty()
}

/// The mounts of `/proc/mounts`: (mount point, file system type).
fn mounts() -> Vec<(PathBuf, String)> {
    std::fs::read_to_string("/proc/mounts")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_whitespace();
            let (_, point, kind) = (fields.next()?, fields.next()?, fields.next()?);
            // Spaces in mount points are escaped as \040.
            Some((PathBuf::from(point.replace("\\040", " ")), kind.to_string()))
        })
        .collect()
}

/// The root of the cgroup v2 hierarchy: the first `cgroup2` mount in `/proc/mounts`
/// (`/sys/fs/cgroup` on most machines, `/sys/fs/cgroup/unified` in hybrid mode).
pub fn cgroup2_root() -> Result<PathBuf, EbpfError> {
    mounts().into_iter().find(|(_, kind)| kind == "cgroup2").map(|(point, _)| point).ok_or_else(
        || EbpfError::Unsupported {
            what: "cgroup v2: no cgroup2 file system is mounted (see /proc/mounts)".into(),
            source: None,
        },
    )
}

/// Checks that `path` is a cgroup of the v2 hierarchy.
pub fn check_cgroup(path: &Path) -> Result<(), EbpfError> {
    let root = cgroup2_root()?;
    let error = |reason: String| EbpfError::Cgroup { path: path.to_path_buf(), reason };
    if !path.starts_with(&root) {
        return Err(error(format!("not under the cgroup v2 mount {}", root.display())));
    }
    if !path.join("cgroup.procs").exists() {
        return Err(error("no such cgroup (it has no cgroup.procs)".into()));
    }
    Ok(())
}

/// Mounts bpffs at `/sys/fs/bpf` unless a bpf file system already holds `pin_root`.
pub fn ensure_bpffs(pin_root: &Path) -> Result<(), EbpfError> {
    let covered = mounts().iter().any(|(point, kind)| {
        kind == "bpf" && pin_root.starts_with(point) && point != Path::new("/")
    });
    if covered {
        return Ok(());
    }
    let target = Path::new(BPFFS);
    if !pin_root.starts_with(target) {
        return Err(EbpfError::Mount {
            path: pin_root.to_path_buf(),
            source: std::io::Error::other("no bpf file system holds this path"),
        });
    }
    let mount_error = |source| EbpfError::Mount { path: target.to_path_buf(), source };
    std::fs::create_dir_all(target).map_err(mount_error)?;
    nix::mount::mount(Some("bpf"), target, Some("bpf"), nix::mount::MsFlags::empty(), None::<&str>)
        .map_err(|e| mount_error(std::io::Error::from(e)))?;
    tracing::info!(
        path = BPFFS,
        "mounted bpffs (it was not mounted) to pin kpng's programs and maps"
    );
    Ok(())
}

/// Checks that the `bpf()` system call works for this process.
pub fn check_bpf_syscall() -> Result<(), EbpfError> {
    let Some(Err(error)) = aya::programs::loaded_programs().next() else { return Ok(()) };
    let errno = std::error::Error::source(&error)
        .and_then(|s| s.downcast_ref::<std::io::Error>())
        .and_then(std::io::Error::raw_os_error);
    let what = match errno {
        Some(nix::libc::ENOSYS) => "the bpf() system call (CONFIG_BPF_SYSCALL)",
        Some(nix::libc::EPERM) => {
            "bpf() for this process: run as root (or with CAP_BPF, CAP_NET_ADMIN and CAP_SYS_ADMIN)"
        }
        _ => "the bpf() system call",
    };
    Err(EbpfError::Unsupported { what: what.into(), source: Some(Box::new(error)) })
}

/// The cgroup's id (its inode number on cgroup v2): names its links' pin directory.
pub fn cgroup_id(path: &Path) -> Result<u64, EbpfError> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .map(|m| m.ino())
        .map_err(|e| EbpfError::Cgroup { path: path.to_path_buf(), reason: e.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_object_or_the_reason_is_there() {
        match available() {
            true => assert!(UNAVAILABLE.is_empty()),
            false => {
                let error = object().unwrap_err().to_string();
                assert!(error.contains("not available in this build"), "{error}");
                assert!(!UNAVAILABLE.trim().is_empty());
            }
        }
    }
}
