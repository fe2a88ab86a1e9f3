//! to-ebpf passes kpng's conformance suite over maps in memory that write one element at
//! a time, as the kernel's maps do ([`Unit::Write`](kpng_backend::reconcile::Unit)).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use kpng_conformance::{Key as KeyOf, Subject, Value as ValueOf};
use kpng_ebpf::backend::{EbpfKernel, EbpfRender};
use kpng_ebpf::dataplane::{Batch, Capacities, Snapshot};
use kpng_ebpf::maps::{Key, Value};
use kpng_ebpf::{Dataplane, EbpfError};

/// The cluster IP the maps refuse.
const POISON: &str = "0.0.0.0";

/// Maps shared by every opening, as pinned maps are.
#[derive(Clone, Default)]
struct Maps(Arc<Mutex<Option<Snapshot>>>);

impl Maps {
    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Snapshot>> {
        self.0.lock().unwrap()
    }
}

impl Dataplane for Maps {
    fn read(&mut self) -> Result<Option<Snapshot>, EbpfError> {
        Ok(self.lock().clone())
    }

    fn install(&mut self, capacities: &Capacities) -> Result<(), EbpfError> {
        let mut maps = self.lock();
        let maps = maps.get_or_insert_with(Snapshot::default);
        maps.capacities = capacities.clone();
        Ok(())
    }

    fn write(&mut self, batch: &Batch) -> Result<(), EbpfError> {
        let mut maps = self.lock();
        let maps = maps.as_mut().ok_or(EbpfError::NotInstalled)?;
        let poison = Key::ClusterIp(POISON.parse().unwrap());
        for (key, value) in &batch.upserts {
            if *key == poison {
                return Err(EbpfError::MapFull { map: "kpng_cluster_ips", capacity: 0 });
            }
            let count = maps.elements.keys().filter(|k| k.map() == key.map()).count();
            let capacity = maps.capacities.get(&key.map()).copied().unwrap_or(0) as usize;
            if !maps.elements.contains_key(key) && count >= capacity {
                let map = key.map().object_name();
                return Err(EbpfError::MapFull { map, capacity });
            }
            maps.elements.insert(*key, *value);
        }
        for key in &batch.deletes {
            maps.elements.remove(key);
        }
        Ok(())
    }

    fn grow(
        &mut self,
        capacities: &Capacities,
        elements: &HashMap<Key, Value>,
    ) -> Result<(), EbpfError> {
        let grown = Snapshot { elements: elements.clone(), capacities: capacities.clone() };
        *self.lock() = Some(grown);
        Ok(())
    }
}

struct Memory {
    maps: Maps,
}

impl Subject for Memory {
    type Render = EbpfRender;
    type Kernel = EbpfKernel;

    fn name(&self) -> &'static str {
        "to-ebpf over maps in memory"
    }

    fn render(&self) -> EbpfRender {
        EbpfRender::default()
    }

    fn open(&self) -> EbpfKernel {
        EbpfKernel::new(Box::new(self.maps.clone()))
    }

    fn wipe(&self) {
        *self.maps.lock() = None;
    }

    fn poison(&self) -> (KeyOf<Self>, ValueOf<Self>) {
        (Key::ClusterIp(POISON.parse().unwrap()), Value::Present)
    }

    fn foreign(&self) -> (KeyOf<Self>, ValueOf<Self>) {
        (Key::ClusterIp("192.0.2.200".parse().unwrap()), Value::Present)
    }

    fn changed(&self, _key: &Key, value: &Value) -> Option<Value> {
        match *value {
            Value::Frontend { group, empty, flow_seconds } => {
                Some(Value::Frontend { group, empty, flow_seconds: flow_seconds + 1 })
            }
            Value::Group { count, affinity_seconds } => {
                Some(Value::Group { count, affinity_seconds: affinity_seconds + 1 })
            }
            Value::Backend((ip, port)) => Some(Value::Backend((ip, port.wrapping_add(1)))),
            Value::Present => None,
        }
    }

    /// Slot positions depend on history: a group's endpoints as a set instead.
    fn canonical(&self, objects: &HashMap<Key, Value>) -> Vec<String> {
        let mut out: Vec<String> = objects
            .iter()
            .map(|(k, v)| match (k, v) {
                (Key::Backend(g, _), Value::Backend(t)) => format!("{:?}", Key::Member(*g, *t)),
                _ => format!("{k:?} = {v:?}"),
            })
            .collect();
        out.sort();
        out
    }
}

