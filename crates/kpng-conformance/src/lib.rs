//! The conformance suite of kpng's backend template: every kernel backend built on
//! [`kpng_backend::reconcile`] runs it, with its kernel in memory and on the real kernel.
//!
//! A backend describes itself as a [`Subject`]: how to make its render, how to open its
//! kernel (the same objects each time, as a restarted process finds them), how to wipe
//! it, a write the kernel refuses (to make a commit fail part-way), and how another process
//! could change it. [`run`] then checks what the template promises:
//! - a refused commit leaves the kernel as before, in the unit the kernel declares
//!   ([`Unit::Plan`]: untouched; [`Unit::Write`]: the writes before the refused one,
//!   made in the plan's order; [`Unit::Group`]: the refused group untouched, every other
//!   group as planned, so one IP family refused does not hold back the other), and the
//!   runner's retry (the whole state) repairs it;
//! - a first load the kernel refuses (part way, for a kernel that streams it) is completed
//!   by the retry;
//! - a restart over what the previous process committed writes nothing, and an upgrade
//!   over what the previous release committed too ([`upgrade_writes_nothing`], with the
//!   subject's fixture of that release's objects); a release that changed its layout
//!   migrates over the older one's objects to what a fresh load leaves
//!   ([`upgrade_migrates`]);
//! - drift of each kind (an object deleted, changed, or a foreign one added) is found by
//!   the next verification, and repaired by it where it was found (the verification then
//!   says the kernel holds the state again) or by the reset that follows, also when kpng
//!   committed a change of its own after the drift;
//! - random change histories, with refused commits and restarts among them, end where a
//!   fresh load of the last state ends (a property test). Their changes and restarts read
//!   the node state from the model on demand ([`kpng_local::OnDemand`]), the retries and
//!   the fresh loads from a state held whole: a backend reads both the same.
//!
//! Each check panics with a message naming the backend and what failed.
//!
//! # Layout
//! - this file: [`Subject`], [`run`] and the checks.
//! - [`faulty`]: [`Faulty`], the kernel wrapper that refuses commits on demand.
//! - [`states`]: the node states the checks apply (a fixed pair, and random histories).

use std::collections::HashMap;
use std::sync::Arc;

use kpng_backend::reconcile::{Kernel, Objects, Plan, Rank, Reconciler, Render, Stats, Unit};
use kpng_backend::{Backend, ChangeSet};
use kpng_model::{LocalState, NodeState};
use proptest::prelude::*;

pub mod faulty;
pub mod states;

pub use faulty::Faulty;

/// The key of a subject's objects.
pub type Key<S> = <<S as Subject>::Render as Render>::Key;
/// The value of a subject's objects.
pub type Value<S> = <<S as Subject>::Render as Render>::Value;

/// A backend under test.
pub trait Subject {
    /// How services render.
    type Render: Render;
    /// Where objects go.
    type Kernel: Kernel<Key = Key<Self>, Value = Value<Self>>;

    /// The backend's name, for messages.
    fn name(&self) -> &'static str;

    /// A new render, as a new process starts with.
    fn render(&self) -> Self::Render;

    /// Opens the kernel: what earlier openings committed is there.
    fn open(&self) -> Self::Kernel;

    /// Removes every kpng object and installation from the kernel (a fresh machine).
    fn wipe(&self);

    /// A write the kernel refuses.
    fn poison(&self) -> (Key<Self>, Value<Self>);

    /// An object no service renders, as another process could add.
    fn foreign(&self) -> (Key<Self>, Value<Self>);

    /// Another value for the object at `key`, as another process could write; `None` for
    /// a kind of object that has one value only (the suite changes another).
    fn changed(&self, key: &Key<Self>, value: &Value<Self>) -> Option<Value<Self>>;

    /// What the kernel holds, in a form that history must not change: positions that
    /// depend on the order of events (endpoint slots) forgotten. By default every object
    /// as debug text, sorted.
    fn canonical(&self, objects: &HashMap<Key<Self>, Value<Self>>) -> Vec<String> {
        let mut out: Vec<String> = objects.iter().map(|(k, v)| format!("{k:?} = {v:?}")).collect();
        out.sort();
        out
    }
}

