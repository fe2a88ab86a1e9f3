//! [`MemoryKernel`]: an in-memory nf_tables table for tests. It applies each transaction
//! as the kernel does (all or nothing, refusing what the kernel refuses: deleting what is
//! missing or still in use, adding to a set or chain that does not exist, an element whose
//! value disagrees), reads back like the real kernel, can be tampered with, can fail
//! commits on demand, and traces packets through the rules it holds ([`trace`]).

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::sync::{Arc, Mutex, MutexGuard};

use kpng_model::Family;
use kpng_netlink::NetlinkError;
use kpng_netlink::nftables::expr::{Expr, Verdict};
use kpng_netlink::nftables::objects::CtHelperSpec;

use crate::error::NftError;
use crate::kernel::{Kernel, KernelContents};
use crate::objects::{ElementId, Key, MapName, Value};
use crate::plan::{Command, Plan};
use crate::reconcile::{HookShape, Name, Present, PresentChain, SetShape};
use crate::rules::Rule;

pub mod trace;

/// One set as the in-memory table holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemorySet {
    /// Its definition.
    pub shape: SetShape,
    /// Its elements (kpng's keys; affinity client sets stay empty).
    pub elements: BTreeMap<Key, Value>,
}

/// One chain: hook and rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryChain {
    /// The hook of a base chain.
    pub hook: Option<HookShape>,
    /// Its rules, in order.
    pub rules: Vec<Rule>,
}

/// The tables an in-memory kernel holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MemoryTables {
    /// Families whose table exists.
    pub tables: BTreeSet<Family>,
    /// Sets and maps.
    pub sets: BTreeMap<Name, MemorySet>,
    /// Chains.
    pub chains: BTreeMap<Name, MemoryChain>,
    /// `ct helper` objects.
    pub helpers: BTreeMap<Name, CtHelperSpec>,
    /// Commits to refuse before applying any.
    pub fail_commits: usize,
    /// Transactions applied.
    pub commits: u64,
}

/// An in-memory kernel; clones share the same tables.
#[derive(Debug, Clone, Default)]
pub struct MemoryKernel(Arc<Mutex<MemoryTables>>);

impl MemoryKernel {
    /// An empty kernel.
    pub fn new() -> Self {
        Self::default()
    }

    /// The tables, to look at or tamper with.
    pub fn tables(&self) -> MutexGuard<'_, MemoryTables> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses the next `n` commits.
    pub fn fail_next(&self, n: usize) {
        self.tables().fail_commits = n;
    }
}

fn refused(what: String, errno: nix::errno::Errno) -> NftError {
    NftError::Commit(NetlinkError::Rejected {
        what,
        source: io::Error::from_raw_os_error(errno as i32),
    })
}

impl MemoryTables {
    /// The `ct helper` objects rules assign, in `family`.
    fn helper_references(&self, family: Family) -> BTreeSet<String> {
        let rules = self.chains.iter().filter(|((f, _), _)| *f == family);
        let exprs = rules.flat_map(|(_, chain)| chain.rules.iter().flat_map(|r| &r.exprs));
        exprs
            .filter_map(|e| match e {
                Expr::CtHelperSet { name } => Some(name.clone()),
                _ => None,
            })
            .collect()
    }

    /// The sets and chains rules refer to, in `family`.
    fn references(&self, family: Family) -> (BTreeSet<String>, BTreeSet<String>) {
        let (mut sets, mut chains) = (BTreeSet::new(), BTreeSet::new());
        for ((f, _), chain) in &self.chains {
            if *f != family {
                continue;
            }
            for expr in chain.rules.iter().flat_map(|r| &r.exprs) {
                match expr {
                    Expr::Lookup { set, .. } | Expr::DynsetUpdate { set, .. } => {
                        sets.insert(set.clone());
                    }
                    Expr::Verdict(Verdict::Jump(c) | Verdict::Goto(c)) => {
                        chains.insert(c.clone());
                    }
                    _ => {}
                }
            }
        }
        for ((f, _), set) in &self.sets {
            for value in set.elements.values().filter(|_| *f == family) {
                if let Value::Affinity(hash) = value {
                    chains.insert(crate::objects::affinity_chain(*hash));
                }
            }
        }
        (sets, chains)
    }

