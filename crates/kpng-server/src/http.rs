//! The HTTP servers' common ground: serving a router on a listener within [`HttpLimits`],
//! and binding with retries whose failures [`BindProblems`] keeps for `/readyz`.
//!
//! The health port is reachable from the whole cluster (and health-check NodePorts from
//! outside it), so a client must not be able to hold what the proxy needs. Every HTTP
//! server of the process draws its connections from one budget, well below the
//! descriptor limit; a client has [`HEADER_TIMEOUT`] to send a request's head, and a
//! kept-alive connection as long to send the next. When the budget is spent, a new
//! connection takes the place of the connection that has waited longest without a request
//! in progress (a slow or idle client), so a prompt client such as a load balancer's
//! probe is served even while many slow ones hold connections.

use std::collections::BTreeMap;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// How long a client may take to send a request's head, and how long a kept-alive
/// connection may wait for its next request.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// How often an address that cannot be bound is tried again.
pub const BIND_RETRY: Duration = Duration::from_secs(5);

/// The connections all HTTP servers of a process may hold together, and how long a client
/// may take to send a request's head. Clones share the budget.
#[derive(Debug, Clone)]
pub struct HttpLimits {
    budget: Arc<Budget>,
    header_timeout: Duration,
}

#[derive(Debug)]
struct Budget {
    max: usize,
    slots: Mutex<Slots>,
    freed: Notify,
    evicted: AtomicU64,
}

#[derive(Debug, Default)]
struct Slots {
    open: usize,
    /// Connections told to close to make room, not closed yet: the room is coming.
    closing: usize,
    next_id: u64,
    /// Connections without a request in progress, by when they became so.
    idle: BTreeMap<(Instant, u64), Weak<Held>>,
}

impl HttpLimits {
    /// At most `max_connections` connections (at least 1) over every server sharing these
    /// limits; `header_timeout` to send a request's head.
    pub fn new(max_connections: usize, header_timeout: Duration) -> Self {
        let budget = Budget {
            max: max_connections.max(1),
            slots: Mutex::default(),
            freed: Notify::new(),
            evicted: AtomicU64::new(0),
        };
        HttpLimits { budget: Arc::new(budget), header_timeout }
    }

    /// The most connections held at once.
    pub fn max_connections(&self) -> usize {
        self.budget.max
    }

    /// Connections held now.
    pub fn open_connections(&self) -> usize {
        self.budget.lock().open
    }

    /// Connections closed to make room for a new one.
    pub fn evicted(&self) -> u64 {
        self.budget.evicted.load(Ordering::Relaxed)
    }
}

impl Budget {
    fn lock(&self) -> std::sync::MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A slot for a new connection: a free one, or the one of the connection that has
    /// waited longest without a request (closed for it), or the next one freed.
    async fn admit(self: &Arc<Self>) -> Arc<Held> {
        loop {
            let freed = self.freed.notified();
            // Dropped once the lock is released: it may be the last reference, and a
            // slot's drop takes the lock.
            let evicted = {
                let mut slots = self.lock();
                if slots.open < self.max {
                    slots.open += 1;
                    slots.next_id += 1;
                    let held = Arc::new(Held {
                        id: slots.next_id,
                        budget: self.clone(),
                        close: Notify::new(),
                        idle_since: Mutex::new(None),
                        evicted: AtomicBool::new(false),
                    });
                    held.set_idle(&mut slots, true);
                    return held;
                }
                // One connection closing at a time: room comes when it has closed.
                match slots.closing {
                    0 => self.evict_oldest(&mut slots),
                    _ => None,
                }
            };
            if let Some(evicted) = evicted {
                evicted.close.notify_one();
                self.evicted.fetch_add(1, Ordering::Relaxed);
            }
            freed.await;
        }
    }

    /// Marks the connection that has waited longest without a request as closing.
    fn evict_oldest(&self, slots: &mut Slots) -> Option<Arc<Held>> {
        while let Some((_, oldest)) = slots.idle.pop_first() {
            if let Some(oldest) = oldest.upgrade() {
                *oldest.idle_since.lock().unwrap_or_else(|e| e.into_inner()) = None;
                oldest.evicted.store(true, Ordering::Relaxed);
                slots.closing += 1;
                return Some(oldest);
            }
        }
        None
    }
}

/// A connection's slot: returned to the budget when dropped.
#[derive(Debug)]
struct Held {
    id: u64,
    budget: Arc<Budget>,
    /// Told when the connection must close to make room.
    close: Notify,
    idle_since: Mutex<Option<Instant>>,
    /// Told to close (counted in [`Slots::closing`] until dropped).
    evicted: AtomicBool,
}

