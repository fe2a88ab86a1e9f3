//! Tests of the backend over in-memory maps: incremental change sets end where a fresh
//! load ends, nothing to change writes nothing, a restart adopts, full maps grow.

use std::collections::{BTreeMap, BTreeSet};

use kpng_backend::{Backend, ChangeSet};
use kpng_local::{diff, project_node_state};
use kpng_model::{Item, LocalState, Op};
use kpng_testkit::strategies::{Mutation, arb_mutation};
use proptest::prelude::*;

use super::*;
use crate::MemoryDataplane;
use crate::dataplane::{Batch, Snapshot};
use crate::maps::{GroupId, Target};

/// The maps with slot positions forgotten: groups' endpoint sets instead of slots.
fn normalized(elements: &HashMap<Key, Value>) -> BTreeSet<(Key, Value)> {
    elements
        .iter()
        .map(|(k, v)| match (k, v) {
            (Key::Backend(g, _), Value::Backend(t)) => (Key::Member(*g, *t), Value::Backend(*t)),
            _ => (*k, *v),
        })
        .collect()
}

fn memory(backend: &EbpfBackend) -> HashMap<Key, Value> {
    backend.held().to_map()
}

/// Slots `0..count` of every group are filled, and nothing else is.
fn slots_are_dense(elements: &HashMap<Key, Value>) -> bool {
    let mut slots: BTreeMap<GroupId, Vec<(u32, Target)>> = BTreeMap::new();
    for (k, v) in elements {
        if let (Key::Backend(g, slot), Value::Backend(t)) = (k, v) {
            slots.entry(*g).or_default().push((*slot, *t));
        }
    }
    slots.iter().all(|(g, list)| {
        let count = match elements.get(&Key::Group(*g)) {
            Some(Value::Group { count, .. }) => *count as usize,
            _ => 0,
        };
        let mut numbers: Vec<u32> = list.iter().map(|(s, _)| *s).collect();
        numbers.sort_unstable();
        numbers == (0..count as u32).collect::<Vec<_>>()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn change_sets_end_where_a_fresh_load_ends(
        mutations in proptest::collection::vec(arb_mutation(), 1..40),
    ) {
        let mut incremental = EbpfBackend::new(Box::new(MemoryDataplane::new()));
        let mut model = kpng_model::GlobalModel::new();
        let mut before = LocalState::default();
        incremental.apply(&ChangeSet::full(&before)).unwrap();
        for mutation in &mutations {
            Mutation::apply_to(mutation, &mut model);
            let after = project_node_state(&model, "n0");
            let ops = diff(&before, &after);
            incremental.apply(&ChangeSet::changes(&ops, &after)).unwrap();
            prop_assert!(slots_are_dense(&incremental.held().to_map()));
            before = after;
        }
        // Nothing changed: nothing written.
        let writes = incremental.stats().writes.load(Ordering::Relaxed);
        incremental.apply(&ChangeSet::changes(&[], &before)).unwrap();
        prop_assert_eq!(incremental.stats().writes.load(Ordering::Relaxed), writes);

        let mut fresh = EbpfBackend::new(Box::new(MemoryDataplane::new()));
        fresh.apply(&ChangeSet::full(&before)).unwrap();
        prop_assert_eq!(normalized(&memory(&incremental)), normalized(&memory(&fresh)));

        // A restart over the maps the incremental backend left adopts them as they are.
        let held = Snapshot {
            elements: memory(&incremental),
            capacities: incremental.capacities().cloned().unwrap_or_default(),
        };
        let mut restarted = EbpfBackend::new(Box::new(MemoryDataplane::holding(held)));
        restarted.apply(&ChangeSet::full(&before)).unwrap();
        prop_assert_eq!(restarted.stats().writes.load(Ordering::Relaxed), 0);
        prop_assert_eq!(memory(&restarted), memory(&incremental));
    }
}

#[test]
fn maps_grow_when_the_cluster_outgrows_them() {
    use kpng_model::local::LocalServiceState;
    let mut state = LocalState::default();
    let mut backend = EbpfBackend::new(Box::new(MemoryDataplane::new()));
    backend.apply(&ChangeSet::full(&state)).unwrap();
    assert_eq!(backend.capacities().unwrap()[&MapName::Frontends], 1024);
    let ports = vec![crate::render::tests::port("http", kpng_model::Protocol::Tcp, 80, None)];
    let mut ops = Vec::new();
    for i in 0..1100u32 {
        let ip = format!("10.96.{}.{}", i / 250, 1 + i % 250);
        let svc: LocalServiceState = crate::render::tests::state(
            &format!("s{i}"),
            &[ip.as_str()],
            ports.clone(),
            Vec::new(),
        );
        ops.push(Op::Set(Item::Service(svc.service.clone())));
        state.services.insert(svc.service.key.clone(), svc);
    }
    backend.apply(&ChangeSet::changes(&ops, &state)).unwrap();
    assert_eq!(backend.ebpf_stats().grows.load(Ordering::Relaxed), 1);
    assert_eq!(backend.capacities().unwrap()[&MapName::Frontends], 4096);
    assert_eq!(backend.held().len(), 2200);
}

/// Maps in memory whose programs are detached until the next install, as after
/// `bpftool link detach`.
struct Detached {
    maps: MemoryDataplane,
    detached: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Dataplane for Detached {
    fn read(&mut self) -> Result<Option<Snapshot>, EbpfError> {
        self.maps.read()
    }

    fn install(&mut self, capacities: &Capacities) -> Result<(), EbpfError> {
        self.detached.store(false, Ordering::Relaxed);
        self.maps.install(capacities)
    }

    fn write(&mut self, batch: &Batch) -> Result<(), EbpfError> {
        self.maps.write(batch)
    }

    fn grow(
        &mut self,
        capacities: &Capacities,
        elements: &HashMap<Key, Value>,
    ) -> Result<(), EbpfError> {
        self.maps.grow(capacities, elements)
    }

    fn unattached(&mut self) -> Result<Vec<&'static str>, EbpfError> {
        Ok(match self.detached.load(Ordering::Relaxed) {
            true => vec!["kpng_connect4"],
            false => Vec::new(),
        })
    }
}

#[test]
fn a_detached_program_is_reported_until_attached_again() {
    let detached = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let dataplane = Detached { maps: MemoryDataplane::new(), detached: detached.clone() };
    let problems = kpng_backend::Problems::default();
    let mut backend = EbpfBackend::new(Box::new(dataplane)).with_problems(problems.clone());
    let state = LocalState::default();
    backend.apply(&ChangeSet::full(&state)).unwrap();
    assert!(
        kpng_conformance::finds_no_drift(backend.stats(), &mut backend),
        "attached and holding what was written"
    );

    detached.store(true, Ordering::Relaxed);
    assert!(!backend.verify().unwrap(), "a detached program is drift");
    let stats = backend.ebpf_stats();
    assert_eq!(stats.unattached.load(Ordering::Relaxed), 1);
    assert_eq!(stats.detachments.load(Ordering::Relaxed), 1);
    let listed = problems.list();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].contains("kpng_connect4") && listed[0].contains("to-ebpf"), "{listed:?}");

    // The runner answers drift with the whole state: the reset attaches again.
    backend.apply(&ChangeSet::full(&state)).unwrap();
    assert!(problems.list().is_empty());
    assert_eq!(stats.unattached.load(Ordering::Relaxed), 0);
    assert!(kpng_conformance::finds_no_drift(backend.stats(), &mut backend));
    assert_eq!(stats.detachments.load(Ordering::Relaxed), 1, "counted once");
}
