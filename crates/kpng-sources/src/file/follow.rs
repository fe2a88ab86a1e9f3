//! [`Follower`]: watches what a path resolves to, not an inode, so `file --watch` keeps
//! following its input when the file is replaced, when it is a symlink into another
//! directory (a ConfigMap volume's `..data` link), when a link is repointed, and when a
//! directory on the way is removed and created again.
//!
//! The directories watched are, for the path as written and for every symlink met while
//! resolving it, the directory holding it and that directory's parent (which sees the
//! directory itself replaced); a directory that does not exist is stood in for by its
//! nearest existing ancestor. They are worked out again after every burst of events, and
//! the watch is rebuilt when they, or the directories they name, changed.

use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use notify::Watcher;
use tokio::sync::mpsc;

/// Symlinks followed at most while resolving a path (as the kernel does).
const MAX_HOPS: usize = 40;

/// The directories whose changes may change what `path` reads (see the module docs), and
/// the directories a relevant event is in or above.
fn watch_targets(path: &Path) -> (BTreeSet<PathBuf>, Vec<PathBuf>) {
    let mut watched = BTreeSet::new();
    let mut relevant = Vec::new();
    let mut current = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for _ in 0..MAX_HOPS {
        let dir = current.parent().map_or_else(|| PathBuf::from("/"), tidy);
        let resolved = std::fs::canonicalize(&dir).ok();
        for dir in std::iter::once(dir.clone()).chain(resolved) {
            let existing = dir.ancestors().find(|d| d.is_dir()).unwrap_or(Path::new("/"));
            watched.insert(existing.to_path_buf());
            if let Some(parent) = existing.parent() {
                watched.insert(parent.to_path_buf());
            }
            relevant.push(dir);
        }
        match std::fs::read_link(&current) {
            Ok(target) => current = dir.join(target),
            Err(_) => break,
        }
    }
    (watched, relevant)
}

/// `dir` with what is above its last component resolved (`links/../data/current` is
/// `/base/data/current`), its last component kept as written: a symlink there is a
/// directory of its own to follow.
fn tidy(dir: &Path) -> PathBuf {
    let above = dir.parent().and_then(|p| std::fs::canonicalize(p).ok());
    match (above, dir.file_name()) {
        (Some(above), Some(name)) => above.join(name),
        _ => dir.to_path_buf(),
    }
}

/// Whether an event on `paths` may concern the file: it is in, or above, a directory the
/// path goes through (an event in a parent directory about its other entries does not).
fn is_relevant(paths: &[PathBuf], relevant: &[PathBuf]) -> bool {
    paths.is_empty()
        || paths.iter().any(|p| relevant.iter().any(|d| p.starts_with(d) || d.starts_with(p)))
}

/// A directory as watched: its path and the directory it named then.
type Identity = (PathBuf, Option<(u64, u64)>);

fn identify(dirs: &BTreeSet<PathBuf>) -> Vec<Identity> {
    let id = |dir: &PathBuf| std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()));
    dirs.iter().map(|dir| (dir.clone(), id(dir))).collect()
}

/// The watch that follows one path; events arrive on the receiver [`Follower::new`]
/// returns.
pub(super) struct Follower {
    path: PathBuf,
    events: mpsc::UnboundedSender<()>,
    watcher: Option<notify::RecommendedWatcher>,
    watched: Vec<Identity>,
    /// Whether the last refresh watched everything it should.
    whole: bool,
}

impl Follower {
    /// Starts following `path`.
    pub(super) fn new(path: &Path) -> notify::Result<(Follower, mpsc::UnboundedReceiver<()>)> {
        let (events, receiver) = mpsc::unbounded_channel();
        let mut follower = Follower {
            path: path.to_path_buf(),
            events,
            watcher: None,
            watched: Vec::new(),
            whole: false,
        };
        follower.refresh()?;
        Ok((follower, receiver))
    }

    /// Works out the directories to watch again and rebuilds the watch if they changed.
    /// Returns whether it did (the caller reads the file after this, so a change made
    /// while the watch was rebuilt is not missed).
    pub(super) fn refresh(&mut self) -> notify::Result<bool> {
        self.whole = false;
        let (dirs, relevant) = watch_targets(&self.path);
        let identities = identify(&dirs);
        if self.watcher.is_some() && identities == self.watched {
            self.whole = true;
            return Ok(false);
        }
        let events = self.events.clone();
        let mut watcher =
            notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
                let wanted = match event {
                    Ok(event) => !event.kind.is_access() && is_relevant(&event.paths, &relevant),
                    // The kernel's queue overflowed: anything may have changed.
                    Err(_) => true,
                };
                if wanted {
                    let _ = events.send(());
                }
            })?;
        for dir in &dirs {
            watcher.watch(dir, notify::RecursiveMode::NonRecursive)?;
        }
        tracing::debug!(path = %self.path.display(), directories = ?dirs, "watching");
        self.watcher = Some(watcher);
        self.watched = identities;
        self.whole = true;
        Ok(true)
    }

    /// Whether the last refresh watched everything it should (else it is worth retrying).
    pub(super) fn is_whole(&self) -> bool {
        self.whole
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_into_another_directory_is_followed_there() {
        let base = tempfile::tempdir().unwrap();
        let (links, data) = (base.path().join("links"), base.path().join("data"));
        std::fs::create_dir_all(data.join("v1")).unwrap();
        std::fs::create_dir(&links).unwrap();
        std::fs::write(data.join("v1/cluster.yaml"), "").unwrap();
        // links/cluster.yaml -> ../data/current/cluster.yaml, data/current -> v1
        std::os::unix::fs::symlink("v1", data.join("current")).unwrap();
        std::os::unix::fs::symlink("../data/current/cluster.yaml", links.join("cluster.yaml"))
            .unwrap();
        let (watched, relevant) = watch_targets(&links.join("cluster.yaml"));
        for dir in [&links, &data, &data.join("v1"), &base.path().to_path_buf()] {
            assert!(watched.contains(dir), "{} not watched: {watched:?}", dir.display());
        }
        // An event about the link's target directory matters; one about a neighbour of
        // the watched directories in their parent does not.
        assert!(is_relevant(&[data.join("current")], &relevant));
        assert!(is_relevant(&[data.join("v1/cluster.yaml")], &relevant));
        assert!(!is_relevant(&[base.path().join("unrelated")], &relevant));
    }

    #[test]
    fn a_missing_directory_is_watched_from_its_nearest_ancestor() {
        let base = tempfile::tempdir().unwrap();
        let path = base.path().join("gone/deeper/cluster.yaml");
        let (watched, relevant) = watch_targets(&path);
        assert!(watched.contains(base.path()), "{watched:?}");
        assert!(!watched.iter().any(|d| d.starts_with(base.path().join("gone"))));
        assert!(is_relevant(&[base.path().join("gone")], &relevant), "its creation is seen");
    }

    #[test]
    fn a_replaced_directory_rebuilds_the_watch() {
        let base = tempfile::tempdir().unwrap();
        let dir = base.path().join("input");
        std::fs::create_dir(&dir).unwrap();
        let path = dir.join("cluster.yaml");
        let (mut follower, _events) = Follower::new(&path).unwrap();
        assert!(!follower.refresh().unwrap(), "nothing changed");
        std::fs::remove_dir(&dir).unwrap();
        assert!(follower.refresh().unwrap(), "the directory went");
        std::fs::create_dir(&dir).unwrap();
        assert!(follower.refresh().unwrap(), "a new directory at the same path");
        assert!(!follower.refresh().unwrap());
    }
}
