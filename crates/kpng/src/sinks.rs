//! Sinks: what consumes the global model.
//!
//! - [`to_file`]: the model as a YAML or JSON document, rewritten atomically on change.
//! - [`to_local`]: this node's ENLS, fed to the backends given on the command line.

pub mod to_file;
pub mod to_local;
