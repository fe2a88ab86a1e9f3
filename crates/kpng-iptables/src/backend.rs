//! [`IptablesBackend`]: the template's reconciler over kpng's chains, committed by
//! [`IptablesKernel`] as the smallest `iptables-restore --noflush` per family.
//!
//! The template reads kpng's chains back at every reset (so a restart over identical
//! chains writes nothing) and renders only the services a change set touched. Each table's
//! section of a restore is applied whole or not at all, and a refused section does not
//! hold back the tables after it or the other family ([`Unit::Group`]).
//!
//! With `iptables-nft`, every table section restored moves the network namespace's
//! nf_tables ruleset generation by one, as every other process's commit does: while the
//! generation is where kpng's own restores left it, a verification reads nothing back
//! (one in 60 reads anyway, within 0.5 % of the time). Otherwise, and always with `iptables-legacy`, verification
//! (every `--sync-period`) reads back, at a cost that does not grow with the
//! cluster, the entry chains (the fixed `KPNG-SERVICES`, `KPNG-FILTER`, ...) and the
//! built-in chains' jumps into them: what a flushed table or a flushed entry chain breaks.
//! Every chain is read back too, but only as often as keeps that read-back under 1% of the
//! time ([`IptablesOptions::full_read_share`]): `iptables-nft-save` takes seconds at 30,000 chains, while
//! `iptables-legacy-save` of the same takes a fraction of a second and so runs at every
//! verification.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use ipnet::IpNet;
use kpng_backend::Target;
use kpng_backend::proxy::LocalDetection;
use kpng_backend::reconcile::{self, Held, Objects, Plan, Reconciler, Sample, Unit};
use kpng_model::Family;

use crate::error::IptablesError;
use crate::kernel::{Kernel, Snapshot};
use crate::render::Table;
use crate::state::{IptablesRender, Key, Restores, Rules};

/// The backend's options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IptablesOptions {
    /// `--masquerade-all`.
    pub masquerade_all: bool,
    /// `--masquerade-bit`: the mark bit flagging connections to masquerade.
    pub masquerade_bit: u8,
    /// The mark bit flagging packets to drop (loadBalancerSourceRanges).
    pub drop_bit: u8,
    /// `--detect-local-mode` and its parameters.
    pub local_detection: LocalDetection,
    /// `--cluster-cidr`.
    pub cluster_cidrs: Vec<IpNet>,
    /// The most chains one restore writes; more are written in batches (cold start,
    /// rebuild), each valid on its own.
    pub batch_chains: usize,
    /// Verification reads every chain back at most one part in this many of the time (the
    /// entry chains at every verification); 1 reads every chain at every verification.
    pub full_read_share: u32,
    /// NodePorts on 127.0.0.1 too (IPv4, with NodePorts on every local address), as
    /// kube-proxy's iptables mode accepts them: `route_localnet` is set, and packets from
    /// elsewhere to 127.0.0.0/8 that are not NodePort traffic are dropped.
    pub localhost_nodeports: bool,
}

impl Default for IptablesOptions {
    fn default() -> Self {
        IptablesOptions {
            masquerade_all: false,
            masquerade_bit: 14,
            drop_bit: 15,
            local_detection: LocalDetection::Auto,
            cluster_cidrs: Vec::new(),
            batch_chains: 2000,
            full_read_share: 100,
            localhost_nodeports: false,
        }
    }
}

/// The iptables kernel's own counters, shared with whoever reports them.
#[derive(Debug, Default)]
pub struct IptablesStats {
    /// Restores run (one per family with something to change).
    pub restores: AtomicU64,
    /// Refused restores.
    pub failures: AtomicU64,
    /// By family (IPv4, IPv6) as kube-proxy reports them: refused restores of whole states,
    /// refused restores of changes, and by table (nat, filter) the rules kpng owns and the
    /// rules the last restore wrote.
    pub by_family: [FamilyStats; 2],
}

/// One family's counters, as kube-proxy's metrics report them.
#[derive(Debug, Default)]
pub struct FamilyStats {
    /// Refused restores of a whole state.
    pub full_failures: AtomicU64,
    /// Refused restores of changes.
    pub partial_failures: AtomicU64,
    /// Rules kpng owns, by table (nat, filter).
    pub rules: [AtomicU64; 2],
    /// Rules the last restore wrote, by table (nat, filter).
    pub last_written: [AtomicU64; 2],
}

