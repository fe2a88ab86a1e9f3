//! [`Backend`]: the narrow interface every dataplane implements.

use std::borrow::Cow;

use kpng_local::full_state_ops;
use kpng_model::{LocalState, Op};

/// One change set for a backend: the ops since the backend's previous change set, ending
/// with `Sync`. The first change set (and the first after a failure) starts with `Reset`
/// and describes everything.
#[derive(Debug, Clone, Copy)]
pub struct ChangeSet<'a> {
    ops: Ops<'a>,
    /// The node's whole ENLS after these ops.
    pub state: &'a LocalState,
}

#[derive(Debug, Clone, Copy)]
enum Ops<'a> {
    /// `Reset` and every item of the state, made on demand.
    Full,
    /// These ops, then `Sync`.
    Changes(&'a [Op]),
}

impl<'a> ChangeSet<'a> {
    /// Everything in `state`, from a `Reset`. The ops are made as they are read, so a large
    /// state is not copied.
    pub fn full(state: &'a LocalState) -> Self {
        ChangeSet { ops: Ops::Full, state }
    }

    /// `ops` (without `Sync`) that led to `state`.
    pub fn changes(ops: &'a [Op], state: &'a LocalState) -> Self {
        ChangeSet { ops: Ops::Changes(ops), state }
    }

    /// Whether this change set starts from scratch.
    pub fn is_reset(&self) -> bool {
        match self.ops {
            Ops::Full => true,
            Ops::Changes(ops) => matches!(ops.first(), Some(Op::Reset)),
        }
    }

    /// The ops, ending with `Sync`.
    pub fn ops(&self) -> Box<dyn Iterator<Item = Cow<'a, Op>> + 'a> {
        let sync = std::iter::once(Cow::Owned(Op::Sync));
        match self.ops {
            Ops::Full => Box::new(full_state_ops(self.state).map(Cow::Owned).chain(sync)),
            Ops::Changes(ops) => Box::new(ops.iter().map(Cow::Borrowed).chain(sync)),
        }
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

    /// Checks that the dataplane still holds what this backend last applied; `false` when
    /// it drifted (someone changed it behind kpng's back): the runner then sends the whole
    /// state again. Called once per sync period, never on the change path. By default
    /// there is nothing to check.
    fn verify(&mut self) -> Result<bool, BackendError> {
        Ok(true)
    }
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
