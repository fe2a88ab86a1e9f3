//! [`FileSource`]: reads the manifests file into the store, and re-reads it on change.

use std::hash::{DefaultHasher, Hasher};
use std::path::PathBuf;
use std::time::Duration;

use kpng_model::Kind;
use kpng_store::{SourceEvent, StoreWriter};
use tokio::sync::mpsc;
use tokio::time::Instant;

use super::follow::Follower;
use super::parse::{DocumentError, Manifests, parse_manifests};
use super::verdict::{Content, DROP_HOLD, Ending, Held as HeldBack, Verdict, judge};
use crate::convert::ConvertOptions;

/// After a file event, the file is read once no further event came for this long: editors
/// and writers make bursts of events.
const SETTLE: Duration = Duration::from_millis(250);
/// A file written without pause is still read this often.
const MAX_SETTLE: Duration = Duration::from_secs(5);
/// A watch that could not be rebuilt is tried again this often.
const RETRY_WATCH: Duration = Duration::from_secs(5);
/// While the file cannot be read, the warning is repeated at most this often.
const READ_WARNING_EVERY: Duration = Duration::from_secs(60);

/// A manifests file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file cannot be read.
    #[error("reading {}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Some documents are invalid; nothing of the file was applied.
    #[error("{}: {} invalid document(s), nothing applied:\n  {}", path.display(), errors.len(), list(errors))]
    Invalid {
        /// The file.
        path: PathBuf,
        /// One error per invalid document.
        errors: Vec<DocumentError>,
    },
    /// The file cannot be watched.
    #[error("watching {}", path.display())]
    Watch {
        /// The file.
        path: PathBuf,
        /// The watcher's error.
        #[source]
        source: notify::Error,
    },
}

/// At most this many document errors are shown; the count says how many there are.
const SHOWN_ERRORS: usize = 10;

fn list(errors: &[DocumentError]) -> String {
    let mut shown: Vec<String> =
        errors.iter().take(SHOWN_ERRORS).map(ToString::to_string).collect();
    if errors.len() > SHOWN_ERRORS {
        shown.push(format!("... and {} more", errors.len() - SHOWN_ERRORS));
    }
    shown.join("\n  ")
}

/// The file source.
#[derive(Debug, Clone)]
pub struct FileSource {
    path: PathBuf,
    watch: bool,
    options: ConvertOptions,
    drop_hold: Duration,
}

/// A content held back because it drops most objects.
#[derive(Debug, Clone, Copy)]
struct Held {
    hash: u64,
    since: Instant,
}

/// What the watch loop knows of the file.
#[derive(Debug, Default)]
struct Watched {
    /// Objects applied now.
    in_force: usize,
    /// The hash of the last content judged.
    seen: Option<u64>,
    held: Option<Held>,
    /// Failed reads since the last good one, and when the last warning was.
    failed_reads: u32,
    warned_at: Option<Instant>,
}

impl FileSource {
    /// A source reading `path`; with `watch`, it re-reads the file whenever it changes.
    pub fn new(path: impl Into<PathBuf>, watch: bool, options: ConvertOptions) -> Self {
        FileSource { path: path.into(), watch, options, drop_hold: DROP_HOLD }
    }

    /// Holds contents that drop most objects for `hold` instead of [`DROP_HOLD`].
    pub fn with_drop_hold(mut self, hold: Duration) -> Self {
        self.drop_hold = hold;
        self
    }

    /// The kinds this source lists: all of them, at every read.
    pub const KINDS: [Kind; 4] = Kind::ALL;

    /// Reads and converts the file once.
    pub fn load(&self) -> Result<Manifests, FileError> {
        let bytes = std::fs::read(&self.path)
            .map_err(|source| FileError::Read { path: self.path.clone(), source })?;
        parse_manifests(&String::from_utf8_lossy(&bytes), &self.options)
            .map_err(|errors| FileError::Invalid { path: self.path.clone(), errors })
    }

    /// Feeds the store: the first read must succeed; then, when watching, every change of
    /// the file is judged by the rules of [`super::verdict`] and applied as a relist, or
    /// kept back. Without watching, it keeps the writer (so readers do not see the source
    /// end) until cancelled.
    #[tracing::instrument(name = "source", skip_all, fields(source = "file", path = %self.path.display()))]
    pub async fn run(self, mut writer: StoreWriter) -> Result<(), FileError> {
        // Watch before the first read: a change made meanwhile is not missed.
        let watching = match self.watch {
            true => Some(
                Follower::new(&self.path)
                    .map_err(|source| FileError::Watch { path: self.path.clone(), source })?,
            ),
            false => None,
        };
        let bytes = std::fs::read(&self.path)
            .map_err(|source| FileError::Read { path: self.path.clone(), source })?;
        let manifests = parse_manifests(&String::from_utf8_lossy(&bytes), &self.options)
            .map_err(|errors| FileError::Invalid { path: self.path.clone(), errors })?;
        let mut watched = Watched { seen: Some(hash(&bytes)), ..Watched::default() };
        drop(bytes);
        self.apply(&mut writer, &mut watched, manifests, "loaded manifests");
        let Some((mut follower, mut events)) = watching else {
            std::future::pending::<()>().await;
            return Ok(());
        };
        loop {
            let deadline = watched.held.map(|h| h.since + self.drop_hold);
            tokio::select! {
                event = events.recv() => match event {
                    Some(()) => {
                        settle(&mut events).await;
                        self.follow(&mut follower);
                    }
                    None => return Ok(()),
                },
                () = sleep_until(deadline), if deadline.is_some() => {}
                // A watch that could not be rebuilt is tried again until it can.
                () = tokio::time::sleep(RETRY_WATCH), if !follower.is_whole() => {
                    self.follow(&mut follower);
                }
            }
            self.reread(&mut writer, &mut watched);
        }
    }

