//! [`IptablesBackend`]: change sets in, the smallest `iptables-restore --noflush` per family
//! out.
//!
//! A sync state machine of two states: `Unknown` (at start, after a refused restore, after
//! drift was found) and `Synced` (what was committed is what the kernel holds). From
//! `Unknown` every change set reads kpng's chains back and writes only the chains that
//! differ (a restart over identical chains writes nothing); from `Synced` a change set
//! renders the services it touches and writes the chains whose rules changed.
//!
//! Verification (every `--sync-period`) reads back, at a cost that does not grow with the
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
use kpng_backend::proxy::LocalDetection;
use kpng_backend::{Backend, BackendError, ChangeSet, Target};
use kpng_model::{Family, LocalState};

use crate::error::IptablesError;
use crate::kernel::{Kernel, Snapshot};
use crate::names;
use crate::render::{ChainKey, Context, Table};
use crate::rule::Rule;
use crate::state::{Desired, Plan, hooks, plan_chains};

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

/// Counters, shared with whoever reports them.
#[derive(Debug, Default)]
pub struct IptablesStats {
    /// Restores run (one per family with something to change).
    pub restores: AtomicU64,
    /// Refused restores.
    pub failures: AtomicU64,
    /// Chains written (created or flushed and filled).
    pub chains_written: AtomicU64,
    /// Chains deleted.
    pub chains_deleted: AtomicU64,
    /// Verifications that found the kernel changed behind kpng's back.
    pub drift: AtomicU64,
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sync {
    /// What the kernel holds must be read back before anything is written.
    Unknown,
    /// The kernel holds what was committed.
    Synced,
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

/// The iptables backend.
pub struct IptablesBackend {
    options: IptablesOptions,
    kernel: Box<dyn Kernel>,
    sync: Sync,
    full_reads: FullReads,
    desired: Desired,
    committed: HashMap<ChainKey, Vec<Rule>>,
    stats: Arc<IptablesStats>,
    /// `--dry-run`: restore inputs are printed, and the log says so.
    dry_run: bool,
}

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
        Ok(IptablesBackend { dry_run, ..IptablesBackend::new(options, kernel) })
    }

    /// A backend writing through `kernel`.
    pub fn new(options: IptablesOptions, kernel: Box<dyn Kernel>) -> Self {
        let full_reads = FullReads::new(options.full_read_share);
        IptablesBackend {
            options,
            kernel,
            sync: Sync::Unknown,
            full_reads,
            desired: Desired::default(),
            committed: HashMap::new(),
            stats: Arc::default(),
            dry_run: false,
        }
    }

    /// The counters.
    pub fn stats(&self) -> Arc<IptablesStats> {
        self.stats.clone()
    }

    /// What kpng committed, by chain.
    pub fn committed(&self) -> &HashMap<ChainKey, Vec<Rule>> {
        &self.committed
    }

    fn context(&self, state: &LocalState) -> Context {
        let o = &self.options;
        Context {
            masquerade_all: o.masquerade_all,
            masq_mark: 1 << o.masquerade_bit,
            drop_mark: 1 << o.drop_bit,
            local: o.local_detection.resolve(state.node.as_ref(), &o.cluster_cidrs),
            node_ips: state.node.as_ref().map(|n| n.primary_ips.clone()).unwrap_or_default(),
            localhost_nodeports: o.localhost_nodeports,
        }
    }

    /// Reads the kernel back and writes whatever differs from `state`.
    fn resync(&mut self, state: &LocalState) -> Result<Plan, IptablesError> {
        self.desired = Desired::build(state, self.context(state));
        let mut plan = Plan::default();
        let started = Instant::now();
        for family in Family::ALL {
            let snapshot = self.kernel.read(family)?;
            diff_snapshot(family, &snapshot, self.desired.chains(), &mut plan);
        }
        self.full_reads.done(started, Instant::now());
        self.commit(&plan, false)?;
        self.committed = self.desired.chains().clone();
        self.recount_rules();
        self.sync = Sync::Synced;
        if plan.is_empty() {
            tracing::info!(
                chains = self.committed.len(),
                "iptables: the kernel already holds this state"
            );
        }
        Ok(plan)
    }

