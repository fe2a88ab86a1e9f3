//! [`Pace`]: when the next batch of kernel work may start. The runner paces backends' change
//! sets with it, and the nftables aggregator its commits: one policy for both.

use std::time::Duration;

use tokio::time::Instant;

/// Syncs allowed back to back before a period paces them.
pub const SYNC_BURST: f64 = 2.0;

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
/// Whoever batches kernel work paces it this way: [`ready`](Pace::ready),
/// [`spend`](Pace::spend), do the work, [`finished`](Pace::finished) with how long it took.
#[derive(Debug)]
pub struct Pace {
    period: Duration,
    tokens: f64,
    at: Instant,
    rest_until: Option<Instant>,
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

#[cfg(test)]
mod tests {
    use std::future::Future;

    use super::*;

    #[tokio::test]
    async fn a_sync_with_a_token_left_starts_without_waiting_for_a_timer_tick() {
        let mut pace = Pace::new(Duration::from_secs(1));
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut ready = std::pin::pin!(pace.ready());
        assert!(ready.as_mut().poll(&mut cx).is_ready(), "a token was left: no wait");

        // Without tokens the sync waits for the refill.
        let mut pace = Pace { tokens: 0.0, ..Pace::new(Duration::from_secs(1)) };
        let mut ready = std::pin::pin!(pace.ready());
        assert!(ready.as_mut().poll(&mut cx).is_pending(), "no token: wait for the refill");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_min_sync_period_only_a_long_sync_makes_the_next_wait() {
        let mut pace = Pace::new(Duration::ZERO);
        for _ in 0..10 {
            assert_eq!(pace.next(), Instant::now(), "short syncs follow each other at once");
            pace.spend();
            pace.finished(Duration::from_micros(150));
        }
        pace.finished(Duration::from_millis(40));
        assert_eq!(pace.next(), Instant::now() + Duration::from_millis(40), "rests as long");
        tokio::time::sleep(Duration::from_millis(25)).await;
        assert_eq!(pace.next(), Instant::now() + Duration::from_millis(15));
        tokio::time::sleep(Duration::from_millis(15)).await;
        assert_eq!(pace.next(), Instant::now());
    }

    #[tokio::test(start_paused = true)]
    async fn a_rest_and_a_min_sync_period_both_hold() {
        let mut pace = Pace::new(Duration::from_millis(50));
        pace.spend();
        pace.spend();
        pace.finished(Duration::from_millis(80));
        let now = Instant::now();
        assert_eq!(pace.next(), now + Duration::from_millis(80), "the rest is the longer wait");
        tokio::time::sleep(Duration::from_millis(80)).await;
        assert_eq!(pace.next(), Instant::now(), "tokens refilled meanwhile");
    }

    #[tokio::test(start_paused = true)]
    async fn a_one_off_long_sync_holds_back_the_next_change_briefly() {
        let mut pace = Pace::new(Duration::ZERO);
        // The whole state at start-up can take seconds at 30k services.
        pace.finished(Duration::from_secs(5));
        assert_eq!(pace.next(), Instant::now() + REST_MAX);
    }
}
