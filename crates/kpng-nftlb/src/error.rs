//! What can go wrong driving nftlb.

use kpng_backend::BackendError;

/// Why a call to nftlb, or the check of what it installed, failed.
#[derive(Debug, thiserror::Error)]
pub enum NftlbError {
    /// `--nftlb-url` is not `http://HOST:PORT`.
    #[error("--nftlb-url {0:?}: expected http://HOST:PORT (nftlb serves plain HTTP)")]
    Url(String),
    /// The key file could not be read, or is empty.
    #[error("--nftlb-key-file {path}: {why}")]
    Key {
        /// The file.
        path: String,
        /// What went wrong.
        why: String,
    },
    /// nftlb could not be reached, or closed the connection.
    #[error("{method} {path} to nftlb at {addr}: {source}")]
    Io {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
        /// nftlb's address.
        addr: String,
        /// The failure.
        source: std::io::Error,
    },
    /// What listens at nftlb's address is not root's: the key is not sent.
    #[error(
        "refusing to send the nftlb key to {addr}: the socket listening there belongs to uid \
         {owner}, not root (is another user holding nftlb's port while nftlb restarts?)"
    )]
    Untrusted {
        /// nftlb's address.
        addr: String,
        /// The listener's owner.
        owner: u32,
    },
    /// nftlb answered with an error.
    #[error("nftlb refused {method} {path}: {status}: {body}")]
    Refused {
        /// The request method.
        method: String,
        /// The request path.
        path: String,
        /// The status line.
        status: String,
        /// nftlb's answer.
        body: String,
    },
    /// nftlb's answer could not be read.
    #[error("nftlb's answer to {what} is not what its API documents: {source}")]
    Decode {
        /// The request.
        what: String,
        /// The failure.
        source: serde_json::Error,
    },
    /// A `dsr` farm's backends could not be placed on the link layer.
    #[error("farm {farm}: {why}")]
    LinkLayer {
        /// The farm.
        farm: String,
        /// Why.
        why: String,
    },
    /// nftlb answered success but the kernel does not hold what was asked.
    #[error(
        "nftlb answered success for farm {farm} but the kernel does not hold it: {what} (nftlb 1.0.7 accepts farms past 1,024 that it never installs)"
    )]
    NotInstalled {
        /// The farm.
        farm: String,
        /// What is missing or left over.
        what: String,
    },
    /// `nft` could not be run to check what nftlb installed.
    #[error("running nft to check what nftlb installed: {0}")]
    Nft(std::io::Error),
}

impl NftlbError {
    /// As the runner's error.
    pub fn into_backend_error(self) -> BackendError {
        BackendError::new(crate::NAME, self)
    }
}
