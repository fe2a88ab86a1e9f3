//! [`KindWatcher`]: the list/watch loop of one kind, as a state machine.
//!
//! ```text
//!            ┌──────── error: backoff ───────┐
//!            v                               │
//!   ──> List ──(pages streamed, then version)──> Watch(version) ──(410 Gone)──> List
//!        │                                        │  ^
//!        │ 403/404 on an optional kind            │  └── server closed the watch: again
//!        v                                        └── error: backoff, watch again
//!      Absent ──(a while later)──> List
//! ```
//!
//! A list announces itself ([`SourceEvent::ListStarted`]), sends each page's objects as
//! soon as the page is read (the next page is already being fetched), and ends with
//! [`SourceEvent::ListDone`], which lets the store delete what the list did not mention.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::time::{Duration, Instant};

use kpng_model::Kind;
use kpng_store::SourceEvent;
use tokio::sync::mpsc;

use super::decode::{Page, Reader, WatchEvent, event_key_hash, resource_version};
use super::pace::Pacer;
use super::request::{self, ApiError};
use super::resource::Resource;
use crate::convert::printable;

/// The server ends a watch after this long (kube-rs and client-go use about 5 minutes).
const WATCH_TIMEOUT_SECONDS: u32 = 290;
/// A watch that delivers nothing (not even a bookmark) for this long is abandoned.
const WATCH_IDLE: Duration = Duration::from_secs(WATCH_TIMEOUT_SECONDS as u64 + 30);
/// How often a kind the server does not serve is looked for again.
const ABSENT_RECHECK: Duration = Duration::from_secs(300);
/// Delays between failed attempts: from the first, doubling, to the last.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(500), Duration::from_secs(30));

/// Where a kind's loop is.
#[derive(Debug, Clone, PartialEq, Eq)]
enum State {
    /// List every object, then watch.
    List,
    /// Watch from this resource version.
    Watch(String),
    /// The server does not serve the kind, or may not be read: it has no objects.
    Absent,
}

/// How a watch ended without an error.
enum WatchEnd {
    /// The server closed it; continue from this version.
    Closed { version: String, delivered: bool },
    /// The version is too old (410 Gone): list again.
    Expired,
}

/// Why a list stopped.
enum ListError {
    /// The store is gone.
    Closed,
    /// A request failed.
    Api(ApiError),
}

/// The list/watch loop of one kind.
pub struct KindWatcher {
    client: kube::Client,
    resource: Resource,
    /// The resource as first asked for: its newest version, tried again after an absence.
    newest: Resource,
    reader: Reader,
    pacer: Pacer,
    events: mpsc::Sender<Vec<SourceEvent>>,
    page_size: usize,
    backoff: Duration,
}

impl KindWatcher {
    /// A loop for `resource`, reading objects with `reader` and sending store events.
    pub fn new(
        client: kube::Client,
        resource: Resource,
        reader: Reader,
        pacer: Pacer,
        events: mpsc::Sender<Vec<SourceEvent>>,
        page_size: usize,
    ) -> Self {
        let newest = resource.clone();
        KindWatcher {
            client,
            resource,
            newest,
            reader,
            pacer,
            events,
            page_size,
            backoff: BACKOFF.0,
        }
    }

    fn kind(&self) -> Kind {
        self.resource.kind
    }

    /// Runs until the store is gone.
    #[tracing::instrument(name = "watch", skip_all, fields(kind = %self.kind()))]
    pub async fn run(mut self) {
        let mut state = State::List;
        while let Some(next) = self.step(state).await {
            state = next;
        }
    }

