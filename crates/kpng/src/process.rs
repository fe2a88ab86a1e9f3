//! What every long-running pipeline shares: the descriptor budget, the HTTP servers'
//! limits, the addresses that cannot be bound, the stop flag; and [`AbortOnDrop`], which
//! ties a background task to the scope that started it.

use kpng_runner::runner::Stop;
use kpng_server::http::{BindProblems, HttpLimits};

use crate::limits::DescriptorBudget;

/// What every long-running pipeline shares.
pub struct Process {
    /// How the open-file limit is shared.
    pub budget: DescriptorBudget,
    /// The connection budget of every HTTP server.
    pub http: HttpLimits,
    /// Addresses that cannot be bound, for `/readyz`.
    pub problems: BindProblems,
    /// What the runner and the backends report as not right yet (a program detached, the
    /// node missing from the source), for `/readyz`.
    pub readiness: kpng_backend::Problems,
    /// Set on SIGTERM or SIGINT: the runner applies nothing more.
    pub stop: Stop,
}

impl Process {
    /// The shared state of a process with `budget`.
    pub fn new(budget: DescriptorBudget) -> Self {
        let http = HttpLimits::new(budget.http_connections, kpng_server::http::HEADER_TIMEOUT);
        Process {
            budget,
            http,
            problems: BindProblems::default(),
            readiness: kpng_backend::Problems::default(),
            stop: Stop::new(),
        }
    }
}

/// Aborts a task when dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
