//! Health-check NodePorts: for each service with a `healthCheckNodePort` (type
//! LoadBalancer with externalTrafficPolicy Local), an HTTP server on that port telling
//! the load balancer whether this node has a local endpoint to send traffic to.
//!
//! It runs as a backend: each change set says which services need a server and how many
//! local endpoints each has; servers open and close as services change.

use std::collections::{BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use kpng_backend::{Backend, BackendError, ChangeSet, NodeStats};
use kpng_model::ServiceKey;

/// What one port answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    service: ServiceKey,
    /// Ready endpoints on this node (distinct IPs; terminating ones do not count).
    local: usize,
}

type Table = Arc<Mutex<HashMap<u16, Entry>>>;

/// The health-check NodePort servers of one node.
pub struct HealthCheckBackend {
    table: Table,
    servers: HashMap<u16, tokio::task::JoinHandle<()>>,
    proxy: Option<(Arc<NodeStats>, Duration)>,
    address: IpAddr,
}

impl HealthCheckBackend {
    /// Servers listening on `address` (all addresses: `::`); with `proxy`, a node whose
    /// backends have an update pending for longer than the duration answers 503 too.
    pub fn new(address: IpAddr, proxy: Option<(Arc<NodeStats>, Duration)>) -> Self {
        HealthCheckBackend { table: Table::default(), servers: HashMap::new(), proxy, address }
    }
}

impl Drop for HealthCheckBackend {
    fn drop(&mut self) {
        for server in self.servers.values() {
            server.abort();
        }
    }
}

impl Backend for HealthCheckBackend {
    fn name(&self) -> &'static str {
        "health-check-nodeports"
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        let mut wanted: HashMap<u16, Entry> = HashMap::new();
        for state in changes.state.services.values() {
            let Some(port) = state.service.health_check_node_port else { continue };
            let local: BTreeSet<IpAddr> = state
                .endpoints
                .values()
                .filter(|e| e.local && e.ready && !e.terminating)
                .map(|e| e.ip)
                .collect();
            wanted.insert(port, Entry { service: state.service.key.clone(), local: local.len() });
        }
        *self.table.lock().unwrap_or_else(|e| e.into_inner()) = wanted.clone();
        self.servers.retain(|port, server| {
            let keep = wanted.contains_key(port);
            if !keep {
                tracing::info!(port, "health-check NodePort closed");
                server.abort();
            }
            keep
        });
        let handle = tokio::runtime::Handle::try_current().map_err(|e| {
            BackendError::new("health-check-nodeports", "no async runtime").with_source(e)
        })?;
        for port in wanted.keys() {
            if !self.servers.contains_key(port) {
                let address = SocketAddr::new(self.address, *port);
                let router = router(self.table.clone(), *port, self.proxy.clone());
                self.servers.insert(*port, handle.spawn(serve(address, router)));
            }
        }
        Ok(())
    }
}

fn router(table: Table, port: u16, proxy: Option<(Arc<NodeStats>, Duration)>) -> Router {
    Router::new().fallback(move || {
        let (table, proxy) = (table.clone(), proxy.clone());
        async move { answer(&table, port, proxy.as_ref()) }
    })
}

fn answer(table: &Table, port: u16, proxy: Option<&(Arc<NodeStats>, Duration)>) -> Response {
    let Some(entry) = table.lock().unwrap_or_else(|e| e.into_inner()).get(&port).cloned() else {
        return StatusCode::NOT_FOUND.into_response();
    };
    let healthy = proxy.is_none_or(|(stats, timeout)| {
        let health = stats.health();
        !health.node_draining && health.pending_since.is_none_or(|t| t.elapsed() <= *timeout)
    });
    let code =
        if entry.local > 0 && healthy { StatusCode::OK } else { StatusCode::SERVICE_UNAVAILABLE };
    let body = serde_json::json!({
        "service": {"namespace": entry.service.namespace, "name": entry.service.name},
        "localEndpoints": entry.local,
        "serviceProxyHealthy": healthy,
    });
    let weight = header::HeaderName::from_static("x-load-balancing-endpoint-weight");
    let headers =
        [(header::CONTENT_TYPE, "application/json".to_string()), (weight, entry.local.to_string())];
    (code, headers, body.to_string()).into_response()
}

/// Serves one port; a port that cannot be bound is reported and retried every 5 s.
async fn serve(address: SocketAddr, router: Router) {
    loop {
        match tokio::net::TcpListener::bind(address).await {
            Ok(listener) => {
                tracing::info!(%address, "health-check NodePort listening");
                if let Err(error) = axum::serve(listener, router.clone()).await {
                    tracing::error!(%address, %error, "health-check NodePort failed");
                }
            }
            Err(error) => {
                tracing::error!(%address, %error, "cannot listen on a health-check NodePort; retrying in 5 s");
            }
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}
