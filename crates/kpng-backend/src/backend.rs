//! [`Backend`]: the narrow interface every dataplane implements.

use std::borrow::Cow;

use kpng_model::{NodeState, Op, full_state_ops};

/// One change set for a backend: the ops since the backend's previous change set, ending
/// with `Sync`. The first change set (and the first after a failure) starts with `Reset`
/// and describes everything.
#[derive(Debug, Clone, Copy)]
pub struct ChangeSet<'a> {
    ops: Ops<'a>,
    /// The node's whole ENLS after these ops, held whole or made on demand: read what the
    /// change set touched rather than every service.
    pub state: &'a dyn NodeState,
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
    pub fn full(state: &'a dyn NodeState) -> Self {
        ChangeSet { ops: Ops::Full, state }
    }

    /// `ops` (without `Sync`) that led to `state`.
    pub fn changes(ops: &'a [Op], state: &'a dyn NodeState) -> Self {
        ChangeSet { ops: Ops::Changes(ops), state }
    }

    /// Whether this change set starts from scratch.
    pub fn is_reset(&self) -> bool {
        match self.ops {
            Ops::Full => true,
            Ops::Changes(ops) => matches!(ops.first(), Some(Op::Reset)),
        }
    }

    /// The services these ops touch, sorted, and whether they change the node.
    pub fn touched(&self) -> (Vec<kpng_model::ServiceKey>, bool) {
        use kpng_model::{Item, ItemRef};
        let mut keys = Vec::new();
        let mut node = false;
        if let Ops::Changes(ops) = self.ops {
            for op in ops {
                match op {
                    Op::Set(Item::Node(_)) | Op::Delete(ItemRef::Node) => node = true,
                    Op::Set(Item::Service(s)) => keys.push(s.key.clone()),
                    Op::Set(Item::Endpoint { service, .. })
                    | Op::Delete(ItemRef::Service(service))
                    | Op::Delete(ItemRef::Endpoint { service, .. }) => keys.push(service.clone()),
                    Op::Reset | Op::Sync => {}
                }
            }
        }
        keys.sort();
        keys.dedup();
        (keys, node)
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
///
/// It wraps the backend's own error: `Display` names the backend, the error chain
/// ([`error_chain`]) says what failed.
#[derive(Debug)]
pub struct BackendError {
    /// The backend's name.
    pub backend: &'static str,
    error: Box<dyn std::error::Error + Send + Sync>,
    permanent: bool,
}

impl BackendError {
    /// An error of `backend`: its own error, or a message.
    pub fn new(
        backend: &'static str,
        error: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        BackendError { backend, error: error.into(), permanent: false }
    }

    /// Says what was being done when `source` failed.
    pub fn with_source(self, source: impl std::error::Error + Send + Sync + 'static) -> Self {
        let context = Context { text: self.error.to_string(), source: Box::new(source) };
        BackendError { backend: self.backend, error: Box::new(context), permanent: self.permanent }
    }

    /// Marks the failure as one retrying cannot mend (the output is gone): the runner then
    /// stops with it instead of retrying.
    pub fn permanent(mut self) -> Self {
        self.permanent = true;
        self
    }

    /// Whether retrying cannot mend this failure.
    pub fn is_permanent(&self) -> bool {
        self.permanent
    }

    /// The backend's own error, to downcast.
    pub fn inner(&self) -> &(dyn std::error::Error + Send + Sync + 'static) {
        &*self.error
    }
}

impl std::fmt::Display for BackendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.backend)
    }
}

impl std::error::Error for BackendError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.error)
    }
}

/// What was being done, and the error that stopped it.
#[derive(Debug)]
struct Context {
    text: String,
    source: Box<dyn std::error::Error + Send + Sync>,
}

impl std::fmt::Display for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.text)
    }
}

impl std::error::Error for Context {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&*self.source)
    }
}

/// Where a kernel backend's changes go.
pub enum Target {
    /// The running kernel.
    Kernel,
    /// Nowhere but this output (`--dry-run`): what would be applied, as text.
    DryRun(Box<dyn std::io::Write + Send>),
}

impl Target {
    /// Whether nothing is applied (`--dry-run`): a backend's logs then say "printed", never
    /// "committed" ([`done`]).
    pub fn is_dry_run(&self) -> bool {
        matches!(self, Target::DryRun(_))
    }
}

/// What a backend's log says its change became: `applied` (`committed`, `restored`,
/// `written`), or under `--dry-run` that it was printed and nothing applied.
pub fn done(dry_run: bool, applied: &'static str) -> &'static str {
    match dry_run {
        true => "printed (dry run: nothing applied)",
        false => applied,
    }
}

impl std::fmt::Debug for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Kernel => f.write_str("Kernel"),
            Target::DryRun(_) => f.write_str("DryRun"),
        }
    }
}

/// A dataplane that enforces one node's ENLS.
pub trait Backend: Send {
    /// The backend's name, as on the command line (`to-json`, `to-nft`).
    fn name(&self) -> &'static str;

    /// Enforces a change set. On error nothing of it may be half-applied: the runner will
    /// retry later with a change set that starts with `Reset`.
    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError>;

    /// The load-balancing settings of a service (kube-nftlb annotations) this backend
    /// cannot enforce, as `(key, value)`; the runner logs them once per service
    /// ([`crate::unsupported`]). By default none: a backend that only reports or follows
    /// the state has nothing to enforce. A dataplane must list what it does not enforce
    /// ([`crate::unsupported::all_settings`] when it enforces none).
    fn unsupported(
        &self,
        lb: &kpng_model::global::LoadBalancing,
    ) -> Vec<(kpng_model::global::AnnotationKey, &'static str)> {
        let _ = lb;
        Vec::new()
    }

    /// Whether this backend acts on what the dataplane backends installed (conntrack
    /// cleanup): it then receives a state only once every other backend holds it, and gets
    /// the whole state again when it missed one.
    fn follows_dataplane(&self) -> bool {
        false
    }

    /// Checks that the dataplane still holds what this backend last applied. A backend
    /// that found drift (someone changed the dataplane behind kpng's back) and wrote back
    /// where it differed returns `true`, as it holds the state again; `false` asks the
    /// runner for the whole state (drift it cannot repair where it is, or cannot tell).
    /// Called once per sync period, never on the change path. By default there is nothing
    /// to check.
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
