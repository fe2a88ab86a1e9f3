//! Which programs the kernel runs on a cgroup for one attach point (`BPF_PROG_QUERY`, which
//! aya keeps to itself): what tells a pinned link that is still attached from one that was
//! detached behind kpng's back (`bpftool link detach`), or whose cgroup went away.
#![allow(unsafe_code)] // One bpf() system call whose argument is a plain struct, below.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// `enum bpf_cmd`'s `BPF_PROG_QUERY` (a stable ABI).
const BPF_PROG_QUERY: nix::libc::c_long = 16;

/// `enum bpf_attach_type` values of kpng's programs (a stable ABI), in the order of
/// [`crate::pins::PROGRAMS`].
pub const ATTACH_TYPES: [u32; 8] = [
    10, // BPF_CGROUP_INET4_CONNECT
    11, // BPF_CGROUP_INET6_CONNECT
    14, // BPF_CGROUP_UDP4_SENDMSG
    15, // BPF_CGROUP_UDP6_SENDMSG
    19, // BPF_CGROUP_UDP4_RECVMSG
    20, // BPF_CGROUP_UDP6_RECVMSG
    29, // BPF_CGROUP_INET4_GETPEERNAME
    30, // BPF_CGROUP_INET6_GETPEERNAME
];

/// The `query` member of `union bpf_attr`.
#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
    prog_attach_flags: u64,
    link_ids: u64,
    link_attach_flags: u64,
    revision: u64,
}

/// The ids of the programs attached to `cgroup` itself (not inherited) at `attach_type`.
pub fn attached_programs(cgroup: BorrowedFd<'_>, attach_type: u32) -> io::Result<Vec<u32>> {
    let mut ids = vec![0u32; 64];
    loop {
        let mut attr = QueryAttr {
            target_fd: cgroup.as_raw_fd() as u32,
            attach_type,
            prog_ids: ids.as_mut_ptr() as u64,
            prog_cnt: ids.len() as u32,
            ..QueryAttr::default()
        };
        // SAFETY: `attr` is a live, fully initialised prefix of `union bpf_attr` of the size
        // passed; `prog_ids` points at `prog_cnt` u32s that stay alive and unmoved until the
        // call returns; the kernel writes at most that many ids, and `prog_cnt` back.
        let ret = unsafe {
            nix::libc::syscall(
                nix::libc::SYS_bpf,
                BPF_PROG_QUERY,
                &mut attr as *mut QueryAttr,
                std::mem::size_of::<QueryAttr>() as nix::libc::c_uint,
            )
        };
        let count = attr.prog_cnt as usize;
        if ret == 0 {
            ids.truncate(count.min(ids.len()));
            return Ok(ids);
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(nix::libc::ENOSPC) && count > ids.len() {
            ids.resize(count, 0);
            continue;
        }
        return Err(error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_attribute_has_the_kernels_layout() {
        // prog_ids at 16, prog_cnt at 24, link_ids at 40, revision at 56.
        assert_eq!(std::mem::size_of::<QueryAttr>(), 64);
        let attr = QueryAttr::default();
        let base = &attr as *const QueryAttr as usize;
        assert_eq!(&attr.prog_ids as *const u64 as usize - base, 16);
        assert_eq!(&attr.prog_cnt as *const u32 as usize - base, 24);
        assert_eq!(&attr.link_ids as *const u64 as usize - base, 40);
        assert_eq!(&attr.revision as *const u64 as usize - base, 56);
    }
}