fn family_index(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

fn table_index(table: Table) -> usize {
    match table {
        Table::Nat => 0,
        Table::Filter => 1,
    }
}

/// When verification next reads every chain back: after a read-back that took `t`, not
/// before `(share - 1) * t` has passed, so read-backs take at most one part in `share` of
/// the time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FullReads {
    share: u32,
    next: Option<Instant>,
}

impl FullReads {
    fn new(share: u32) -> FullReads {
        FullReads { share: share.max(1), next: None }
    }

    fn due(&self, now: Instant) -> bool {
        self.next.is_none_or(|next| now >= next)
    }

    fn done(&mut self, started: Instant, ended: Instant) {
        self.next = Some(ended + ended.duration_since(started) * (self.share - 1));
    }
}

/// kpng's chains in iptables, as the template's kernel: read back with `iptables-save`
/// (or a stand-in [`Kernel`]), a plan committed as one `iptables-restore --noflush` per
/// family with something to change.
pub struct IptablesKernel {
    inner: Box<dyn Kernel>,
    stats: Arc<IptablesStats>,
    batch_chains: usize,
    full_reads: FullReads,
    /// The next commit is a reset's (a whole state, for kube-proxy's failure counters).
    whole: bool,
    /// The entry chains committed, which verification lists every time.
    entries: BTreeSet<(Family, Table, String)>,
    /// Table sections the last commit restored: the generations it moved.
    sections: u64,
}

impl IptablesKernel {
    /// Commits through `inner`, written in restores of at most `batch_chains` chains, and
    /// reads every chain back at most one part in `full_read_share` of the time.
    pub fn new(inner: Box<dyn Kernel>, batch_chains: usize, full_read_share: u32) -> Self {
        IptablesKernel {
            inner,
            stats: Arc::default(),
            batch_chains,
            full_reads: FullReads::new(full_read_share),
            whole: false,
            entries: BTreeSet::new(),
            sections: 0,
        }
    }

    /// The counters.
    pub fn stats(&self) -> Arc<IptablesStats> {
        self.stats.clone()
    }

    /// Runs `family`'s restores. When a section is refused, the sections after it (the
    /// other table) are tried on their own, so a refused table holds back no other.
    fn restore(&mut self, family: Family, restores: &Restores) -> Result<(), IptablesError> {
        let texts = restores.restore_texts(family, self.batch_chains);
        let single = texts.len() == 1;
        for text in texts {
            self.stats.restores.fetch_add(1, Ordering::Relaxed);
            let Err(error) = self.inner.restore(family, &text) else {
                self.sections += text.lines().filter(|l| *l == "COMMIT").count() as u64;
                continue;
            };
            self.refused(family);
            // Where the refused section ends: the tables after it were not tried.
            let after = match (&error, single) {
                (IptablesError::Restore { line: Some(line), .. }, true) => {
                    let sections = restores.sections(family);
                    let mut end = 0;
                    let at = sections.iter().position(|(_, text)| {
                        end += text.lines().count();
                        *line <= end
                    });
                    at.map(|at| sections[at + 1..].to_vec()).unwrap_or_default()
                }
                _ => Vec::new(),
            };
            for (_, text) in after {
                self.stats.restores.fetch_add(1, Ordering::Relaxed);
                if self.inner.restore(family, &text).is_err() {
                    self.refused(family);
                }
            }
            return Err(error);
        }
        Ok(())
    }

