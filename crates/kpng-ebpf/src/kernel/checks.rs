//! What the kernel says when loading and attaching, and whether a pinned link already
//! runs the program just loaded.

use std::path::Path;

use aya::programs::ProgramInfo;
use aya::programs::links::{FdLink, PinnedLink};

use super::boxed;
use crate::error::EbpfError;

/// A load error, naming a kernel feature when the verifier did not know a helper.
pub(super) fn load_error(name: &str, error: aya::programs::ProgramError) -> EbpfError {
    let text = format!("{error:?}");
    if text.contains("unknown func") || text.contains("invalid func") {
        return EbpfError::Unsupported {
            what: format!(
                "a helper {name} uses (bpf_set_retval needs Linux 5.18; netns and socket cookies 5.7)"
            ),
            source: Some(boxed(error)),
        };
    }
    EbpfError::Load { step: name.into(), source: boxed(error) }
}

/// An attach error; the kernel refusing the attach type itself names what it lacks.
pub(super) fn attach_failure(
    name: &str,
    cgroup: &Path,
    error: aya::programs::ProgramError,
) -> EbpfError {
    let errno = match &error {
        aya::programs::ProgramError::SyscallError(e) => e.io_error.raw_os_error(),
        _ => None,
    };
    if matches!(errno, Some(nix::libc::EINVAL | nix::libc::EOPNOTSUPP)) {
        let point = name.trim_start_matches("kpng_");
        return EbpfError::Unsupported {
            what: format!(
                "the cgroup BPF attach point {point} through a BPF link (CONFIG_CGROUP_BPF; links since Linux 5.7, recvmsg 5.2, getpeername 5.8)"
            ),
            source: Some(boxed(error)),
        };
    }
    EbpfError::Attach { program: name.into(), cgroup: cgroup.to_path_buf(), source: boxed(error) }
}

/// Whether the link pinned at `pin` runs a program with the same instructions and maps.
pub(super) fn same_program(pin: &Path, ours: &ProgramInfo) -> bool {
    let Ok(link) = PinnedLink::from_pin(pin) else { return false };
    let link: FdLink = link.into();
    let Ok(info) = link.info() else { return false };
    let theirs = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == info.program_id());
    let maps = |p: &ProgramInfo| {
        p.map_ids().ok().flatten().map(|mut ids| {
            ids.sort_unstable();
            ids
        })
    };
    theirs.is_some_and(|t| t.tag() == ours.tag() && maps(&t) == maps(ours))
}
