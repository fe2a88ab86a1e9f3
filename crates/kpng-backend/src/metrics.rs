//! [`encode_counters`]: a backend's atomic counters written as Prometheus counters, the one
//! way every backend's metrics collector reports them.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;

/// kube-proxy's `ip_family` label values. kpng programs both families in every sync, so
/// each kube-proxy series it keeps per family carries the same value for both.
pub const IP_FAMILIES: [&str; 2] = ["IPv4", "IPv6"];

/// Writes each `(name, help, value)` as a counter (the encoder adds `_total`).
pub fn encode_counters(
    encoder: &mut DescriptorEncoder<'_>,
    counters: &[(&str, &str, &AtomicU64)],
) -> Result<(), std::fmt::Error> {
    for (name, help, value) in counters {
        let metric = ConstCounter::new(value.load(Ordering::Relaxed));
        metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)?;
    }
    Ok(())
}

/// Writes one counter family: a series per `(label value, count)` of `values`.
pub fn encode_counter_family<'a>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    label: &str,
    values: impl IntoIterator<Item = (&'a str, u64)>,
) -> Result<(), std::fmt::Error> {
    let kind = prometheus_client::metrics::MetricType::Counter;
    let mut family = encoder.encode_descriptor(name, help, None, kind)?;
    for (value, count) in values {
        ConstCounter::new(count).encode(family.encode_family(&[(label, value)])?)?;
    }
    Ok(())
}

/// Writes `metric` once per `ip_family`, the same value under each: kpng syncs both families
/// at once, where kube-proxy runs a proxier per family.
pub fn encode_per_family(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    metric: &impl EncodeMetric,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, None, metric.metric_type())?;
    for ip_family in IP_FAMILIES {
        metric.encode(family.encode_family(&[("ip_family", ip_family)])?)?;
    }
    Ok(())
}