    /// Rebuilds the watch if what the path resolves to changed (a directory replaced, a
    /// symlink repointed); a failure is logged and retried.
    fn follow(&self, follower: &mut Follower) {
        let path = self.path.display();
        match follower.refresh() {
            Ok(true) => tracing::info!(%path, "following the input where it now resolves"),
            Ok(false) => {}
            Err(error) => {
                tracing::warn!(%path, %error, retry_in = ?RETRY_WATCH, "cannot watch the input's directories; retrying")
            }
        }
    }

    /// Reads the file again and acts on what it holds.
    fn reread(&self, writer: &mut StoreWriter, watched: &mut Watched) {
        let bytes = match std::fs::read(&self.path) {
            Ok(bytes) => bytes,
            Err(error) => return self.unreadable(watched, &error),
        };
        if watched.failed_reads > 0 {
            tracing::info!(path = %self.path.display(), failed_reads = watched.failed_reads, "the manifests can be read again");
            (watched.failed_reads, watched.warned_at) = (0, None);
        }
        let hash = hash(&bytes);
        let held = watched.held.filter(|h| h.hash == hash);
        let ripe = held.is_some_and(|h| h.since.elapsed() >= self.drop_hold);
        if watched.seen == Some(hash) && !ripe {
            return;
        }
        if watched.held.is_some() && held.is_none() {
            tracing::info!(path = %self.path.display(), "the held content changed before it was applied");
            watched.held = None;
        }
        watched.seen = Some(hash);
        let content = match parse_manifests(&String::from_utf8_lossy(&bytes), &self.options) {
            Err(errors) => Content::Invalid(errors),
            Ok(m) if m.documents == 0 && !m.empty_list => Content::Empty,
            Ok(m) => Content::Parsed(m, Ending::of(&bytes)),
        };
        drop(bytes);
        let verdict = match (&content, ripe) {
            (Content::Parsed(..), true) => Verdict::Apply,
            _ => judge(watched.in_force, &content),
        };
        self.act(writer, watched, content, verdict, hash);
    }

    /// Carries out a verdict.
    fn act(
        &self,
        writer: &mut StoreWriter,
        watched: &mut Watched,
        content: Content,
        verdict: Verdict,
        hash: u64,
    ) {
        let path = self.path.display();
        match (verdict, content) {
            (Verdict::Apply, Content::Parsed(manifests, _)) => {
                watched.held = None;
                self.apply(writer, watched, manifests, "reloaded manifests");
            }
            (Verdict::Keep(_), Content::Invalid(errors)) => {
                let error = FileError::Invalid { path: self.path.clone(), errors };
                tracing::error!("{error}; keeping the last good state");
            }
            (Verdict::Keep(why), _) => {
                tracing::warn!(%path, "{why}; keeping the last good state (to remove every object, write a List with items: [])");
            }
            // `judge` applies only parsed contents.
            (Verdict::Apply, _) => {}
            (Verdict::Hold(why), _) => {
                let hold = self.drop_hold;
                match why {
                    HeldBack::Drop { before, after } => {
                        tracing::warn!(%path, before, after, ?hold, "the file would remove most objects: held back, applied only if it stays so");
                    }
                    HeldBack::Unterminated => {
                        tracing::warn!(%path, ?hold, "the file ends in the middle of a line (a write in progress?): held back, applied only if it stays so");
                    }
                }
                watched.held = Some(Held { hash, since: Instant::now() });
            }
        }
    }

    /// Applies a content as one relist of every kind.
    fn apply(&self, writer: &mut StoreWriter, watched: &mut Watched, m: Manifests, what: &str) {
        for warning in &m.warnings {
            tracing::warn!(path = %self.path.display(), "{warning}");
        }
        let count = m.objects.len();
        let revision = writer.apply(SourceEvent::relist(&Self::KINDS, m.objects));
        watched.in_force = count;
        tracing::info!(path = %self.path.display(), objects = count, ?revision, "{what}");
    }

    /// Reports a failed read: at once, then at most once a minute while it lasts.
    fn unreadable(&self, watched: &mut Watched, error: &std::io::Error) {
        watched.failed_reads += 1;
        let path = self.path.display();
        if watched.warned_at.is_none_or(|at| at.elapsed() >= READ_WARNING_EVERY) {
            watched.warned_at = Some(Instant::now());
            let failed_reads = watched.failed_reads;
            tracing::warn!(%path, %error, failed_reads, "cannot read manifests; keeping the last good state (repeated at most once a minute)");
        } else {
            tracing::debug!(%path, %error, "cannot read manifests");
        }
    }
}

/// Waits until no event came for [`SETTLE`] (at most [`MAX_SETTLE`]).
async fn settle(events: &mut mpsc::UnboundedReceiver<()>) {
    let start = Instant::now();
    while start.elapsed() < MAX_SETTLE {
        match tokio::time::timeout(SETTLE, events.recv()).await {
            Ok(Some(())) => continue,
            Ok(None) | Err(_) => return,
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(deadline) => tokio::time::sleep_until(deadline).await,
        None => std::future::pending().await,
    }
}

/// A hash of the file's content: what tells a real change from an event that changed
/// nothing, without keeping the content.
fn hash(bytes: &[u8]) -> u64 {
    let mut hasher = DefaultHasher::new();
    hasher.write(bytes);
    hasher.finish()
}
