//! The process's allocator, and giving its free memory back to the system around a full
//! sync.
//!
//! kpng allocates through jemalloc ([`Allocator`]; each binary that runs kpng makes it the
//! global allocator). A cluster's state is hundreds of thousands of small records (a
//! service, its endpoint list, a slice, a tree node, a name): the C library's allocator
//! puts an 8-byte header before each and rounds it to 16 bytes, where jemalloc groups
//! blocks of one size class in pages of their own, with no header. Blocks freed between
//! long-lived ones (the lists read from the API server, a full sync's rendered table) leave
//! pages that hold both; jemalloc gives back the pages of a size class that empty, where
//! the C library's allocator gives back only pages that lie wholly inside one free block.
//! At 30,000 services, kpng then holds 3 to 4 MiB less after its first sync, and at
//! 100,000 about 17 MiB less.
//!
//! jemalloc is configured when the process starts ([`MALLOC_CONF`]):
//! - One arena. It would otherwise give each thread one of several arenas (four per
//!   core): blocks freed in one arena are not reused by the others, so the threads of a
//!   full sync (rendering on every core, committing beside the main thread) would each
//!   keep their own free memory. kpng allocates little outside full syncs, so one arena
//!   costs nothing measurable.
//! - Each thread caches freed blocks of up to 1 KiB (32 KiB by default) for its next
//!   allocations. kpng's larger blocks (list pages, netlink messages, a service's packed
//!   objects being rebuilt) are freed in bursts and would sit in the cache of whichever
//!   thread freed them, keeping their pages: about 1 MiB less is held after a
//!   30,000-service sync, for no measurable change in its time. (No cache at all holds
//!   about 1 MiB less again, but the sync takes a fifth longer: every block then takes
//!   the arena's lock.)
//!
//! A full sync builds the whole table at once (at 30,000 services, hundreds of megabytes of
//! rendered elements, element lists and netlink messages) and frees it when committed. An
//! allocator keeps what was freed mapped for later use (jemalloc for ten seconds): the
//! process would go on holding its start-up peak a while, and the peak of the next sync
//! would sit on top of it. Asking it to return the free pages once, after each full sync
//! (rare: start-up, a failure, drift), lowers what a running kpng holds. Asking once more
//! just before a full sync lowers the peak: at start-up, the lists read from the API
//! server and freed once reduced would otherwise stay resident beneath it (the call takes
//! well under a millisecond).
#![allow(unsafe_code)]

use std::ffi::{CStr, c_char, c_uint, c_void};

/// The allocator kpng runs with: a binary that runs kpng declares
/// `#[global_allocator] static ALLOCATOR: kpng_runner::Allocator = kpng_runner::Allocator;`.
pub use tikv_jemallocator::Jemalloc as Allocator;

/// jemalloc's options, read when it first allocates, before `main`: one arena for every
/// thread, and threads cache freed blocks of up to 1 KiB. Exported under the name the
/// bundled jemalloc reads (its symbols carry a prefix, so that it never stands in for the
/// C library's `malloc`).
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static MALLOC_CONF: Option<&c_char> = Some(first(c"narenas:1,tcache_max:1024"));

/// The first character of `text`, which jemalloc reads up to its NUL.
const fn first(text: &'static CStr) -> &'static c_char {
    // SAFETY: a `CStr` holds at least its NUL: the pointer is to a live, static character.
    unsafe { &*text.as_ptr() }
}

/// The number of arenas jemalloc runs with (`None` when it cannot say): 1 when
/// [`MALLOC_CONF`] was read.
pub fn arenas() -> Option<u32> {
    let mut n: c_uint = 0;
    // SAFETY: `opt.narenas` is an unsigned int.
    unsafe { read_option(c"opt.narenas", &mut n) }.then_some(n)
}

/// The largest block jemalloc's thread caches keep (`None` when it cannot say): 1024 when
/// [`MALLOC_CONF`] was read.
pub fn thread_cache_max() -> Option<usize> {
    let mut n: usize = 0;
    // SAFETY: `opt.tcache_max` is a size_t.
    unsafe { read_option(c"opt.tcache_max", &mut n) }.then_some(n)
}

/// Reads jemalloc's option `name` into `value`; whether it could.
///
/// # Safety
/// `T` must be the option's C type.
unsafe fn read_option<T>(name: &CStr, value: &mut T) -> bool {
    let mut len = std::mem::size_of::<T>();
    // SAFETY: `value` and `len` describe a buffer of the option's size (the caller's
    // contract), and nothing is written to jemalloc.
    let read = unsafe {
        tikv_jemalloc_sys::mallctl(
            name.as_ptr(),
            std::ptr::from_mut(value).cast::<c_void>(),
            &mut len,
            std::ptr::null_mut(),
            0,
        )
    };
    read == 0
}

/// The bytes jemalloc takes for a block of `size` bytes: the size class that serves it.
pub fn size_class(size: usize) -> usize {
    if size == 0 {
        return 0;
    }
    // SAFETY: `nallocx` computes a size and touches no memory; `size` is not 0, for which
    // its result is undefined.
    unsafe { tikv_jemalloc_sys::nallocx(size, 0) }
}

/// Returns the allocator's free pages to the system (how long it took is logged at debug
/// level). Both allocators are asked: jemalloc, which kpng runs with, and the C library's,
/// which the C code linked in uses (and Rust code, in a process that kept the default
/// global allocator); each call finds nothing to return in the allocator not in use.
pub fn release_free_memory() {
    let started = std::time::Instant::now();
    // The calling thread's cache of freed blocks first: the thread that frees a full
    // sync's state holds the most, and a page whose blocks sit in a cache cannot empty.
    // Then every arena's empty pages (4096: every arena). Both take and return nothing.
    let purged = [c"thread.tcache.flush", c"arena.4096.purge"].map(|name| {
        // SAFETY: neither reads nor writes a buffer; they only move blocks no allocation
        // uses back to their arena, and return pages no allocation uses.
        unsafe {
            tikv_jemalloc_sys::mallctl(
                name.as_ptr(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                0,
            )
        }
    });
    let purged = purged.iter().all(|r| *r == 0);
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `malloc_trim` takes no pointer and may be called from any thread at any
    // time; it only releases memory no allocation uses.
    unsafe {
        libc::malloc_trim(0);
    }
    tracing::debug!(took = ?started.elapsed(), purged, "returned the allocators' free memory");
}

#[cfg(test)]
mod tests {
    #[global_allocator]
    static ALLOCATOR: super::Allocator = super::Allocator;

    /// The process's resident set in KiB.
    fn rss_kib() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
        line.trim().trim_end_matches("kB").trim().parse().unwrap()
    }

    #[test]
    fn the_allocator_reads_its_options() {
        assert_eq!(super::arenas(), Some(1));
        assert_eq!(super::thread_cache_max(), Some(1024));
    }

    #[test]
    fn blocks_take_their_size_class() {
        assert_eq!(super::size_class(0), 0);
        assert_eq!(super::size_class(1), 8);
        assert_eq!(super::size_class(120), 128);
        assert_eq!(super::size_class(192), 192);
        assert_eq!(super::size_class(193), 224);
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
