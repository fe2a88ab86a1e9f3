//! [`EbpfError`]: what went wrong, naming the step and the object.

use std::path::PathBuf;

/// An error of the eBPF backend.
#[derive(Debug, thiserror::Error)]
pub enum EbpfError {
    /// This build has no BPF object.
    #[error("to-ebpf is not available in this build: {reason}")]
    Unavailable {
        /// Why (from the build).
        reason: String,
    },
    /// The kernel lacks something the backend needs.
    #[error("the kernel does not support {what}")]
    Unsupported {
        /// What is missing, and what provides it.
        what: String,
        /// The failing call, when there is one.
        #[source]
        source: Option<Box<dyn std::error::Error + Send + Sync>>,
    },
    /// Connected UDP sockets could not be listed or destroyed.
    #[error("connected UDP sockets: {step}")]
    Sockets {
        /// What was being done, and where.
        step: String,
        /// The failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The cgroup to attach to cannot be used.
    #[error("cgroup {}: {reason}", path.display())]
    Cgroup {
        /// The cgroup's path.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// bpffs is missing and cannot be mounted.
    #[error("mounting bpffs at {}", path.display())]
    Mount {
        /// Where.
        path: PathBuf,
        /// The failure.
        #[source]
        source: std::io::Error,
    },
    /// The object could not be loaded (maps created or opened, programs verified).
    #[error("loading the BPF programs ({step})")]
    Load {
        /// The step: the object, or a program's name.
        step: String,
        /// The failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A program could not be attached to the cgroup.
    #[error("attaching {program} to cgroup {}", cgroup.display())]
    Attach {
        /// The program.
        program: String,
        /// The cgroup.
        cgroup: PathBuf,
        /// The failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A pin under bpffs could not be made, read or removed.
    #[error("{step} {}", path.display())]
    Pin {
        /// What was being done ("pinning", "opening", "removing").
        step: &'static str,
        /// The pin's path.
        path: PathBuf,
        /// The failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A map element could not be written, read or deleted.
    #[error("{step} {map} element {key}")]
    Map {
        /// "writing", "reading" or "deleting".
        step: &'static str,
        /// The map.
        map: &'static str,
        /// The element's key (or `*` for a whole read).
        key: String,
        /// The failure.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A map is full (only the in-memory maps report this; kpng grows maps before).
    #[error("map {map} is full ({capacity} entries)")]
    MapFull {
        /// The map.
        map: &'static str,
        /// Its capacity.
        capacity: usize,
    },
    /// A write came before the maps were installed.
    #[error("the maps are not installed yet")]
    NotInstalled,
    /// The dry run could not print.
    #[error("printing the dry run")]
    Print {
        /// The failure.
        #[source]
        source: std::io::Error,
    },
}

impl EbpfError {
    /// The error as the runner reports it.
    pub fn into_backend_error(self) -> kpng_backend::BackendError {
        kpng_backend::BackendError::new(crate::NAME, "eBPF dataplane").with_source(self)
    }
}
