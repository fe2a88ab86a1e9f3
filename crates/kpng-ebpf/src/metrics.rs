//! [`EbpfMetrics`]: the backend's counters as Prometheus metrics.

use std::sync::Arc;

use crate::backend::EbpfStats;

/// The eBPF backend's counters, for the metrics registry.
#[derive(Debug)]
pub struct EbpfMetrics(pub Arc<EbpfStats>);

impl prometheus_client::collector::Collector for EbpfMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        let stats = &self.0;
        let counters = [
            ("kpng_ebpf_updates", "Change sets that wrote eBPF map elements.", &stats.updates),
            (
                "kpng_ebpf_map_writes",
                "eBPF map element writes (updates and deletions, growth copies included).",
                &stats.map_writes,
            ),
            (
                "kpng_ebpf_map_grows",
                "Times the eBPF maps were replaced by larger ones.",
                &stats.grows,
            ),
            (
                "kpng_ebpf_update_failures",
                "Change sets the eBPF backend failed to apply.",
                &stats.failures,
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
