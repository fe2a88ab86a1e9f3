//! [`NftError`]: what can go wrong in the nftables backend, one variant per step.

use kpng_netlink::NetlinkError;

/// A failure of the nftables backend. Whatever was in force before stays in force.
#[derive(Debug, thiserror::Error)]
pub enum NftError {
    /// The netfilter netlink socket cannot be opened.
    #[error(
        "cannot open a netfilter netlink socket (no nf_tables in this kernel, or no CAP_NET_ADMIN)"
    )]
    Socket(#[source] NetlinkError),
    /// The kernel refuses kpng's requests.
    #[error(
        "not allowed to change nftables: kpng needs CAP_NET_ADMIN (run as root or grant the capability)"
    )]
    Permission(#[source] NetlinkError),
    /// The kernel lacks a feature the table needs.
    #[error("the kernel lacks {feature}, which kpng's nftables table needs")]
    MissingFeature {
        /// What is missing (and the module that provides it).
        feature: &'static str,
        /// What the kernel answered.
        #[source]
        source: NetlinkError,
    },
    /// The kernel refused a transaction; nothing of it is in force.
    #[error("transaction failed; the previous rules stay in force")]
    Commit(#[source] NetlinkError),
    /// kpng's tables cannot be read back.
    #[error("reading kpng's tables back")]
    Read(#[source] NetlinkError),
    /// The aggregator did not commit a transaction; nothing of it is in force.
    #[error("the nftables aggregator did not commit the transaction: {0}")]
    Aggregator(String),
    /// A plan asked for an object kpng cannot declare (a bug: nothing was applied).
    #[error("a plan cannot be written: {0}")]
    Plan(String),
    /// The dry run's output cannot be written.
    #[error("writing the dry run")]
    Output(#[source] std::io::Error),
}

impl NftError {
    /// The backend error the runner reports, naming the backend.
    pub fn into_backend(self) -> kpng_backend::BackendError {
        kpng_backend::BackendError::new("to-nft", self)
    }
}
