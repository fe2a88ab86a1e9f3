//! The template every kernel backend is an instance of: a [`Reconciler`] that owns the
//! change path, and the two things a backend supplies, how a service renders into kernel
//! objects ([`Render`]) and a kernel that reads them back and commits a plan ([`Kernel`]).
//!
//! The reconciler owns everything else, once for every dataplane:
//! - the loop over the services a change set touched (every service when the node's facts
//!   that shape them change), then over the objects no one service owns that their renders
//!   changed ([`Render::shared`]: a dispatch chain listing many services);
//! - one owner-keyed table of what each service wants and, derived from it (no copy), what
//!   the kernel holds
//!   ([`Objects`]), where two services wanting one key resolve the same way whatever the
//!   order of events, and a service's objects are kept as a few bytes each when its keys
//!   and values say how ([`Pack`]), its claims filed by what its keys say two services
//!   may both want ([`Filed`]: a destination, say), one entry for many keys;
//! - the plan of differences, ordered by [`Rank`] so that a reader never sees an object
//!   before what it refers to, and committed in the unit the kernel declares ([`Unit`]);
//! - resets: at start-up, and after a failure or a drift a verification cannot repair
//!   where it found it (the runner then sends the whole state), the kernel's objects are
//!   read back and only what differs is written, so a restart over a right kernel writes
//!   nothing and a damaged one is repaired in place;
//! - verification, once per sync period: faults beyond objects (a detached hook), then the
//!   objects read back and compared, and the objects found different written back at once
//!   when the read says what the kernel holds everywhere (a whole read, or the part foreign
//!   commits touched); a kernel that counts its commits ([`Kernel::generation`])
//!   is read back only when another process committed since kpng (only what it touched,
//!   when the kernel announces that: [`Kernel::untouched`], [`Kernel::sample_touched`]),
//!   and once in [`FULL_READ_EVERY`] regardless, within [`SAFETY_NET_SHARE`] of the time;
//!   a kernel whose read-back is costly may read a part
//!   most of the time ([`Kernel::sample`]);
//! - the counters every backend reports ([`Stats`]), under the backend's prefix.
//!
//! Retrying with backoff is the runner's: a failed change set returns an error, and the
//! runner sends the whole state later, which the reconciler treats as a reset. A
//! reconciler whose commit failed treats its next change set as a reset whatever it says.
//!
//! # Layout
//! - this file: [`Kernel`], [`Render`], [`Reconciler`], [`Stats`], [`Sample`].
//! - [`plan`]: [`Plan`], [`Rank`] and [`Unit`].
//! - [`objects`]: [`Objects`], the owner-keyed table, [`Wanted`], one owner's render, and
//!   [`Filed`], what a key's claims are filed under.
//! - [`pack`]: [`Pack`], keys and values kept as bytes.
//! - [`memory`]: [`MemoryKernel`], a kernel in memory (tests, examples, `--dry-run`).
//! - [`generation`]: [`KnownGeneration`], when a verification may skip reading back.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

pub use kpng_model::global::{AnnotationKey, LoadBalancing};
use kpng_model::local::LocalServiceState;
use kpng_model::{NodeState, ServiceKey};

use crate::{Backend, BackendError, ChangeSet, Problems};

pub mod generation;
pub mod memory;
pub mod objects;
pub mod pack;
pub mod plan;

pub use generation::{FULL_READ_EVERY, KnownGeneration, SAFETY_NET_SHARE};
pub use memory::MemoryKernel;
pub use objects::{Filed, Objects, Owner, Wanted};
pub use pack::{PACKED, Pack, Packed};
pub use plan::{Plan, Rank, Unit};

/// Implements [`Backend`] for a backend type that wraps a [`Reconciler`] in its field
/// `$field` (to add constructors and accessors of its own): every method is the
/// reconciler's. `delegate_backend!(EbpfBackend, inner);`
#[macro_export]
macro_rules! delegate_backend {
    ($backend:ty, $field:ident) => {
        impl $crate::Backend for $backend {
            fn name(&self) -> &'static str {
                $crate::Backend::name(&self.$field)
            }

            fn unsupported(
                &self,
                lb: &$crate::reconcile::LoadBalancing,
            ) -> Vec<($crate::reconcile::AnnotationKey, &'static str)> {
                $crate::Backend::unsupported(&self.$field, lb)
            }

            fn apply(
                &mut self,
                changes: &$crate::ChangeSet<'_>,
            ) -> Result<(), $crate::BackendError> {
                $crate::Backend::apply(&mut self.$field, changes)
            }

            fn verify(&mut self) -> Result<bool, $crate::BackendError> {
                $crate::Backend::verify(&mut self.$field)
            }
        }
    };
}

/// Every object a kernel holds, by key.
pub type Held<K> = HashMap<<K as Kernel>::Key, <K as Kernel>::Value>;

/// Where a backend's objects live: read back whole, and changed by plans.
pub trait Kernel: Send {
    /// An object's key.
    type Key: Clone + Ord + Filed + Rank + Pack + Debug + Send;
    /// An object's value. The default value is that of an object that carries none (a
    /// set's element): the reconciler keeps such objects as bare keys.
    type Value: Clone + Eq + Default + Pack + Debug + Send;
    /// The kernel's errors.
    type Error: std::error::Error + Send + Sync + 'static;

    /// What one [`commit`](Self::commit) applies at once.
    const UNIT: Unit;

