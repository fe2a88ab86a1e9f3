//! [`KernelDataplane`]: the real kernel, through aya.
//!
//! At start it checks what it needs (the object, `bpf()`, the cgroup, bpffs), loads the
//! object with every map pinned ([`crate::pins`]), and attaches each program to the cgroup
//! with a pinned link. The kernel runs every link of a cgroup (links are multi-program by
//! nature, and take no attach flags), so a replacement is attached before the program it
//! replaces is detached. A restart reuses the pinned maps, and keeps an attached program
//! whose instructions and maps are the same as the ones just loaded, once the kernel says
//! ([`crate::query`]) that it still runs on the cgroup: a pinned link can outlive its
//! attachment (`bpftool link detach`, or its cgroup removed), and the cgroup at the path
//! is looked up again each time (a cgroup created again there has another id).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use aya::maps::{Map, MapData};
use aya::programs::CgroupSockAddr;
use aya::programs::links::{CgroupAttachMode, FdLink};
use aya::{Ebpf, EbpfLoader};

use crate::batch;
use crate::dataplane::Batch;
use crate::dataplane::{Capacities, Dataplane, Snapshot};
use crate::error::EbpfError;
use crate::maps::{self, Key, LRU_MAPS, MapName, Value};
use crate::pins::{self, PROGRAMS};
use crate::query::ATTACH_TYPES;
use crate::support;

/// Where the programs go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelOptions {
    /// The cgroup v2 whose sockets are translated (and its descendants').
    pub cgroup: PathBuf,
    /// The bpffs directory holding kpng's pins.
    pub pin_root: PathBuf,
}

/// The kernel's maps and programs.
pub struct KernelDataplane {
    options: KernelOptions,
    cgroup_id: u64,
    /// The generation of maps in use and its open maps.
    generation: Option<u32>,
    maps: BTreeMap<MapName, Map>,
    /// Whether the kernel takes batched map writes (until it says it does not).
    batches: bool,
}

fn boxed(
    e: impl std::error::Error + Send + Sync + 'static,
) -> Box<dyn std::error::Error + Send + Sync> {
    Box::new(e)
}

impl KernelDataplane {
    /// Checks the machine (naming what is missing) and prepares to install into
    /// `options.cgroup`. Nothing is loaded until the first reset.
    pub fn open(options: KernelOptions) -> Result<Self, EbpfError> {
        support::object()?;
        support::check_bpf_syscall()?;
        support::check_cgroup(&options.cgroup)?;
        support::ensure_bpffs(&options.pin_root)?;
        let cgroup_id = support::cgroup_id(&options.cgroup)?;
        Ok(KernelDataplane {
            options,
            cgroup_id,
            generation: None,
            maps: BTreeMap::new(),
            batches: true,
        })
    }

    fn root(&self) -> &Path {
        &self.options.pin_root
    }

    /// Loads the object with generation `generation` of the maps (created with
    /// `capacities` when not pinned yet) and every program verified, not attached.
    fn load(&self, generation: u32, capacities: &Capacities) -> Result<Ebpf, EbpfError> {
        let object = support::object()?;
        let dir = pins::maps_dir(self.root(), generation);
        let lru = pins::lru_dir(self.root());
        for d in [&dir, &lru] {
            std::fs::create_dir_all(d).map_err(|e| EbpfError::Pin {
                step: "creating",
                path: d.clone(),
                source: boxed(e),
            })?;
        }
        let paths: Vec<(&str, PathBuf)> = MapName::ALL
            .iter()
            .map(|m| (m.object_name(), dir.join(m.object_name())))
            .chain(LRU_MAPS.iter().map(|m| (*m, lru.join(m))))
            .collect();
        let mut loader = EbpfLoader::new();
        for (name, path) in &paths {
            loader.map_pin_path(name, path.as_path());
        }
        for (map, capacity) in capacities {
            loader.map_max_entries(map.object_name(), *capacity);
        }
        let mut ebpf = loader
            .load(object)
            .map_err(|e| EbpfError::Load { step: "the object".into(), source: boxed(e) })?;
        for name in PROGRAMS {
            let program: &mut CgroupSockAddr = ebpf
                .program_mut(name)
                .ok_or_else(|| EbpfError::Load {
                    step: name.into(),
                    source: "missing from the object".into(),
                })?
                .try_into()
                .map_err(|e| EbpfError::Load { step: name.into(), source: boxed(e) })?;
            program.load().map_err(|e| load_error(name, e))?;
        }
        Ok(ebpf)
    }

