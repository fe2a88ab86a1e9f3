//! Giving the allocator's free memory back to the system around a full sync.
//!
//! A full sync builds the whole table at once (at 30,000 services, hundreds of megabytes of
//! rendered elements, element lists and netlink messages) and frees it when committed. The
//! C library's allocator keeps most of what was freed mapped for later use: the process
//! would go on holding its start-up peak. Asking it to return the free pages once, after
//! each full sync (rare: start-up, a failure, drift), lowers what a running kpng holds.
//! Asking once more just before a full sync lowers the peak: at start-up, the lists read
//! from the API server and freed once reduced would otherwise stay resident beneath it
//! (3 to 5 MiB of the peak at 30,000 services; the call takes well under a millisecond).
//!
//! The C library's allocator also gives each new thread an arena of its own, up to eight
//! per core: blocks freed in one arena are not reused by the others, so the threads of a
//! full sync (rendering on every core, committing beside the main thread) would each keep
//! their own free memory. kpng allocates little outside full syncs, so one arena for the
//! whole process costs nothing measurable and lowers both its peak and what it keeps.
#![allow(unsafe_code)]

/// Makes every thread started from now on allocate from the main arena. Call it first
/// thing, before any thread starts. Whether the allocator took the setting.
pub fn use_one_arena() -> bool {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` takes no pointer; `M_ARENA_MAX` only bounds the arenas created
    // later, and blocks already allocated stay valid.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1) == 1
    }
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    false
}

/// Returns the allocator's free pages to the system (how long it took is logged at debug
/// level).
pub fn release_free_memory() {
    let started = std::time::Instant::now();
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointer and may be called from any thread at any
    // time; it only releases memory no allocation uses.
    unsafe {
        libc::malloc_trim(0);
    }
    tracing::debug!(took = ?started.elapsed(), "returned the allocator's free memory");
}

#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// The process's resident set in KiB.
    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
        line.trim().trim_end_matches("kB").trim().parse().unwrap()
    }

    #[test]
    fn the_allocator_takes_one_arena() {
        assert!(super::use_one_arena());
    }

    #[test]
    fn freed_memory_goes_back_to_the_system() {
        // 128 MiB in small blocks, with a small one kept after every 64 KiB, so the free
        // space is in the middle of the heap, where freeing alone leaves it resident.
        let mut blocks: Vec<Vec<u8>> = Vec::new();
        let mut kept: Vec<Vec<u8>> = Vec::new();
        for i in 0..128 * 1024 {
            blocks.push(vec![1; 1024]);
            if i % 64 == 0 {
                kept.push(vec![2; 16]);
            }
        }
        drop(blocks);
        let before = rss_kib();
        super::release_free_memory();
        let after = rss_kib();
        assert!(before >= after + 64 * 1024, "resident {before} KiB -> {after} KiB");
        assert!(kept.iter().all(|k| k.iter().all(|b| *b == 2)));
    }
}
