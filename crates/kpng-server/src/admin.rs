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
use kpng_model::global::ModelDocument;
use kpng_runner::NodeStats;
use kpng_store::StoreReader;
use prometheus_client::collector::Collector;
use prometheus_client::registry::Registry;

use crate::counters::ServerStats;
use crate::http::{BindProblems, Binder, HttpLimits, bind_retrying, serve_http};

mod metrics;

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
    /// What the runner and the backends report as not right yet (a program detached, the
    /// node missing from the source): `/readyz` names it.
    pub readiness_problems: kpng_backend::Problems,
    /// Addresses the process's servers cannot bind: `/readyz` names them.
    pub bind_problems: BindProblems,
    /// The HTTP servers' connection budget, for the metrics.
    pub http: Option<HttpLimits>,
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
    /// `/healthz` then `/livez` answers, each 200 then 503.
    healthz: Arc<[[AtomicU64; 2]; 2]>,
    registry: Registry,
}

impl Admin {
    /// The admin state for `sources`.
    pub fn new(mut sources: AdminSources) -> Arc<Self> {
        let collectors = std::mem::take(&mut sources.collectors);
        let sources = Arc::new(sources);
        let healthz: Arc<[[AtomicU64; 2]; 2]> = Arc::default();
        let mut registry = Registry::default();
        registry.register_collector(Box::new(metrics::Metrics {
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
        self.healthz[usize::from(!with_node)][usize::from(!healthy)]
            .fetch_add(1, Ordering::Relaxed);
        (code, [(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
    }

    /// 200 once the initial lists are complete, every backend has applied the state once,
    /// every server could bind its address and no backend has a dataplane problem open
    /// (a program detached); otherwise 503 with one line per reason.
    fn ready(&self) -> Response {
        let listed = self.sources.reader.as_ref().is_none_or(StoreReader::is_ready);
        let applied = self.sources.node.as_ref().is_none_or(|(_, s)| s.synced().is_released());
        let mut reasons = Vec::new();
        if !listed {
            reasons.push("initial lists not complete".to_string());
        } else if !applied {
            reasons.push("backends not synced yet".to_string());
        }
        for (address, problem) in self.sources.bind_problems.list() {
            reasons.push(format!("cannot listen on {address} ({problem})"));
        }
        reasons.extend(self.sources.readiness_problems.list());
        match reasons.is_empty() {
            true => (StatusCode::OK, "ready\n").into_response(),
            false => (StatusCode::SERVICE_UNAVAILABLE, reasons.join("\n") + "\n").into_response(),
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

/// Serves `router` on `address` within `limits` until the task is dropped. While the
/// address cannot be bound, that is logged, reported in `problems` (so `/readyz` names it)
/// and retried every 5 s: the proxy keeps working without its admin server.
pub async fn serve_admin(
    name: &'static str,
    address: SocketAddr,
    router: Router,
    limits: HttpLimits,
    problems: BindProblems,
    bind: Binder,
) {
    let listener = bind_retrying(name, address, &problems, &bind).await;
    serve_http(name, listener, router, limits).await
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
