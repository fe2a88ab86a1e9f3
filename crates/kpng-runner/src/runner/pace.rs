//! [`Pace`]: when the next sync may start.

use std::time::Duration;

use tokio::time::Instant;

use super::SYNC_BURST;

/// Shortest sync after which the runner rests before the next one. A sync this long is a
/// large share of the time under a storm of changes: resting as long as it took holds the
/// runner to half a core, and the changes that arrive meanwhile coalesce into the next
/// sync. Shorter syncs (a change set is about 0.1 ms) follow each other at once.
pub const REST_AFTER: Duration = Duration::from_millis(2);

/// The longest rest: a one-off long sync (the whole state at start-up, seconds at 30k
/// services) must not hold back the change after it for as long.
pub const REST_MAX: Duration = Duration::from_millis(100);

/// When the next sync may start: a token bucket of [`SYNC_BURST`] syncs at once, then one
/// per `period` (none with a zero period), and a rest after a long sync ([`REST_AFTER`]).
///
/// The runner's policy, public so that whatever else batches kernel work (the nftables
/// aggregator) paces it the same way: [`ready`](Pace::ready), [`spend`](Pace::spend), do
/// the work, [`finished`](Pace::finished) with how long it took.
#[derive(Debug)]
pub struct Pace {
    pub(super) period: Duration,
    pub(super) tokens: f64,
    pub(super) at: Instant,
    pub(super) rest_until: Option<Instant>,
}

impl Pace {
    /// A pace of one sync per `period` after a burst of [`SYNC_BURST`] (zero: no limit).
    pub fn new(period: Duration) -> Self {
        Pace { period, tokens: SYNC_BURST, at: Instant::now(), rest_until: None }
    }

    /// When the next sync may start (now if a token is left and no rest is due).
    #[allow(clippy::should_implement_trait)] // Not an iterator: it never ends.
    pub fn next(&mut self) -> Instant {
        let now = Instant::now();
        let rested = self.rest_until.filter(|&until| until > now).unwrap_or(now);
        if self.period.is_zero() {
            return rested;
        }
        let refill = now.duration_since(self.at).as_secs_f64() / self.period.as_secs_f64();
        self.tokens = (self.tokens + refill).min(SYNC_BURST);
        self.at = now;
        let paced =
            if self.tokens >= 1.0 { now } else { now + self.period.mul_f64(1.0 - self.tokens) };
        paced.max(rested)
    }

    /// Records how long a sync took: after a long one the next waits as long, at most
    /// [`REST_MAX`].
    pub fn finished(&mut self, took: Duration) {
        self.rest_until = (took >= REST_AFTER).then(|| Instant::now() + took.min(REST_MAX));
    }

    /// Waits until the next sync may start. With a token left it returns at once: a
    /// timer, even one already due, would wait for the timer's next tick (up to 1 ms).
    pub async fn ready(&mut self) {
        let at = self.next();
        if at > Instant::now() {
            tokio::time::sleep_until(at).await;
        }
    }

    /// Spends a token for a sync that starts now.
    pub fn spend(&mut self) {
        if !self.period.is_zero() {
            let _ = self.next();
            self.tokens -= 1.0;
        }
    }
}
