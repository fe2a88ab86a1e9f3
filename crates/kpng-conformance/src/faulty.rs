//! [`Faulty`]: a kernel that, while armed, adds a write the kernel refuses to the end of
//! each plan, so that the real kernel fails the commit part-way, as it would on its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};

use kpng_backend::reconcile::{Kernel, Objects, Plan, Sample, Unit};

/// A kernel whose commits fail while armed.
pub struct Faulty<K: Kernel> {
    inner: K,
    poison: (K::Key, K::Value),
    armed: AtomicBool,
}

impl<K: Kernel> Faulty<K> {
    /// `inner`, which refuses to write `poison`.
    pub fn new(inner: K, poison: (K::Key, K::Value)) -> Self {
        Faulty { inner, poison, armed: AtomicBool::new(false) }
    }

    /// While armed, every commit ends with the refused write.
    pub fn arm(&self, armed: bool) {
        self.armed.store(armed, Ordering::Relaxed);
    }

    /// `plan`, ending with the refused write while armed.
    fn poisoned(&self, plan: &Plan<K::Key, K::Value>) -> Plan<K::Key, K::Value> {
        let mut poisoned = plan.clone();
        if self.armed.load(Ordering::Relaxed) {
            let (key, value) = self.poison.clone();
            poisoned.upserts.push((key, None, value));
        }
        poisoned
    }
}

impl<K: Kernel> Kernel for Faulty<K> {
    type Key = K::Key;
    type Value = K::Value;
    type Error = K::Error;

    const UNIT: Unit = K::UNIT;
    const WHAT: &'static str = K::WHAT;
    const APPLIED: &'static str = K::APPLIED;

    fn read(&mut self) -> Result<Option<HashMap<K::Key, K::Value>>, K::Error> {
        self.inner.read()
    }

    fn prepare(
        &mut self,
        plan: &Plan<K::Key, K::Value>,
        after: &Objects<K::Key, K::Value>,
        installed: bool,
    ) -> Result<(), K::Error> {
        self.inner.prepare(plan, after, installed)
    }

    fn commit(
        &mut self,
        plan: &Plan<K::Key, K::Value>,
        after: &Objects<K::Key, K::Value>,
    ) -> Result<(), K::Error> {
        self.inner.commit(&self.poisoned(plan), after)
    }

    fn resetting(&mut self, state: &dyn kpng_model::NodeState) {
        self.inner.resetting(state);
    }

    fn stream(&self) -> Option<usize> {
        self.inner.stream()
    }

    fn commit_part(&mut self, plan: &Plan<K::Key, K::Value>) -> Result<(), K::Error> {
        self.inner.commit_part(&self.poisoned(plan))
    }

    fn sample(&mut self) -> Result<Sample<Self>, K::Error> {
        Ok(match self.inner.sample()? {
            Sample::Whole(held) => Sample::Whole(held),
            Sample::Part { held, covers } => Sample::Part { held, covers },
        })
    }

    fn sample_touched(&mut self, known: u64, now: u64) -> Result<Option<Sample<Self>>, K::Error> {
        Ok(self.inner.sample_touched(known, now)?.map(|sample| match sample {
            Sample::Whole(held) => Sample::Whole(held),
            Sample::Part { held, covers } => Sample::Part { held, covers },
        }))
    }

    fn generation(&mut self) -> Option<u64> {
        self.inner.generation()
    }

    fn untouched(&mut self, known: u64, now: u64) -> bool {
        self.inner.untouched(known, now)
    }

    fn transactions(&self) -> u64 {
        self.inner.transactions()
    }

    fn faults(&mut self) -> Result<Vec<String>, K::Error> {
        self.inner.faults()
    }

    fn is_permanent(error: &K::Error) -> bool {
        K::is_permanent(error)
    }
}
