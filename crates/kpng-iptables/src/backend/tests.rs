//! The backend over the in-memory kernel: any sequence of change sets, with refused
//! restores and restarts, ends where a fresh load of the final state ends.

use kpng_backend::ChangeSet;
use kpng_local::{diff, project_node_state};
use kpng_testkit::strategies::{Mutation, arb_mutation};
use proptest::prelude::*;

use super::*;
use crate::MemoryKernel;
use crate::kernel::Snapshot;
use crate::render::Table;

fn backend(kernel: &MemoryKernel) -> IptablesBackend {
    // Small batches, so that rebuilds go through several restores.
    let options = IptablesOptions {
        cluster_cidrs: vec!["10.0.0.0/8".parse().unwrap()],
        batch_chains: 7,
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
        prop_assert!(incremental.verify().unwrap());

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
    assert!(b.verify().unwrap());

    // Someone flushes the leaf holding the service and adds a chain of the prefix.
    let mut damaged = good.clone();
    let leaf = (Table::Nat, crate::names::shard2("SH", 7));
    damaged.chains.get_mut(&leaf).expect("the leaf of 10.96.0.7").clear();
    damaged
        .chains
        .insert((Table::Nat, crate::names::ChainName::new("KPNG-FOREIGN").unwrap()), vec![]);
    kernel.set_snapshot(Family::V4, damaged);
    assert!(!b.verify().unwrap(), "drift is reported");
    let restores = kernel.restores();
    b.apply(&ChangeSet::full(&state)).unwrap();
    assert_eq!(kernel.restores(), restores + 1, "one restore, IPv4 only");
    assert_eq!(kernel.snapshot(Family::V4), good);
    assert!(b.verify().unwrap());
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