impl Held {
    /// Marks the connection as waiting for a request (evictable) or serving one.
    fn set_idle(self: &Arc<Self>, slots: &mut Slots, idle: bool) {
        let mut since = self.idle_since.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(at) = since.take() {
            slots.idle.remove(&(at, self.id));
        }
        // A connection told to close is not offered again.
        if idle && !self.evicted.load(Ordering::Relaxed) {
            let now = Instant::now();
            slots.idle.insert((now, self.id), Arc::downgrade(self));
            *since = Some(now);
        }
    }

    fn mark(self: &Arc<Self>, idle: bool) {
        let mut slots = self.budget.lock();
        self.set_idle(&mut slots, idle);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        let mut slots = self.budget.lock();
        if let Some(at) = self.idle_since.get_mut().unwrap_or_else(|e| e.into_inner()).take() {
            slots.idle.remove(&(at, self.id));
        }
        slots.open -= 1;
        if *self.evicted.get_mut() {
            slots.closing -= 1;
        }
        drop(slots);
        self.budget.freed.notify_one();
    }
}

/// Serves `router` on `listener` within `limits`, until the task is dropped. An accept
/// that fails (no descriptor left, for instance) is logged and retried after a pause.
pub async fn serve_http(
    name: &'static str,
    listener: TcpListener,
    router: Router,
    limits: HttpLimits,
) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(server = name, %error, "accepting a connection failed; retrying in 100 ms");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let held = limits.budget.admit().await;
        let (router, timeout) = (router.clone(), limits.header_timeout);
        tokio::spawn(connection(stream, router, held, timeout));
    }
}

/// Serves one connection until it ends, times out, or is closed to make room.
async fn connection(
    stream: tokio::net::TcpStream,
    router: Router,
    held: Arc<Held>,
    timeout: Duration,
) {
    let slot = held.clone();
    let service =
        hyper::service::service_fn(move |request: http::Request<hyper::body::Incoming>| {
            let (router, held) = (router.clone(), slot.clone());
            async move {
                held.mark(false);
                let response = tower::ServiceExt::oneshot(router, request).await;
                held.mark(true);
                response
            }
        });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder.timer(TokioTimer::new()).header_read_timeout(timeout);
    let served = builder.serve_connection(TokioIo::new(stream), service);
    tokio::select! {
        result = served => if let Err(error) = result {
            tracing::debug!(%error, "HTTP connection ended");
        },
        () = held.close.notified() => tracing::debug!("HTTP connection closed to make room"),
    }
}

/// Addresses that cannot be bound now, and why; `/readyz` names them.
#[derive(Debug, Clone, Default)]
pub struct BindProblems(Arc<Mutex<BTreeMap<SocketAddr, String>>>);

impl BindProblems {
    /// `address` cannot be bound, because of `problem`.
    pub fn report(&self, address: SocketAddr, problem: String) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(address, problem);
    }

    /// `address` is bound, or no longer wanted.
    pub fn clear(&self, address: SocketAddr) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).remove(&address);
    }

    /// Every address that cannot be bound, with why.
    pub fn list(&self) -> Vec<(SocketAddr, String)> {
        let problems = self.0.lock().unwrap_or_else(|e| e.into_inner());
        problems.iter().map(|(a, p)| (*a, p.clone())).collect()
    }
}

/// Opens a listening socket on an address: the system's (see [`system_binder`]), or a
/// test's that hands out sockets it bound beforehand.
pub type Binder = Arc<dyn Fn(SocketAddr) -> io::Result<std::net::TcpListener> + Send + Sync>;

/// Binds with the operating system.
pub fn system_binder() -> Binder {
    Arc::new(std::net::TcpListener::bind)
}

/// Binds `address` for server `name`, trying again every [`BIND_RETRY`] while it cannot:
/// each failure is logged and kept in `problems` until the bind succeeds (or the future is
/// dropped, which clears it too).
pub async fn bind_retrying(
    name: &str,
    address: SocketAddr,
    problems: &BindProblems,
    bind: &Binder,
) -> TcpListener {
    let reported = Reported { problems, address };
    loop {
        let bound = bind(address).and_then(|listener| {
            listener.set_nonblocking(true)?;
            TcpListener::from_std(listener)
        });
        match bound {
            Ok(listener) => {
                drop(reported);
                tracing::info!(server = name, %address, "listening");
                return listener;
            }
            Err(error) => {
                tracing::error!(server = name, %address, %error, "cannot listen; retrying in 5 s");
                reported.problems.report(address, format!("{name}: {error}"));
            }
        }
        tokio::time::sleep(BIND_RETRY).await;
    }
}

/// Clears a reported address when dropped.
struct Reported<'a> {
    problems: &'a BindProblems,
    address: SocketAddr,
}

impl Drop for Reported<'_> {
    fn drop(&mut self) {
        self.problems.clear(self.address);
    }
}

#[cfg(test)]
mod tests;
