//! [`NftBackend`]: `to-nft`, the backend template's reconciler
//! ([`kpng_backend::reconcile::Reconciler`]) over kpng's tables: [`NftRender`] renders
//! services into their elements and layout objects, [`Tables`] commits each plan as one
//! nf_tables transaction (a cold start split for size, see [`Tables`]).
//!
//! The template owns the change path: a change set renders only the services it touched
//! and commits what differs; at start-up, after a refused transaction and after drift, the
//! tables are read back and only what differs from the whole node state is written (a
//! restart over a right table writes nothing, a damaged one is repaired in place); a
//! verification reads nothing back while the ruleset generation is still kpng's, or while
//! the kernel's announcements say that the transactions since left kpng's tables alone.

use std::sync::Arc;

use kpng_backend::Target;
use kpng_backend::delegate_backend;
use kpng_backend::reconcile::{self, Objects, Reconciler};

use crate::entry::{EntryKey, EntryValue, LayoutName, LayoutValue};
use crate::error::NftError;
use crate::instance::{NftRender, Tables};
use crate::kernel::Kernel;
use crate::options::NftOptions;

use crate::objects::{ElementId, Value};
use crate::stats::NftStats;

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
            Target::Kernel => Box::new(crate::kernel::NetlinkKernel::open()?),
            Target::DryRun(out) => Box::new(crate::dry_run::DryRunKernel::new(out)),
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
