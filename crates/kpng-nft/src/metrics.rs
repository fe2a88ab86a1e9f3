//! [`NftMetrics`]: the backend's counters as Prometheus metrics: the template's under
//! `kpng_nft_` ([`reconcile::Stats`]), the transactions' ([`NftStats`]), and kube-proxy's
//! nftables-mode series.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use kpng_backend::reconcile;

use crate::backend::NftBackend;
use crate::stats::NftStats;

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
    pub fn of(backend: &NftBackend) -> Self {
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
