//! [`FileSource`]: reads the manifests file into the store, and re-reads it on change.

use std::path::{Path, PathBuf};
use std::time::Duration;

use kpng_model::Kind;
use kpng_store::{SourceEvent, StoreWriter};
use notify::Watcher;
use tokio::sync::mpsc;

use super::parse::{DocumentError, Manifests, parse_manifests};
use crate::convert::ConvertOptions;

/// How long to wait after a file event for the burst of events an editor makes to end.
const SETTLE: Duration = Duration::from_millis(50);

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
}

impl FileSource {
    /// A source reading `path`; with `watch`, it re-reads the file whenever it changes.
    pub fn new(path: impl Into<PathBuf>, watch: bool, options: ConvertOptions) -> Self {
        FileSource { path: path.into(), watch, options }
    }

    /// The kinds this source lists: all of them, at every read.
    pub const KINDS: [Kind; 4] = Kind::ALL;

    /// Reads and converts the file once.
    pub fn load(&self) -> Result<Manifests, FileError> {
        let text = std::fs::read_to_string(&self.path)
            .map_err(|source| FileError::Read { path: self.path.clone(), source })?;
        self.parse(&text)
    }

    fn parse(&self, text: &str) -> Result<Manifests, FileError> {
        parse_manifests(text, &self.options)
            .map_err(|errors| FileError::Invalid { path: self.path.clone(), errors })
    }

    /// Feeds the store: the first read must succeed; then, when watching, every change of
    /// the file is applied as a relist, and an invalid read is logged and skipped. Without
    /// watching, it keeps the writer (so readers do not see the source end) until cancelled.
    pub async fn run(self, mut writer: StoreWriter) -> Result<(), FileError> {
        let mut last = std::fs::read(&self.path)
            .map_err(|source| FileError::Read { path: self.path.clone(), source })?;
        let objects = self.parse(&String::from_utf8_lossy(&last))?.objects;
        let count = objects.len();
        let revision = writer.apply(SourceEvent::relist(&Self::KINDS, objects));
        tracing::info!(path = %self.path.display(), objects = count, ?revision, "loaded manifests");
        if !self.watch {
            std::future::pending::<()>().await;
            return Ok(());
        }

        let (_watcher, mut events) = self.watch_directory()?;
        while events.recv().await.is_some() {
            tokio::time::sleep(SETTLE).await;
            while events.try_recv().is_ok() {}
            let current = match std::fs::read(&self.path) {
                Ok(bytes) => bytes,
                Err(e) => {
                    tracing::warn!(path = %self.path.display(), error = %e, "cannot read manifests; keeping the last good state");
                    continue;
                }
            };
            if current == last {
                continue;
            }
            last = current;
            match self.parse(&String::from_utf8_lossy(&last)).map(|m| m.objects) {
                Ok(objects) => {
                    let count = objects.len();
                    let revision = writer.apply(SourceEvent::relist(&Self::KINDS, objects));
                    tracing::info!(path = %self.path.display(), objects = count, ?revision, "reloaded manifests");
                }
                Err(e) => tracing::error!("{e}; keeping the last good state"),
            }
        }
        Ok(())
    }

    /// Watches the file's directory (editors and ConfigMap volumes replace files rather
    /// than write them in place), forwarding a signal for every event.
    fn watch_directory(
        &self,
    ) -> Result<(notify::RecommendedWatcher, mpsc::UnboundedReceiver<()>), FileError> {
        let error = |source| FileError::Watch { path: self.path.clone(), source };
        let (tx, rx) = mpsc::unbounded_channel();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                if event.is_ok_and(|e| !e.kind.is_access()) {
                    let _ = tx.send(());
                }
            })
            .map_err(error)?;
        let dir = match self.path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        watcher.watch(dir, notify::RecursiveMode::NonRecursive).map_err(error)?;
        Ok((watcher, rx))
    }
}