    /// One step of the loop; `None` when the store is gone.
    async fn step(&mut self, state: State) -> Option<State> {
        let next = match state {
            State::List => match self.list().await {
                Ok(version) => {
                    self.backoff = BACKOFF.0;
                    Some(State::Watch(version))
                }
                Err(ListError::Closed) => None,
                Err(ListError::Api(e)) => self.list_failed(e).await,
            },
            State::Watch(version) => match self.watch(version).await {
                Ok(WatchEnd::Expired) => {
                    tracing::info!(kind = %self.kind(), "watch expired (410 Gone): listing again");
                    Some(State::List)
                }
                Ok(WatchEnd::Closed { version, delivered }) => {
                    if !delivered {
                        // A server that closes watches at once must not make a hot loop.
                        self.pause().await;
                    }
                    Some(State::Watch(version))
                }
                Err((version, e)) => {
                    tracing::warn!(kind = %self.kind(), error = %e, retry_in = ?self.backoff, "watch failed");
                    self.pause().await;
                    Some(State::Watch(version))
                }
            },
            State::Absent => {
                tokio::time::sleep(ABSENT_RECHECK).await;
                self.resource = self.newest.clone();
                Some(State::List)
            }
        };
        next.filter(|_| !self.events.is_closed())
    }

    /// What to do after a failed list.
    async fn list_failed(&mut self, error: ApiError) -> Option<State> {
        let kind = self.kind();
        match error.code() {
            Some(404) if self.resource.optional && !self.resource.older.is_empty() => {
                let served = self.resource.path;
                let older = self.resource.try_older()?;
                tracing::info!(%kind, not_served = served, trying = older, "not served: trying an older version");
                Some(State::List)
            }
            Some(403 | 404) if self.resource.optional => {
                tracing::info!(%kind, %error, "not served or not readable: treated as none; looking again in 5 minutes");
                let events = vec![SourceEvent::ListStarted(kind), SourceEvent::ListDone(kind)];
                self.events.send(events).await.ok()?;
                Some(State::Absent)
            }
            Some(410) => {
                tracing::info!(%kind, %error, "list expired: listing again from the start");
                Some(State::List)
            }
            _ => {
                tracing::warn!(%kind, %error, retry_in = ?self.backoff, "list failed");
                self.pause().await;
                Some(State::List)
            }
        }
    }

    /// Sleeps for the current backoff (with jitter) and doubles it.
    async fn pause(&mut self) {
        let jitter = RandomState::new().hash_one(Instant::now()) % 1000;
        let delay = self.backoff.mul_f64(0.8 + 0.4 * jitter as f64 / 1000.0);
        tokio::time::sleep(delay).await;
        self.backoff = (self.backoff * 2).min(BACKOFF.1);
    }

    /// Lists every object, page by page, sending each page's events as it is read. Returns
    /// the list's resource version.
    async fn list(&mut self) -> Result<String, ListError> {
        self.pacer.wait().await;
        let started = Instant::now();
        let (hasher, mut seen) = (RandomState::new(), HashSet::new());
        let mut next = Some(self.fetch(None));
        let (mut pages, mut version) = (0, None);
        while let Some(fetch) = next.take() {
            let waited = Instant::now();
            let body = fetch.join().await.map_err(ListError::Api)?;
            let waited = waited.elapsed();
            let decoding = Instant::now();
            let text = std::str::from_utf8(&body)
                .map_err(|e| ListError::Api(ApiError::Invalid(format!("list page: {e}"))))?;
            let page: Page = serde_json::from_str(text)
                .map_err(|e| ListError::Api(ApiError::Invalid(format!("list page: {e}"))))?;
            let token = page.metadata.continue_token.filter(|t| !t.is_empty());
            next = token.as_deref().map(|t| self.fetch(Some(t)));
            version = page.metadata.resource_version;
            let items = page.items.unwrap_or_default();
            let mut events = Vec::with_capacity(items.len() + 2);
            if pages == 0 {
                events.push(SourceEvent::ListStarted(self.kind()));
            }
            for item in items {
                let Some(event) = self.reader.object(item.get()) else { continue };
                if !seen.insert(event_key_hash(&hasher, &event)) {
                    self.listed_twice(&event);
                }
                events.push(event);
            }
            if next.is_none() {
                events.push(SourceEvent::ListDone(self.kind()));
            }
            pages += 1;
            let decoded = decoding.elapsed();
            let sending = Instant::now();
            self.events.send(events).await.map_err(|_| ListError::Closed)?;
            tracing::debug!(kind = %self.kind(), page = pages, ?waited, ?decoded, sent = ?sending.elapsed(), "page");
        }
        let elapsed_ms = started.elapsed().as_millis() as u64;
        tracing::info!(kind = %self.kind(), objects = seen.len(), pages, elapsed_ms, "listed");
        version.ok_or_else(|| {
            ListError::Api(ApiError::Invalid("a list without a resourceVersion".into()))
        })
    }

