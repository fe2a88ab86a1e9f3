//! The backend over the in-memory kernel: any sequence of change sets, with refused
//! restores and restarts, ends where a fresh load of the final state ends.

use kpng_backend::{Backend, ChangeSet};
use kpng_local::{diff, project_node_state};
use kpng_model::LocalState;
use kpng_testkit::strategies::{Mutation, arb_mutation};
use proptest::prelude::*;

use super::*;
use crate::MemoryKernel;
use crate::kernel::Snapshot;
use crate::names;
use crate::render::Table;

fn backend(kernel: &MemoryKernel) -> IptablesBackend {
    // Small batches, so that rebuilds go through several restores.
    let options = IptablesOptions {
        cluster_cidrs: vec!["10.0.0.0/8".parse().unwrap()],
        batch_chains: 7,
        full_read_share: 1,
        ..IptablesOptions::default()
    };
    IptablesBackend::new(options, Box::new(kernel.clone()))
}

fn snapshots(kernel: &MemoryKernel) -> Vec<Snapshot> {
    Family::ALL.iter().map(|f| kernel.snapshot(*f)).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    #[test]
    fn change_sets_end_where_a_fresh_load_ends(
        mutations in proptest::collection::vec((arb_mutation(), 0u8..10), 1..30),
    ) {
        let kernel = MemoryKernel::new();
        let mut incremental = backend(&kernel);
        let mut model = kpng_model::GlobalModel::new();
        let mut before = LocalState::default();
        incremental.apply(&ChangeSet::full(&before)).unwrap();
        for (mutation, fate) in &mutations {
            Mutation::apply_to(mutation, &mut model);
            let after = project_node_state(&model, "n0");
            let ops = diff(&before, &after);
            match fate {
                // A refused restore: the runner then sends the whole state again.
                0 => {
                    kernel.fail_next(1);
                    let refused = incremental.apply(&ChangeSet::changes(&ops, &after));
                    // A change set that needed no restore leaves the failure unused.
                    kernel.fail_next(0);
                    if refused.is_err() {
                        incremental.apply(&ChangeSet::full(&after)).unwrap();
                    }
                }
                // A restart over the tables.
                1 => {
                    incremental = backend(&kernel);
                    incremental.apply(&ChangeSet::full(&after)).unwrap();
                }
                _ => incremental.apply(&ChangeSet::changes(&ops, &after)).unwrap(),
            }
            before = after;
        }
        // Nothing changed: nothing run.
        let restores = kernel.restores();
        incremental.apply(&ChangeSet::changes(&[], &before)).unwrap();
        prop_assert_eq!(kernel.restores(), restores);
        prop_assert!(kpng_conformance::finds_no_drift(incremental.template_stats(), &mut incremental));

        let fresh_kernel = MemoryKernel::new();
        backend(&fresh_kernel).apply(&ChangeSet::full(&before)).unwrap();
        prop_assert_eq!(snapshots(&kernel), snapshots(&fresh_kernel));

        // A restart over identical chains writes nothing.
        backend(&kernel).apply(&ChangeSet::full(&before)).unwrap();
        prop_assert_eq!(kernel.restores(), restores);
    }
}

#[test]
fn drift_is_found_and_repaired_touching_only_what_differs() {
    use kpng_model::{Object, Protocol};
    use kpng_testkit::builders::{endpoint, node, service, slice};
    let mut model = kpng_model::GlobalModel::new();
    model.apply(Object::Node(node("n0", None, &["192.168.0.1"])));
    model.apply(Object::Service(service(
        "ns",
        "web",
        &["10.96.0.7"],
        &[("http", Protocol::Tcp, 80)],
    )));
    model.apply(Object::EndpointSlice(slice(
        "ns",
        "w",
        "web",
        &[("http", Protocol::Tcp, 8080)],
        vec![endpoint("10.1.0.1", "n0")],
    )));
    let state = project_node_state(&model, "n0");
    let kernel = MemoryKernel::new();
    let mut b = backend(&kernel);
    b.apply(&ChangeSet::full(&state)).unwrap();
    let good = kernel.snapshot(Family::V4);
    assert!(kpng_conformance::finds_no_drift(b.template_stats(), &mut b));

    // Someone flushes the leaf holding the service and adds a chain of the prefix.
    let mut damaged = good.clone();
    let leaf = (Table::Nat, crate::names::shard2("SH", 7));
    damaged.chains.get_mut(&leaf).expect("the leaf of 10.96.0.7").clear();
    damaged
        .chains
        .insert((Table::Nat, crate::names::ChainName::new("KPNG-FOREIGN").unwrap()), vec![]);
    kernel.set_snapshot(Family::V4, damaged);
    let restores = kernel.restores();
    assert!(b.verify().unwrap(), "the verification repairs what it found");
    assert_eq!(b.template_stats().drifts.load(Ordering::Relaxed), 1, "drift is reported");
    assert_eq!(kernel.restores(), restores + 1, "one restore, IPv4 only");
    assert_eq!(kernel.snapshot(Family::V4), good);
    assert!(kpng_conformance::finds_no_drift(b.template_stats(), &mut b));
}

