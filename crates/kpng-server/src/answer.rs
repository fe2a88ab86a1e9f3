//! [`Answers`]: the server side of one pull-based watch stream, as a stream of frames.
//!
//! The client sends a request each time it is ready; the stream then waits until the feed
//! holds something the client has not seen, and yields it frame by frame, then `Sync`.
//! Nothing is buffered per client: frames are read from the shared log or snapshot as the
//! connection asks for them, so a client that stops reading holds a cursor, not a copy of
//! the state. Its [`Progress`] tells the connection's watchdog whether it is stuck.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio_stream::Stream;
use tokio_stream::wrappers::WatchStream;
use tonic::{Status, Streaming};

use crate::counters::Connected;
use crate::feed::{Answer, Content, Feed, Version};
use crate::frame::Frame;

/// Milliseconds since the first call: a clock that fits in an atomic.
pub(crate) fn now_ms() -> u64 {
    static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    START.get_or_init(Instant::now).elapsed().as_millis() as u64 + 1
}

/// Whether a stream is in the middle of an answer, and how many frames it has handed to
/// the connection. The stream only counts (one relaxed add per frame); the watchdog, which
/// looks a few times per timeout, notices when the count stands still during an answer.
#[derive(Debug, Default)]
pub struct Progress {
    answering: AtomicBool,
    frames: AtomicU64,
    /// The watchdog's last look: the count it saw, and since when (ms, [`now_ms`]).
    seen: Mutex<(u64, u64)>,
}

impl Progress {
    /// Milliseconds the answer in progress has not moved, as of `now`; `None` without an
    /// answer in progress.
    pub fn stalled_for(&self, now: u64) -> Option<u64> {
        let frames = self.frames.load(Ordering::Relaxed);
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        if !self.answering.load(Ordering::Relaxed) || seen.0 != frames || seen.1 == 0 {
            *seen = (frames, now);
            return self.answering.load(Ordering::Relaxed).then_some(0);
        }
        Some(now.saturating_sub(seen.1))
    }

    fn moved(&self) {
        self.frames.fetch_add(1, Ordering::Relaxed);
    }

    fn started(&self) {
        self.answering.store(true, Ordering::Relaxed);
        self.moved();
    }

    fn done(&self) {
        self.answering.store(false, Ordering::Relaxed);
    }
}

enum State<Cursor> {
    /// Waiting for something the client has not seen, then for its request (`asked`: the
    /// request came already). A client asks again as soon as it has an answer, long before
    /// there is anything new, so its request alone does not wake the stream: the stream
    /// looks for it once there is something to send.
    Wait {
        /// The client has asked.
        asked: bool,
    },
    /// Sending an answer (then `Sync`), which brings the client to this version.
    Send(Answer<Cursor>, u64),
    /// Over.
    Done,
}

/// The frames of one stream, answering the requests in `requests`.
///
/// A client that goes away while its stream waits is noticed by the transport (its
/// connection closes or it resets the stream), which drops the stream; one that only
/// closes its side of the stream ends it at the next change.
pub struct Answers<C: Content, R> {
    feed: Arc<Feed<C>>,
    requests: Streaming<R>,
    versions: WatchStream<Version>,
    sent: Option<u64>,
    state: State<C::Cursor>,
    with_node: bool,
    progress: Arc<Progress>,
    _client: Connected,
}

impl<C: Content, R> Answers<C, R> {
    /// The stream of a client whose first request has been read: it is answered as soon
    /// as the feed has a state. Node items go only to a client that asked `with_node`.
    pub fn new(
        feed: Arc<Feed<C>>,
        requests: Streaming<R>,
        with_node: bool,
        progress: Arc<Progress>,
        client: Connected,
    ) -> Self {
        let versions = WatchStream::new(feed.subscribe());
        Answers {
            feed,
            requests,
            versions,
            sent: None,
            state: State::Wait { asked: true },
            with_node,
            progress,
            _client: client,
        }
    }

    /// Whether the feed holds something the client has not seen (`Ok`), or the store
    /// closed (`Err`, to send).
    fn poll_news(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Status>> {
        let closed = || Poll::Ready(Err(Status::unavailable("the server's store closed")));
        loop {
            let version = self.feed.current();
            if version.closed {
                return closed();
            }
            if version.number > 0 && Some(version.number) != self.sent {
                return Poll::Ready(Ok(()));
            }
            match Pin::new(&mut self.versions).poll_next(cx) {
                Poll::Ready(Some(_)) => continue,
                Poll::Ready(None) => return closed(),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<C: Content, R> Stream for Answers<C, R>
where
    Streaming<R>: Stream<Item = Result<R, Status>>,
    C::Cursor: Unpin,
{
    type Item = Result<Frame, Status>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            match &mut this.state {
                State::Done => return Poll::Ready(None),
                State::Wait { asked } => {
                    let asked = *asked;
                    match this.poll_news(cx) {
                        Poll::Ready(Ok(())) => {}
                        Poll::Ready(Err(status)) => {
                            this.state = State::Done;
                            return Poll::Ready(Some(Err(status)));
                        }
                        Poll::Pending => return Poll::Pending,
                    }
                    if !asked {
                        match Pin::new(&mut this.requests).poll_next(cx) {
                            Poll::Ready(Some(Ok(_))) => {}
                            Poll::Ready(_) => {
                                this.state = State::Done;
                                return Poll::Ready(None);
                            }
                            Poll::Pending => {
                                this.state = State::Wait { asked: false };
                                return Poll::Pending;
                            }
                        }
                    }
                    let (number, answer) = this.feed.lock().since(this.sent);
                    this.state = State::Send(answer, number);
                    this.progress.started();
                }
                State::Send(answer, version) => {
                    let with_node = this.with_node;
                    if let Some(frame) = answer.find(|f| with_node || !f.is_node()) {
                        this.progress.moved();
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    this.sent = Some(*version);
                    this.state = State::Wait { asked: false };
                    this.progress.done();
                    return Poll::Ready(Some(Ok(Frame::sync())));
                }
            }
        }
    }
}
