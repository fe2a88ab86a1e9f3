//! The process's file-descriptor budget.
//!
//! kpng's own work (reading its input, netlink sockets, `nft`, conntrack) needs
//! descriptors, and clients must never be able to take them all: at start-up the soft
//! open-file limit is raised to the hard one, then divided. The HTTP servers together
//! (health, metrics, health-check NodePorts) may hold an eighth of it, `to-api` clients a
//! quarter by default (`--max-clients`); the rest, at least five eighths, is kpng's own.

/// How the open-file limit is shared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DescriptorBudget {
    /// The open-file limit in force.
    pub limit: u64,
    /// Connections all HTTP servers may hold together.
    pub http_connections: usize,
    /// `to-api` clients served at once, unless `--max-clients` says otherwise.
    pub api_clients: usize,
}

impl DescriptorBudget {
    /// The shares of `limit`.
    pub fn of(limit: u64) -> Self {
        let share = |divisor: u64, max: u64| (limit / divisor).clamp(4, max) as usize;
        DescriptorBudget { limit, http_connections: share(8, 4096), api_clients: share(4, 65_536) }
    }
}

/// Raises the soft open-file limit to the hard one and returns the budget. When the limit
/// cannot be read, a conservative 1,024 is assumed.
pub fn raise_and_share() -> DescriptorBudget {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let limit = match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(error) => {
                tracing::warn!(%error, soft, hard, "cannot raise the open-file limit");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(error) => {
            tracing::warn!(%error, "cannot read the open-file limit; assuming 1024");
            1024
        }
    };
    let budget = DescriptorBudget::of(limit);
    tracing::debug!(?budget, "descriptor budget");
    budget
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clients_never_get_most_descriptors() {
        for limit in [64, 256, 1024, 65_536, 1 << 20] {
            let b = DescriptorBudget::of(limit);
            let clients = (b.http_connections + b.api_clients) as u64;
            assert!(clients * 8 <= limit * 3, "limit {limit}: {b:?}");
        }
        assert_eq!(DescriptorBudget::of(1024).http_connections, 128);
        assert_eq!(DescriptorBudget::of(1 << 20).http_connections, 4096);
    }
}
