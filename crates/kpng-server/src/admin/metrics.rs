//! The admin servers' metrics, read from their sources at each scrape.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::UNIX_EPOCH;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use super::AdminSources;

/// Reads the counters at each scrape.
#[derive(Debug)]
pub(super) struct Metrics {
    pub(super) sources: Arc<AdminSources>,
    pub(super) healthz: Arc<[[AtomicU64; 2]; 2]>,
}

fn counter(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: u64,
) -> std::fmt::Result {
    let metric = ConstCounter::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

fn gauge(encoder: &mut DescriptorEncoder, name: &str, help: &str, value: f64) -> std::fmt::Result {
    let metric = ConstGauge::new(value);
    metric.encode(encoder.encode_descriptor(name, help, None, metric.metric_type())?)
}

impl Collector for Metrics {
    fn encode(&self, mut encoder: DescriptorEncoder) -> std::fmt::Result {
        if let Some(reader) = &self.sources.reader {
            let store = reader.stats().snapshot();
            let stats = reader.stats();
            let kinds = [
                (kpng_model::Kind::Service, "service"),
                (kpng_model::Kind::EndpointSlice, "endpointslice"),
                (kpng_model::Kind::Node, "node"),
                (kpng_model::Kind::ServiceCidr, "servicecidr"),
            ];
            kpng_backend::metrics::encode_counter_family(
                &mut encoder,
                "kpng_source_events",
                "Object events from the source (API events, file objects), by kind.",
                "kind",
                kinds.map(|(kind, label)| (label, stats.by_kind(kind).0)),
            )?;
            counter(
                &mut encoder,
                "kubeproxy_sync_proxy_rules_service_changes",
                "Service changes that reached the model.",
                stats.by_kind(kpng_model::Kind::Service).1,
            )?;
            counter(
                &mut encoder,
                "kubeproxy_sync_proxy_rules_endpoint_changes",
                "EndpointSlice changes that reached the model.",
                stats.by_kind(kpng_model::Kind::EndpointSlice).1,
            )?;
            counter(
                &mut encoder,
                "kpng_store_changes",
                "Source events that changed the model.",
                store.changes,
            )?;
            gauge(
                &mut encoder,
                "kpng_store_revision",
                "Revisions of the global model.",
                store.revisions as f64,
            )?;
            let ready = if reader.is_ready() { 1.0 } else { 0.0 };
            gauge(
                &mut encoder,
                "kpng_store_ready",
                "1 once every initial list is complete.",
                ready,
            )?;
        }
        if let Some((_, stats)) = &self.sources.node {
            counter(
                &mut encoder,
                "kpng_enls_revisions",
                "Changes of this node's state.",
                stats.enls_revisions(),
            )?;
            counter(
                &mut encoder,
                "kpng_change_sets",
                "Change sets applied by backends.",
                stats.change_sets(),
            )?;
            counter(
                &mut encoder,
                "kpng_sync_failures",
                "Change sets a backend failed to apply.",
                stats.failures(),
            )?;
            counter(
                &mut encoder,
                "kpng_drift_repairs",
                "Dataplanes found changed behind kpng's back and rebuilt from the whole state.",
                stats.repairs(),
            )?;
            let last = stats
                .health()
                .last_applied
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0.0, |d| d.as_secs_f64());
            kpng_backend::metrics::encode_per_family(
                &mut encoder,
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                "When the backends last held the node's whole current state.",
                &ConstGauge::new(last),
            )?;
            let queued = stats
                .health()
                .last_queued
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0.0, |d| d.as_secs_f64());
            kpng_backend::metrics::encode_per_family(
                &mut encoder,
                "kubeproxy_sync_proxy_rules_last_queued_timestamp_seconds",
                "When the node's state last changed, queueing a sync.",
                &ConstGauge::new(queued),
            )?;
            for (name, help, histogram) in [
                (
                    "kubeproxy_sync_proxy_rules_duration_seconds",
                    "Time a dataplane backend took to apply one change set.",
                    stats.sync_durations(),
                ),
                (
                    "kubeproxy_sync_full_proxy_rules_duration_seconds",
                    "Time a dataplane backend took to apply a whole state.",
                    stats.full_sync_durations(),
                ),
                (
                    "kubeproxy_sync_partial_proxy_rules_duration_seconds",
                    "Time a dataplane backend took to apply changes.",
                    stats.partial_sync_durations(),
                ),
                (
                    "kubeproxy_network_programming_duration_seconds",
                    "From an EndpointSlice's last-change-trigger-time to every backend applying it.",
                    stats.network_programming(),
                ),
            ] {
                kpng_backend::metrics::encode_per_family(&mut encoder, name, help, histogram)?;
            }
            let (services, endpoints) = stats.pending_changes();
            gauge(
                &mut encoder,
                "kubeproxy_sync_proxy_rules_service_changes_pending",
                "Service changes of the node's state not applied by every backend yet.",
                services as f64,
            )?;
            gauge(
                &mut encoder,
                "kubeproxy_sync_proxy_rules_endpoint_changes_pending",
                "Endpoint changes of the node's state not applied by every backend yet.",
                endpoints as f64,
            )?;
            let (internal, external) = stats.no_local_endpoints();
            let mut family = encoder.encode_descriptor(
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                "Services with a Local traffic policy and no endpoint on this node.",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (policy, n) in [("internal", internal), ("external", external)] {
                for ip_family in kpng_backend::metrics::IP_FAMILIES {
                    let labels = [("traffic_policy", policy), ("ip_family", ip_family)];
                    ConstGauge::new(n as i64).encode(family.encode_family(&labels)?)?;
                }
            }
            let conflicts = ConstGauge::new(stats.conflicts() as i64);
            conflicts.encode(encoder.encode_descriptor(
                "kpng_service_address_conflicts",
                "Services yielding a destination to an older service claiming it too.",
                None,
                conflicts.metric_type(),
            )?)?;
            for (answers, name, help) in [
                (&self.healthz[0], "kubeproxy_proxy_healthz", "/healthz answers by HTTP code."),
                (&self.healthz[1], "kubeproxy_proxy_livez", "/livez answers by HTTP code."),
            ] {
                let counts = answers.each_ref().map(|a| a.load(Ordering::Relaxed));
                let values = ["200", "503"].into_iter().zip(counts);
                kpng_backend::metrics::encode_counter_family(
                    &mut encoder,
                    name,
                    help,
                    "code",
                    values,
                )?;
            }
        }
        if let Some(server) = &self.sources.server {
            gauge(
                &mut encoder,
                "kpng_api_clients",
                "Connected to-api stream clients.",
                server.connected() as f64,
            )?;
            counter(&mut encoder, "kpng_api_streams", "to-api streams served.", server.streams())?;
            counter(
                &mut encoder,
                "kpng_api_clients_refused",
                "to-api connections refused because every client slot was taken.",
                server.refused(),
            )?;
            counter(
                &mut encoder,
                "kpng_api_clients_unauthorized",
                "to-api connections refused because the client's user and groups are not allowed (--allow-uid, --allow-gid).",
                server.unauthorized(),
            )?;
            counter(
                &mut encoder,
                "kpng_api_clients_dropped",
                "to-api connections closed because their client stopped reading or opened no stream.",
                server.dropped(),
            )?;
        }
        if let Some(http) = &self.sources.http {
            gauge(
                &mut encoder,
                "kpng_http_connections",
                "Connections held by the HTTP servers (health, metrics, health-check NodePorts).",
                http.open_connections() as f64,
            )?;
            counter(
                &mut encoder,
                "kpng_http_connections_evicted",
                "HTTP connections without a request in progress closed to make room for a new one.",
                http.evicted(),
            )?;
        }
        Ok(())
    }
}
