//! The admin HTTP servers, with kube-proxy's conventions: `/healthz`, `/livez` and
//! `/readyz` on the health address; `/metrics` (Prometheus text) and `/state` (the global
//! model and this node's ENLS as JSON) on the metrics address.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use kpng_backend::NodeStats;
use kpng_model::global::ModelDocument;
use kpng_store::StoreReader;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

use crate::ServerStats;

/// What the admin servers report on.
pub struct AdminSources {
    /// The store (`kpng local` has none).
    pub reader: Option<StoreReader>,
    /// This node's name and runner, when the process runs backends.
    pub node: Option<(String, Arc<NodeStats>)>,
    /// The `to-api` server, when there is one.
    pub server: Option<Arc<ServerStats>>,
    /// An update pending for longer than this makes `/healthz` and `/livez` fail (twice
    /// the sync period, as kube-proxy).
    pub health_timeout: Duration,
    /// Further metrics (a backend's own).
    pub collectors: Vec<Box<dyn Collector>>,
}

impl std::fmt::Debug for AdminSources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminSources")
            .field("node", &self.node.as_ref().map(|(name, _)| name))
            .field("health_timeout", &self.health_timeout)
            .finish_non_exhaustive()
    }
}

/// The admin servers' shared state.
pub struct Admin {
    sources: Arc<AdminSources>,
    healthz: Arc<[AtomicU64; 2]>,
    registry: Registry,
}

impl Admin {
    /// The admin state for `sources`.
    pub fn new(mut sources: AdminSources) -> Arc<Self> {
        let collectors = std::mem::take(&mut sources.collectors);
        let sources = Arc::new(sources);
        let healthz = Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Metrics {
            sources: sources.clone(),
            healthz: healthz.clone(),
        }));
        for collector in collectors {
            registry.register_collector(collector);
        }
        Arc::new(Admin { sources, healthz, registry })
    }

    /// `/healthz`, `/livez` and `/readyz`.
    pub fn health_router(self: &Arc<Self>) -> Router {
        let (a, b, c) = (self.clone(), self.clone(), self.clone());
        Router::new()
            .route("/healthz", get(move || async move { a.health(true) }))
            .route("/livez", get(move || async move { b.health(false) }))
            .route("/readyz", get(move || async move { c.ready() }))
    }

    /// `/metrics` and `/state`.
    pub fn metrics_router(self: &Arc<Self>) -> Router {
        let (a, b) = (self.clone(), self.clone());
        Router::new()
            .route("/metrics", get(move || async move { a.metrics() }))
            .route("/state", get(move || async move { b.state() }))
    }

    fn health(&self, with_node: bool) -> Response {
        let now = SystemTime::now();
        let health = self.sources.node.as_ref().map(|(_, stats)| stats.health());
        let stale = health
            .and_then(|h| h.pending_since)
            .is_some_and(|since| since.elapsed() > self.sources.health_timeout);
        let eligible = !health.is_some_and(|h| h.node_draining);
        let healthy = !stale && (!with_node || eligible);
        let mut body = serde_json::json!({
            "lastUpdated": health.and_then(|h| h.last_applied).map(rfc3339).unwrap_or_default(),
            "currentTime": rfc3339(now),
            "healthy": healthy,
        });
        if with_node {
            body["nodeEligible"] = eligible.into();
        }
        let code = if healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
        if with_node {
            self.healthz[usize::from(!healthy)].fetch_add(1, Ordering::Relaxed);
        }
        (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }

    fn ready(&self) -> Response {
        let listed = self.sources.reader.as_ref().is_none_or(StoreReader::is_ready);
        let applied = self.sources.node.as_ref().is_none_or(|(_, s)| s.health().applied_once);
        match (listed, applied) {
            (true, true) => (StatusCode::OK, "ready\n").into_response(),
            (false, _) => {
                (StatusCode::SERVICE_UNAVAILABLE, "initial lists not complete\n").into_response()
            }
            (true, false) => {
                (StatusCode::SERVICE_UNAVAILABLE, "backends not synced yet\n").into_response()
            }
        }
    }

    fn metrics(&self) -> Response {
        let mut text = String::new();
        match prometheus_client::encoding::text::encode(&mut text, &self.registry) {
            Ok(()) => (
                [(
                    header::CONTENT_TYPE,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                )],
                text,
            )
                .into_response(),
            Err(_) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        }
    }

    fn state(&self) -> Response {
        let Some(reader) = &self.sources.reader else {
            return (StatusCode::NOT_FOUND, "no global model in this process (kpng local)\n")
                .into_response();
        };
        let snapshot = reader.snapshot();
        let model = snapshot.model();
        let mut body = serde_json::json!({
            "revision": snapshot.revision(),
            "model": ModelDocument::from(model),
        });
        if let Some((node, _)) = &self.sources.node {
            body["node"] = serde_json::json!({
                "name": node,
                "state": kpng_local::project_node_state(model, node),
            });
        }
        ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }
}

