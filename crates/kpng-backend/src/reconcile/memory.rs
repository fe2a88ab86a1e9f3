//! [`MemoryKernel`]: a kernel that keeps its objects in memory, shared between its clones
//! (a restarted reconciler opens the same one). Plans are committed whole; a key can be
//! made refused, so that any plan writing it fails and changes nothing.

use std::collections::{BTreeSet, HashMap};
use std::fmt::Debug;
use std::hash::Hash;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{Filed, Kernel, Objects, Pack, Plan, Rank, Unit};

/// Why the in-memory kernel refused a plan.
#[derive(Debug, thiserror::Error)]
#[error("the kernel refuses {key}")]
pub struct Refused {
    /// The refused key, as debug text.
    pub key: String,
}

#[derive(Debug)]
struct Inner<K, V> {
    objects: Option<HashMap<K, V>>,
    refused: BTreeSet<K>,
    generation: u64,
}

/// Objects in memory; clones share them.
#[derive(Debug)]
pub struct MemoryKernel<K, V>(Arc<Mutex<Inner<K, V>>>);

impl<K, V> Clone for MemoryKernel<K, V> {
    fn clone(&self) -> Self {
        MemoryKernel(self.0.clone())
    }
}

impl<K, V> Default for MemoryKernel<K, V> {
    fn default() -> Self {
        let inner = Inner { objects: None, refused: BTreeSet::new(), generation: 0 };
        MemoryKernel(Arc::new(Mutex::new(inner)))
    }
}

impl<K, V> MemoryKernel<K, V>
where
    K: Clone + Ord + Hash,
    V: Clone,
{
    /// A kernel with nothing installed.
    pub fn new() -> Self {
        Self::default()
    }

    fn inner(&self) -> MutexGuard<'_, Inner<K, V>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What it holds (`None`: nothing installed).
    pub fn objects(&self) -> Option<HashMap<K, V>> {
        self.inner().objects.clone()
    }

    /// Every plan writing `key` is refused.
    pub fn refuse(&self, key: K) {
        self.inner().refused.insert(key);
    }
}

impl<K, V> Kernel for MemoryKernel<K, V>
where
    K: Clone + Ord + Filed + Rank + Pack + Debug + Send,
    V: Clone + Eq + Default + Pack + Debug + Send,
{
    type Key = K;
    type Value = V;
    type Error = Refused;

    const UNIT: Unit = Unit::Plan;

    fn read(&mut self) -> Result<Option<HashMap<K, V>>, Refused> {
        Ok(self.objects())
    }

    fn prepare(
        &mut self,
        _plan: &Plan<K, V>,
        _after: &Objects<K, V>,
        _installed: bool,
    ) -> Result<(), Refused> {
        let mut inner = self.inner();
        if inner.objects.is_none() {
            inner.objects = Some(HashMap::new());
            inner.generation += 1;
        }
        Ok(())
    }

    fn commit(&mut self, plan: &Plan<K, V>, _after: &Objects<K, V>) -> Result<(), Refused> {
        let mut inner = self.inner();
        let written =
            plan.upserts.iter().map(|(k, _, _)| k).chain(plan.deletes.iter().map(|(k, _)| k));
        if let Some(key) = written.into_iter().find(|k| inner.refused.contains(k)) {
            return Err(Refused { key: format!("{key:?}") });
        }
        plan.apply_to(inner.objects.get_or_insert_default(), None);
        inner.generation += 1;
        Ok(())
    }

    fn generation(&mut self) -> Option<u64> {
        Some(self.inner().generation)
    }
}
