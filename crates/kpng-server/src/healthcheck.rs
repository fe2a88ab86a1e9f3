//! Health-check NodePorts: for each service with a `healthCheckNodePort` (type
//! LoadBalancer with externalTrafficPolicy Local), an HTTP server on that port telling
//! the load balancer whether this node has a local endpoint to send traffic to.
//!
//! It runs as a backend: each change set says which services need a server and how many
//! local endpoints each has; servers open and close as services change. Only the services
//! a change set touched are looked at (every one at a reset): at 30,000 services, going
//! through all of them took more of a change's time than the dataplane's commit. The
//! servers run on the runtime they are given (the backend itself may run on a thread of
//! its own), within the process's HTTP limits; a port that cannot be bound is logged,
//! reported to `/readyz` and retried every 5 s.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use kpng_model::ServiceKey;
use kpng_model::local::LocalServiceState;
use kpng_runner::{Backend, BackendError, ChangeSet, NodeStats};

use crate::http::{BindProblems, Binder, HttpLimits, bind_retrying, serve_http};

/// What one port answers for.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Entry {
    service: ServiceKey,
    /// Ready endpoints on this node (distinct IPs; terminating ones do not count).
    local: usize,
}

type Table = Arc<Mutex<HashMap<u16, Entry>>>;

/// Where and how the health-check NodePort servers run.
pub struct HealthCheckOptions {
    /// The address they listen on (all addresses: `::`).
    pub address: IpAddr,
    /// With this, a node whose backends have had an update pending for longer than the
    /// duration answers 503 too.
    pub proxy: Option<(Arc<NodeStats>, Duration)>,
    /// The runtime the servers run on.
    pub runtime: tokio::runtime::Handle,
    /// The process's HTTP limits, shared with its other HTTP servers.
    pub limits: HttpLimits,
    /// Where ports that cannot be bound are reported.
    pub problems: BindProblems,
    /// How ports are bound.
    pub bind: Binder,
}

impl std::fmt::Debug for HealthCheckOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HealthCheckOptions").field("address", &self.address).finish_non_exhaustive()
    }
}

/// The health-check NodePort servers of one node.
pub struct HealthCheckBackend {
    table: Table,
    /// Each service with a health-check NodePort: its port and its local endpoints.
    services: BTreeMap<ServiceKey, (u16, usize)>,
    servers: HashMap<u16, tokio::task::JoinHandle<()>>,
    options: HealthCheckOptions,
}

impl HealthCheckBackend {
    /// Servers as `options` say; none until a change set asks for them.
    pub fn new(options: HealthCheckOptions) -> Self {
        let (table, services, servers) = (Table::default(), BTreeMap::new(), HashMap::new());
        HealthCheckBackend { table, services, servers, options }
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
        let state = changes.state;
        if changes.is_reset() {
            let services = state.services();
            self.services =
                services.filter_map(|s| Some((s.service.key.clone(), health_check(&s)?))).collect();
        } else {
            let mut changed = false;
            for key in changes.touched().0 {
                let old = self.services.remove(&key);
                let new = state.service(&key).and_then(|s| health_check(&s));
                changed |= old != new;
                if let Some(new) = new {
                    self.services.insert(key, new);
                }
            }
            if !changed {
                return Ok(());
            }
        }
        // Two services naming one port (the API server allocates them apart): the last
        // by key answers.
        let wanted: HashMap<u16, Entry> = (self.services.iter())
            .map(|(key, (port, local))| (*port, Entry { service: key.clone(), local: *local }))
            .collect();
        *self.table.lock().unwrap_or_else(|e| e.into_inner()) = wanted.clone();
        self.servers.retain(|port, server| {
            let keep = wanted.contains_key(port);
            if !keep {
                tracing::info!(port, "health-check NodePort closed");
                server.abort();
            }
            keep
        });
        for port in wanted.keys() {
            if !self.servers.contains_key(port) {
                let options = &self.options;
                let address = SocketAddr::new(options.address, *port);
                let router = router(self.table.clone(), *port, options.proxy.clone());
                let (limits, problems) = (options.limits.clone(), options.problems.clone());
                let bind = options.bind.clone();
                let server = serve(address, router, limits, problems, bind);
                self.servers.insert(*port, options.runtime.spawn(server));
            }
        }
        Ok(())
    }
}

/// A service's health-check NodePort and its ready local endpoints (distinct IPs), if it
/// has the port.
fn health_check(state: &LocalServiceState) -> Option<(u16, usize)> {
    let port = state.service.health_check_node_port?;
    let local: BTreeSet<IpAddr> = (state.endpoints.values())
        .filter(|e| e.local && e.ready && !e.terminating)
        .map(|e| e.ip)
        .collect();
    Some((port, local.len()))
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
        "service": {"namespace": entry.service.namespace(), "name": entry.service.name()},
        "localEndpoints": entry.local,
        "serviceProxyHealthy": healthy,
    });
    let weight = header::HeaderName::from_static("x-load-balancing-endpoint-weight");
    let headers =
        [(header::CONTENT_TYPE, "application/json".to_string()), (weight, entry.local.to_string())];
    (code, headers, body.to_string()).into_response()
}

/// Serves one port; a port that cannot be bound is reported and retried every 5 s (the
/// report is withdrawn when the server is closed).
async fn serve(
    address: SocketAddr,
    router: Router,
    limits: HttpLimits,
    problems: BindProblems,
    bind: Binder,
) {
    let listener = bind_retrying("health-check NodePort", address, &problems, &bind).await;
    serve_http("health-check NodePort", listener, router, limits).await
}

#[cfg(test)]
mod tests;