    /// Keeps the maps of `ebpf` for writes.
    fn take_maps(&mut self, ebpf: &mut Ebpf, generation: u32) -> Result<(), EbpfError> {
        let mut maps = BTreeMap::new();
        for map in MapName::ALL {
            let taken = ebpf.take_map(map.object_name()).ok_or_else(|| EbpfError::Load {
                step: map.object_name().into(),
                source: "map missing from the object".into(),
            })?;
            maps.insert(map, taken);
        }
        self.maps = maps;
        self.generation = Some(generation);
        Ok(())
    }

    /// Looks the cgroup at the configured path up again: a cgroup removed and created again
    /// there has a new id, and programs attached to the old one run on nothing.
    fn refresh_cgroup(&mut self) -> Result<(), EbpfError> {
        let id = support::cgroup_id(&self.options.cgroup)?;
        if id != self.cgroup_id {
            tracing::warn!(
                cgroup = %self.options.cgroup.display(),
                was = self.cgroup_id,
                now = id,
                "eBPF: the cgroup was created again; its programs must be attached again"
            );
            self.cgroup_id = id;
        }
        Ok(())
    }

    fn open_cgroup(&self) -> Result<std::fs::File, EbpfError> {
        std::fs::File::open(&self.options.cgroup).map_err(|e| EbpfError::Cgroup {
            path: self.options.cgroup.clone(),
            reason: e.to_string(),
        })
    }

    /// Whether the link pinned at `pin` runs its program on `cgroup` at `attach_type`.
    fn runs(&self, pin: &Path, cgroup: &std::fs::File, attach_type: u32) -> bool {
        let Ok(link) = aya::programs::links::PinnedLink::from_pin(pin) else { return false };
        let Ok(info) = FdLink::from(link).info() else { return false };
        let fd = std::os::fd::AsFd::as_fd(cgroup);
        crate::query::attached_programs(fd, attach_type)
            .is_ok_and(|ids| ids.contains(&info.program_id()))
    }

    /// Attaches every program of `ebpf` whose pinned link does not already run the same
    /// program on the same maps on the cgroup, then detaches what it replaces.
    fn attach(&self, ebpf: &mut Ebpf) -> Result<usize, EbpfError> {
        let dir = pins::links_dir(self.root(), self.cgroup_id);
        std::fs::create_dir_all(&dir).map_err(|e| EbpfError::Pin {
            step: "creating",
            path: dir.clone(),
            source: boxed(e),
        })?;
        let cgroup = self.open_cgroup()?;
        let mut attached = 0;
        for (name, attach_type) in PROGRAMS.into_iter().zip(ATTACH_TYPES) {
            let program: &mut CgroupSockAddr =
                ebpf.program_mut(name).and_then(|p| p.try_into().ok()).ok_or_else(|| {
                    EbpfError::Load { step: name.into(), source: "not loaded".into() }
                })?;
            let pin = dir.join(name);
            let ours = program
                .info()
                .map_err(|e| EbpfError::Load { step: name.into(), source: boxed(e) })?;
            if pin.exists() && same_program(&pin, &ours) {
                if self.runs(&pin, &cgroup, attach_type) {
                    continue;
                }
                tracing::warn!(program = name, cgroup = %self.options.cgroup.display(), "eBPF: a pinned program no longer runs on the cgroup: attaching it again");
            }
            let attach_error = |source| EbpfError::Attach {
                program: name.into(),
                cgroup: self.options.cgroup.clone(),
                source,
            };
            let id = program
                .attach(&cgroup, CgroupAttachMode::Single)
                .map_err(|e| attach_failure(name, &self.options.cgroup, e))?;
            let link = program.take_link(id).map_err(|e| attach_error(boxed(e)))?;
            let link = FdLink::try_from(link).map_err(|e| attach_error(boxed(e)))?;
            // The new link is in force before the old one goes: no socket sees neither.
            // bpffs refuses dots in pin names.
            let fresh = dir.join(format!("{name}_new"));
            let _ = std::fs::remove_file(&fresh);
            link.pin(&fresh).map_err(|e| EbpfError::Pin {
                step: "pinning",
                path: fresh.clone(),
                source: boxed(e),
            })?;
            let mut removed = Vec::new();
            pins::remove_pin(&pin, &mut removed)?;
            std::fs::rename(&fresh, &pin).map_err(|e| EbpfError::Pin {
                step: "renaming",
                path: fresh.clone(),
                source: boxed(e),
            })?;
            attached += 1;
        }
        // Links on another cgroup (an earlier --cgroup-path) go.
        for (id, other) in pins::link_dirs(self.root()) {
            if id != self.cgroup_id {
                tracing::info!(dir = %other.display(), "eBPF: detaching from the cgroup used before");
                pins::remove_links(&other, &mut Vec::new())?;
            }
        }
        Ok(attached)
    }

