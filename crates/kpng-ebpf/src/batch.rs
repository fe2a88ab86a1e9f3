//! Batched map writes: many elements in one `bpf()` call (`BPF_MAP_UPDATE_BATCH` and
//! `BPF_MAP_DELETE_BATCH`, Linux 5.6), which aya does not offer.
//!
//! One system call whose argument is a plain struct that points at two buffers owned by
//! the caller for the call's duration (the crate's other unsafe code is the same kind of
//! call, in [`crate::query`]).
#![allow(unsafe_code)]

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `enum bpf_cmd` values from `<linux/bpf.h>` (a stable ABI).
const BPF_MAP_UPDATE_BATCH: nix::libc::c_long = 26;
const BPF_MAP_DELETE_BATCH: nix::libc::c_long = 27;

/// The `batch` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// A batch the kernel stopped short of: how many elements it wrote, and why it stopped.
#[derive(Debug)]
pub struct Partial {
    /// Elements written before the failure.
    pub done: usize,
    /// The failure.
    pub error: io::Error,
}

impl Partial {
    /// Whether the failure says the kernel has no batch operations for this map (so
    /// nothing was written, and element-by-element writes will do).
    pub fn unsupported(&self) -> bool {
        self.done == 0
            && matches!(
                self.error.raw_os_error(),
                Some(nix::libc::EINVAL | nix::libc::EOPNOTSUPP | 524 /* ENOTSUPP */)
            )
    }
}

fn call(command: nix::libc::c_long, attr: &mut BatchAttr, count: usize) -> Result<(), Partial> {
    // SAFETY: `attr` is a live, fully initialised prefix of `union bpf_attr` of the size
    // passed; its `keys` and `values` point at buffers of `count` keys and values that
    // the caller keeps alive and unmoved until this call returns; the kernel writes back
    // only `attr.count`.
    let ret = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_bpf,
            command,
            attr as *mut BatchAttr,
            std::mem::size_of::<BatchAttr>() as nix::libc::c_uint,
        )
    };
    match ret {
        0.. => Ok(()),
        _ => {
            let error = io::Error::last_os_error();
            Err(Partial { done: (attr.count as usize).min(count), error })
        }
    }
}

/// Creates or replaces `count` elements: `keys` and `values` hold them end to end.
pub fn update(
    map: BorrowedFd<'_>,
    keys: &[u8],
    values: &[u8],
    count: usize,
) -> Result<(), Partial> {
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        values: values.as_ptr() as u64,
        count: count as u32,
        map_fd: map.as_raw_fd() as u32,
        ..BatchAttr::default()
    };
    call(BPF_MAP_UPDATE_BATCH, &mut attr, count)
}

/// Deletes `count` elements whose keys `keys` holds end to end.
pub fn delete(map: BorrowedFd<'_>, keys: &[u8], count: usize) -> Result<(), Partial> {
    let mut attr = BatchAttr {
        keys: keys.as_ptr() as u64,
        count: count as u32,
        map_fd: map.as_raw_fd() as u32,
        ..BatchAttr::default()
    };
    call(BPF_MAP_DELETE_BATCH, &mut attr, count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attribute_has_the_kernels_layout() {
        // keys at 16, count at 32, map_fd at 36, elem_flags at 40, flags at 48.
        assert_eq!(std::mem::size_of::<BatchAttr>(), 56);
        let attr = BatchAttr::default();
        let base = &attr as *const BatchAttr as usize;
        assert_eq!(&attr.keys as *const u64 as usize - base, 16);
        assert_eq!(&attr.count as *const u32 as usize - base, 32);
        assert_eq!(&attr.map_fd as *const u32 as usize - base, 36);
        assert_eq!(&attr.flags as *const u64 as usize - base, 48);
    }
}
