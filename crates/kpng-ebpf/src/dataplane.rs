//! [`Dataplane`]: where map writes go. [`KernelDataplane`](crate::KernelDataplane) writes
//! the kernel's maps; [`MemoryDataplane`] keeps them in memory (tests) and can print every
//! write (`--dry-run`).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;

use crate::error::EbpfError;
use crate::maps::{Key, MapName, Value};

/// Map writes, in the order they must be made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Batch {
    /// Elements to create or replace, ordered by [`MapName::ALL`].
    pub upserts: Vec<(Key, Value)>,
    /// Elements to delete, after the upserts, in the reverse map order.
    pub deletes: Vec<Key>,
}

impl Batch {
    /// Whether the batch writes nothing.
    pub fn is_empty(&self) -> bool {
        self.upserts.is_empty() && self.deletes.is_empty()
    }

    /// The number of element writes (upserts and deletions).
    pub fn len(&self) -> usize {
        self.upserts.len() + self.deletes.len()
    }
}

/// The number of entries each map can hold.
pub type Capacities = BTreeMap<MapName, u32>;

/// The smallest capacity a map gets.
pub const MIN_CAPACITY: u32 = 1024;

/// Room for `count` entries with headroom: twice the count, a power of two, at least
/// [`MIN_CAPACITY`]. Maps are created without preallocation, so headroom costs only hash
/// buckets.
pub fn capacity_for(count: usize) -> u32 {
    let wanted = (count.saturating_mul(2)).clamp(MIN_CAPACITY as usize, 1 << 30);
    wanted.next_power_of_two() as u32
}

/// Capacities with headroom for `counts`.
pub fn capacities_for(counts: &BTreeMap<MapName, usize>) -> Capacities {
    MapName::ALL.iter().map(|m| (*m, capacity_for(counts.get(m).copied().unwrap_or(0)))).collect()
}

/// What the maps hold, read back.
#[derive(Debug, Clone, Default)]
pub struct Snapshot {
    /// Every element kpng wrote.
    pub elements: HashMap<Key, Value>,
    /// Each map's capacity.
    pub capacities: Capacities,
}

/// The programs and maps of the eBPF backend.
pub trait Dataplane: Send {
    /// What the installed maps hold, or `None` when nothing is installed yet. Called at
    /// every reset (a restart adopts what it finds; a reset after a failure repairs it).
    fn read(&mut self) -> Result<Option<Snapshot>, EbpfError>;

    /// Makes sure the programs are attached and the maps exist with at least
    /// `capacities` (creating what is missing, keeping what is already right).
    fn install(&mut self, capacities: &Capacities) -> Result<(), EbpfError>;

    /// Makes the writes of `batch`, in order. On error, some may have been made: the
    /// caller reads the maps back at the next reset.
    fn write(&mut self, batch: &Batch) -> Result<(), EbpfError>;

    /// Moves to maps of `capacities` holding `elements`, without a moment where sockets
    /// see no service.
    fn grow(
        &mut self,
        capacities: &Capacities,
        elements: &HashMap<Key, Value>,
    ) -> Result<(), EbpfError>;

    /// Whether the maps still hold `expected` (a check once per sync period).
    fn verify(&mut self, expected: &HashMap<Key, Value>) -> Result<bool, EbpfError> {
        let _ = expected;
        Ok(true)
    }

    /// The programs that should run on the cgroup and do not: detached behind kpng's back,
    /// or their cgroup removed and created again (checked at each sync period; the next
    /// [`install`](Self::install) attaches them again). None until installed.
    fn unattached(&mut self) -> Result<Vec<&'static str>, EbpfError> {
        Ok(Vec::new())
    }
}

/// Maps in memory, optionally printing every write: the dry run, and the tests' kernel.
pub struct MemoryDataplane {
    maps: Option<Snapshot>,
    out: Option<Box<dyn Write + Send>>,
    /// Element writes made so far (upserts and deletions).
    pub writes: usize,
    /// Times the maps were grown.
    pub grown: usize,
}

impl MemoryDataplane {
    /// Empty maps, printing nothing.
    pub fn new() -> Self {
        MemoryDataplane { maps: None, out: None, writes: 0, grown: 0 }
    }

    /// Empty maps; every write is printed to `out`.
    pub fn printing(out: impl Write + Send + 'static) -> Self {
        MemoryDataplane { out: Some(Box::new(out)), ..MemoryDataplane::new() }
    }

    /// Maps that already hold `elements` (as after a restart).
    pub fn holding(snapshot: Snapshot) -> Self {
        MemoryDataplane { maps: Some(snapshot), ..MemoryDataplane::new() }
    }

    /// What the maps hold.
    pub fn snapshot(&self) -> Option<&Snapshot> {
        self.maps.as_ref()
    }

    fn print(&mut self, text: impl FnOnce() -> String) -> Result<(), EbpfError> {
        if let Some(out) = self.out.as_mut() {
            out.write_all(text().as_bytes())
                .and_then(|()| out.flush())
                .map_err(|source| EbpfError::Print { source })?;
        }
        Ok(())
    }
}

impl Default for MemoryDataplane {
    fn default() -> Self {
        MemoryDataplane::new()
    }
}

impl Dataplane for MemoryDataplane {
    fn read(&mut self) -> Result<Option<Snapshot>, EbpfError> {
        Ok(self.maps.clone())
    }

    fn install(&mut self, capacities: &Capacities) -> Result<(), EbpfError> {
        if self.maps.is_none() {
            self.print(|| {
                let sizes: Vec<String> =
                    capacities.iter().map(|(m, c)| format!("{} {c}", m.object_name())).collect();
                format!("# maps created with capacities: {}\n", sizes.join(", "))
            })?;
            self.maps = Some(Snapshot { elements: HashMap::new(), capacities: capacities.clone() });
        }
        Ok(())
    }

    fn write(&mut self, batch: &Batch) -> Result<(), EbpfError> {
        let maps = self.maps.as_mut().ok_or(EbpfError::NotInstalled)?;
        for (key, value) in &batch.upserts {
            let map = key.map();
            let count = maps.elements.keys().filter(|k| k.map() == map).count();
            let capacity = maps.capacities.get(&map).copied().unwrap_or(0) as usize;
            if !maps.elements.contains_key(key) && count >= capacity {
                return Err(EbpfError::MapFull { map: map.object_name(), capacity });
            }
            maps.elements.insert(*key, *value);
        }
        for key in &batch.deletes {
            maps.elements.remove(key);
        }
        self.writes += batch.len();
        self.print(|| {
            let mut text = String::new();
            for (key, value) in &batch.upserts {
                text.push_str(&format!("update {} {key} => {value}\n", key.map().object_name()));
            }
            for key in &batch.deletes {
                text.push_str(&format!("delete {} {key}\n", key.map().object_name()));
            }
            text
        })
    }

    fn grow(
        &mut self,
        capacities: &Capacities,
        elements: &HashMap<Key, Value>,
    ) -> Result<(), EbpfError> {
        self.maps = Some(Snapshot { elements: elements.clone(), capacities: capacities.clone() });
        self.grown += 1;
        self.writes += elements.len();
        self.print(|| {
            let sizes: Vec<String> =
                capacities.iter().map(|(m, c)| format!("{} {c}", m.object_name())).collect();
            format!(
                "# maps grown to capacities: {} ({} elements copied)\n",
                sizes.join(", "),
                elements.len()
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacities_have_headroom() {
        assert_eq!(capacity_for(0), MIN_CAPACITY);
        assert_eq!(capacity_for(600), 2048);
        assert_eq!(capacity_for(30_000), 65_536);
    }
}
