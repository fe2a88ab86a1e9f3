//! [`NftStats`]: the nftables transactions' counters, and [`NftMetrics`], the backend's
//! counters as Prometheus metrics: the template's under `kpng_nft_`
//! ([`reconcile::Stats`]), the transactions', and kube-proxy's nftables-mode series.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kpng_backend::reconcile;
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

/// The nftables backend's counters as Prometheus metrics.
#[derive(Debug)]
pub struct NftMetrics {
    /// The template's counters.
    pub template: Arc<reconcile::Stats>,
    /// The transactions'.
    pub nft: Arc<NftStats>,
}

impl NftMetrics {
    /// The metrics of `backend`.
    pub fn of(backend: &crate::NftBackend) -> Self {
        NftMetrics { template: backend.template_stats(), nft: backend.stats() }
    }
}

impl prometheus_client::collector::Collector for NftMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        self.template.encode(&mut encoder, "nft")?;
        let stats = &self.nft;
        let counters = [
            ("kpng_nft_transactions", "nftables transactions committed.", &stats.transactions),
            (
                "kpng_nft_transaction_failures",
                "nftables transactions the kernel refused.",
                &stats.transaction_failures,
            ),
            ("kpng_nft_elements_added", "Set and map elements added.", &stats.elements_added),
            ("kpng_nft_elements_deleted", "Set and map elements deleted.", &stats.elements_deleted),
        ];
        kpng_backend::metrics::encode_counters(&mut encoder, &counters)?;
        let histograms = [
            (
                "kpng_nft_commit_duration_seconds",
                "Time the kernel took to commit one transaction.",
                &stats.commit_seconds,
            ),
            (
                "kpng_nft_transaction_elements",
                "Elements added or deleted per transaction.",
                &stats.transaction_elements,
            ),
        ];
        for (name, help, histogram) in histograms {
            let descriptor =
                encoder.encode_descriptor(name, help, None, histogram.metric_type())?;
            histogram.encode(descriptor)?;
        }
        // kube-proxy's nftables-mode series: one transaction covers both families.
        for (name, help, value) in [
            (
                "kubeproxy_sync_proxy_rules_nftables_sync_failures",
                "nftables transactions the kernel refused.",
                &stats.transaction_failures,
            ),
            (
                "kubeproxy_sync_proxy_rules_nftables_cleanup_failures",
                "Clean-ups of kube-proxy's rules that failed.",
                &stats.cleanup_failures,
            ),
        ] {
            let count = value.load(Ordering::Relaxed);
            let values = kpng_backend::metrics::IP_FAMILIES.map(|family| (family, count));
            kpng_backend::metrics::encode_counter_family(
                &mut encoder,
                name,
                help,
                "ip_family",
                values,
            )?;
        }
        Ok(())
    }
}