/// A subject's backend over its kernel, which can be made to refuse commits.
pub type Tested<S> = Reconciler<<S as Subject>::Render, Faulty<<S as Subject>::Kernel>>;

/// A new backend (a new process) over the subject's kernel.
pub fn start<S: Subject>(subject: &S) -> Tested<S> {
    let kernel = Faulty::new(subject.open(), subject.poison());
    Reconciler::new(subject.name(), subject.render(), kernel)
}

/// What the kernel holds, read back.
pub fn contents<S: Subject>(subject: &S) -> HashMap<Key<S>, Value<S>> {
    subject.open().read().ok().flatten().unwrap_or_default()
}

/// Writes `plan` as another process would: it opens the kernel, finds what is there,
/// and commits.
fn tamper<S: Subject>(subject: &S, plan: Plan<Key<S>, Value<S>>) {
    let name = subject.name();
    let mut kernel = subject.open();
    let held = kernel.read().unwrap_or_else(|e| panic!("{name}: reading back failed: {e}"));
    let installed = held.is_some();
    let mut after = held.unwrap_or_default();
    let found = Objects::of_node(after.clone());
    let prepared = kernel.prepare(&Plan::default(), &found, installed);
    prepared.unwrap_or_else(|e| panic!("{name}: opening the kernel failed: {e}"));
    plan.apply_to(&mut after, None);
    let committed = kernel.commit(&plan, &Objects::of_node(after));
    committed.unwrap_or_else(|e| panic!("{name}: tampering was refused: {e}"));
}

/// Applies `state` whole, as the runner does at a start and a retry.
fn load<S: Subject>(subject: &S, backend: &mut Tested<S>, state: &dyn NodeState) {
    let applied = backend.apply(&ChangeSet::full(state));
    applied.unwrap_or_else(|e| panic!("{}: a full state was refused: {e:?}", subject.name()));
}

/// Applies the change from `before` to `after`.
fn change<S: Subject>(
    backend: &mut Tested<S>,
    before: &LocalState,
    after: &LocalState,
) -> Result<(), kpng_backend::BackendError> {
    change_to::<S>(backend, before, after, after)
}

/// Applies the change from `before` to `after`, the backend reading the state from `read`
/// (`after` itself, or a view that makes it on demand).
fn change_to<S: Subject>(
    backend: &mut Tested<S>,
    before: &LocalState,
    after: &LocalState,
    read: &dyn NodeState,
) -> Result<(), kpng_backend::BackendError> {
    let ops = kpng_local::diff(before, after);
    backend.apply(&ChangeSet::changes(&ops, read))
}

/// What a fresh load of `state` leaves in a wiped kernel.
pub fn fresh<S: Subject>(subject: &S, state: &LocalState) -> Vec<String> {
    subject.wipe();
    load(subject, &mut start(subject), state);
    subject.canonical(&contents(subject))
}

/// Runs every check, and `cases` random histories.
pub fn run<S: Subject>(subject: &S, cases: u32) {
    refused_commit_leaves_the_previous_state(subject);
    refused_first_load_is_completed(subject);
    restart_writes_nothing(subject);
    drift_is_found_and_repaired(subject);
    drift_before_a_change_is_found(subject);
    histories_end_as_a_fresh_load(subject, cases);
    subject.wipe();
}