    /// Removes every generation of maps but `keep`.
    fn drop_generations_but(&self, keep: u32) -> Result<(), EbpfError> {
        for generation in pins::generations(self.root()).into_iter().filter(|g| *g != keep) {
            pins::remove_generation(&pins::maps_dir(self.root(), generation), &mut Vec::new())?;
        }
        Ok(())
    }

    /// Makes `upserts`, then `deletes`, map after map in their order: one batched call per
    /// map where the kernel takes them, else one call per element.
    fn write_elements(
        &mut self,
        upserts: &[(Key, Value)],
        deletes: &[Key],
    ) -> Result<(), EbpfError> {
        for run in upserts.chunk_by(|a, b| a.0.map() == b.0.map()) {
            let keys: Vec<Key> = run.iter().map(|(k, _)| *k).collect();
            let values: Vec<u8> = run.iter().flat_map(|(_, v)| maps::value_bytes(v)).collect();
            if !self.write_batch(&keys, Some(&values))? {
                for (key, value) in run {
                    self.write_one(key, Some(value))?;
                }
            }
        }
        for run in deletes.chunk_by(|a, b| a.map() == b.map()) {
            if !self.write_batch(run, None)? {
                for key in run {
                    self.write_one(key, None)?;
                }
            }
        }
        Ok(())
    }

    /// One batched update (with `values`) or deletion of `keys`, all of one map. Returns
    /// `false` when it wrote nothing because batches are not available.
    fn write_batch(&mut self, keys: &[Key], values: Option<&[u8]>) -> Result<bool, EbpfError> {
        if !self.batches || keys.len() < 2 {
            return Ok(false);
        }
        let map_name = keys[0].map();
        let Some(Map::HashMap(data)) = self.maps.get(&map_name) else {
            return Err(EbpfError::NotInstalled);
        };
        let key_bytes: Vec<u8> = keys.iter().flat_map(maps::key_bytes).collect();
        let fd = std::os::fd::AsFd::as_fd(data.fd());
        let result = match values {
            Some(values) => batch::update(fd, &key_bytes, values, keys.len()),
            None => batch::delete(fd, &key_bytes, keys.len()),
        };
        match result {
            Ok(()) => Ok(true),
            Err(partial) if partial.unsupported() => {
                tracing::info!(error = %partial.error, "eBPF: no batched map writes in this kernel; writing one element at a time");
                self.batches = false;
                Ok(false)
            }
            Err(partial) => Err(EbpfError::Map {
                step: if values.is_some() { "writing" } else { "deleting" },
                map: map_name.object_name(),
                key: keys.get(partial.done).map(ToString::to_string).unwrap_or_default(),
                source: boxed(partial.error),
            }),
        }
    }

    fn write_one(&mut self, key: &Key, value: Option<&Value>) -> Result<(), EbpfError> {
        let map_name = key.map();
        let map = self.maps.get_mut(&map_name).ok_or(EbpfError::NotInstalled)?;
        let k = maps::key_bytes(key);
        let result = match value {
            Some(v) => raw::insert(map_name, map, &k, &maps::value_bytes(v)),
            None => raw::remove(map_name, map, &k),
        };
        result.map_err(|source| EbpfError::Map {
            step: if value.is_some() { "writing" } else { "deleting" },
            map: map_name.object_name(),
            key: key.to_string(),
            source,
        })
    }
}