#[test]
fn ebpf_maps_in_memory_conform() {
    kpng_conformance::run(&Memory { maps: Maps::default() }, 64);
}

/// The kernel's maps, refusing the poison key where a batch reaches it: the writes before
/// it are made, as when the kernel refuses an element part-way through a batch.
struct Refusing(kpng_ebpf::KernelDataplane);

impl Dataplane for Refusing {
    fn read(&mut self) -> Result<Option<Snapshot>, EbpfError> {
        self.0.read()
    }

    fn install(&mut self, capacities: &Capacities) -> Result<(), EbpfError> {
        self.0.install(capacities)
    }

    fn write(&mut self, batch: &Batch) -> Result<(), EbpfError> {
        let poison = Key::ClusterIp(POISON.parse().unwrap());
        let Some(at) = batch.upserts.iter().position(|(k, _)| *k == poison) else {
            return self.0.write(batch);
        };
        let before = Batch { upserts: batch.upserts[..at].to_vec(), deletes: Vec::new() };
        self.0.write(&before)?;
        Err(EbpfError::MapFull { map: "kpng_cluster_ips", capacity: 0 })
    }

    fn grow(
        &mut self,
        capacities: &Capacities,
        elements: &HashMap<Key, Value>,
    ) -> Result<(), EbpfError> {
        self.0.grow(capacities, elements)
    }

    fn unattached(&mut self) -> Result<Vec<&'static str>, EbpfError> {
        self.0.unattached()
    }
}

/// Programs attached to a cgroup of the test's own (no process runs in it), and maps
/// pinned under a directory of its own; both removed on drop.
struct Pinned {
    cgroup: std::path::PathBuf,
    pins: std::path::PathBuf,
}

impl Drop for Pinned {
    fn drop(&mut self) {
        let _ = kpng_ebpf::pins::cleanup(&self.pins);
        let _ = std::fs::remove_dir(&self.pins);
        for _ in 0..50 {
            if std::fs::remove_dir(&self.cgroup).is_ok() || !self.cgroup.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Subject for Pinned {
    type Render = EbpfRender;
    type Kernel = EbpfKernel;

    fn name(&self) -> &'static str {
        "to-ebpf over the kernel's maps"
    }

    fn render(&self) -> EbpfRender {
        EbpfRender::default()
    }

    fn open(&self) -> EbpfKernel {
        let options =
            kpng_ebpf::KernelOptions { cgroup: self.cgroup.clone(), pin_root: self.pins.clone() };
        let dataplane = kpng_ebpf::KernelDataplane::open(options).expect("opening the maps");
        EbpfKernel::new(Box::new(Refusing(dataplane)))
    }

    fn wipe(&self) {
        kpng_ebpf::pins::cleanup(&self.pins).expect("removing the test's pins");
    }

    fn poison(&self) -> (KeyOf<Self>, ValueOf<Self>) {
        Memory { maps: Maps::default() }.poison()
    }

    fn foreign(&self) -> (KeyOf<Self>, ValueOf<Self>) {
        Memory { maps: Maps::default() }.foreign()
    }

    fn changed(&self, key: &Key, value: &Value) -> Option<Value> {
        Memory { maps: Maps::default() }.changed(key, value)
    }

    fn canonical(&self, objects: &HashMap<Key, Value>) -> Vec<String> {
        Memory { maps: Maps::default() }.canonical(objects)
    }
}

#[test]
fn ebpf_maps_in_the_kernel_conform() {
    let test = "to-ebpf's conformance on the kernel's maps";
    if !kpng_testkit::privileged::require(test, &[]) {
        return;
    }
    if let Err(error) =
        kpng_ebpf::support::cgroup2_root().and_then(|_| kpng_ebpf::support::object().map(drop))
    {
        kpng_testkit::privileged::skip(&format!(
            "{test} needs cgroup v2 and the BPF object: {error}"
        ));
        return;
    }
    let name = format!("kpng-conformance-{}", std::process::id());
    let cgroup = kpng_ebpf::support::cgroup2_root().unwrap().join(&name);
    std::fs::create_dir_all(&cgroup).expect("creating the test's cgroup");
    let subject = Pinned { cgroup, pins: std::path::PathBuf::from("/sys/fs/bpf").join(name) };
    kpng_conformance::run(&subject, 16);
}