    /// What a commit changes, as logs name it (`eBPF maps`, `nftables transaction`).
    const WHAT: &'static str = "plan";

    /// What a commit did, as logs say it after [`WHAT`](Self::WHAT) (`committed`,
    /// `written`, `restored`).
    const APPLIED: &'static str = "committed";

    /// Every object kpng's part of the kernel holds, or `None` when nothing is installed
    /// yet. Called at every reset and at verifications, never on the change path.
    fn read(&mut self) -> Result<Option<Held<Self>>, Self::Error>;

    /// Whether a reset reads back only to keep positions (endpoint slots), because every
    /// reset hands the kernel its objects whole anyway (a kernel that publishes to another
    /// process owning the objects: `to-nft`'s aggregator). Then only the first reset reads;
    /// the later ones take the positions from what was committed (or planned, when the
    /// commit was refused), which is all a read-back would add: at 100,000 services it
    /// costs the kernel about 25 s. Such a reset plans nothing either: its
    /// [`prepare`](Self::prepare) gets an empty plan and `after`, every object, which it
    /// hands on whole, so no list of every object is made beside them. `false` by default.
    fn reads_only_positions(&self) -> bool {
        false
    }

    /// Called at every reset before [`read`](Self::read), with the node state the reset
    /// brings the kernel to: a kernel whose read-back may skip what is going anyway (most
    /// of a table after most services went) sizes it up here. Nothing by default.
    fn resetting(&mut self, state: &dyn NodeState) {
        let _ = state;
    }

    /// Called at every reset, before its `plan` is committed (even an empty one): installs
    /// or repairs what is not an object (hooks, programs, tables sized for `after`, what the
    /// kernel will hold once the plan is in). `installed` says whether
    /// [`read`](Self::read) found anything.
    fn prepare(
        &mut self,
        plan: &Plan<Self::Key, Self::Value>,
        after: &Objects<Self::Key, Self::Value>,
        installed: bool,
    ) -> Result<(), Self::Error> {
        let _ = (plan, after, installed);
        Ok(())
    }

    /// Applies `plan` in the kernel's [`UNIT`](Self::UNIT). `after` is what the kernel
    /// holds once it is in, for a kernel that must rebuild (maps grown).
    fn commit(
        &mut self,
        plan: &Plan<Self::Key, Self::Value>,
        after: &Objects<Self::Key, Self::Value>,
    ) -> Result<(), Self::Error>;

    /// Over a kernel that holds none of kpng's objects (a cold start), whether the reset
    /// may commit in parts of about this many objects rather than one plan: the node's
    /// and the shared objects first, then whole services as they render (each part with
    /// the shared objects they change), each part through
    /// [`commit_part`](Self::commit_part) on a thread of its own while the next renders.
    /// A refused part leaves those before it in force; the reset that follows reads them
    /// back. `None` (the default): one plan.
    fn stream(&self) -> Option<usize> {
        None
    }

    /// Commits one part of a streamed cold start ([`stream`](Self::stream)): additions
    /// only, over the parts committed before it. By default a [`commit`](Self::commit)
    /// whose `after` is not known (empty).
    fn commit_part(&mut self, plan: &Plan<Self::Key, Self::Value>) -> Result<(), Self::Error> {
        self.commit(plan, &Objects::new())
    }

    /// What a verification reads back: everything by default ([`read`](Self::read)). A
    /// kernel whose whole read-back is costly may read a part most of the time (the entry
    /// points a flushed table breaks) and say which keys that part covers.
    fn sample(&mut self) -> Result<Sample<Self>, Self::Error> {
        Ok(Sample::Whole(self.read()?))
    }

    /// A number the kernel moves at every commit by any process, when it has one (the
    /// nf_tables ruleset generation): while it stays where kpng's own commit left it,
    /// nothing can have changed kpng's objects.
    fn generation(&mut self) -> Option<u64> {
        None
    }

    /// Whether every commit from generation `known` up to `now` (none of them kpng's own)
    /// left kpng's objects alone, as the kernel's own announcements of commits say (the
    /// nf_tables multicast group): other processes commit to their own tables all the
    /// time, and reading kpng's back after each would cost what the generation saves.
    /// `false` when the kernel cannot say (by default, and after a lost announcement).
    fn untouched(&mut self, known: u64, now: u64) -> bool {
        let _ = (known, now);
        false
    }

    /// What a verification reads back when other processes' commits after generation
    /// `known` up to `now` touched kpng's objects and the kernel announced which: those
    /// parts alone ([`Sample::Part`]), every other object being as known at `known`. At a
    /// large table a whole read-back takes far longer than a verification period, while a
    /// foreign commit usually touches one set or chain. `None` (the default): the kernel
    /// cannot say, and [`sample`](Self::sample) reads.
    fn sample_touched(
        &mut self,
        known: u64,
        now: u64,
    ) -> Result<Option<Sample<Self>>, Self::Error> {
        let _ = (known, now);
        Ok(None)
    }

    /// How many steps of [`generation`](Self::generation) the last successful commit made
    /// (one nf_tables transaction each): one by default; `iptables-nft-restore` commits
    /// each table's section as a transaction of its own.
    fn transactions(&self) -> u64 {
        1
    }

    /// What is wrong beyond the objects (a program detached behind kpng's back), checked at
    /// each verification; the next reset's [`prepare`](Self::prepare) repairs it.
    fn faults(&mut self) -> Result<Vec<String>, Self::Error> {
        Ok(Vec::new())
    }