#[test]
fn a_one_service_change_rewrites_neither_the_top_chain_nor_other_leaves() {
    use kpng_model::{Object, Protocol};
    use kpng_testkit::builders::{endpoint, service, slice};
    let mut model = kpng_model::GlobalModel::new();
    for i in 0..200u32 {
        let ip = format!("10.96.{}.{}", i / 250, i % 250);
        model.apply(Object::Service(service(
            "ns",
            &format!("s{i}"),
            &[&ip],
            &[("http", Protocol::Tcp, 80)],
        )));
        model.apply(Object::EndpointSlice(slice(
            "ns",
            &format!("s{i}"),
            &format!("s{i}"),
            &[("http", Protocol::Tcp, 8080)],
            vec![endpoint(&format!("10.1.{}.{}", i / 250, i % 250), "n1")],
        )));
    }
    let before = project_node_state(&model, "n0");
    let kernel = MemoryKernel::new();
    let mut b = backend(&kernel);
    b.apply(&ChangeSet::full(&before)).unwrap();
    let old = kernel.snapshot(Family::V4);
    model.apply(Object::EndpointSlice(slice(
        "ns",
        "s42",
        "s42",
        &[("http", Protocol::Tcp, 8080)],
        vec![endpoint("10.1.0.42", "n1"), endpoint("10.1.9.9", "n1")],
    )));
    let after = project_node_state(&model, "n0");
    b.apply(&ChangeSet::changes(&diff(&before, &after), &after)).unwrap();
    let new = kernel.snapshot(Family::V4);
    let changed: Vec<String> = new
        .chains
        .iter()
        .filter(|(k, v)| old.chains.get(k) != Some(v))
        .map(|((_, c), _)| c.to_string())
        .collect();
    // The service's pick chain and its new endpoint chain; no dispatch chain.
    assert_eq!(changed.len(), 2, "{changed:?}");
    assert!(
        changed.iter().all(|c| c.starts_with("KPNG-SVC-") || c.starts_with("KPNG-SEP-")),
        "{changed:?}"
    );
}

/// A one-service model on node n0: `ns/web` at `ip`:80 with one endpoint.
fn one_service(ips: &[&str]) -> LocalState {
    use kpng_model::{Object, Protocol};
    use kpng_testkit::builders::{endpoint, node, service, slice};
    let mut model = kpng_model::GlobalModel::new();
    model.apply(Object::Node(node("n0", None, &["192.168.0.1"])));
    model.apply(Object::Service(service("ns", "web", ips, &[("http", Protocol::Tcp, 80)])));
    for ip in ips {
        let (name, address) = if ip.contains(':') { ("w6", "fd00::1") } else { ("w4", "10.1.0.1") };
        model.apply(Object::EndpointSlice(slice(
            "ns",
            name,
            "web",
            &[("http", Protocol::Tcp, 8080)],
            vec![endpoint(address, "n0")],
        )));
    }
    project_node_state(&model, "n0")
}

#[test]
fn a_refused_family_does_not_hold_back_the_other() {
    let state = one_service(&["10.96.0.7", "fd00:96::7"]);
    let kernel = MemoryKernel::new();
    let mut b = backend(&kernel);
    kernel.fail_next_in(Family::V4, 1);
    assert!(b.apply(&ChangeSet::full(&state)).is_err(), "IPv4 was refused");
    assert!(kernel.snapshot(Family::V4).chains.is_empty(), "IPv4 holds nothing");
    let v6 = kernel.snapshot(Family::V6);
    assert!(v6.chains.keys().any(|(_, c)| c.as_str().starts_with("KPNG-SVC-")), "{v6:?}");

    // The retry reads back and writes IPv4; IPv6 already holds the state.
    b.apply(&ChangeSet::full(&state)).unwrap();
    let v4 = kernel.snapshot(Family::V4);
    assert!(v4.chains.keys().any(|(_, c)| c.as_str().starts_with("KPNG-SVC-")), "{v4:?}");
    assert_eq!(kernel.snapshot(Family::V6), v6);
    let restores = kernel.restores();
    backend(&kernel).apply(&ChangeSet::full(&state)).unwrap();
    assert_eq!(kernel.restores(), restores, "a restart finds both families in place");
    assert!(kpng_conformance::finds_no_drift(b.template_stats(), &mut b));
}

