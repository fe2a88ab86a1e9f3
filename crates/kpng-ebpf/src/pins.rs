//! Where kpng's programs and maps live under bpffs, and how `kpng cleanup` removes them.
//!
//! ```text
//! <root>/                         default /sys/fs/bpf/kpng
//!   maps-<generation>/kpng_frontends, kpng_groups, kpng_backends, kpng_members,
//!                     kpng_cluster_ips        the maps sized from the cluster
//!   lru/kpng_affinity, kpng_revnat, kpng_udp_flows
//!                                             filled by the programs; kept across growth
//!   links-<cgroup id>/kpng_connect4, ...      one link per program, on that cgroup
//! ```
//!
//! A larger generation of maps replaces the previous one when the cluster outgrows it;
//! the links hold the programs, which hold the maps, so a restarted kpng finds everything
//! in place and a removed pin detaches or frees exactly what kpng made.

use std::path::{Path, PathBuf};

use crate::error::EbpfError;
use crate::maps::{LRU_MAPS, MapName};

/// The programs of the object, one per attach point.
pub const PROGRAMS: [&str; 8] = [
    "kpng_connect4",
    "kpng_connect6",
    "kpng_sendmsg4",
    "kpng_sendmsg6",
    "kpng_recvmsg4",
    "kpng_recvmsg6",
    "kpng_getpeername4",
    "kpng_getpeername6",
];

/// The pin directory of one generation of maps.
pub fn maps_dir(root: &Path, generation: u32) -> PathBuf {
    root.join(format!("maps-{generation}"))
}

/// The pin directory of the LRU maps.
pub fn lru_dir(root: &Path) -> PathBuf {
    root.join("lru")
}

/// The pin directory of the links on the cgroup with id `cgroup`.
pub fn links_dir(root: &Path, cgroup: u64) -> PathBuf {
    root.join(format!("links-{cgroup}"))
}

fn numbered(root: &Path, prefix: &str) -> Vec<(u64, PathBuf)> {
    let Ok(entries) = std::fs::read_dir(root) else { return Vec::new() };
    let mut found: Vec<(u64, PathBuf)> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let n = name.strip_prefix(prefix)?.parse().ok()?;
            Some((n, e.path()))
        })
        .collect();
    found.sort();
    found
}

/// The generations of maps pinned under `root`, oldest first; only complete ones.
pub fn generations(root: &Path) -> Vec<u32> {
    numbered(root, "maps-")
        .into_iter()
        .filter(|(_, dir)| MapName::ALL.iter().all(|m| dir.join(m.object_name()).exists()))
        .filter_map(|(n, _)| u32::try_from(n).ok())
        .collect()
}

/// The link directories under `root`: (cgroup id, directory).
pub fn link_dirs(root: &Path) -> Vec<(u64, PathBuf)> {
    numbered(root, "links-")
}

/// Removes one pin (a missing one is no error), recording it in `removed`.
pub fn remove_pin(path: &Path, removed: &mut Vec<PathBuf>) -> Result<(), EbpfError> {
    match std::fs::remove_file(path) {
        Ok(()) => {
            removed.push(path.to_path_buf());
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => {
            Err(EbpfError::Pin { step: "removing", path: path.to_path_buf(), source: e.into() })
        }
    }
}

/// Removes a directory if it is empty; leaves it (with a warning) if something that kpng
/// did not pin is in it.
fn remove_dir(path: &Path) {
    if let Err(e) = std::fs::remove_dir(path)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %e, "eBPF cleanup: directory left in place");
    }
}

/// Removes the link pins of one directory: each program is detached from its cgroup as
/// its last reference goes.
pub fn remove_links(dir: &Path, removed: &mut Vec<PathBuf>) -> Result<(), EbpfError> {
    for program in PROGRAMS {
        remove_pin(&dir.join(program), removed)?;
    }
    remove_dir(dir);
    Ok(())
}

/// Removes the pins of one generation of maps.
pub fn remove_generation(dir: &Path, removed: &mut Vec<PathBuf>) -> Result<(), EbpfError> {
    for map in MapName::ALL {
        remove_pin(&dir.join(map.object_name()), removed)?;
    }
    remove_dir(dir);
    Ok(())
}

/// `kpng cleanup --backend ebpf`: detaches kpng's programs (removing their link pins) and
/// unpins its maps under `root`, and nothing else; returns the pins removed.
pub fn cleanup(root: &Path) -> Result<Vec<PathBuf>, EbpfError> {
    let mut removed = Vec::new();
    if !root.exists() {
        return Ok(removed);
    }
    // Links first: from then on no socket is translated.
    for (_, dir) in link_dirs(root) {
        remove_links(&dir, &mut removed)?;
    }
    for (_, dir) in numbered(root, "maps-") {
        remove_generation(&dir, &mut removed)?;
    }
    let lru = lru_dir(root);
    for map in LRU_MAPS {
        remove_pin(&lru.join(map), &mut removed)?;
    }
    remove_dir(&lru);
    remove_dir(root);
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cleanup_of_nothing_removes_nothing() {
        let dir = std::env::temp_dir().join(format!("kpng-pins-{}", std::process::id()));
        assert!(cleanup(&dir).unwrap().is_empty());
        assert!(generations(&dir).is_empty());
    }

    #[test]
    fn directories_are_numbered() {
        let root = Path::new("/sys/fs/bpf/kpng");
        assert_eq!(maps_dir(root, 3), Path::new("/sys/fs/bpf/kpng/maps-3"));
        assert_eq!(links_dir(root, 42), Path::new("/sys/fs/bpf/kpng/links-42"));
    }
}
