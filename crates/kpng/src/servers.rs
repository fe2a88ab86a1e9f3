//! The process's HTTP servers: the admin servers (health, readiness, metrics, state) and
//! the health-check NodePorts, all within the process's HTTP limits.

use std::sync::Arc;

use kpng_runner::NodeStats;
use kpng_server::http::system_binder;

use crate::cli::GlobalArgs;
use crate::process::{AbortOnDrop, Process};
use crate::sinks::to_local::programs_kernel;

/// The admin HTTP servers `global` asks for (none with --once; a port of 0 disables one),
/// within the process's HTTP limits. Never returns.
pub fn admin_servers(
    global: &GlobalArgs,
    sources: kpng_server::admin::AdminSources,
    process: &Process,
) -> impl std::future::Future<Output = ()> + use<> {
    use kpng_server::admin::{Admin, serve_admin};
    let admin = Admin::new(sources);
    let mut servers = Vec::new();
    if !global.once {
        let wanted = [
            ("healthz", global.admin.healthz_bind_address, admin.health_router()),
            ("metrics", global.admin.metrics_bind_address, admin.metrics_router()),
        ];
        for (name, address, router) in wanted.into_iter().filter(|(_, a, _)| a.port() != 0) {
            let (limits, problems) = (process.http.clone(), process.problems.clone());
            let server = serve_admin(name, address, router, limits, problems, system_binder());
            servers.push(tokio::spawn(server));
        }
    }
    async move {
        let _abort_on_drop: Vec<_> = servers.into_iter().map(AbortOnDrop).collect();
        std::future::pending::<()>().await
    }
}

/// The health-check NodePort servers, alongside backends that program the kernel
/// ([`programs_kernel`]; not for `to-json` alone, nor in a dry run).
pub fn health_checks(
    commands: &[crate::cli::BackendCommand],
    global: &GlobalArgs,
    stats: &Arc<NodeStats>,
    process: &Process,
) -> Option<Box<dyn kpng_runner::Backend>> {
    use kpng_server::healthcheck::{HealthCheckBackend, HealthCheckOptions};
    programs_kernel(commands, global).then(|| {
        let options = HealthCheckOptions {
            address: std::net::IpAddr::from(std::net::Ipv6Addr::UNSPECIFIED),
            proxy: Some((stats.clone(), global.sync.sync_period * 2)),
            // The servers run here, not on the runner's thread, which a long apply blocks.
            runtime: tokio::runtime::Handle::current(),
            limits: process.http.clone(),
            problems: process.problems.clone(),
            bind: system_binder(),
        };
        Box::new(HealthCheckBackend::new(options)) as Box<dyn kpng_runner::Backend>
    })
}