/// A refused commit leaves the kernel as the declared unit says; the retry repairs it.
pub fn refused_commit_leaves_the_previous_state<S: Subject>(subject: &S) {
    let name = subject.name();
    let (a, b) = states::pair();
    let expected = fresh(subject, &b);
    subject.wipe();
    let mut backend = start(subject);
    load(subject, &mut backend, &a);
    let before = contents(subject);
    backend.kernel().arm(true);
    let refused = change::<S>(&mut backend, &a, &b);
    assert!(refused.is_err(), "{name}: a commit with a refused write succeeded");
    let after = contents(subject);
    match <S::Kernel as Kernel>::UNIT {
        Unit::Plan => assert!(after == before, "{name}: a refused plan changed the kernel"),
        Unit::Write => {
            // Only writes of the refused plan were made: every object is as before, or as
            // the plan wanted it (what the backend now counts as held).
            let planned = backend.held().to_map();
            for key in before.keys().chain(after.keys()).chain(planned.keys()) {
                let now = after.get(key);
                let kept = now == before.get(key) || now == planned.get(key);
                assert!(kept, "{name}: {key:?} is {now:?}, in neither the old state nor the plan");
            }
        }
        Unit::Group => {
            // The poison's group is as before; every other group is as planned.
            let refused = subject.poison().0.group();
            let planned = backend.held().to_map();
            let mut others = 0;
            for key in before.keys().chain(after.keys()).chain(planned.keys()) {
                let now = after.get(key);
                if key.group() == refused {
                    assert!(now == before.get(key), "{name}: {key:?} of the refused group changed");
                } else {
                    others += usize::from(before.get(key) != planned.get(key));
                    let what = "of a group that was not refused is not as planned";
                    assert!(now == planned.get(key), "{name}: {key:?} {what}");
                }
            }
            assert!(others > 0, "{name}: the change wrote nothing outside the refused group");
        }
    }
    backend.kernel().arm(false);
    load(subject, &mut backend, &b);
    assert_eq!(subject.canonical(&contents(subject)), expected, "{name}: the retry did not repair");
    assert!(finds_no_drift(backend.stats(), &mut backend), "{name}: the retry left drift");
}

/// A first load over a wiped kernel (streamed in parts where the kernel allows,
/// [`Kernel::stream`]) that the kernel refuses is completed by the retry.
pub fn refused_first_load_is_completed<S: Subject>(subject: &S) {
    let name = subject.name();
    let (_, b) = states::pair();
    let expected = fresh(subject, &b);
    subject.wipe();
    let mut backend = start(subject);
    backend.kernel().arm(true);
    let refused = backend.apply(&ChangeSet::full(&b));
    assert!(refused.is_err(), "{name}: a first load with a refused write succeeded");
    backend.kernel().arm(false);
    load(subject, &mut backend, &b);
    assert_eq!(
        subject.canonical(&contents(subject)),
        expected,
        "{name}: the retry did not complete"
    );
    assert!(finds_no_drift(backend.stats(), &mut backend), "{name}: the retry left drift");
}

/// A new process over what the last one committed writes nothing.
pub fn restart_writes_nothing<S: Subject>(subject: &S) {
    let name = subject.name();
    let (a, b) = states::pair();
    subject.wipe();
    let mut first = start(subject);
    load(subject, &mut first, &a);
    change::<S>(&mut first, &a, &b)
        .unwrap_or_else(|e| panic!("{name}: a change was refused: {e:?}"));
    drop(first);
    let mut restarted = start(subject);
    load(subject, &mut restarted, &b);
    let writes = restarted.stats().writes.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(writes, 0, "{name}: a restart over a right kernel wrote {writes} objects");
    assert!(finds_no_drift(restarted.stats(), &mut restarted), "{name}: a restart left drift");
}

/// An upgrade over an older layout migrates in place: over what a release whose objects
/// the current one names or shapes differently left in the kernel (put there by
/// `install`), loading the second state of [`states::pair`] leaves what a fresh load
/// leaves, and a restart then writes nothing.
pub fn upgrade_migrates<S: Subject>(subject: &S, install: impl FnOnce()) {
    let name = subject.name();
    let (_, b) = states::pair();
    let expected = fresh(subject, &b);
    subject.wipe();
    install();
    let before = subject.canonical(&contents(subject));
    assert!(!before.is_empty(), "{name}: the older release's objects are not in the kernel");
    assert_ne!(before, expected, "{name}: the older layout is the current one");
    load(subject, &mut start(subject), &b);
    let after = subject.canonical(&contents(subject));
    let stale: Vec<&String> = after.iter().filter(|o| !expected.contains(o)).collect();
    let missing: Vec<&String> = expected.iter().filter(|o| !after.contains(o)).collect();
    assert!(
        stale.is_empty() && missing.is_empty(),
        "{name}: the upgrade did not end as a fresh load: left {stale:#?}, missing {missing:#?}"
    );
    let mut restarted = start(subject);
    load(subject, &mut restarted, &b);
    let writes = restarted.stats().writes.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(writes, 0, "{name}: a restart after the upgrade wrote {writes} objects");
}