    /// Whether retrying cannot mend `error` (the output is gone).
    fn is_permanent(error: &Self::Error) -> bool {
        let _ = error;
        false
    }
}

/// Which keys a [`Sample::Part`] read.
pub type Covers<K> = Box<dyn Fn(&<K as Kernel>::Key) -> bool + Send>;

/// What a verification read back.
pub enum Sample<K: Kernel + ?Sized> {
    /// Everything, as [`Kernel::read`] returns it.
    Whole(Option<Held<K>>),
    /// The objects of the keys `covers` accepts, and no others.
    Part {
        /// What the kernel holds of them.
        held: Held<K>,
        /// Whether a key is among those read.
        covers: Covers<K>,
    },
}

/// How services render into a backend's objects.
pub trait Render: Send {
    /// An object's key.
    type Key: Clone + Ord + Filed + Rank + Pack + Debug + Send;
    /// An object's value. The default value is that of an object that carries none (a
    /// set's element): the reconciler keeps such objects as bare keys.
    type Value: Clone + Eq + Default + Pack + Debug + Send;
    /// What of the node shapes services' objects (NodePort addresses, say): when it
    /// changes, every service renders again.
    type Facts: Clone + PartialEq + Send;
    /// Why a service could not render.
    type Error: std::error::Error + Send + Sync + 'static;

    /// The facts of `state`'s node.
    fn facts(&self, state: &dyn NodeState) -> Self::Facts;

    /// The node's own objects (none by default).
    fn node(&mut self, facts: &Self::Facts) -> Wanted<Self::Key, Self::Value> {
        let _ = facts;
        Wanted::default()
    }

    /// One service's objects. `held` is what the kernel holds (at a reset, what it read
    /// back; on a change, what was committed), so positions (endpoint slots) can be kept
    /// without the render remembering them.
    fn service(
        &mut self,
        facts: &Self::Facts,
        service: &LocalServiceState,
        held: &dyn Lookup<Self::Key, Self::Value>,
    ) -> Result<Wanted<Self::Key, Self::Value>, Self::Error>;

    /// Objects no one service owns, made from many services' renders (a chain that lists
    /// the destinations of every service whose address ends in one byte). Called after the
    /// services of each change set and reset have rendered (and after [`node`](Self::node)
    /// when the facts changed; in a streamed cold start, after the node and after each
    /// part, see [`Kernel::stream`]): the objects that changed since the last call, `None`
    /// for those gone. They are claimed by [`Owner::Shared`]. None by default.
    fn shared(&mut self, facts: &Self::Facts) -> Vec<(Self::Key, Option<Self::Value>)> {
        let _ = facts;
        Vec::new()
    }

    /// `key` is gone: forget what was kept for it.
    fn forget(&mut self, key: &ServiceKey) {
        let _ = key;
    }

    /// A reset starts: forget what was kept for every service.
    fn reset(&mut self) {}

    /// The kube-nftlb settings of a service this dataplane does not enforce
    /// ([`Backend::unsupported`]).
    fn unsupported(&self, lb: &LoadBalancing) -> Vec<(AnnotationKey, &'static str)>;
}

/// Objects by key: what a kernel holds, read back ([`Held`]) or as committed ([`Objects`]).
pub trait Lookup<K, V: Clone> {
    /// The value at `key`.
    fn lookup(&self, key: &K) -> Option<Cow<'_, V>>;
}

impl<K: Eq + Hash, V: Clone, S: std::hash::BuildHasher> Lookup<K, V> for HashMap<K, V, S> {
    fn lookup(&self, key: &K) -> Option<Cow<'_, V>> {
        self.get(key).map(Cow::Borrowed)
    }
}

impl<K, V> Lookup<K, V> for Objects<K, V>
where
    K: Clone + Ord + Filed + Rank + Pack,
    V: Clone + Eq + Default + Pack,
{
    fn lookup(&self, key: &K) -> Option<Cow<'_, V>> {
        self.get(key)
    }
}

/// The counters every reconciler keeps, shared with whoever reports them.
#[derive(Debug, Default)]
pub struct Stats {
    /// Plans committed (change sets and resets that wrote something).
    pub commits: AtomicU64,
    /// Object writes committed (upserts and deletions).
    pub writes: AtomicU64,
    /// Change sets that failed (a render refused, a commit refused).
    pub failures: AtomicU64,
    /// Verifications that read the kernel back.
    pub readbacks: AtomicU64,
    /// Verifications that read nothing back: the kernel's generation was kpng's.
    pub readbacks_skipped: AtomicU64,
    /// Verifications that found the kernel changed behind kpng's back.
    pub drifts: AtomicU64,
    /// Times other processes' commits were let pass without a read-back: the kernel's
    /// announcements said they left kpng's objects alone.
    pub untouched: AtomicU64,
    /// Objects the kernel holds, as last committed.
    pub objects: AtomicU64,
}

