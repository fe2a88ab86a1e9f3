//! [`Backend`]: the narrow interface every dataplane implements.

use kpng_model::{LocalState, Op};

/// One change set for a backend.
#[derive(Debug, Clone, Copy)]
pub struct ChangeSet<'a> {
    /// The ops since the backend's previous change set, ending with `Sync`. The first change
    /// set (and the first after a failure) starts with `Reset` and describes everything.
    pub ops: &'a [Op],
    /// The node's whole ENLS after these ops.
    pub state: &'a LocalState,
}

impl ChangeSet<'_> {
    /// Whether this change set starts from scratch.
    pub fn is_reset(&self) -> bool {
        matches!(self.ops.first(), Some(Op::Reset))
    }
}

/// Why a backend could not apply a change set. What was in force before stays in force.
#[derive(Debug, thiserror::Error)]
#[error("{backend}: {message}")]
pub struct BackendError {
    /// The backend's name.
    pub backend: &'static str,
    /// What failed, naming the object or operation.
    pub message: String,
    /// The underlying error.
    #[source]
    pub source: Option<Box<dyn std::error::Error + Send + Sync>>,
}

impl BackendError {
    /// An error of `backend`.
    pub fn new(backend: &'static str, message: impl Into<String>) -> Self {
        BackendError { backend, message: message.into(), source: None }
    }

    /// Attaches the underlying error.
    pub fn with_source(mut self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        self.source = Some(Box::new(source));
        self
    }
}

/// A dataplane that enforces one node's ENLS.
pub trait Backend: Send {
    /// The backend's name, as on the command line (`to-json`, `to-nft`).
    fn name(&self) -> &'static str;

    /// Enforces a change set. On error nothing of it may be half-applied: the runner will
    /// retry later with a change set that starts with `Reset`.
    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError>;
}

/// An error and its sources, joined by `: `, for one-line logs.
pub fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}
