//! [`Stop`]: how a process that is shutting down tells its runner to apply nothing more.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Tells a runner to apply nothing more: checked before each backend's change set, so a
/// process that is shutting down stops between two kernel transactions. Clones share the
/// flag.
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// A flag not set yet.
    pub fn new() -> Self {
        Stop::default()
    }

    /// Sets the flag.
    pub fn stop(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    /// Whether the flag is set.
    pub fn is_stopped(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}