impl Dataplane for KernelDataplane {
    fn read(&mut self) -> Result<Option<Snapshot>, EbpfError> {
        let Some(generation) = pins::generations(self.root()).last().copied() else {
            // Nothing pinned (never installed, or removed behind kpng's back): the next
            // install starts from nothing.
            self.generation = None;
            self.maps.clear();
            return Ok(None);
        };
        let dir = pins::maps_dir(self.root(), generation);
        let mut snapshot = Snapshot::default();
        let mut opened = BTreeMap::new();
        for map in MapName::ALL {
            let path = dir.join(map.object_name());
            let data = MapData::from_pin(&path).map_err(|e| EbpfError::Pin {
                step: "opening",
                path: path.clone(),
                source: boxed(e),
            })?;
            let capacity = data.info().map(|i| i.max_entries()).map_err(|e| EbpfError::Pin {
                step: "reading",
                path: path.clone(),
                source: boxed(e),
            })?;
            snapshot.capacities.insert(map, capacity);
            let mut handle = Map::from_map_data(data).map_err(|e| EbpfError::Pin {
                step: "opening",
                path: path.clone(),
                source: boxed(e),
            })?;
            let elements = raw::read(map, &mut handle).map_err(|source| EbpfError::Map {
                step: "reading",
                map: map.object_name(),
                key: "*".into(),
                source,
            })?;
            for (key, value) in elements {
                match maps::decode(map, &key, &value) {
                    Some((k, v)) => {
                        snapshot.elements.insert(k, v);
                    }
                    None => {
                        tracing::warn!(map = map.object_name(), "eBPF: an element kpng cannot read")
                    }
                }
            }
            opened.insert(map, handle);
        }
        self.maps = opened;
        self.generation = Some(generation);
        Ok(Some(snapshot))
    }

    fn install(&mut self, capacities: &Capacities) -> Result<(), EbpfError> {
        self.refresh_cgroup()?;
        let generation = self.generation.unwrap_or(1);
        let mut ebpf = self.load(generation, capacities)?;
        let attached = self.attach(&mut ebpf)?;
        self.take_maps(&mut ebpf, generation)?;
        self.drop_generations_but(generation)?;
        match attached {
            0 => {
                tracing::info!(cgroup = %self.options.cgroup.display(), "eBPF: programs already attached; adopted")
            }
            n => {
                tracing::info!(cgroup = %self.options.cgroup.display(), programs = n, generation, "eBPF: programs attached")
            }
        }
        Ok(())
    }

    fn write(&mut self, batch: &Batch) -> Result<(), EbpfError> {
        self.write_elements(&batch.upserts, &batch.deletes)
    }

    fn grow(
        &mut self,
        capacities: &Capacities,
        elements: &HashMap<Key, Value>,
    ) -> Result<(), EbpfError> {
        let old = self.generation;
        let generation =
            pins::generations(self.root()).last().copied().unwrap_or(0).max(old.unwrap_or(0)) + 1;
        let mut ebpf = self.load(generation, capacities)?;
        self.take_maps(&mut ebpf, generation)?;
        let mut ordered: Vec<(Key, Value)> = elements.iter().map(|(k, v)| (*k, *v)).collect();
        ordered.sort_by_key(|(k, _)| MapName::ALL.iter().position(|m| *m == k.map()));
        self.write_elements(&ordered, &[])?;
        // The new programs (on the new maps) replace the old ones, then the old maps go.
        self.refresh_cgroup()?;
        self.attach(&mut ebpf)?;
        self.drop_generations_but(generation)?;
        tracing::info!(generation, elements = elements.len(), "eBPF: maps grown");
        Ok(())
    }

    fn verify(&mut self, expected: &HashMap<Key, Value>) -> Result<bool, EbpfError> {
        let held = self.read()?.map(|s| s.elements).unwrap_or_default();
        Ok(held == *expected)
    }

    fn unattached(&mut self) -> Result<Vec<&'static str>, EbpfError> {
        if self.generation.is_none() {
            return Ok(Vec::new());
        }
        let before = self.cgroup_id;
        self.refresh_cgroup()?;
        if self.cgroup_id != before {
            return Ok(PROGRAMS.to_vec());
        }
        let cgroup = self.open_cgroup()?;
        let links = pins::links_dir(self.root(), self.cgroup_id);
        let missing = PROGRAMS
            .into_iter()
            .zip(ATTACH_TYPES)
            .filter(|(name, attach_type)| !self.runs(&links.join(name), &cgroup, *attach_type))
            .map(|(name, _)| name)
            .collect();
        Ok(missing)
    }
}

mod checks;
mod raw;

use checks::{attach_failure, load_error, same_program};
