//! [`NftStats`]: the nftables transactions' counters.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// Counters of the nftables backend, shared with whoever reports them (metrics).
#[derive(Debug)]
pub struct NftStats {
    /// Transactions committed.
    pub transactions: AtomicU64,
    /// Transactions the kernel refused.
    pub transaction_failures: AtomicU64,
    /// Elements added, over all transactions.
    pub elements_added: AtomicU64,
    /// Elements deleted, over all transactions.
    pub elements_deleted: AtomicU64,
    /// Seconds the kernel took to commit each transaction.
    pub commit_seconds: Histogram,
    /// Elements per committed transaction.
    pub transaction_elements: Histogram,
    /// Clean-ups of another proxy's rules (kube-proxy's, when kpng replaces it) that failed.
    pub cleanup_failures: AtomicU64,
}

impl Default for NftStats {
    fn default() -> Self {
        NftStats {
            transactions: AtomicU64::default(),
            transaction_failures: AtomicU64::default(),
            elements_added: AtomicU64::default(),
            elements_deleted: AtomicU64::default(),
            // 10 µs to about 1.3 s.
            commit_seconds: Histogram::new(exponential_buckets(0.00001, 2.0, 18)),
            // 1 to about 260,000 elements.
            transaction_elements: Histogram::new(exponential_buckets(1.0, 4.0, 10)),
            cleanup_failures: AtomicU64::default(),
        }
    }
}

impl NftStats {
    /// Counts one committed transaction.
    pub fn record_commit(&self, adds: usize, deletes: usize, took: Duration) {
        self.transactions.fetch_add(1, Ordering::Relaxed);
        self.elements_added.fetch_add(adds as u64, Ordering::Relaxed);
        self.elements_deleted.fetch_add(deletes as u64, Ordering::Relaxed);
        self.commit_seconds.observe(took.as_secs_f64());
        self.transaction_elements.observe((adds + deletes) as f64);
    }
}
