//! The to-api server's connections: a cap on how many ([`Admission`]), and a watchdog that
//! closes those that hold a slot without using it.
//!
//! Each accepted connection is wrapped in a [`Guarded`] stream that holds its slot until it
//! closes and can be cut from outside: the watchdog sets its switch and wakes its reader,
//! whose next read fails, so the HTTP/2 connection ends and every stream on it is dropped.
//! A connection is cut when one of its streams has had an answer under way without the
//! client taking any of it for longer than the client timeout (the client stopped
//! reading), or when it has carried no stream for that long (nothing to serve).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use kpng_api::peer::Credentials;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::answer::{Progress, now_ms};
use crate::counters::ServerStats;
use crate::throttle::Throttle;

/// One client connection, as its streams and the watchdog see it.
#[derive(Debug, Clone)]
pub struct Connection(Arc<State>);

#[derive(Debug, Default)]
struct State {
    /// The client's credentials, on a Unix socket.
    credentials: Option<Credentials>,
    cut: AtomicBool,
    reader: Mutex<Option<Waker>>,
    streams: Mutex<Vec<Weak<Progress>>>,
    /// Since when the connection has had no stream (ms, [`now_ms`]); 0 while it has one.
    idle_since: AtomicU64,
}

impl Connection {
    fn new(credentials: Option<Credentials>) -> Self {
        let state = State { credentials, idle_since: AtomicU64::new(now_ms()), ..State::default() };
        Connection(Arc::new(state))
    }

    /// The client's credentials, when it connected on a Unix socket.
    pub fn credentials(&self) -> Option<&Credentials> {
        self.0.credentials.as_ref()
    }

    /// Registers a stream opened on this connection; the watchdog follows its progress.
    pub fn track(&self) -> Arc<Progress> {
        let progress = Arc::new(Progress::default());
        let mut streams = self.0.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.push(Arc::downgrade(&progress));
        self.0.idle_since.store(0, Ordering::Relaxed);
        progress
    }

    /// Why the connection should be cut now, if it should.
    fn verdict(&self, now: u64, timeout: u64) -> Option<&'static str> {
        let mut streams = self.0.streams.lock().unwrap_or_else(|e| e.into_inner());
        streams.retain(|s| s.strong_count() > 0);
        if streams.is_empty() {
            let since = self.0.idle_since.load(Ordering::Relaxed);
            if since == 0 {
                self.0.idle_since.store(now, Ordering::Relaxed);
                return None;
            }
            return (now.saturating_sub(since) > timeout).then_some("it opened no stream");
        }
        let stalled = streams
            .iter()
            .filter_map(Weak::upgrade)
            .any(|p| p.stalled_for(now).is_some_and(|ms| ms > timeout));
        stalled.then_some("it stopped reading its answer")
    }

    fn cut(&self) {
        self.0.cut.store(true, Ordering::Relaxed);
        if let Some(waker) = self.0.reader.lock().unwrap_or_else(|e| e.into_inner()).take() {
            waker.wake();
        }
    }

    fn is_cut(&self) -> bool {
        self.0.cut.load(Ordering::Relaxed)
    }
}

/// Admits connections up to a maximum and watches them.
#[derive(Debug)]
pub struct Admission {
    slots: Arc<Semaphore>,
    max: usize,
    timeout: Duration,
    connections: Mutex<Vec<Weak<State>>>,
    stats: Arc<ServerStats>,
    full: Throttle,
    /// The server, as logs name it.
    what: &'static str,
}

impl Admission {
    /// At most `max` connections of the server logs call `what`; a stuck or idle one is
    /// cut after `timeout`.
    pub fn new(
        max: usize,
        timeout: Duration,
        stats: Arc<ServerStats>,
        what: &'static str,
    ) -> Arc<Self> {
        Arc::new(Admission {
            slots: Arc::new(Semaphore::new(max.max(1))),
            max,
            timeout,
            connections: Mutex::new(Vec::new()),
            stats,
            full: Throttle::new(10_000),
            what,
        })
    }

    /// Wraps a new connection (of a client with these credentials, on a Unix socket), or
    /// refuses it (`None`: close it) when all slots are taken.
    pub fn admit<IO>(&self, io: IO, credentials: Option<Credentials>) -> Option<Guarded<IO>> {
        let Ok(slot) = self.slots.clone().try_acquire_owned() else {
            self.stats.refused.fetch_add(1, Ordering::Relaxed);
            if self.full.occur().is_some() {
                tracing::warn!(
                    max_clients = self.max,
                    "{}: client refused: every client slot is taken",
                    self.what
                );
            }
            return None;
        };
        let connection = Connection::new(credentials);
        let mut connections = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        connections.retain(|c| c.strong_count() > 0);
        connections.push(Arc::downgrade(&connection.0));
        Some(Guarded { io, connection, _slot: slot })
    }

    /// Cuts every connection (the server stops): streams that last (node watches, an
    /// aggregator's producers) would otherwise hold a graceful shutdown forever.
    pub fn cut_all(&self) {
        for connection in self.live() {
            connection.cut();
        }
    }

    /// The connections still open (those closed are forgotten).
    fn live(&self) -> Vec<Connection> {
        let mut all = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        all.retain(|c| c.strong_count() > 0);
        all.iter().filter_map(Weak::upgrade).map(Connection).collect()
    }

    /// Cuts stuck and idle connections, checking a few times per timeout; never returns.
    pub async fn watch(&self) {
        let period = (self.timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        let timeout = self.timeout.as_millis() as u64;
        loop {
            tokio::time::sleep(period).await;
            let now = now_ms();
            for connection in self.live().iter().filter(|c| !c.is_cut()) {
                if let Some(reason) = connection.verdict(now, timeout) {
                    self.stats.dropped.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(timeout = ?self.timeout, "{}: client dropped: {reason}", self.what);
                    connection.cut();
                }
            }
        }
    }
}

/// A connection's byte stream, holding its slot, that fails once cut.
#[derive(Debug)]
pub struct Guarded<IO> {
    io: IO,
    connection: Connection,
    _slot: OwnedSemaphorePermit,
}

fn cut_error() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "connection cut by the server (idle, stuck, or stopping)",
    )
}

impl<IO: AsyncRead + Unpin> AsyncRead for Guarded<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.connection.is_cut() {
            return Poll::Ready(Err(cut_error()));
        }
        {
            let mut reader = self.connection.0.reader.lock().unwrap_or_else(|e| e.into_inner());
            if !reader.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *reader = Some(cx.waker().clone());
            }
        }
        // Cut between the check and the registration: the waker was not there to wake.
        if self.connection.is_cut() {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Guarded<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.connection.is_cut() {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if self.connection.is_cut() {
            return Poll::Ready(Err(cut_error()));
        }
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl<IO> tonic::transport::server::Connected for Guarded<IO> {
    type ConnectInfo = Connection;

    fn connect_info(&self) -> Connection {
        self.connection.clone()
    }
}

/// The connection a request arrived on (plain or under TLS).
pub fn of_request<T>(request: &tonic::Request<T>) -> Option<Connection> {
    of_extensions(request.extensions())
}

/// The connection a request with these extensions came on, when the server tracks it.
pub fn of_extensions(extensions: &http::Extensions) -> Option<Connection> {
    use tonic::transport::server::TlsConnectInfo;
    extensions.get::<Connection>().cloned().or_else(|| {
        extensions.get::<TlsConnectInfo<Connection>>().map(|info| info.get_ref().clone())
    })
}
