//! A kernel wrapper that records what the backend asks of the kernel: the last commit's
//! duration and size, the sum of every commit's (a streamed cold start commits in parts),
//! and the number of transactions and element operations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kpng_nft::plan::Plan;
use kpng_nft::{Kernel, KernelContents, NetlinkKernel, NftError};

/// What the probed kernel has seen; shared with the scenario.
#[derive(Debug)]
pub struct Probe {
    last_commit: Mutex<Duration>,
    last_read: Mutex<Duration>,
    /// Transactions so far and when the last one ended, published after each commit.
    committed: tokio::sync::watch::Sender<(u64, Option<Instant>)>,
    last_bytes: AtomicU64,
    committing_ns: AtomicU64,
    bytes: AtomicU64,
    transactions: AtomicU64,
    elements: AtomicU64,
}

impl Default for Probe {
    fn default() -> Self {
        Probe {
            last_commit: Mutex::default(),
            last_read: Mutex::default(),
            committed: tokio::sync::watch::Sender::new((0, None)),
            last_bytes: AtomicU64::default(),
            committing_ns: AtomicU64::default(),
            bytes: AtomicU64::default(),
            transactions: AtomicU64::default(),
            elements: AtomicU64::default(),
        }
    }
}

impl Probe {
    /// Follows commits: the count of transactions and the end of the last one.
    pub fn commits(&self) -> tokio::sync::watch::Receiver<(u64, Option<Instant>)> {
        self.committed.subscribe()
    }

    /// The duration of the last commit (zero after [`Probe::reset_last`]).
    pub fn last_commit(&self) -> Duration {
        *self.last_commit.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The duration of the last read-back of the tables.
    pub fn last_read(&self) -> Duration {
        *self.last_read.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Netlink bytes the last commit sent (zero after [`Probe::reset_last`]).
    pub fn last_bytes(&self) -> u64 {
        self.last_bytes.load(Ordering::Relaxed)
    }

    /// Forgets the last commit's duration and size.
    pub fn reset_last(&self) {
        *self.last_commit.lock().unwrap_or_else(|e| e.into_inner()) = Duration::ZERO;
        self.last_bytes.store(0, Ordering::Relaxed);
    }

    /// The time spent in commits so far, and the netlink bytes they sent.
    pub fn committed_so_far(&self) -> (Duration, u64) {
        let ns = self.committing_ns.load(Ordering::Relaxed);
        (Duration::from_nanos(ns), self.bytes.load(Ordering::Relaxed))
    }

    /// Transactions committed so far.
    pub fn transactions(&self) -> u64 {
        self.transactions.load(Ordering::Relaxed)
    }

    /// Element additions and deletions committed so far.
    pub fn elements(&self) -> u64 {
        self.elements.load(Ordering::Relaxed)
    }
}

/// The real netlink kernel, probed.
pub struct ProbedKernel {
    inner: NetlinkKernel,
    probe: Arc<Probe>,
}

impl ProbedKernel {
    /// Opens the netlink kernel; the returned probe reports on it.
    pub fn open() -> anyhow::Result<(ProbedKernel, Arc<Probe>)> {
        let probe = Arc::new(Probe::default());
        Ok((ProbedKernel { inner: NetlinkKernel::open()?, probe: probe.clone() }, probe))
    }
}

impl Kernel for ProbedKernel {
    fn commit(&mut self, plan: &Plan<'_>) -> Result<(), NftError> {
        let (start, bytes) = (Instant::now(), self.inner.bytes_sent());
        let result = self.inner.commit(plan);
        let (took, sent) = (start.elapsed(), self.inner.bytes_sent() - bytes);
        *self.probe.last_commit.lock().unwrap_or_else(|e| e.into_inner()) = took;
        self.probe.last_bytes.store(sent, Ordering::Relaxed);
        let ns = u64::try_from(took.as_nanos()).unwrap_or(u64::MAX);
        self.probe.committing_ns.fetch_add(ns, Ordering::Relaxed);
        self.probe.bytes.fetch_add(sent, Ordering::Relaxed);
        let count = self.probe.transactions.fetch_add(1, Ordering::Relaxed) + 1;
        self.probe.committed.send_replace((count, Some(Instant::now())));
        let (adds, deletes) = plan.element_count();
        let elements = (adds + deletes) as u64;
        self.probe.elements.fetch_add(elements, Ordering::Relaxed);
        result
    }

    fn read(&mut self) -> Result<Option<KernelContents>, NftError> {
        let start = Instant::now();
        let contents = self.inner.read();
        *self.probe.last_read.lock().unwrap_or_else(|e| e.into_inner()) = start.elapsed();
        contents
    }

    fn read_unless_stale(
        &mut self,
        stale: &dyn Fn(usize) -> bool,
    ) -> Result<Option<KernelContents>, NftError> {
        let start = Instant::now();
        let contents = self.inner.read_unless_stale(stale);
        *self.probe.last_read.lock().unwrap_or_else(|e| e.into_inner()) = start.elapsed();
        contents
    }

    // As the kpng binary verifies: by generation and announcements, not whole read-backs.
    fn read_sets_of(
        &mut self,
        sets: &std::collections::BTreeSet<(kpng_model::Family, kpng_nft::objects::MapName)>,
    ) -> Result<Option<KernelContents>, NftError> {
        self.inner.read_sets_of(sets)
    }

    fn generation(&mut self) -> Result<Option<u32>, NftError> {
        self.inner.generation()
    }

    fn touched(&mut self, known: u32, now: u32) -> kpng_netlink::nftables::announce::Touched {
        self.inner.touched(known, now)
    }
}
