//! The file source: Kubernetes manifests from a file, read once or watched.
//!
//! Every read of the file is applied to the store as one relist of every kind, so the
//! store sees only the objects that really changed, and a read that changes nothing costs
//! no revision. A file with an invalid document is rejected whole: at start-up that is an
//! error; while watching, the error is logged and the last good state stays in force.
//!
//! While watching, the path is followed, not an inode: the directories it goes through,
//! its symlinks' target directories included, are watched and worked out again at every
//! change, so a replaced directory or a repointed link is followed too. A change is read once the file has been quiet for a quarter of a
//! second, and a content that looks like a write in progress is not applied
//! ([`verdict`]): an empty or unparseable file keeps the state in force; a file that would
//! remove most objects, or ends in the middle of a line, is applied only if it stays so
//! for [`verdict::DROP_HOLD`]; removing everything at once takes a `List` with `items: []`.
//!
//! # Layout
//! - `parse`: text → objects ([`parse_manifests`]), streamed document by document and item
//!   by item, with YAML limits sized from each document ([`YamlLimits`]).
//! - [`verdict`]: what a new content may do to the state in force.
//! - `watch`: [`FileSource`], the read loop.
//! - `follow`: the watch that follows the path wherever it resolves (symlinks into other
//!   directories, directories replaced).

mod follow;
mod parse;
pub mod verdict;
mod watch;

pub use parse::{DocumentError, Manifests, Position, YamlLimits, parse_manifests};
pub use watch::{FileError, FileSource};
