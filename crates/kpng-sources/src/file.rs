//! The file source: Kubernetes manifests from a file, read once or watched.
//!
//! Every read of the file is applied to the store as one relist of every kind, so the
//! store sees only the objects that really changed, and a read that changes nothing costs
//! no revision. A file with an invalid document is rejected whole: at start-up that is an
//! error; while watching, the error is logged and the last good state stays in force.

mod parse;
mod watch;

pub use parse::{DocumentError, Manifests, Position, YamlLimits, parse_manifests};
pub use watch::{FileError, FileSource};
