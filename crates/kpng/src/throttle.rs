//! Client-side rate limiting of API requests (`--kube-api-qps`, `--kube-api-burst`): a
//! token bucket in front of the Kubernetes client, so a mass relist after an API server
//! restart does not hammer it. Watches are long-lived requests and each costs one token
//! when it starts.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
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

/// The layer to put in front of the client's HTTP service.
#[derive(Debug, Clone)]
pub struct ThrottleLayer {
    qps: f64,
    burst: u32,
}

impl ThrottleLayer {
    /// `qps` requests per second on average, `burst` at once.
    pub fn new(qps: f64, burst: u32) -> ThrottleLayer {
        ThrottleLayer { qps, burst }
    }
}

impl<S> tower::Layer<S> for ThrottleLayer {
    type Service = Throttle<S>;

    fn layer(&self, inner: S) -> Throttle<S> {
        Throttle {
            inner,
            bucket: Bucket::new(self.qps, self.burst, Instant::now()),
            taken: false,
            sleep: None,
        }
    }
}

/// A service that waits for a token before each request.
pub struct Throttle<S> {
    inner: S,
    bucket: Bucket,
    /// A token taken for the next call.
    taken: bool,
    sleep: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S: tower::Service<R>, R> tower::Service<R> for Throttle<S> {
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        while !self.taken {
            if let Some(sleep) = self.sleep.as_mut() {
                if sleep.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                self.sleep = None;
            }
            match self.bucket.take(Instant::now()) {
                Ok(()) => self.taken = true,
                Err(wait) => self.sleep = Some(Box::pin(tokio::time::sleep(wait))),
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        self.taken = false;
        self.inner.call(request)
    }
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
}
