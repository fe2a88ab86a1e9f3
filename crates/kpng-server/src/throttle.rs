//! [`Throttle`]: a warning said at most once per period, with how many times it happened
//! since it was last said, so that a peer that keeps provoking it cannot fill the log.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

/// Occurrences of one warning and when it was last said.
#[derive(Debug)]
pub struct Throttle {
    period_ms: u64,
    /// When the warning was last said (ms since the first throttle's first use), 0 never.
    said_at: AtomicU64,
    /// Occurrences since it was last said.
    since: AtomicU64,
    /// Serializes the decision, so that two threads never both say it.
    deciding: Mutex<()>,
}

impl Throttle {
    /// A warning said at most every `period_ms` milliseconds.
    pub const fn new(period_ms: u64) -> Self {
        Throttle {
            period_ms,
            said_at: AtomicU64::new(0),
            since: AtomicU64::new(0),
            deciding: Mutex::new(()),
        }
    }

    /// Counts one occurrence; `Some(n)` when the warning is to be said now, `n` being the
    /// occurrences since it was last said (this one included).
    pub fn occur(&self) -> Option<u64> {
        let _deciding = self.deciding.lock().unwrap_or_else(|e| e.into_inner());
        let count = self.since.fetch_add(1, Ordering::Relaxed) + 1;
        let now = now_ms();
        let last = self.said_at.load(Ordering::Relaxed);
        if last != 0 && now.saturating_sub(last) <= self.period_ms {
            return None;
        }
        self.said_at.store(now, Ordering::Relaxed);
        self.since.store(0, Ordering::Relaxed);
        Some(count)
    }
}

/// Milliseconds since the first call, from 1.
fn now_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn said_once_per_period_with_the_count_since() {
        let throttle = Throttle::new(60_000);
        assert_eq!(throttle.occur(), Some(1), "the first is said");
        assert_eq!(throttle.occur(), None);
        assert_eq!(throttle.occur(), None);
        let soon = Throttle::new(0);
        assert_eq!(soon.occur(), Some(1));
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(soon.occur(), Some(1), "a period later it is said again");
        assert_eq!(throttle.since.load(Ordering::Relaxed), 2, "counted meanwhile");
    }
}