/// An upgrade writes nothing: over what the previous release left in the kernel for the
/// second state of [`states::pair`] (put there by `install`, from a fixture that release
/// wrote), the current one loads that state without a write.
pub fn upgrade_writes_nothing<S: Subject>(subject: &S, install: impl FnOnce()) {
    let name = subject.name();
    let (_, b) = states::pair();
    subject.wipe();
    install();
    let before = contents(subject);
    assert!(!before.is_empty(), "{name}: the previous release's objects are not in the kernel");
    let mut upgraded = start(subject);
    load(subject, &mut upgraded, &b);
    let after = contents(subject);
    let mut differ: Vec<String> = before
        .iter()
        .filter(|(k, v)| after.get(*k) != Some(*v))
        .map(|(k, v)| format!("{k:?} was {v:?}, now {:?}", after.get(k)))
        .chain(after.keys().filter(|k| !before.contains_key(*k)).map(|k| format!("{k:?} added")))
        .collect();
    differ.sort();
    assert!(
        differ.is_empty(),
        "{name}: an upgrade rewrote what the previous release wrote: {differ:#?}"
    );
    let writes = upgraded.stats().writes.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(writes, 0, "{name}: an upgrade wrote {writes} objects");
    subject.wipe();
}

/// Each kind of drift is found by a verification (counted as a drift), and repaired by
/// it in place (the kernel then holds what was committed as the verification returns) or
/// by the reset after it.
pub fn drift_is_found_and_repaired<S: Subject>(subject: &S) {
    let name = subject.name();
    let (a, _) = states::pair();
    let kinds = ["deleted", "changed", "foreign"];
    for kind in kinds {
        subject.wipe();
        let mut backend = start(subject);
        load(subject, &mut backend, &a);
        let right = contents(subject);
        let mut keys: Vec<&Key<S>> = right.keys().collect();
        keys.sort();
        let first = keys.first().unwrap_or_else(|| panic!("{name}: the sample left nothing"));
        let plan = match kind {
            "deleted" => {
                let deleted = ((*first).clone(), right[*first].clone());
                Plan { upserts: vec![], deletes: vec![deleted] }
            }
            "changed" => {
                let change = keys.iter().find_map(|k| {
                    let value = &right[*k];
                    Some(((*k).clone(), Some(value.clone()), subject.changed(k, value)?))
                });
                let change = change.unwrap_or_else(|| panic!("{name}: no object can change"));
                Plan { upserts: vec![change], deletes: vec![] }
            }
            _ => {
                let (key, value) = subject.foreign();
                Plan { upserts: vec![(key, None, value)], deletes: vec![] }
            }
        };
        tamper(subject, plan);
        let held = verify_counting_drift(&mut backend, &format!("{name}: an object {kind}"));
        if !held {
            load(subject, &mut backend, &a);
        }
        assert!(contents(subject) == right, "{name}: an object {kind} was not repaired");
        assert!(
            finds_no_drift(backend.stats(), &mut backend),
            "{name}: drift remained after repair"
        );
    }
}

/// Whether a verification of `backend` (whose template counters are `stats`) finds the
/// kernel holding what was committed: it succeeds, and finds no drift (a verification that
/// repairs drift in place also says the kernel holds the state, so the drift counter tells
/// the two apart). `finds_no_drift(b.stats(), &mut b)`.
pub fn finds_no_drift(stats: Arc<Stats>, backend: &mut dyn Backend) -> bool {
    let before = stats.drifts.load(std::sync::atomic::Ordering::Relaxed);
    let held = backend.verify().ok() == Some(true);
    held && stats.drifts.load(std::sync::atomic::Ordering::Relaxed) == before
}

