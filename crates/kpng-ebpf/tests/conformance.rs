//! to-ebpf passes kpng's conformance suite, writing one element at a time as the kernel's
//! maps do ([`Unit::Write`](kpng_backend::reconcile::Unit)): over maps in memory, and over
//! the kernel's own maps (as root).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kpng_conformance::{Key as KeyOf, Subject, Value as ValueOf};
use kpng_ebpf::backend::{EbpfKernel, EbpfRender};
use kpng_ebpf::dataplane::{Batch, Capacities, Snapshot};
use kpng_ebpf::maps::{Key, Value};
use kpng_ebpf::{Dataplane, EbpfError, MemoryDataplane};

/// The cluster IP the maps refuse.
const POISON: &str = "0.0.0.0";

fn poison() -> Key {
    Key::ClusterIp(POISON.parse().unwrap())
}

/// Maps that refuse the poison key where a batch reaches it: the writes before it are
/// made, as when the kernel refuses an element part-way through a batch.
struct Refusing<D>(D);

impl<D: Dataplane> Dataplane for Refusing<D> {
    fn read(&mut self) -> Result<Option<Snapshot>, EbpfError> {
        self.0.read()
    }

    fn install(&mut self, capacities: &Capacities) -> Result<(), EbpfError> {
        self.0.install(capacities)
    }

    fn write(&mut self, batch: &Batch) -> Result<(), EbpfError> {
        let Some(at) = batch.upserts.iter().position(|(k, _)| *k == poison()) else {
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

/// Maps in memory shared by every opening, as pinned maps are.
#[derive(Clone, Default)]
struct Shared(Arc<Mutex<MemoryDataplane>>);

impl Shared {
    fn maps(&self) -> std::sync::MutexGuard<'_, MemoryDataplane> {
        self.0.lock().unwrap()
    }
}

impl Dataplane for Shared {
    fn read(&mut self) -> Result<Option<Snapshot>, EbpfError> {
        self.maps().read()
    }

    fn install(&mut self, capacities: &Capacities) -> Result<(), EbpfError> {
        self.maps().install(capacities)
    }

    fn write(&mut self, batch: &Batch) -> Result<(), EbpfError> {
        self.maps().write(batch)
    }

    fn grow(
        &mut self,
        capacities: &Capacities,
        elements: &HashMap<Key, Value>,
    ) -> Result<(), EbpfError> {
        self.maps().grow(capacities, elements)
    }
}

/// Where the maps are.
enum Maps {
    /// In memory.
    Memory(Shared),
    /// Pinned under a directory of the test's own, the programs attached to a cgroup of
    /// its own (no process runs in it); both removed on drop.
    Pinned { cgroup: PathBuf, pins: PathBuf },
}

impl Drop for Maps {
    fn drop(&mut self) {
        let Maps::Pinned { cgroup, pins } = self else { return };
        let _ = kpng_ebpf::pins::cleanup(pins);
        let _ = std::fs::remove_dir(&*pins);
        for _ in 0..50 {
            if std::fs::remove_dir(&*cgroup).is_ok() || !cgroup.exists() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

impl Subject for Maps {
    type Render = EbpfRender;
    type Kernel = EbpfKernel;

    fn name(&self) -> &'static str {
        match self {
            Maps::Memory(_) => "to-ebpf over maps in memory",
            Maps::Pinned { .. } => "to-ebpf over the kernel's maps",
        }
    }

    fn render(&self) -> EbpfRender {
        EbpfRender::default()
    }

    fn open(&self) -> EbpfKernel {
        match self {
            Maps::Memory(shared) => EbpfKernel::new(Box::new(Refusing(shared.clone()))),
            Maps::Pinned { cgroup, pins } => {
                let options =
                    kpng_ebpf::KernelOptions { cgroup: cgroup.clone(), pin_root: pins.clone() };
                let dataplane =
                    kpng_ebpf::KernelDataplane::open(options).expect("opening the maps");
                EbpfKernel::new(Box::new(Refusing(dataplane)))
            }
        }
    }

    fn wipe(&self) {
        match self {
            Maps::Memory(shared) => *shared.maps() = MemoryDataplane::new(),
            Maps::Pinned { pins, .. } => {
                kpng_ebpf::pins::cleanup(pins).expect("removing the test's pins");
            }
        }
    }

    fn poison(&self) -> (KeyOf<Self>, ValueOf<Self>) {
        (poison(), Value::Present)
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
    kpng_conformance::run(&Maps::Memory(Shared::default()), 64);
}

#[test]
fn ebpf_maps_in_the_kernel_conform() {
    let test = "to-ebpf's conformance on the kernel's maps";
    if !kpng_testkit::privileged::require(test, &[]) {
        return;
    }
    let available = kpng_ebpf::support::cgroup2_root().and_then(|_| kpng_ebpf::support::object());
    if let Err(error) = available {
        kpng_testkit::privileged::skip(&format!(
            "{test} needs cgroup v2 and the BPF object: {error}"
        ));
        return;
    }
    let name = format!("kpng-conformance-{}", std::process::id());
    let cgroup = kpng_ebpf::support::cgroup2_root().unwrap().join(&name);
    std::fs::create_dir_all(&cgroup).expect("creating the test's cgroup");
    let pins = PathBuf::from("/sys/fs/bpf").join(name);
    kpng_conformance::run(&Maps::Pinned { cgroup, pins }, 16);
}
