//! [`ServerStats`]: a `to-api` server's counters, and [`Connected`], which counts a client
//! for as long as its answer lives.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of a server.
#[derive(Debug, Default)]
pub struct ServerStats {
    pub(crate) connected: AtomicU64,
    pub(crate) streams: AtomicU64,
    pub(crate) refused: AtomicU64,
    pub(crate) unauthorized: AtomicU64,
    pub(crate) dropped: AtomicU64,
}

impl ServerStats {
    /// Clients connected now.
    pub fn connected(&self) -> u64 {
        self.connected.load(Ordering::Relaxed)
    }

    /// Streams served since start.
    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Relaxed)
    }

    /// Connections refused because every client slot was taken.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Connections refused because their client's user and groups are not allowed.
    pub fn unauthorized(&self) -> u64 {
        self.unauthorized.load(Ordering::Relaxed)
    }

    /// Connections cut because their client stopped reading or opened no stream.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }
}

/// Counts a connected client while alive.
pub struct Connected(Arc<ServerStats>);

impl Connected {
    pub(crate) fn new(stats: &Arc<ServerStats>) -> Self {
        stats.connected.fetch_add(1, Ordering::Relaxed);
        stats.streams.fetch_add(1, Ordering::Relaxed);
        Connected(stats.clone())
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.connected.fetch_sub(1, Ordering::Relaxed);
    }
}
