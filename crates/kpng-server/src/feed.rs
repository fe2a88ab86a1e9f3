//! [`Feed`]: one stream's content, kept current once per store revision and shared by
//! every client of that stream, with a bounded log of recent change sets.
//!
//! A client is answered from the log (the change sets since its previous answer) or, when
//! it is new or fell further behind than the log reaches, with `Reset` and the whole state
//! read through a cursor over the content's current snapshot. Nothing is copied per
//! client: log entries and snapshots are shared, frames are reference-counted bytes.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::watch;

use crate::frame::Frame;

/// Items kept in a feed's log; a client further behind gets the whole state again.
const LOG_ITEMS: usize = 16 * 1024;

/// What a feed serves.
pub trait Content: Send + 'static {
    /// Reads a whole state: `Reset` and every item. It holds what it reads (an `Arc` of a
    /// snapshot), so the content may move on meanwhile.
    type Cursor: Iterator<Item = Frame> + Send + 'static;

    /// A cursor over the current state.
    fn full(&mut self) -> Self::Cursor;
}

/// The published version of a feed: 0 before its first state; `closed` once the store is
/// gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Version {
    /// Increases with each change of the content.
    pub number: u64,
    /// The store is gone: no further version will come.
    pub closed: bool,
}

/// A feed's content and its recent change sets.
pub struct Log<C> {
    /// The content, at [`version`](Self::version).
    pub content: C,
    version: u64,
    entries: VecDeque<(u64, Arc<[Frame]>)>,
    items: usize,
}

impl<C: Content> Log<C> {
    /// The current version.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Records the change set that brought the content to a new state: a new version when
    /// it holds something, or when it is the first state. Returns the version.
    pub fn record(&mut self, frames: Vec<Frame>) -> u64 {
        if frames.is_empty() {
            if self.version == 0 {
                self.version = 1;
            }
            return self.version;
        }
        self.version += 1;
        self.items += frames.len();
        self.entries.push_back((self.version, frames.into()));
        while self.items > LOG_ITEMS && self.entries.len() > 1 {
            if let Some((_, dropped)) = self.entries.pop_front() {
                self.items -= dropped.len();
            }
        }
        self.version
    }

    /// The version and what brings a client from `sent` (none: nothing yet) to it: the
    /// logged change sets in order, or `Reset` and everything.
    pub fn since(&mut self, sent: Option<u64>) -> (u64, Answer<C::Cursor>) {
        if let Some(sent) = sent {
            let first = self.entries.front().map_or(self.version + 1, |(v, _)| *v);
            if sent + 1 >= first {
                let entries: Vec<Arc<[Frame]>> = self
                    .entries
                    .iter()
                    .filter(|(v, _)| *v > sent)
                    .map(|(_, frames)| frames.clone())
                    .collect();
                return (self.version, Answer::Changes { entries, entry: 0, item: 0 });
            }
        }
        (self.version, Answer::Full(self.content.full()))
    }
}

/// The frames of one answer (without the closing `Sync`).
pub enum Answer<Cursor> {
    /// `Reset` and the whole state.
    Full(Cursor),
    /// Logged change sets, in order.
    Changes {
        /// The change sets.
        entries: Vec<Arc<[Frame]>>,
        /// The change set being sent.
        entry: usize,
        /// The next item in it.
        item: usize,
    },
}

impl<Cursor: Iterator<Item = Frame>> Iterator for Answer<Cursor> {
    type Item = Frame;

    fn next(&mut self) -> Option<Frame> {
        match self {
            Answer::Full(cursor) => cursor.next(),
            Answer::Changes { entries, entry, item } => loop {
                let frames = entries.get(*entry)?;
                if let Some(frame) = frames.get(*item) {
                    *item += 1;
                    return Some(frame.clone());
                }
                *entry += 1;
                *item = 0;
            },
        }
    }
}

/// A shared stream content.
pub struct Feed<C> {
    log: Mutex<Log<C>>,
    version: watch::Sender<Version>,
}

impl<C: Content> Feed<C> {
    /// A feed of `content`, at version 0 (no state yet).
    pub fn new(content: C) -> Arc<Self> {
        let log = Log { content, version: 0, entries: VecDeque::new(), items: 0 };
        let (version, _) = watch::channel(Version { number: 0, closed: false });
        Arc::new(Feed { log: Mutex::new(log), version })
    }

    /// Watches the published version.
    pub fn subscribe(&self) -> watch::Receiver<Version> {
        self.version.subscribe()
    }

    /// The published version now.
    pub fn current(&self) -> Version {
        *self.version.borrow()
    }

    /// The log, locked.
    pub fn lock(&self) -> MutexGuard<'_, Log<C>> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Tells the clients that version `number` is there.
    pub fn publish(&self, number: u64) {
        self.version.send_if_modified(|v| {
            let changed = v.number != number;
            v.number = number;
            changed
        });
    }

    /// Tells the clients that no further version will come.
    pub fn close(&self) {
        self.version.send_modify(|v| v.closed = true);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Items(Vec<Frame>);

    impl Content for Items {
        type Cursor = std::iter::Chain<std::iter::Once<Frame>, std::vec::IntoIter<Frame>>;

        fn full(&mut self) -> Self::Cursor {
            std::iter::once(Frame::reset()).chain(self.0.clone())
        }
    }

    fn frame(n: i32) -> Frame {
        let reference = kpng_api::localv1::Ref { set: 1, path: n.to_string() };
        let op = kpng_api::localv1::op_item::Op::Delete(reference);
        Frame::of_item(&kpng_api::localv1::OpItem { op: Some(op) })
    }

    #[test]
    fn clients_get_the_log_or_the_whole_state() {
        let feed = Feed::new(Items(vec![frame(1)]));
        let mut log = feed.lock();
        assert_eq!(log.record(Vec::new()), 1, "the first state is a version");
        assert_eq!(log.record(Vec::new()), 1, "an empty change set is not");
        assert_eq!(log.record(vec![frame(2), frame(3)]), 2);
        assert_eq!(log.record(vec![frame(4)]), 3);
        let (v, answer) = log.since(Some(1));
        assert_eq!((v, answer.collect::<Vec<_>>()), (3, vec![frame(2), frame(3), frame(4)]));
        let (_, answer) = log.since(Some(2));
        assert_eq!(answer.collect::<Vec<_>>(), vec![frame(4)]);
        let (_, answer) = log.since(None);
        assert_eq!(answer.collect::<Vec<_>>(), vec![Frame::reset(), frame(1)]);
    }

    #[test]
    fn a_client_behind_the_log_gets_the_whole_state() {
        let feed = Feed::new(Items(Vec::new()));
        let mut log = feed.lock();
        log.record(Vec::new());
        for _ in 0..3 {
            log.record((0..LOG_ITEMS as i32 / 2 + 1).map(frame).collect());
        }
        let (v, answer) = log.since(Some(1));
        assert_eq!(v, 4);
        assert!(matches!(answer, Answer::Full(_)), "the oldest change sets were dropped");
        let (_, answer) = log.since(Some(3));
        assert_eq!(answer.count(), LOG_ITEMS / 2 + 1);
    }
}
