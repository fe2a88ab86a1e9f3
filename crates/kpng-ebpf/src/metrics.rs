//! [`EbpfMetrics`]: the backend's counters as Prometheus metrics.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::backend::EbpfStats;

/// The eBPF backend's counters, for the metrics registry.
#[derive(Debug)]
pub struct EbpfMetrics(pub Arc<EbpfStats>);

impl prometheus_client::collector::Collector for EbpfMetrics {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        use prometheus_client::metrics::counter::ConstCounter;
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
        ];
        for (name, help, value) in counters {
            let metric = ConstCounter::new(value.load(Ordering::Relaxed));
            metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
        }
        Ok(())
    }
}
