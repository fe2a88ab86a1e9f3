//! Client-side pacing of API requests (`--kube-api-qps`, `--kube-api-burst`): a token
//! bucket shared by every kind's list/watch loop, so a node relisting after an API server
//! restart does not add to the storm.
//!
//! A request is one list (however many pages it takes: a paginated list costs the server
//! what one unpaginated list does, and client-go's reflector lists from the watch cache in
//! one request) or one watch. Watches are long-lived, so in steady state pacing costs
//! nothing.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A token bucket: `burst` tokens, refilled at `qps` per second.
#[derive(Debug, Clone)]
pub struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket at `now`.
    pub fn new(qps: f64, burst: u32, now: Instant) -> Bucket {
        let burst = f64::from(burst.max(1));
        Bucket { qps, burst, tokens: burst, at: now }
    }

    /// Takes a token at `now`, or says how long until one is available.
    pub fn take(&mut self, now: Instant) -> Result<(), Duration> {
        let elapsed = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.at = now.max(self.at);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64((1.0 - self.tokens) / self.qps))
        }
    }
}

/// The pacing of one source's requests: unlimited, or a shared [`Bucket`].
#[derive(Debug, Clone, Default)]
pub struct Pacer(Option<Arc<Mutex<Bucket>>>);

impl Pacer {
    /// No limit.
    pub fn unlimited() -> Pacer {
        Pacer(None)
    }

    /// `qps` requests per second on average, `burst` at once (`qps` 0: no limit).
    pub fn new(qps: f64, burst: u32) -> Pacer {
        match qps > 0.0 {
            true => Pacer(Some(Arc::new(Mutex::new(Bucket::new(qps, burst, now()))))),
            false => Pacer(None),
        }
    }

    /// Waits for a token.
    pub async fn wait(&self) {
        let Some(bucket) = &self.0 else { return };
        loop {
            let taken = bucket.lock().unwrap_or_else(|e| e.into_inner()).take(now());
            match taken {
                Ok(()) => return,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }
}

/// Now, on Tokio's clock (so that tests on paused time see the bucket refill).
fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bursts_then_paces_at_the_rate() {
        let t0 = Instant::now();
        let mut bucket = Bucket::new(2.0, 3, t0);
        assert!((0..3).all(|_| bucket.take(t0).is_ok()), "the burst is available at once");
        let wait = bucket.take(t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500), "one token every 1/qps");
        assert!(bucket.take(t0 + Duration::from_millis(400)).is_err());
        assert!(bucket.take(t0 + Duration::from_millis(600)).is_ok());
        // A long idle period refills to the burst, not beyond.
        let later = t0 + Duration::from_secs(60);
        assert!((0..3).all(|_| bucket.take(later).is_ok()));
        assert!(bucket.take(later).is_err());
    }

    #[tokio::test(start_paused = true)]
    async fn a_pacer_waits_for_tokens() {
        let pacer = Pacer::new(10.0, 2);
        let start = tokio::time::Instant::now();
        for _ in 0..4 {
            pacer.wait().await;
        }
        // Two at once, then one every 100 ms (paused time moves only when all wait).
        assert!(start.elapsed() >= Duration::from_millis(150), "{:?}", start.elapsed());
    }
}