/// `time` as RFC 3339 in UTC, to the millisecond.
fn rfc3339(time: SystemTime) -> String {
    let since = time.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (days, secs) = (since.as_secs() / 86_400, since.as_secs() % 86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        secs / 3_600,
        secs / 60 % 60,
        secs % 60,
        since.subsec_millis()
    )
}

/// Reads the counters at each scrape.
#[derive(Debug)]
struct Metrics {
    sources: Arc<AdminSources>,
    healthz: Arc<[AtomicU64; 2]>,
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
            let mut family = encoder.encode_descriptor(
                "kpng_source_events",
                "Object events from the source (API events, file objects), by kind.",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (kind, label) in kinds {
                let metric = ConstCounter::new(stats.by_kind(kind).0);
                metric.encode(family.encode_family(&[("kind", label)])?)?;
            }
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
                "Dataplanes found changed behind kpng's back and rebuilt.",
                stats.repairs(),
            )?;
            let last = stats
                .health()
                .last_applied
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map_or(0.0, |d| d.as_secs_f64());
            gauge(
                &mut encoder,
                "kubeproxy_sync_proxy_rules_last_timestamp_seconds",
                "When the backends last held the node's whole current state.",
                last,
            )?;
            let durations = stats.sync_durations();
            durations.encode(encoder.encode_descriptor(
                "kubeproxy_sync_proxy_rules_duration_seconds",
                "Time a backend took to apply one change set.",
                None,
                durations.metric_type(),
            )?)?;
            let programming = stats.network_programming();
            programming.encode(encoder.encode_descriptor(
                "kubeproxy_network_programming_duration_seconds",
                "From an EndpointSlice's last-change-trigger-time to every backend applying it.",
                None,
                programming.metric_type(),
            )?)?;
            let (internal, external) = stats.no_local_endpoints();
            let mut family = encoder.encode_descriptor(
                "kubeproxy_sync_proxy_rules_no_local_endpoints_total",
                "Services with a Local traffic policy and no endpoint on this node.",
                None,
                prometheus_client::metrics::MetricType::Gauge,
            )?;
            for (policy, n) in [("internal", internal), ("external", external)] {
                let metric = ConstGauge::new(n as i64);
                metric.encode(family.encode_family(&[("traffic_policy", policy)])?)?;
            }
            let conflicts = ConstGauge::new(stats.conflicts() as i64);
            conflicts.encode(encoder.encode_descriptor(
                "kpng_service_address_conflicts",
                "Services yielding a destination to an older service claiming it too.",
                None,
                conflicts.metric_type(),
            )?)?;
            let mut family = encoder.encode_descriptor(
                "kubeproxy_proxy_healthz",
                "/healthz answers by HTTP code.",
                None,
                prometheus_client::metrics::MetricType::Counter,
            )?;
            for (i, code) in ["200", "503"].iter().enumerate() {
                let labels = [("code", *code)];
                let metric = ConstCounter::new(self.healthz[i].load(Ordering::Relaxed));
                metric.encode(family.encode_family(&labels)?)?;
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
        }
        Ok(())
    }
}

/// Serves `router` on `address` until the process ends. A port that cannot be bound is
/// reported and retried every 5 s: the proxy keeps working without its admin server.
pub async fn serve_admin(name: &'static str, address: SocketAddr, router: Router) {
    loop {
        match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => {
                tracing::info!(server = name, %address, "admin server listening");
                if let Err(error) = axum::serve(listener, router.clone()).await {
                    tracing::error!(server = name, %address, %error, "admin server failed");
                }
            }
            Err(error) => {
                tracing::error!(server = name, %address, %error, "cannot listen; retrying in 5 s");
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00.000Z");
        let t = UNIX_EPOCH + Duration::from_millis(1_795_385_045_123);
        assert_eq!(rfc3339(t), "2026-11-22T22:04:05.123Z");
        let leap = UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert_eq!(rfc3339(leap), "2000-02-29T00:00:00.000Z");
    }
}
