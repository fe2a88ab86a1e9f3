//! [`IptablesMetrics`]: the backend's counters as Prometheus metrics: the template's under
//! `kpng_iptables_` ([`reconcile::Stats`]), the restores ([`IptablesStats`]), and
//! kube-proxy's iptables-mode series.

use std::sync::Arc;

use kpng_backend::reconcile;

use crate::backend::IptablesStats;

/// The iptables backend's counters as Prometheus metrics.
#[derive(Debug)]
pub struct IptablesMetrics {
    /// The template's counters.
    pub template: Arc<reconcile::Stats>,
    /// The restores'.
    pub iptables: Arc<IptablesStats>,
}

impl IptablesMetrics {
    /// The metrics of `backend`.
    pub fn of(backend: &crate::IptablesBackend) -> Self {
        IptablesMetrics { template: backend.template_stats(), iptables: backend.stats() }
    }
}

impl prometheus_client::collector::Collector for IptablesMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        self.template.encode(&mut encoder, "iptables")?;
        let stats = &self.iptables;
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
        ];
        kpng_backend::metrics::encode_counters(&mut encoder, &counters)?;
        kube_proxy_series(stats, &mut encoder)
    }
}

/// kube-proxy's iptables-mode series, with its names and labels.
fn kube_proxy_series(
    stats: &IptablesStats,
    encoder: &mut prometheus_client::encoding::DescriptorEncoder,
) -> Result<(), std::fmt::Error> {
    use prometheus_client::encoding::EncodeMetric;
    use prometheus_client::metrics::MetricType;
    use prometheus_client::metrics::gauge::ConstGauge;
    use std::sync::atomic::Ordering::Relaxed;
    let families = kpng_backend::metrics::IP_FAMILIES.iter().zip(&stats.by_family);
    for (name, help, full) in [
        (
            "kubeproxy_sync_proxy_rules_iptables_restore_failures",
            "Refused iptables-restore runs of whole states.",
            true,
        ),
        (
            "kubeproxy_sync_proxy_rules_iptables_partial_restore_failures",
            "Refused iptables-restore runs of changes.",
            false,
        ),
    ] {
        let values = families.clone().map(|(ip_family, counts)| {
            let n = match full {
                true => counts.full_failures.load(Relaxed),
                false => counts.partial_failures.load(Relaxed),
            };
            (*ip_family, n)
        });
        kpng_backend::metrics::encode_counter_family(encoder, name, help, "ip_family", values)?;
    }
    for (name, help, owned) in [
        ("kubeproxy_sync_proxy_rules_iptables_total", "iptables rules kpng owns.", true),
        (
            "kubeproxy_sync_proxy_rules_iptables_last",
            "iptables rules written by the last restore.",
            false,
        ),
    ] {
        let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (ip_family, counts) in families.clone() {
            for (t, table) in ["nat", "filter"].iter().enumerate() {
                let n = match owned {
                    true => counts.rules[t].load(Relaxed),
                    false => counts.last_written[t].load(Relaxed),
                };
                let labels = [("table", *table), ("ip_family", *ip_family)];
                ConstGauge::new(n as i64).encode(family.encode_family(&labels)?)?;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use super::*;

    #[test]
    fn counters_are_exported_by_name() {
        let metrics = IptablesMetrics { template: Arc::default(), iptables: Arc::default() };
        metrics.iptables.restores.fetch_add(3, Ordering::Relaxed);
        metrics.template.writes.fetch_add(5, Ordering::Relaxed);
        let mut registry = prometheus_client::registry::Registry::default();
        registry.register_collector(Box::new(metrics));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(text.contains("kpng_iptables_restores_total 3"), "{text}");
        assert!(text.contains("kpng_iptables_object_writes_total 5"), "{text}");
        assert!(text.contains("kpng_iptables_restore_failures_total 0"), "{text}");
    }
}