    fn listed_twice(&self, event: &SourceEvent) {
        if let Some(key) = super::decode::event_key(event) {
            let key = printable(&key.to_string()).into_owned();
            tracing::warn!(kind = %self.kind(), object = %key, "listed twice in one list; the later copy is kept");
        }
    }

    /// Starts fetching a list page in a task of its own, so the page before it is read
    /// while this one travels.
    fn fetch(&self, continue_token: Option<&str>) -> Fetch {
        let url = self.resource.list_url(self.page_size, continue_token);
        let client = self.client.clone();
        Fetch(tokio::spawn(async move { request::get(&client, &url).await }))
    }

    /// Watches from `version` until the server closes the watch or it fails.
    async fn watch(&mut self, version: String) -> Result<WatchEnd, (String, ApiError)> {
        self.pacer.wait().await;
        let url = self.resource.watch_url(&version, WATCH_TIMEOUT_SECONDS);
        let mut lines = match request::watch(&self.client, &url, WATCH_IDLE).await {
            Ok(lines) => lines,
            Err(e) if e.code() == Some(410) => return Ok(WatchEnd::Expired),
            Err(e) => return Err((version, e)),
        };
        let (mut version, mut delivered) = (version, false);
        loop {
            let line = match lines.next_line().await {
                Ok(Some(line)) => line,
                Ok(None) => return Ok(WatchEnd::Closed { version, delivered }),
                Err(e) => return Err((version, e)),
            };
            delivered = true;
            self.backoff = BACKOFF.0;
            match self.watch_event(&line, &mut version) {
                Ok(events) if events.is_empty() => {}
                Ok(events) => {
                    if self.events.send(events).await.is_err() {
                        return Ok(WatchEnd::Closed { version, delivered });
                    }
                }
                Err(e) if e.code() == Some(410) => return Ok(WatchEnd::Expired),
                Err(e) => return Err((version, e)),
            }
        }
    }

    /// The store events of one watch line; advances `version`. An `ERROR` event is an error.
    fn watch_event(
        &mut self,
        line: &[u8],
        version: &mut String,
    ) -> Result<Vec<SourceEvent>, ApiError> {
        let parsed = std::str::from_utf8(line)
            .map_err(|e| e.to_string())
            .and_then(|text| serde_json::from_str::<WatchEvent>(text).map_err(|e| e.to_string()));
        let event = match parsed {
            Ok(event) => event,
            Err(error) => {
                tracing::warn!(kind = %self.kind(), %error, "skipping a watch event that cannot be parsed");
                return Ok(Vec::new());
            }
        };
        let object = event.object.get();
        let outcome = match event.event_type.as_str() {
            "ADDED" | "MODIFIED" => self.reader.object(object),
            "DELETED" => self.reader.deleted(object),
            "BOOKMARK" => None,
            "ERROR" => return Err(ApiError::from_status(object.as_bytes(), 500)),
            other => {
                let other = printable(other).into_owned();
                tracing::warn!(kind = %self.kind(), event = %other, "skipping a watch event of unknown type");
                None
            }
        };
        if let Some(v) = resource_version(object) {
            *version = v;
        }
        Ok(outcome.into_iter().collect())
    }
}

/// A list page being fetched; the fetch is abandoned if this is dropped.
struct Fetch(tokio::task::JoinHandle<Result<bytes::Bytes, ApiError>>);

impl Fetch {
    async fn join(mut self) -> Result<bytes::Bytes, ApiError> {
        match (&mut self.0).await {
            Ok(result) => result,
            Err(e) => Err(ApiError::Invalid(format!("page fetch: {e}"))),
        }
    }
}

impl Drop for Fetch {
    fn drop(&mut self) {
        self.0.abort();
    }
}