    fn update(&mut self, changes: &ChangeSet<'_>) -> Result<Plan, IptablesError> {
        let state = changes.state;
        let (keys, node_changed) = changes.touched();
        let mut touched = BTreeSet::new();
        let ctx = self.context(state);
        let renew = node_changed
            && (&ctx, &crate::state::NodeFacts::of(state))
                != (self.desired.context().0, self.desired.context().1);
        if renew {
            self.desired.renew(state, ctx, &mut touched);
        } else {
            self.desired.update(state, &keys, &mut touched);
        }
        let plan = plan_chains(self.desired.chains(), &self.committed, &touched);
        self.commit(&plan, true)?;
        for key in &touched {
            let old = match self.desired.chains().get(key) {
                Some(rules) => self.committed.insert(key.clone(), rules.clone()),
                None => self.committed.remove(key),
            };
            let new = self.committed.get(key).map_or(0, Vec::len);
            self.count_rules(key, old.map_or(0, |r| r.len()), new);
        }
        Ok(plan)
    }

    /// Runs one restore per family with something to change. A family whose restore is
    /// refused does not hold back the other: both are tried, and the first refusal is the
    /// error.
    fn commit(&mut self, plan: &Plan, partial: bool) -> Result<(), IptablesError> {
        let mut refused = None;
        for family in plan.families() {
            let counts = &self.stats.by_family[family_index(family)];
            for text in plan.restore_texts(family, self.options.batch_chains) {
                self.stats.restores.fetch_add(1, Ordering::Relaxed);
                if let Err(error) = self.kernel.restore(family, &text) {
                    self.stats.failures.fetch_add(1, Ordering::Relaxed);
                    match partial {
                        true => counts.partial_failures.fetch_add(1, Ordering::Relaxed),
                        false => counts.full_failures.fetch_add(1, Ordering::Relaxed),
                    };
                    refused.get_or_insert(error);
                    break;
                }
            }
            for ((f, table), t) in plan.tables.iter().filter(|((f, _), _)| *f == family) {
                let written: usize = t.write.values().map(Vec::len).sum();
                let counts = &self.stats.by_family[family_index(*f)];
                counts.last_written[table_index(*table)].store(written as u64, Ordering::Relaxed);
            }
        }
        if let Some(error) = refused {
            return Err(error);
        }
        let (written, deleted) = plan.counts();
        self.stats.chains_written.fetch_add(written as u64, Ordering::Relaxed);
        self.stats.chains_deleted.fetch_add(deleted as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Moves the count of rules kpng owns (kube-proxy's metrics) by one chain's change:
    /// per-change work stays proportional to the change.
    fn count_rules(&self, (family, table, _): &ChainKey, old: usize, new: usize) {
        let rules = &self.stats.by_family[family_index(*family)].rules[table_index(*table)];
        rules.fetch_add(new as u64, Ordering::Relaxed);
        rules.fetch_sub(old as u64, Ordering::Relaxed);
    }

    /// Counts the rules kpng owns afresh, after a whole state (a change adjusts them).
    fn recount_rules(&self) {
        let mut counts = [[0u64; 2]; 2];
        for ((family, table, _), rules) in &self.committed {
            counts[family_index(*family)][table_index(*table)] += rules.len() as u64;
        }
        for (stats, counts) in self.stats.by_family.iter().zip(counts) {
            for (rules, n) in stats.rules.iter().zip(counts) {
                rules.store(n, Ordering::Relaxed);
            }
        }
    }

    /// The first difference between the kernel and what was committed, if any: in every
    /// chain when `full`, else in the entry chains and the jumps into them.
    fn drift(&mut self, full: bool) -> Result<Option<String>, IptablesError> {
        let hooks = hooks();
        for family in Family::ALL {
            let mut plan = Plan::default();
            if full {
                let snapshot = self.kernel.read(family)?;
                diff_snapshot(family, &snapshot, &self.committed, &mut plan);
            } else {
                let entry: HashMap<ChainKey, Vec<Rule>> = names::entry_chains()
                    .into_iter()
                    .flat_map(|chain| Table::ALL.map(|table| (family, table, chain.clone())))
                    .filter_map(|key| Some((key.clone(), self.committed.get(&key)?.clone())))
                    .collect();
                let listed: Vec<(Table, String)> = entry
                    .keys()
                    .map(|(_, table, chain)| (*table, chain.to_string()))
                    .chain(hooks.iter().map(|hook| (hook.table, hook.builtin.to_string())))
                    .collect();
                let snapshot = self.kernel.read_chains(family, &listed)?;
                diff_snapshot(family, &snapshot, &entry, &mut plan);
            }
            if let Some(((f, table), t)) = plan.tables.iter().find(|(_, t)| !t.is_empty()) {
                let what = match (t.write.keys().next(), t.delete.iter().next(), t.hooks.first()) {
                    (Some(c), _, _) => format!("chain {c} differs"),
                    (_, Some(c), _) => format!("chain {c} is foreign"),
                    (_, _, Some(h)) => format!("the jump from {} is missing", h.builtin),
                    _ => String::new(),
                };
                return Ok(Some(format!("{f} {}: {what}", table.as_str())));
            }
        }
        Ok(None)
    }
}

/// Adds to `plan` what makes `snapshot` (one family) hold `desired`'s chains of that family.
fn diff_snapshot(
    family: Family,
    snapshot: &Snapshot,
    desired: &HashMap<ChainKey, Vec<Rule>>,
    plan: &mut Plan,
) {
    for ((f, table, chain), rules) in desired.iter().filter(|((f, _, _), _)| *f == family) {
        let key = (*f, *table, chain.clone());
        let same = snapshot.chains.get(&(*table, chain.clone())).is_some_and(|have| {
            have.len() == rules.len() && have.iter().zip(rules).all(|(h, r)| *h == r.to_string())
        });
        if !same {
            plan.write(&key, rules.clone());
        }
    }
    for (table, chain) in snapshot.chains.keys() {
        if !desired.contains_key(&(family, *table, chain.clone())) {
            plan.delete(&(family, *table, chain.clone()));
        }
    }
    for hook in hooks() {
        let present = (hook.table, hook.builtin.to_string(), hook.rule.to_string());
        if !snapshot.hooks.contains(&present) {
            plan.hook(family, hook);
        }
    }
}

impl Backend for IptablesBackend {
    fn unsupported(
        &self,
        lb: &kpng_model::global::LoadBalancing,
    ) -> Vec<(kpng_model::global::AnnotationKey, &'static str)> {
        // None of the kube-nftlb settings has a translation here yet.
        kpng_backend::unsupported::all_settings(lb)
    }

    fn name(&self) -> &'static str {
        crate::NAME
    }

    fn apply(&mut self, changes: &ChangeSet<'_>) -> Result<(), BackendError> {
        let start = Instant::now();
        let result = match (changes.is_reset(), self.sync) {
            (false, Sync::Synced) => self.update(changes),
            _ => self.resync(changes.state),
        };
        match result {
            Ok(plan) if plan.is_empty() => {
                tracing::debug!(chains = self.committed.len(), "iptables: nothing to change");
                Ok(())
            }
            Ok(plan) => {
                let (written, deleted) = plan.counts();
                let done = kpng_backend::backend::done(self.dry_run, "restored");
                tracing::info!(written, deleted, chains = self.committed.len(), took = ?start.elapsed(), "iptables rules {done}");
                Ok(())
            }
            Err(error) => {
                // The refused table keeps its previous rules; read back before writing again.
                self.sync = Sync::Unknown;
                tracing::warn!(error = %kpng_backend::error_chain(&error), "iptables: restore refused");
                Err(error.into_backend_error())
            }
        }
    }

    fn verify(&mut self) -> Result<bool, BackendError> {
        if self.sync != Sync::Synced {
            return Ok(true);
        }
        let started = Instant::now();
        let full = self.full_reads.due(started);
        let drift = self.drift(full).map_err(IptablesError::into_backend_error)?;
        if full {
            self.full_reads.done(started, Instant::now());
        }
        match drift {
            None => Ok(true),
            Some(what) => {
                self.stats.drift.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%what, "iptables: kpng's chains changed behind its back; repairing");
                self.sync = Sync::Unknown;
                Ok(false)
            }
        }
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
