//! [`NftBackend`]: `to-nft`, the backend template's reconciler
//! ([`kpng_backend::reconcile::Reconciler`]) over kpng's tables: [`NftRender`] renders
//! services into their elements and layout objects, [`Tables`] commits each plan as one
//! nf_tables transaction (a cold start split for size, see [`Tables`]).
//!
//! The template owns the change path: a change set renders only the services it touched
//! and commits what differs; at start-up, after a refused transaction and after drift, the
//! tables are read back and only what differs from the whole node state is written (a
//! restart over a right table writes nothing, a damaged one is repaired in place); a
//! verification reads nothing back while the ruleset generation is still kpng's.

use std::sync::Arc;

use ipnet::IpNet;
use kpng_backend::Target;
use kpng_backend::delegate_backend;
use kpng_backend::proxy::LocalDetection;
use kpng_backend::reconcile::{self, Objects, Reconciler};

use crate::entry::{EntryKey, EntryValue, LayoutName, LayoutValue};
use crate::error::NftError;
use crate::instance::{NftRender, Tables};
use crate::kernel::Kernel;
use crate::objects::{ElementId, Value};
use crate::stats::NftStats;

/// Configuration of the nftables backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NftOptions {
    /// Masquerade all traffic to cluster IPs (`--masquerade-all`).
    pub masquerade_all: bool,
    /// The packet-mark bit that flags connections for masquerading.
    pub masquerade_bit: u8,
    /// How traffic from local pods is recognised (`--detect-local-mode`).
    pub local_detection: LocalDetection,
    /// `--cluster-cidr`.
    pub cluster_cidrs: Vec<IpNet>,
    /// Over tables without an element (a cold start), the skeleton is committed first
    /// (while the first services are rendered), then the elements of whole services in
    /// transactions of about this many elements rather than in one: the kernel inserts
    /// half a million elements a quarter faster in ten transactions than in one, each is
    /// rendered and prepared while the one before commits, and kpng never lists the whole
    /// table's elements at once. Each service is programmed atomically; services not yet committed
    /// are simply not there yet, as before kpng started. A change, and a restart or a
    /// repair over tables that hold elements, stay one transaction.
    pub cold_start_transaction: usize,
}

/// The default [`NftOptions::cold_start_transaction`].
const COLD_START_TRANSACTION: usize = 50_000;

impl Default for NftOptions {
    fn default() -> Self {
        NftOptions {
            masquerade_all: false,
            masquerade_bit: 14,
            local_detection: LocalDetection::Auto,
            cluster_cidrs: Vec::new(),
            cold_start_transaction: COLD_START_TRANSACTION,
        }
    }
}

/// Whether the backend knows what the kernel holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableSync {
    /// Unknown: the next change set reads the tables back and reconciles them whole.
    Unknown,
    /// The kernel holds what the backend last committed: changes are applied as they come.
    InSync,
}

/// The nftables backend.
pub struct NftBackend {
    inner: Reconciler<NftRender, Tables>,
    stats: Arc<NftStats>,
}

delegate_backend!(NftBackend, inner);

impl NftBackend {
    /// A backend with `options` that commits to `target`: the kernel over netlink, or the
    /// `nft` text of each transaction (`--dry-run`).
    pub fn open(options: NftOptions, target: Target) -> Result<Self, NftError> {
        let dry_run = target.is_dry_run();
        let kernel: Box<dyn Kernel> = match target {
            Target::Kernel => Box::new(crate::NetlinkKernel::open()?),
            Target::DryRun(out) => Box::new(crate::DryRunKernel::new(out)),
        };
        let NftBackend { inner, stats } = NftBackend::new(options, kernel);
        Ok(NftBackend { inner: inner.with_dry_run(dry_run), stats })
    }

    /// A backend sending its transactions to `kernel`.
    pub fn new(options: NftOptions, kernel: Box<dyn Kernel>) -> Self {
        let stats = Arc::<NftStats>::default();
        let render = NftRender::new(options.clone(), kernel.ct_helpers());
        let tables = Tables::new(kernel, options.cold_start_transaction, stats.clone());
        NftBackend { inner: Reconciler::new("to-nft", render, tables), stats }
    }

    /// Reports the kernel's faults to `problems` (which `/readyz` lists).
    pub fn with_problems(self, problems: kpng_backend::Problems) -> Self {
        NftBackend { inner: self.inner.with_problems(problems), stats: self.stats }
    }

    /// The transactions' counters.
    pub fn stats(&self) -> Arc<NftStats> {
        self.stats.clone()
    }

    /// The template's counters.
    pub fn template_stats(&self) -> Arc<reconcile::Stats> {
        self.inner.stats()
    }

    /// Every object committed.
    pub fn held(&self) -> &Objects<EntryKey, EntryValue> {
        self.inner.held()
    }

    /// The elements committed, sorted.
    pub fn elements(&self) -> Vec<(ElementId, Value)> {
        let held = self.inner.held().iter();
        let mut out: Vec<(ElementId, Value)> =
            held.filter_map(|(k, v)| Some((k.as_element()?, v.as_element()?))).collect();
        out.sort_unstable();
        out
    }

    /// How many elements are committed.
    pub fn element_count(&self) -> usize {
        self.inner.held().iter().filter(|(k, _)| k.as_layout().is_none()).count()
    }

    /// The chains committed, with their rules.
    pub fn chains(&self) -> Vec<(LayoutName, usize)> {
        let held = self.inner.held().iter();
        let mut out: Vec<(LayoutName, usize)> = held
            .filter_map(|(k, v)| match (k.as_layout()?, v.as_layout()?) {
                (name @ LayoutName::Chain(..), LayoutValue::Chain(_, rules)) => {
                    Some((name.clone(), rules.len()))
                }
                _ => None,
            })
            .collect();
        out.sort();
        out
    }

    /// The whole table as it stands, as `nft -f` input that builds it from nothing.
    pub fn ruleset(&self) -> String {
        crate::instance::ruleset(self.inner.held())
    }

    /// Whether the backend knows what the kernel holds.
    pub fn sync(&self) -> TableSync {
        match self.inner.in_sync() {
            true => TableSync::InSync,
            false => TableSync::Unknown,
        }
    }
}