/// A kernel whose full read-back takes a while, counting full reads and chain listings.
struct SlowReads {
    kernel: MemoryKernel,
    delay: std::time::Duration,
    full: Arc<AtomicU64>,
    listed: Arc<AtomicU64>,
    /// Whether the tables count their commits (iptables-nft's do).
    generations: bool,
}

impl Kernel for SlowReads {
    fn read(&mut self, family: Family) -> Result<Snapshot, IptablesError> {
        std::thread::sleep(self.delay);
        self.full.fetch_add(1, Ordering::Relaxed);
        self.kernel.read(family)
    }

    fn read_chains(
        &mut self,
        family: Family,
        chains: &[(Table, String)],
    ) -> Result<Snapshot, IptablesError> {
        self.listed.fetch_add(chains.len() as u64, Ordering::Relaxed);
        self.kernel.read_chains(family, chains)
    }

    fn restore(&mut self, family: Family, input: &str) -> Result<(), IptablesError> {
        self.kernel.restore(family, input)
    }

    fn generation(&mut self) -> Option<u64> {
        self.generations.then(|| self.kernel.generation()).flatten()
    }
}

#[test]
fn verification_reads_the_entry_chains_always_and_every_chain_at_most_one_percent_of_the_time() {
    let state = one_service(&["10.96.0.7"]);
    let kernel = MemoryKernel::new();
    let (full, listed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let slow = SlowReads {
        kernel: kernel.clone(),
        delay: std::time::Duration::from_millis(5),
        full: full.clone(),
        listed: listed.clone(),
        generations: false,
    };
    let options = IptablesOptions {
        cluster_cidrs: vec!["10.0.0.0/8".parse().unwrap()],
        ..IptablesOptions::default()
    };
    let mut b = IptablesBackend::new(options, Box::new(slow));
    b.apply(&ChangeSet::full(&state)).unwrap();
    let good = kernel.snapshot(Family::V4);
    // The cold start read both families back (about 10 ms): the next full read-back is
    // about a second away.
    let started = Instant::now();
    assert_eq!(full.load(Ordering::Relaxed), 2);

    // A flushed leaf is not seen by the quick look, which lists no leaf.
    let mut damaged = good.clone();
    damaged.chains.get_mut(&(Table::Nat, names::shard2("SH", 7))).unwrap().clear();
    kernel.set_snapshot(Family::V4, damaged.clone());
    assert!(
        kpng_conformance::finds_no_drift(b.template_stats(), &mut b),
        "the quick look lists no leaf"
    );
    assert_eq!(full.load(Ordering::Relaxed), 2, "no full read-back yet");
    let per_look = listed.load(Ordering::Relaxed);
    // Per family: the entry chains that exist (KPNG-NODEPORTS in both tables) and the six
    // built-in chains, whatever the number of services.
    assert!((2 * 6..=2 * (8 + 6)).contains(&per_look), "{per_look} chains listed");

    // A flushed entry chain is seen at once.
    damaged.chains.get_mut(&(Table::Nat, names::services())).unwrap().clear();
    kernel.set_snapshot(Family::V4, damaged);
    assert!(!b.verify().unwrap(), "the flushed KPNG-SERVICES is seen");
    if started.elapsed() < std::time::Duration::from_millis(900) {
        assert_eq!(full.load(Ordering::Relaxed), 2, "seen by the quick look");
    }

    // Repaired; then the full read-back comes due and sees a flushed leaf.
    b.apply(&ChangeSet::full(&state)).unwrap();
    assert_eq!(kernel.snapshot(Family::V4), good);
    let mut damaged = good.clone();
    damaged.chains.get_mut(&(Table::Nat, names::shard2("SH", 7))).unwrap().clear();
    kernel.set_snapshot(Family::V4, damaged);
    let deadline = Instant::now() + std::time::Duration::from_secs(10);
    let before = full.load(Ordering::Relaxed);
    let stats = b.template_stats();
    let drifts = || stats.drifts.load(Ordering::Relaxed);
    let drifted = drifts();
    while drifts() == drifted {
        assert!(Instant::now() < deadline, "the full read-back never came due");
        std::thread::sleep(std::time::Duration::from_millis(50));
        // A whole read-back repairs what it finds in place.
        assert!(b.verify().unwrap());
    }
    assert!(full.load(Ordering::Relaxed) > before, "found by a full read-back");
    assert_eq!(kernel.snapshot(Family::V4), good, "repaired by the verification");
}

#[test]
fn full_reads_are_spaced_by_their_share_of_the_time() {
    let mut reads = FullReads::new(100);
    let t0 = Instant::now();
    assert!(reads.due(t0), "the first verification reads everything");
    let took = std::time::Duration::from_millis(10);
    reads.done(t0, t0 + took);
    assert!(!reads.due(t0 + took + took * 98));
    assert!(reads.due(t0 + took + took * 99));
    let mut always = FullReads::new(1);
    always.done(t0, t0 + took);
    assert!(always.due(t0 + took));
}

#[test]
fn verification_reads_nothing_while_the_generation_is_kpngs() {
    let state = one_service(&["10.96.0.7", "fd00:96::7"]);
    let kernel = MemoryKernel::new();
    let (full, listed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let counting = SlowReads {
        kernel: kernel.clone(),
        delay: std::time::Duration::ZERO,
        full: full.clone(),
        listed: listed.clone(),
        generations: true,
    };
    let mut b = IptablesBackend::new(IptablesOptions::default(), Box::new(counting));
    b.apply(&ChangeSet::full(&state)).unwrap();
    // Both families' restores, four table sections: the generation moved by kpng alone.
    let reads = || full.load(Ordering::Relaxed) + listed.load(Ordering::Relaxed);
    let after_load = reads();
    for _ in 0..5 {
        assert!(kpng_conformance::finds_no_drift(b.template_stats(), &mut b));
    }
    assert_eq!(reads(), after_load, "nothing read back");
    let skipped = b.template_stats().readbacks_skipped.load(Ordering::Relaxed);
    assert_eq!(skipped, 5);

    // Another process commits (here: flushes a leaf): the next verification reads.
    let mut damaged = kernel.snapshot(Family::V4);
    damaged.chains.get_mut(&(Table::Nat, names::shard2("SH", 7))).unwrap().clear();
    kernel.set_snapshot(Family::V4, damaged);
    let _ = b.verify().unwrap();
    assert!(reads() > after_load, "read back after another's commit");
}

#[test]
fn a_whole_read_back_repairs_in_place_what_it_found_and_a_refused_repair_asks_for_a_reset() {
    let state = one_service(&["10.96.0.7"]);
    let kernel = MemoryKernel::new();
    let (full, listed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let slow = SlowReads {
        kernel: kernel.clone(),
        delay: std::time::Duration::ZERO,
        full: full.clone(),
        listed,
        generations: true,
    };
    let options = IptablesOptions {
        cluster_cidrs: vec!["10.0.0.0/8".parse().unwrap()],
        full_read_share: 1,
        ..IptablesOptions::default()
    };
    let mut b = IptablesBackend::new(options, Box::new(slow));
    b.apply(&ChangeSet::full(&state)).unwrap();
    let good = kernel.snapshot(Family::V4);
    let damage = || {
        let mut damaged = good.clone();
        damaged.chains.get_mut(&(Table::Nat, names::shard2("SH", 7))).unwrap().clear();
        kernel.set_snapshot(Family::V4, damaged);
    };
    let drifts = |b: &IptablesBackend| b.template_stats().drifts.load(Ordering::Relaxed);

    // Found by a whole read-back of both families and written back at once: one restore,
    // of the damaged family, and nothing read again.
    damage();
    let (before, restores) = (full.load(Ordering::Relaxed), kernel.restores());
    assert!(b.verify().unwrap(), "the verification repairs what it found");
    assert_eq!(drifts(&b), 1, "the flushed leaf is seen");
    assert_eq!(full.load(Ordering::Relaxed), before + 2);
    assert_eq!(kernel.restores(), restores + 1, "one restore, IPv4 only");
    assert_eq!(kernel.snapshot(Family::V4), good, "repaired from the verification's read");
    assert!(kpng_conformance::finds_no_drift(b.template_stats(), &mut b));
    assert_eq!(drifts(&b), 1);

    // The repair refused: the verification fails, and the whole state (a reset, which
    // reads again) repairs.
    damage();
    kernel.fail_next(1);
    assert!(b.verify().is_err(), "a refused repair is an error");
    assert_eq!(drifts(&b), 2);
    assert_ne!(kernel.snapshot(Family::V4), good);
    let read = full.load(Ordering::Relaxed);
    b.apply(&ChangeSet::full(&state)).unwrap();
    assert_eq!(full.load(Ordering::Relaxed), read + 2, "the reset reads again");
    assert_eq!(kernel.snapshot(Family::V4), good, "repaired by the reset");
    assert!(kpng_conformance::finds_no_drift(b.template_stats(), &mut b));
}