/// Verifies once, which must find drift (`what` went unseen otherwise): whether the
/// backend repaired it in place.
fn verify_counting_drift<R, K>(backend: &mut Reconciler<R, K>, what: &str) -> bool
where
    R: Render,
    K: Kernel<Key = R::Key, Value = R::Value>,
{
    let stats = backend.stats();
    let drifts = || stats.drifts.load(std::sync::atomic::Ordering::Relaxed);
    let before = drifts();
    let held = backend.verify();
    let held = held.unwrap_or_else(|e| panic!("{what}: the verification failed: {e}"));
    assert_eq!(drifts(), before + 1, "{what} went unseen");
    held
}

/// A foreign object added, then a change committed by kpng before the next verification:
/// the verification still finds the foreign object (kpng's commit must not make the kernel
/// pass for known right), and no verification finds drift where the kernel holds exactly
/// what kpng committed.
pub fn drift_before_a_change_is_found<S: Subject>(subject: &S) {
    let name = subject.name();
    let (a, b) = states::pair();
    subject.wipe();
    let mut backend = start(subject);
    load(subject, &mut backend, &a);
    let (key, value) = subject.foreign();
    tamper(subject, Plan { upserts: vec![(key, None, value)], deletes: vec![] });
    let changed = change::<S>(&mut backend, &a, &b);
    changed.unwrap_or_else(|e| panic!("{name}: the change was refused: {e:?}"));
    let exact = backend.held().to_map() == contents(subject);
    assert!(!exact, "{name}: the change removed the foreign object");
    let held = verify_counting_drift(&mut backend, &format!("{name}: drift before a change"));
    if !held {
        load(subject, &mut backend, &b);
    }
    assert!(finds_no_drift(backend.stats(), &mut backend), "{name}: drift remained after repair");
    assert!(backend.held().to_map() == contents(subject), "{name}: not repaired");
    subject.wipe();
}

/// What happens between two states of a history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// The change is applied.
    Change,
    /// The change's commit is refused; the runner retries with the whole state.
    Refused,
    /// The process restarts, then gets the whole state.
    Restart,
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![6 => Just(Event::Change), 1 => Just(Event::Refused), 1 => Just(Event::Restart)]
}

/// Random histories with refused commits and restarts end where a fresh load ends, and a
/// restart after them writes nothing.
pub fn histories_end_as_a_fresh_load<S: Subject>(subject: &S, cases: u32) {
    let name = subject.name();
    let config = ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() };
    let mut runner = proptest::test_runner::TestRunner::new(config);
    let strategy = proptest::collection::vec((states::arb_step(), arb_event()), 1..24);
    let result = runner.run(&strategy, |steps| {
        subject.wipe();
        let mut backend = start(subject);
        let mut history = states::History::default();
        let mut before = LocalState::default();
        load(subject, &mut backend, &before);
        for (mutations, event) in &steps {
            let after = history.step(mutations);
            match event {
                // Read from the model on demand, as from a state held whole: the same.
                Event::Change => change_to::<S>(&mut backend, &before, &after, &history.view())
                    .map_err(|e| TestCaseError::fail(format!("refused: {e:?}")))?,
                Event::Refused => {
                    backend.kernel().arm(true);
                    let refused = change::<S>(&mut backend, &before, &after);
                    backend.kernel().arm(false);
                    // A change that writes nothing commits nothing, and so cannot fail.
                    if refused.is_err() {
                        load(subject, &mut backend, &after);
                    }
                }
                Event::Restart => {
                    backend = start(subject);
                    load(subject, &mut backend, &history.view());
                }
            }
            before = after;
        }
        let ended = subject.canonical(&contents(subject));
        prop_assert!(
            finds_no_drift(backend.stats(), &mut backend),
            "{name}: the history left drift"
        );
        let mut restarted = start(subject);
        load(subject, &mut restarted, &before);
        let writes = restarted.stats().writes.load(std::sync::atomic::Ordering::Relaxed);
        prop_assert_eq!(writes, 0, "{}: a restart after the history wrote", name);
        prop_assert_eq!(ended, fresh(subject, &before), "{}: differs from a fresh load", name);
        Ok(())
    });
    if let Err(failure) = result {
        panic!("{name}: {failure}");
    }
}