impl Stats {
    /// Writes the counters as `kpng_<prefix>_...` metrics.
    pub fn encode(
        &self,
        encoder: &mut prometheus_client::encoding::DescriptorEncoder<'_>,
        prefix: &str,
    ) -> Result<(), std::fmt::Error> {
        let name = |what: &str| format!("kpng_{prefix}_{what}");
        let counters = [
            (name("commits"), "Plans committed to the kernel.", &self.commits),
            (
                name("object_writes"),
                "Object writes committed (upserts and deletions).",
                &self.writes,
            ),
            (name("commit_failures"), "Change sets that could not be applied.", &self.failures),
            (
                name("verification_readbacks"),
                "Verifications that read the kernel back.",
                &self.readbacks,
            ),
            (
                name("verification_readbacks_skipped"),
                "Verifications that read nothing back: no other process had committed since kpng, or the kernel announced that their commits left kpng's objects alone.",
                &self.readbacks_skipped,
            ),
            (
                name("drifts"),
                "Verifications that found the kernel changed behind kpng's back.",
                &self.drifts,
            ),
            (
                name("foreign_commits_untouched"),
                "Times other processes' commits were let pass without a read-back: the kernel announced that they left kpng's objects alone.",
                &self.untouched,
            ),
        ];
        let refs: Vec<(&str, &str, &AtomicU64)> =
            counters.iter().map(|(n, h, v)| (n.as_str(), *h, *v)).collect();
        crate::metrics::encode_counters(encoder, &refs)?;
        let gauge = prometheus_client::metrics::gauge::ConstGauge::new(
            self.objects.load(Ordering::Relaxed) as i64,
        );
        let objects = name("objects");
        let metric = encoder.encode_descriptor(
            &objects,
            "Objects the kernel holds, as last committed.",
            None,
            prometheus_client::metrics::MetricType::Gauge,
        )?;
        prometheus_client::encoding::EncodeMetric::encode(&gauge, metric)
    }
}

/// What a reset or change wrote.
#[derive(Debug, Clone, Copy, Default)]
struct Written {
    upserts: usize,
    deletes: usize,
}

impl Written {
    fn of<K: Rank, V>(plan: &Plan<K, V>) -> Written {
        Written { upserts: plan.upserts.len(), deletes: plan.deletes.len() }
    }

    fn add<K: Rank, V>(&mut self, plan: &Plan<K, V>) {
        self.upserts += plan.upserts.len();
        self.deletes += plan.deletes.len();
    }

    fn is_empty(&self) -> bool {
        self.upserts + self.deletes == 0
    }
}