    fn refused(&self, family: Family) {
        self.stats.failures.fetch_add(1, Ordering::Relaxed);
        let counts = &self.stats.by_family[family_index(family)];
        match self.whole {
            true => counts.full_failures.fetch_add(1, Ordering::Relaxed),
            false => counts.partial_failures.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Moves kube-proxy's rule counts by a change's `plan` (a reset's are counted whole by
    /// [`prepare`](reconcile::Kernel::prepare)).
    fn count_rules(&self, plan: &Plan<Key, Rules>) {
        let mut counts = [[0i64; 2]; 2];
        let mut add = |key: &Key, n: usize, sign: i64| {
            if let Key::Chain(family, table, _) = key {
                counts[family_index(*family)][table_index(*table)] += sign * n as i64;
            }
        };
        for (key, old, new) in &plan.upserts {
            add(key, new.len(), 1);
            add(key, old.as_ref().map_or(0, Rules::len), -1);
        }
        plan.deletes.iter().for_each(|(key, old)| add(key, old.len(), -1));
        for (stats, counts) in self.stats.by_family.iter().zip(counts) {
            for (rules, n) in stats.rules.iter().zip(counts) {
                // Two's complement: adding a negative count subtracts it.
                rules.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
    }

    fn held_of(family: Family, snapshot: Snapshot, held: &mut Held<Self>) {
        for ((table, chain), rules) in snapshot.chains {
            held.insert(Key::Chain(family, table, chain), Rules::new(rules));
        }
        // kpng's jumps carry its comment; another's jump into kpng's chains is left alone
        // (a chain it holds on to cannot be deleted: that restore is refused, and retried).
        let kpngs = snapshot.hooks.into_iter().filter(|(_, _, rule)| rule.contains(KPNG_COMMENT));
        for (table, builtin, rule) in kpngs {
            held.insert(Key::Hook(family, table, builtin, rule), Rules::default());
        }
    }
}

/// What marks kpng's own jumps from built-in chains.
const KPNG_COMMENT: &str = "-m comment --comment kpng ";

/// An entry chain's family, table and name.
fn entry_of(key: &Key) -> Option<(Family, Table, String)> {
    match key {
        Key::Chain(family, table, name) if key.is_entry() => {
            Some((*family, *table, name.to_string()))
        }
        _ => None,
    }
}

impl reconcile::Kernel for IptablesKernel {
    type Key = Key;
    type Value = Rules;
    type Error = IptablesError;

    const UNIT: Unit = Unit::Group;
    const WHAT: &'static str = "iptables rules";
    const APPLIED: &'static str = "restored";

    fn read(&mut self) -> Result<Option<Held<Self>>, IptablesError> {
        let started = Instant::now();
        let mut held = HashMap::new();
        for family in Family::ALL {
            Self::held_of(family, self.inner.read(family)?, &mut held);
        }
        self.full_reads.done(started, Instant::now());
        Ok((!held.is_empty()).then_some(held))
    }

    /// `iptables-nft`'s: the nf_tables generation, which each table section restored moves
    /// by one.
    fn generation(&mut self) -> Option<u64> {
        self.inner.generation()
    }

    fn transactions(&self) -> u64 {
        self.sections
    }

    fn sample(&mut self) -> Result<Sample<Self>, IptablesError> {
        if self.full_reads.due(Instant::now()) {
            return Ok(Sample::Whole(self.read()?));
        }
        let mut held = HashMap::new();
        for family in Family::ALL {
            let listed: Vec<(Table, String)> = self
                .entries
                .iter()
                .filter(|(f, _, _)| *f == family)
                .map(|(_, table, chain)| (*table, chain.clone()))
                .chain(crate::state::hooks().iter().map(|h| (h.table, h.builtin.to_string())))
                .collect();
            Self::held_of(family, self.inner.read_chains(family, &listed)?, &mut held);
        }
        Ok(Sample::Part { held, covers: Box::new(Key::is_entry) })
    }

    /// At each reset: counts and lists what the kernel will hold from `after`; the commit
    /// that follows (if the plan writes anything) is a whole state's.
    fn prepare(
        &mut self,
        plan: &Plan<Key, Rules>,
        after: &Objects<Key, Rules>,
        _installed: bool,
    ) -> Result<(), IptablesError> {
        self.whole = !plan.is_empty();
        self.entries = after.iter().filter_map(|(key, _)| entry_of(&key)).collect();
        let mut counts = [[0u64; 2]; 2];
        for (key, rules) in after.iter() {
            if let Key::Chain(family, table, _) = &*key {
                counts[family_index(*family)][table_index(*table)] += rules.len() as u64;
            }
        }
        for (stats, counts) in self.stats.by_family.iter().zip(counts) {
            for (rules, n) in stats.rules.iter().zip(counts) {
                rules.store(n, Ordering::Relaxed);
            }
        }
        Ok(())
    }

    fn commit(
        &mut self,
        plan: &Plan<Key, Rules>,
        _after: &Objects<Key, Rules>,
    ) -> Result<(), IptablesError> {
        let restores = Restores::of(plan);
        let mut refused = None;
        self.sections = 0;
        for family in restores.families() {
            if let Err(error) = self.restore(family, &restores) {
                refused.get_or_insert(error);
            }
            for ((f, table), t) in restores.tables.iter().filter(|((f, _), _)| *f == family) {
                let counts = &self.stats.by_family[family_index(*f)];
                let written = t.rules_written() as u64;
                counts.last_written[table_index(*table)].store(written, Ordering::Relaxed);
            }
        }
        if !self.whole {
            self.count_rules(plan);
            self.entries.extend(plan.upserts.iter().filter_map(|(key, _, _)| entry_of(key)));
            plan.deletes.iter().filter_map(|(key, _)| entry_of(key)).for_each(|e| {
                self.entries.remove(&e);
            });
        }
        self.whole = false;
        refused.map_or(Ok(()), Err)
    }
}

/// The iptables backend: [`IptablesRender`] and [`IptablesKernel`] in the template's
/// reconciler.
pub struct IptablesBackend {
    inner: Reconciler<IptablesRender, IptablesKernel>,
    stats: Arc<IptablesStats>,
}

kpng_backend::delegate_backend!(IptablesBackend, inner);

impl IptablesBackend {
    /// A backend with `options` that writes to `target`: the kernel through `mode`'s
    /// `iptables-restore` (checked to be there), or the restore input printed
    /// (`--dry-run`). Refuses a drop bit equal to the masquerade bit.
    pub fn open(
        options: IptablesOptions,
        mode: crate::Mode,
        target: Target,
    ) -> Result<Self, IptablesError> {
        if options.drop_bit == options.masquerade_bit {
            return Err(IptablesError::Options(format!(
                "--masquerade-bit {} is the bit to-iptables uses for dropping",
                options.drop_bit
            )));
        }
        let dry_run = target.is_dry_run();
        let kernel: Box<dyn Kernel> = match target {
            Target::DryRun(out) => Box::new(crate::MemoryKernel::printing(out)),
            Target::Kernel => {
                let (mode, why) = mode.resolve();
                tracing::info!(iptables = %mode.describe(), chosen_by = why, "to-iptables");
                if options.localhost_nodeports {
                    route_localnet()?;
                }
                Box::new(crate::CommandKernel::new(mode)?)
            }
        };
        let mut backend = IptablesBackend::new(options, kernel);
        backend.inner = backend.inner.with_dry_run(dry_run);
        Ok(backend)
    }

    /// A backend writing through `kernel`.
    pub fn new(options: IptablesOptions, kernel: Box<dyn Kernel>) -> Self {
        let kernel = IptablesKernel::new(kernel, options.batch_chains, options.full_read_share);
        let stats = kernel.stats();
        let render = IptablesRender::new(options);
        IptablesBackend { inner: Reconciler::new(crate::NAME, render, kernel), stats }
    }

    /// The iptables kernel's counters.
    pub fn stats(&self) -> Arc<IptablesStats> {
        self.stats.clone()
    }

    /// The template's counters.
    pub fn template_stats(&self) -> Arc<reconcile::Stats> {
        self.inner.stats()
    }

    /// What kpng committed: its chains and hooks.
    pub fn held(&self) -> &Objects<Key, Rules> {
        self.inner.held()
    }
}

#[cfg(test)]
mod tests;

/// Lets packets to 127.0.0.0/8 be routed, which NodePorts on 127.0.0.1 need (their DNAT
/// sends them to a pod). Set once; kube-proxy leaves it set too.
fn route_localnet() -> Result<(), IptablesError> {
    let path = "/proc/sys/net/ipv4/conf/all/route_localnet";
    if std::fs::read_to_string(path).is_ok_and(|v| v.trim() == "1") {
        return Ok(());
    }
    std::fs::write(path, "1").map_err(|e| {
        IptablesError::Options(format!("--localhost-nodeports needs {path} set to 1: {e}"))
    })?;
    tracing::info!(sysctl = path, "set to 1 for NodePorts on 127.0.0.1");
    Ok(())
}
