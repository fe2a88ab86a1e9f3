//! [`NftOptions`]: how `to-nft` is configured.

use ipnet::IpNet;
use kpng_backend::proxy::LocalDetection;

/// Configuration of the nftables backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftOptions {
    /// Masquerade all traffic to cluster IPs (`--masquerade-all`).
    pub masquerade_all: bool,
    /// The packet-mark bit that flags connections for masquerading.
    pub masquerade_bit: u8,
    /// How traffic from local pods is recognised (`--detect-local-mode`).
    pub local_detection: LocalDetection,
    /// `--cluster-cidr`.
    pub cluster_cidrs: Vec<IpNet>,
    /// Over tables without an element (a cold start), the skeleton is committed first
    /// (while the first services are rendered), then the elements of whole services in
    /// transactions of about this many elements rather than in one: the kernel inserts
    /// half a million elements faster in many transactions than in one, each is
    /// rendered and prepared while the one before commits, and kpng never lists the whole
    /// table's elements at once. Each service is programmed atomically; services not yet committed
    /// are simply not there yet, as before kpng started. A change, and a restart or a
    /// repair over tables that hold elements, stay one transaction.
    ///
    /// A part's elements are held two or three times over (planned, as commands, encoded)
    /// while it commits and the next is planned: small parts keep the start's peak near
    /// what kpng holds after it. Parts of 10,000 elements (the default) peak about
    /// 15 MiB lower than parts of 50,000 at 30,000 services at the same speed; at 100,000
    /// the start takes as long within the runs' spread (each count's backends map being
    /// read by few rules, a commit costs little more in large tables).
    pub cold_start_transaction: usize,
}

/// The default [`NftOptions::cold_start_transaction`].
const COLD_START_TRANSACTION: usize = 10_000;

impl Default for NftOptions {
    fn default() -> Self {
        NftOptions {
            masquerade_all: false,
            masquerade_bit: 14,
            local_detection: LocalDetection::Auto,
            cluster_cidrs: Vec::new(),
            cold_start_transaction: COLD_START_TRANSACTION,
        }
    }
}