    fn apply(
        &mut self,
        family: Family,
        command: &Command<'_>,
        what: String,
    ) -> Result<(), NftError> {
        use nix::errno::Errno::{EBUSY, EEXIST, ENOENT};
        let need_table = |t: &Self| {
            if t.tables.contains(&family) { Ok(()) } else { Err(refused(what.clone(), ENOENT)) }
        };
        match command {
            Command::AddTable => {
                self.tables.insert(family);
            }
            Command::AddSet(decl) => {
                need_table(self)?;
                let shape = SetShape::of(decl);
                match self.sets.get(&(family, decl.spec.name.clone())) {
                    Some(set) if set.shape != shape => return Err(refused(what, EEXIST)),
                    Some(_) => {}
                    None => {
                        let set = MemorySet { shape, elements: BTreeMap::new() };
                        self.sets.insert((family, decl.spec.name.clone()), set);
                    }
                }
            }
            Command::FlushSet(name) => {
                let set = self
                    .sets
                    .get_mut(&(family, name.clone()))
                    .ok_or_else(|| refused(what, ENOENT))?;
                set.elements.clear();
            }
            Command::DeleteSet(name) => {
                if !self.sets.contains_key(&(family, name.clone())) {
                    return Err(refused(what, ENOENT));
                }
                if self.references(family).0.contains(name) {
                    return Err(refused(what, EBUSY));
                }
                self.sets.remove(&(family, name.clone()));
            }
            Command::AddCtHelper(spec) => {
                need_table(self)?;
                match self.helpers.get(&(family, spec.name.clone())) {
                    Some(present) if present != spec => return Err(refused(what, EEXIST)),
                    Some(_) => {}
                    None => {
                        self.helpers.insert((family, spec.name.clone()), spec.clone());
                    }
                }
            }
            Command::DeleteCtHelper(name) => {
                if !self.helpers.contains_key(&(family, name.clone())) {
                    return Err(refused(what, ENOENT));
                }
                if self.helper_references(family).contains(name) {
                    return Err(refused(what, EBUSY));
                }
                self.helpers.remove(&(family, name.clone()));
            }
            Command::AddChain(spec) => {
                need_table(self)?;
                let hook = crate::reconcile::hook_shape(&spec.hook);
                match self.chains.get(&(family, spec.name.clone())) {
                    Some(chain) if chain.hook != hook => return Err(refused(what, EEXIST)),
                    Some(_) => {}
                    None => {
                        let chain = MemoryChain { hook, rules: Vec::new() };
                        self.chains.insert((family, spec.name.clone()), chain);
                    }
                }
            }
            Command::FlushChain(name) => {
                let chain = self
                    .chains
                    .get_mut(&(family, name.clone()))
                    .ok_or_else(|| refused(what, ENOENT))?;
                chain.rules.clear();
            }
            Command::DeleteChain(name) => {
                let chain = self
                    .chains
                    .get(&(family, name.clone()))
                    .ok_or_else(|| refused(what.clone(), ENOENT))?;
                if !chain.rules.is_empty() || self.references(family).1.contains(name) {
                    return Err(refused(what, EBUSY));
                }
                self.chains.remove(&(family, name.clone()));
            }
            Command::AddRule { chain, rule } => {
                for expr in &rule.exprs {
                    let missing = match expr {
                        Expr::Lookup { set, .. } | Expr::DynsetUpdate { set, .. } => {
                            !self.sets.contains_key(&(family, set.clone()))
                        }
                        Expr::Verdict(Verdict::Jump(c) | Verdict::Goto(c)) => {
                            !self.chains.contains_key(&(family, c.clone()))
                        }
                        Expr::CtHelperSet { name } => {
                            !self.helpers.contains_key(&(family, name.clone()))
                        }
                        _ => false,
                    };
                    if missing {
                        return Err(refused(what, ENOENT));
                    }
                }
                let chain = self
                    .chains
                    .get_mut(&(family, chain.clone()))
                    .ok_or_else(|| refused(what, ENOENT))?;
                chain.rules.push(rule.clone());
            }
            Command::Elements { add, map, elements } => {
                let name = (family, map.name().into_owned());
                let chains: BTreeSet<Name> = self.chains.keys().cloned().collect();
                let set = self.sets.get_mut(&name).ok_or_else(|| refused(what.clone(), ENOENT))?;
                for (id, value) in elements.iter().copied() {
                    let value = &value;
                    let present = set.elements.get(&id.key);
                    match (add, present) {
                        (true, Some(v)) if v != value => return Err(refused(what, EEXIST)),
                        (true, _) => {
                            if let Value::Affinity(hash) = value {
                                let chain = (family, crate::objects::affinity_chain(*hash));
                                if !chains.contains(&chain) {
                                    return Err(refused(what, ENOENT));
                                }
                            }
                            set.elements.insert(id.key, *value);
                        }
                        (false, None) => return Err(refused(what, ENOENT)),
                        (false, Some(_)) => {
                            set.elements.remove(&id.key);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// What a read-back returns.
    pub fn contents(&self) -> KernelContents {
        let mut present = Present {
            tables: self.tables.clone(),
            helpers: self.helpers.clone(),
            ..Present::default()
        };
        let mut elements = Vec::new();
        for ((family, name), set) in &self.sets {
            present.sets.insert((*family, name.clone()), set.shape.clone());
            if let Some(map) = MapName::parse(name) {
                for (key, value) in &set.elements {
                    elements.push((ElementId { family: *family, map, key: *key }, *value));
                }
            }
        }
        for (name, chain) in &self.chains {
            let rules = chain.rules.iter().map(|r| r.exprs.iter().cloned().map(Some).collect());
            let chain = PresentChain { hook: chain.hook.clone(), rules: rules.collect() };
            present.chains.insert(name.clone(), chain);
        }
        KernelContents { present, elements, unread: Default::default() }
    }

    /// Every element of kpng's element sets, sorted.
    pub fn elements(&self) -> Vec<(ElementId, Value)> {
        let mut elements = self.contents().elements;
        elements.sort();
        elements
    }
}

impl Kernel for MemoryKernel {
    fn commit(&mut self, plan: &Plan<'_>) -> Result<(), NftError> {
        let mut tables = self.tables();
        if tables.fail_commits > 0 {
            tables.fail_commits -= 1;
            return Err(refused("(an injected failure)".into(), nix::errno::Errno::ENOMEM));
        }
        let mut next = tables.clone();
        for (family, command) in &plan.commands {
            let mut what = String::new();
            let one = Plan { commands: vec![(*family, command.clone())] };
            what.push_str(one.text().lines().next().unwrap_or_default());
            next.apply(*family, command, what)?;
        }
        next.commits += 1;
        *tables = next;
        Ok(())
    }

    fn read(&mut self) -> Result<Option<KernelContents>, NftError> {
        Ok(Some(self.tables().contents()))
    }

    /// As the netlink kernel reads: the cluster IPs first, and no other set's elements
    /// when `stale` says so of their number.
    fn read_unless_stale(
        &mut self,
        stale: &dyn Fn(usize) -> bool,
    ) -> Result<Option<KernelContents>, NftError> {
        let mut contents = self.tables().contents();
        let is_cluster_ip = |id: &ElementId| id.map == MapName::ClusterIps;
        if stale(contents.elements.iter().filter(|(id, _)| is_cluster_ip(id)).count()) {
            contents.elements.retain(|(id, _)| is_cluster_ip(id));
            contents.unread = contents
                .present
                .sets
                .keys()
                .filter_map(|(family, name)| Some((*family, MapName::parse(name)?)))
                .filter(|(_, map)| *map != MapName::ClusterIps)
                .collect();
        }
        Ok(Some(contents))
    }
}
