//! [`EbpfMetrics`]: the backend's counters as Prometheus metrics: the template's under
//! `kpng_ebpf_` ([`reconcile::Stats`]), and the eBPF kernel's own.

use std::sync::Arc;

use kpng_backend::reconcile;

use crate::backend::EbpfStats;

/// The eBPF backend's counters, for the metrics registry.
#[derive(Debug)]
pub struct EbpfMetrics {
    /// The template's counters.
    pub template: Arc<reconcile::Stats>,
    /// The eBPF kernel's.
    pub ebpf: Arc<EbpfStats>,
}

impl EbpfMetrics {
    /// The metrics of `backend`.
    pub fn of(backend: &crate::EbpfBackend) -> Self {
        EbpfMetrics { template: backend.stats(), ebpf: backend.ebpf_stats() }
    }
}

impl prometheus_client::collector::Collector for EbpfMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        self.template.encode(&mut encoder, "ebpf")?;
        let stats = &self.ebpf;
        let counters = [
            (
                "kpng_ebpf_map_grows",
                "Times the eBPF maps were replaced by larger ones.",
                &stats.grows,
            ),
            (
                "kpng_ebpf_program_detachments",
                "Programs found not running on their cgroup (detached behind kpng's back, or the cgroup created again), then attached again.",
                &stats.detachments,
            ),
        ];
        kpng_backend::metrics::encode_counters(&mut encoder, &counters)?;
        let gauge = prometheus_client::metrics::gauge::ConstGauge::new(
            stats.unattached.load(std::sync::atomic::Ordering::Relaxed) as i64,
        );
        let metric = encoder.encode_descriptor(
            "kpng_ebpf_unattached_programs",
            "Programs not running on their cgroup at the last check, until attached again.",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        prometheus_client::encoding::EncodeMetric::encode(&gauge, metric)?;
        Ok(())
    }
}