/// Why a change set failed: a render or the kernel.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError<R: std::error::Error + 'static, K: std::error::Error + 'static> {
    /// A service could not render.
    #[error("service {service} could not be rendered")]
    Render {
        /// The service.
        service: ServiceKey,
        /// Why.
        #[source]
        source: R,
    },
    /// The kernel could not be read back.
    #[error("kpng's objects could not be read back")]
    Read(#[source] K),
    /// What is not an object could not be installed or repaired.
    #[error("the kernel could not be prepared")]
    Prepare(#[source] K),
    /// The kernel refused the plan.
    #[error("the kernel refused a plan of {writes} writes")]
    Commit {
        /// The plan's writes.
        writes: usize,
        /// Why.
        #[source]
        source: K,
    },
}

/// A backend made of a [`Render`] and a [`Kernel`].
pub struct Reconciler<R, K>
where
    R: Render,
    K: Kernel<Key = R::Key, Value = R::Value>,
{
    name: &'static str,
    render: R,
    kernel: K,
    objects: Objects<R::Key, R::Value>,
    /// The facts services were last rendered with; `None` until a reset succeeds, and
    /// after a failure.
    facts: Option<R::Facts>,
    stats: Arc<Stats>,
    problems: Problems,
    dry_run: bool,
    known: KnownGeneration,
    /// The generation at which a verification found none of kpng's objects installed: the
    /// reset that repairs it starts from nothing rather than reading the kernel again,
    /// unless anything committed since.
    drifted: Option<u64>,
}

type Failure<R, K> = ReconcileError<<R as Render>::Error, <K as Kernel>::Error>;

impl<R, K> Reconciler<R, K>
where
    R: Render,
    K: Kernel<Key = R::Key, Value = R::Value>,
{
    /// The backend `name` (as on the command line) rendering with `render` into `kernel`.
    pub fn new(name: &'static str, render: R, kernel: K) -> Self {
        Reconciler {
            name,
            render,
            kernel,
            objects: Objects::new(),
            facts: None,
            stats: Arc::default(),
            problems: Problems::default(),
            dry_run: false,
            known: KnownGeneration::default(),
            drifted: None,
        }
    }

    /// Logs say that plans were printed, not applied (`--dry-run`).
    pub fn with_dry_run(mut self, dry_run: bool) -> Self {
        self.dry_run = dry_run;
        self
    }

    /// Reports the kernel's faults to `problems` (which `/readyz` lists) until repaired.
    pub fn with_problems(mut self, problems: Problems) -> Self {
        self.problems = problems;
        self
    }

    /// The counters.
    pub fn stats(&self) -> Arc<Stats> {
        self.stats.clone()
    }

    /// What the kernel holds, as far as the commits say.
    pub fn held(&self) -> &Objects<R::Key, R::Value> {
        &self.objects
    }

    /// Whether the reconciler knows what the kernel holds: a reset succeeded, and no
    /// change set failed since.
    pub fn in_sync(&self) -> bool {
        self.facts.is_some()
    }

    /// The kernel.
    pub fn kernel(&self) -> &K {
        &self.kernel
    }

    /// The render, to configure.
    pub fn render_mut(&mut self) -> &mut R {
        &mut self.render
    }

    /// Reads the kernel back, renders every service, and commits what differs.
    fn reset(&mut self, state: &dyn NodeState) -> Result<Written, Failure<R, K>> {
        self.kernel.resetting(state);
        // Positions from what was committed, not read back (see `reads_only_positions`).
        let remembered = self.kernel.reads_only_positions() && !self.objects.is_empty();
        let held = match self.drifted.take() {
            _ if remembered => Some(HashMap::new()),
            // Found empty by the verification, and nothing committed since.
            Some(at) if self.kernel.generation() == Some(at) => None,
            _ => self.kernel.read().map_err(ReconcileError::Read)?,
        };
        let installed = held.is_some();
        let held = held.unwrap_or_default();
        if let (true, false, Some(part)) = (held.is_empty(), remembered, self.kernel.stream()) {
            return self.cold_start(state, installed, part);
        }
        let facts = self.render.facts(state);
        self.render.reset();
        let positions: &dyn Lookup<R::Key, R::Value> =
            if remembered { &self.objects } else { &held };
        let mut renders = Vec::with_capacity(state.service_count() + 1);
        renders.push((Owner::Node, Some(self.render.node(&facts))));
        for service in state.services() {
            let key = &service.service.key;
            let wanted = self
                .render
                .service(&facts, &service, positions)
                .map_err(|source| ReconcileError::Render { service: key.clone(), source })?;
            renders.push((Owner::Service(key.clone()), Some(wanted)));
        }
        let shared = self.render.shared(&facts).into_iter().filter_map(|(k, v)| Some((k, v?)));
        renders.push((Owner::Shared, Some(Wanted::objects(shared))));
        // A kernel that takes every object whole in `prepare` needs no difference spelled out.
        let whole = self.kernel.reads_only_positions();
        let plan = match whole {
            true => {
                drop(held);
                self.objects.claim_all(renders);
                Plan::default()
            }
            false => self.objects.replace_all(held, renders),
        };
        let prepared = self.kernel.prepare(&plan, &self.objects, installed);
        prepared.map_err(ReconcileError::Prepare)?;
        self.problems.clear(self.name);
        let written = match whole {
            true => {
                // What was known of the kernel's generation no longer says what it holds.
                self.known.forget();
                let written = Written { upserts: self.objects.len(), deletes: 0 };
                self.count(&written);
                written
            }
            false => {
                self.commit(&plan, true)?;
                Written::of(&plan)
            }
        };
        self.facts = Some(facts);
        Ok(written)
    }

    /// A reset over a kernel that holds nothing, in parts ([`Kernel::stream`]): this
    /// thread renders and plans a part while another commits the one before.
    fn cold_start(
        &mut self,
        state: &dyn NodeState,
        installed: bool,
        part: usize,
    ) -> Result<Written, Failure<R, K>> {
        let empty = HashMap::new();
        let facts = self.render.facts(state);
        self.render.reset();
        self.objects = Objects::new();
        let node = vec![(Owner::Node, Some(self.render.node(&facts)))];
        let first = self.objects.update_and_patch(node, self.render.shared(&facts));
        let prepared = self.kernel.prepare(&first, &self.objects, installed);
        prepared.map_err(ReconcileError::Prepare)?;
        self.problems.clear(self.name);
        let before = self.kernel.generation();
        self.known.forget();
        let mut written = Written::of(&first);
        // No part waits in the channel: one commits while the next is planned.
        let (sender, parts) = std::sync::mpsc::sync_channel::<Plan<R::Key, R::Value>>(0);
        let (kernel, render, objects) = (&mut self.kernel, &mut self.render, &mut self.objects);
        let span = tracing::Span::current();
        let outcome = std::thread::scope(|scope| {
            let committer = scope.spawn(move || {
                let _span = span.enter();
                let mut committed = 0u64;
                for plan in parts {
                    if plan.is_empty() {
                        continue;
                    }
                    kernel.commit_part(&plan).map_err(|source| (plan.len(), source))?;
                    committed += 1;
                }
                Ok::<u64, (usize, K::Error)>(committed)
            });
            let mut open = sender.send(first).is_ok();
            let mut renders = Vec::new();
            let mut size = 0;
            let mut rendered = Ok(());
            for service in state.services() {
                if !open {
                    break;
                }
                let key = &service.service.key;
                match render.service(&facts, &service, &empty) {
                    Ok(wanted) => {
                        size += wanted.objects.len();
                        renders.push((Owner::Service(key.clone()), Some(wanted)));
                    }
                    Err(source) => {
                        rendered = Err(ReconcileError::Render { service: key.clone(), source });
                        break;
                    }
                }
                if size >= part {
                    // With what the part's services add to the shared objects.
                    let shared = render.shared(&facts);
                    let plan = objects.update_and_patch(std::mem::take(&mut renders), shared);
                    written.add(&plan);
                    open = sender.send(plan).is_ok();
                    size = 0;
                }
            }
            if rendered.is_ok() && open {
                let plan = objects.update_and_patch(renders, render.shared(&facts));
                written.add(&plan);
                let _ = sender.send(plan);
            }
            drop(sender);
            let committed = committer.join().unwrap_or_else(|p| std::panic::resume_unwind(p));
            rendered.map(|()| committed)
        });
        let committed =
            outcome?.map_err(|(writes, source)| ReconcileError::Commit { writes, source })?;
        let after = self.kernel.generation();
        self.known.committed(before, after, committed);
        self.count(&written);
        self.facts = Some(facts);
        Ok(written)
    }

    /// Renders the services a change set touched and commits what differs.
    fn update(&mut self, changes: &ChangeSet<'_>) -> Result<Written, Failure<R, K>> {
        let state = changes.state;
        let (mut keys, _) = changes.touched();
        let facts = self.render.facts(state);
        let renew = self.facts.as_ref() != Some(&facts);
        if renew {
            keys.extend(state.services().map(|s| s.service.key.clone()));
            keys.extend(self.objects.services().cloned());
            keys.sort();
            keys.dedup();
        }
        let mut renders = Vec::with_capacity(keys.len() + 1);
        if renew {
            renders.push((Owner::Node, Some(self.render.node(&facts))));
        }
        for key in keys {
            let wanted = match state.service(&key) {
                Some(service) => {
                    let wanted = self.render.service(&facts, &service, &self.objects);
                    Some(wanted.map_err(|source| ReconcileError::Render {
                        service: key.clone(),
                        source,
                    })?)
                }
                None => {
                    self.render.forget(&key);
                    None
                }
            };
            renders.push((Owner::Service(key), wanted));
        }
        let shared = self.render.shared(&facts);
        let plan = self.objects.update_and_patch(renders, shared);
        self.commit(&plan, false)?;
        self.facts = Some(facts);
        Ok(Written::of(&plan))
    }

    /// Commits a verification's `plan` of repairs, as a reset restricted to the drift it
    /// found: prepared as a reset's plan is (what is not an object, the kernel's counts),
    /// and over objects known right before it when the read was `consistent`.
    fn repair(
        &mut self,
        plan: &Plan<R::Key, R::Value>,
        consistent: bool,
    ) -> Result<(), Failure<R, K>> {
        let start = Instant::now();
        let prepared = self.kernel.prepare(plan, &self.objects, true);
        prepared.map_err(ReconcileError::Prepare)?;
        self.commit(plan, consistent)?;
        self.log_written(Written::of(plan), start, "drift repaired: ");
        Ok(())
    }

    /// Logs what a change, a reset or a repair (`what`) wrote.
    fn log_written(&self, written: Written, start: Instant, what: &str) {
        tracing::info!(
            backend = self.name,
            upserted = written.upserts,
            deleted = written.deletes,
            objects = self.objects.len(),
            took = ?start.elapsed(),
            "{what}{} {}",
            K::WHAT,
            crate::backend::done(self.dry_run, K::APPLIED)
        );
    }

    /// Commits `plan`: a reset's (over what it read) or a change's (over what kpng last
    /// committed).
    fn commit(&mut self, plan: &Plan<R::Key, R::Value>, reset: bool) -> Result<(), Failure<R, K>> {
        if plan.is_empty() {
            return Ok(());
        }
        // The generation before and after: one more means the commit was kpng's alone. A
        // change is known to leave the kernel right only over objects known right before
        // it: a foreign change to them must not pass for kpng's own once kpng commits.
        let before = self.kernel.generation();
        let continued = reset || self.known_at(before);
        self.known.forget();
        self.kernel
            .commit(plan, &self.objects)
            .map_err(|source| ReconcileError::Commit { writes: plan.len(), source })?;
        if continued {
            let after = self.kernel.generation();
            self.known.committed(before, after, self.kernel.transactions());
        }
        self.count(&Written::of(plan));
        Ok(())
    }

    /// Whether kpng's objects are known right at generation `now`: kpng's last commit or
    /// read-back left them known at `now`, or at an earlier generation and the kernel
    /// says every commit since left them alone (then they are known at `now` from here on).
    fn known_at(&mut self, now: Option<u64>) -> bool {
        let (Some(now), Some(known)) = (now, self.known.at()) else { return false };
        if now == known {
            return true;
        }
        if !self.kernel.untouched(known, now) {
            return false;
        }
        self.known.advance(now);
        self.stats.untouched.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Counts a committed reset or change.
    fn count(&self, written: &Written) {
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        let writes = written.upserts + written.deletes;
        self.stats.writes.fetch_add(writes as u64, Ordering::Relaxed);
        self.stats.objects.store(self.objects.len() as u64, Ordering::Relaxed);
    }

    /// Counts a failed change, reset or repair: the next change set is a reset.
    fn failed(&mut self, error: Failure<R, K>) -> BackendError {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        self.facts = None;
        self.known.forget();
        self.backend_error(error)
    }

    fn backend_error(&self, error: Failure<R, K>) -> BackendError {
        let permanent = match &error {
            ReconcileError::Read(e)
            | ReconcileError::Prepare(e)
            | ReconcileError::Commit { source: e, .. } => K::is_permanent(e),
            ReconcileError::Render { .. } => false,
        };
        let error = BackendError::new(self.name, error);
        match permanent {
            true => error.permanent(),
            false => error,
        }
    }
}

impl<R, K> Backend for Reconciler<R, K>
where
    R: Render,
    K: Kernel<Key = R::Key, Value = R::Value>,
{
    fn name(&self) -> &'static str {
        self.name
    }

    fn unsupported(&self, lb: &LoadBalancing) -> Vec<(AnnotationKey, &'static str)> {
        self.render.unsupported(lb)
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        let start = Instant::now();
        let reset = changes.is_reset() || self.facts.is_none();
        let result = match reset {
            true => self.reset(changes.state),
            false => self.update(changes),
        };
        match result {
            Ok(written) if written.is_empty() && reset => {
                let objects = self.objects.len();
                tracing::info!(backend = self.name, objects, "the kernel already holds this state");
                Ok(())
            }
            Ok(written) if written.is_empty() => {
                let objects = self.objects.len();
                tracing::debug!(backend = self.name, objects, "nothing to change");
                Ok(())
            }
            Ok(written) => {
                self.log_written(written, start, "");
                Ok(())
            }
            Err(error) => Err(self.failed(error)),
        }
    }

    fn verify(&mut self) -> Result<bool, BackendError> {
        if self.facts.is_none() {
            return Ok(true);
        }
        let faults =
            self.kernel.faults().map_err(|e| self.backend_error(ReconcileError::Read(e)))?;
        if !faults.is_empty() {
            let text = format!("{}: {} (repairing)", self.name, faults.join(", "));
            tracing::warn!(backend = self.name, faults = ?faults, "the kernel changed behind kpng's back: repairing");
            self.problems.report(self.name, text);
            self.stats.drifts.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        let before = self.kernel.generation();
        self.known_at(before);
        if self.known.may_skip(before, Instant::now()) {
            self.stats.readbacks_skipped.fetch_add(1, Ordering::Relaxed);
            return Ok(true);
        }
        self.stats.readbacks.fetch_add(1, Ordering::Relaxed);
        // Other processes committed since kpng's objects were known: the parts they touched
        // when the kernel can say which, else everything (or the kernel's usual sample).
        let since = self.known.at().filter(|known| before.is_some_and(|now| now != *known));
        let targeted = match (since, before) {
            (Some(known), Some(now)) => self.kernel.sample_touched(known, now),
            _ => Ok(None),
        };
        let targeted = targeted.map_err(|e| self.backend_error(ReconcileError::Read(e)))?;
        let part_of_known = targeted.is_some();
        let sample = match targeted {
            Some(sample) => sample,
            None => {
                let started = Instant::now();
                let sample = self.kernel.sample();
                let sample = sample.map_err(|e| self.backend_error(ReconcileError::Read(e)))?;
                if matches!(sample, Sample::Whole(_)) {
                    self.known.read_whole(started, Instant::now());
                }
                sample
            }
        };
        let nothing = matches!(sample, Sample::Whole(None));
        let (held, covers, whole): (_, Covers<K>, _) = match sample {
            Sample::Whole(read) => (read.unwrap_or_default(), Box::new(|_| true), true),
            Sample::Part { held, covers } => (held, covers, false),
        };
        self.drifted = None;
        let expected = &self.objects;
        let mut count = 0;
        let same = expected.iter().all(|(k, v)| {
            count += 1;
            held.get(&*k) == Some(&*v)
        });
        if whole && same && count == held.len() {
            // Read back unchanged while the generation held: known from there on.
            let after = self.kernel.generation();
            self.known.read_back(before, after);
            return Ok(true);
        }
        let covered = || expected.iter().filter(|(k, _)| covers(k));
        let missing: Vec<Cow<R::Key>> =
            covered().filter(|(k, _)| !held.contains_key(&**k)).map(|(k, _)| k).collect();
        let changed = covered().filter(|(k, v)| held.get(&**k).is_some_and(|h| *h != **v));
        let changed: Vec<Cow<R::Key>> = changed.map(|(k, _)| k).collect();
        let foreign: Vec<Cow<R::Key>> = (held.keys())
            .filter(|k| covers(k) && expected.get(k).is_none())
            .map(Cow::Borrowed)
            .collect();
        if missing.is_empty() && changed.is_empty() && foreign.is_empty() {
            // The part read back is as committed. What it did not cover is not known, unless
            // it is the part foreign commits touched of objects known right before them.
            if part_of_known {
                let after = self.kernel.generation();
                self.known.read_back(before, after);
            }
            return Ok(true);
        }
        self.known.forget();
        let first = missing.iter().chain(&changed).chain(&foreign).next().map(|k| format!("{k:?}"));
        let after = self.kernel.generation();
        // What the kernel holds is known everywhere: what the read covered differs at these
        // keys alone, and what it did not cover is as kpng committed it. Writing them back
        // is what a reset would commit, without rendering every service again (seconds at
        // a large table, with every change waiting).
        let in_place = (whole && !nothing) || part_of_known;
        let repair = in_place.then(|| {
            let keys = missing.iter().chain(&changed).chain(&foreign).cloned();
            self.objects.repair(keys, &held)
        });
        self.stats.drifts.fetch_add(1, Ordering::Relaxed);
        let how = if repair.is_some() { "in place" } else { "from the whole state" };
        tracing::warn!(
            backend = self.name,
            missing = missing.len(),
            changed = changed.len(),
            foreign = foreign.len(),
            first = first.unwrap_or_default(),
            "the kernel no longer holds what kpng committed: repairing {how}"
        );
        let Some(plan) = repair else {
            if nothing {
                self.drifted = before.filter(|at| after == Some(*at));
            }
            return Ok(false);
        };
        // Known right once the plan is in if nothing committed while it was read.
        let consistent = before.is_some() && after == before;
        match self.repair(&plan, consistent) {
            Ok(()) => Ok(true),
            Err(error) => Err(self.failed(error)),
        }
    }
}

#[cfg(test)]
mod tests {
    use kpng_model::LocalState;
    use kpng_model::local::LocalServiceState;

    use super::*;

    /// An object per service, named after it; the service `bad` cannot be rendered.
    struct Named;

    #[derive(Debug, thiserror::Error)]
    #[error("refused")]
    struct Refused;

    impl Rank for String {}

    impl super::Filed for String {}

    impl Render for Named {
        type Key = String;
        type Value = u32;
        type Facts = ();
        type Error = Refused;

        fn facts(&self, _: &dyn NodeState) {}

        fn service(
            &mut self,
            _: &(),
            service: &LocalServiceState,
            _: &dyn Lookup<String, u32>,
        ) -> Result<Wanted<String, u32>, Refused> {
            let name = service.service.key.name().to_string();
            match name.as_str() {
                "bad" => Err(Refused),
                _ => Ok(Wanted::objects([(name, 1)])),
            }
        }

        fn unsupported(&self, _: &LoadBalancing) -> Vec<(AnnotationKey, &'static str)> {
            Vec::new()
        }
    }

    fn state(names: &[&str]) -> LocalState {
        let services = names.iter().map(|name| {
            let service = crate::bare_service("ns", name);
            (service.key.clone(), LocalServiceState { service, endpoints: Default::default() })
        });
        LocalState { node: None, services: services.collect() }
    }

    fn held<K: Kernel<Key = String, Value = u32>>(
        reconciler: &Reconciler<Named, K>,
    ) -> Vec<String> {
        sorted_keys(reconciler.held())
    }

    fn sorted_keys(objects: &Objects<String, u32>) -> Vec<String> {
        let mut keys: Vec<String> = objects.iter().map(|(k, _)| k.into_owned()).collect();
        keys.sort();
        keys
    }

    #[test]
    fn a_reset_whose_render_fails_keeps_what_was_committed() {
        let kernel = MemoryKernel::new();
        let mut reconciler = Reconciler::new("test", Named, kernel.clone());
        reconciler.apply(&ChangeSet::full(&state(&["a", "b"]))).unwrap();
        assert_eq!(held(&reconciler), ["a", "b"]);
        // The render of `bad` fails after `a`'s was claimed: nothing of the reset stays.
        assert!(reconciler.apply(&ChangeSet::full(&state(&["a", "bad", "c"]))).is_err());
        assert_eq!(held(&reconciler), ["a", "b"]);
        let mut in_kernel: Vec<String> = kernel.objects().unwrap().into_keys().collect();
        in_kernel.sort();
        assert_eq!(in_kernel, ["a", "b"]);
        // The next reset brings the kernel to exactly its state.
        reconciler.apply(&ChangeSet::full(&state(&["a", "c"]))).unwrap();
        assert_eq!(held(&reconciler), ["a", "c"]);
        let mut in_kernel: Vec<String> = kernel.objects().unwrap().into_keys().collect();
        in_kernel.sort();
        assert_eq!(in_kernel, ["a", "c"]);
    }

    /// A kernel handed every object whole at each reset: what each reset's `prepare` and
    /// each commit received, and how often it was read.
    #[derive(Default)]
    struct Whole {
        reads: usize,
        /// Per reset: the plan's length, and every object it was handed.
        wholes: Vec<(usize, Vec<String>)>,
        /// Per commit: the keys it wrote.
        commits: Vec<Vec<String>>,
    }

    impl Kernel for Whole {
        type Key = String;
        type Value = u32;
        type Error = Refused;

        const UNIT: Unit = Unit::Plan;

        fn read(&mut self) -> Result<Option<HashMap<String, u32>>, Refused> {
            self.reads += 1;
            Ok(None)
        }

        fn reads_only_positions(&self) -> bool {
            true
        }

        fn prepare(
            &mut self,
            plan: &Plan<String, u32>,
            after: &Objects<String, u32>,
            _: bool,
        ) -> Result<(), Refused> {
            self.wholes.push((plan.len(), sorted_keys(after)));
            Ok(())
        }

        fn commit(
            &mut self,
            plan: &Plan<String, u32>,
            _: &Objects<String, u32>,
        ) -> Result<(), Refused> {
            let written =
                plan.upserts.iter().map(|(k, _, _)| k).chain(plan.deletes.iter().map(|(k, _)| k));
            self.commits.push(written.cloned().collect());
            Ok(())
        }
    }

    #[test]
    fn a_kernel_handed_objects_whole_gets_no_plan_at_a_reset_and_differences_after() {
        let mut reconciler = Reconciler::new("test", Named, Whole::default());
        reconciler.apply(&ChangeSet::full(&state(&["a", "b"]))).unwrap();
        let ops =
            [kpng_model::Op::Delete(kpng_model::ItemRef::Service(ServiceKey::new("ns", "b")))];
        reconciler.apply(&ChangeSet::changes(&ops, &state(&["a"]))).unwrap();
        reconciler.apply(&ChangeSet::full(&state(&["a", "c"]))).unwrap();
        let kernel = reconciler.kernel();
        let wholes: Vec<(usize, Vec<&str>)> = (kernel.wholes.iter())
            .map(|(planned, all)| (*planned, all.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(wholes, [(0, vec!["a", "b"]), (0, vec!["a", "c"])]);
        assert_eq!(kernel.commits, [vec!["b".to_string()]], "a change commits its difference");
        assert_eq!(kernel.reads, 1, "only the first reset reads back");
        assert_eq!(held(&reconciler), ["a", "c"]);
    }
}
