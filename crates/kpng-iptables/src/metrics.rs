//! [`IptablesMetrics`]: the backend's counters ([`IptablesStats`]) as Prometheus metrics.

use std::sync::Arc;

use crate::backend::IptablesStats;

/// The iptables backend's counters as Prometheus metrics.
#[derive(Debug)]
pub struct IptablesMetrics(pub Arc<IptablesStats>);

impl prometheus_client::collector::Collector for IptablesMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let stats = &self.0;
        let counters = [
            (
                "kpng_iptables_restores",
                "iptables-restore runs (one per family and change).",
                &stats.restores,
            ),
            (
                "kpng_iptables_restore_failures",
                "iptables-restore runs that were refused.",
                &stats.failures,
            ),
            (
                "kpng_iptables_chains_written",
                "Chains created, or flushed and filled.",
                &stats.chains_written,
            ),
            ("kpng_iptables_chains_deleted", "Chains deleted.", &stats.chains_deleted),
        ];
        kpng_backend::metrics::encode_counters(&mut encoder, &counters)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn counters_are_exported_by_name() {
        let stats = Arc::new(IptablesStats::default());
        stats.restores.fetch_add(3, Ordering::Relaxed);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(IptablesMetrics(stats)));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("kpng_iptables_restores_total 3"), "{text}");
        assert!(text.contains("kpng_iptables_chains_deleted_total 0"), "{text}");
    }
}
