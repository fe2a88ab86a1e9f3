//! Properties of projection and diff over random models.

use kpng_local::{
    Fingerprints, NodeLocal, NodeProjector, diff, full_state_ops, project_node_state,
};
use kpng_model::{Changes, GlobalModel, LocalState, NodeState, Op, Touched};
use kpng_testkit::strategies::{Mutation, NODES, arb_mutation, build};
use proptest::prelude::*;

fn apply(model: &mut GlobalModel, m: &Mutation) -> Vec<Touched> {
    m.apply_to(model)
}

fn replay(mut state: LocalState, ops: &[Op]) -> LocalState {
    for op in ops {
        state.apply(op).expect("ops from diff fit the state");
    }
    state
}

/// Checks the order contract: a service is set before its endpoints and deleted after them.
fn check_order(ops: &[Op]) {
    use kpng_model::{Item, ItemRef};
    let position = |pred: &dyn Fn(&Op) -> bool| ops.iter().position(pred);
    for (i, op) in ops.iter().enumerate() {
        match op {
            Op::Set(Item::Endpoint { service, .. }) => {
                if let Some(j) =
                    position(&|o| matches!(o, Op::Set(Item::Service(s)) if &s.key == service))
                {
                    assert!(j < i, "service set after its endpoint");
                }
            }
            Op::Delete(ItemRef::Service(key)) => {
                let later = ops[i..].iter().any(|o| matches!(o, Op::Delete(ItemRef::Endpoint { service, .. }) if service == key));
                assert!(!later, "endpoint deleted after its service");
            }
            _ => {}
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn diff_leads_from_a_to_b(a in proptest::collection::vec(arb_mutation(), 0..25),
                              b in proptest::collection::vec(arb_mutation(), 0..25),
                              node in proptest::sample::select(&NODES[..])) {
        let sa = project_node_state(&build(&a), node);
        let sb = project_node_state(&build(&b), node);
        let ops = diff(&sa, &sb);
        check_order(&ops);
        prop_assert_eq!(replay(sa.clone(), &ops), sb.clone());
        prop_assert!(diff(&sa, &sa).is_empty());
        let full: Vec<Op> = full_state_ops(&sb).collect();
        prop_assert_eq!(&full[1..], &diff(&LocalState::default(), &sb)[..], "same order as diff");
        prop_assert_eq!(replay(LocalState::default(), &full), sb);
    }

    #[test]
    fn incremental_projection_equals_full_projection(
        batches in proptest::collection::vec(proptest::collection::vec(arb_mutation(), 1..6), 1..12),
        node in proptest::sample::select(&NODES[..]),
    ) {
        let mut model = GlobalModel::new();
        let mut projector = NodeProjector::new(node);
        // Refreshed without ops, from a full recomputation every other batch.
        let mut quiet = NodeProjector::new(node);
        let mut seen = LocalState::default();
        for (i, batch) in batches.iter().enumerate() {
            let mut touched = std::collections::BTreeSet::new();
            for m in batch {
                touched.extend(apply(&mut model, m));
            }
            let changes = if i % 2 == 0 { Changes::All } else { Changes::Touched(touched.clone()) };
            let changed = quiet.refresh(&model, &changes);
            let ops = projector.update(&model, &Changes::Touched(touched));
            prop_assert_eq!(changed, !ops.is_empty());
            prop_assert_eq!(quiet.state(), projector.state());
            check_order(&ops);
            seen = replay(seen, &ops);
            let full = project_node_state(&model, node);
            prop_assert_eq!(projector.state(), &full);
            prop_assert_eq!(&seen, &full);
            // A second update with nothing touched yields nothing.
            prop_assert!(projector.update(&model, &Changes::Touched(Default::default())).is_empty());
        }
    }

    #[test]
    fn a_projector_keeping_fingerprints_makes_the_ops_of_one_keeping_the_state(
        batches in proptest::collection::vec(proptest::collection::vec(arb_mutation(), 1..6), 1..12),
        node in proptest::sample::select(&NODES[..]),
    ) {
        let mut model = GlobalModel::new();
        let (mut whole, mut lean) = (NodeProjector::new(node), NodeProjector::lean(node, NodeLocal::default()));
        let (mut quiet, mut quiet_lean) = (NodeProjector::new(node), NodeProjector::lean(node, NodeLocal::default()));
        for (i, batch) in batches.iter().enumerate() {
            let mut touched = std::collections::BTreeSet::new();
            for m in batch {
                touched.extend(apply(&mut model, m));
            }
            // A full recomputation every third batch, as at a start or a zone change.
            let changes = if i % 3 == 0 { Changes::All } else { Changes::Touched(touched) };
            let ops = whole.update(&model, &changes);
            prop_assert_eq!(&lean.update(&model, &changes), &ops);
            let made = lean.whole();
            // Made by every full recomputation (a zone change makes one too).
            prop_assert!(made.is_some() || !matches!(changes, Changes::All));
            if let Some(made) = made {
                prop_assert_eq!(made, whole.state());
            }
            // Read from the model before the fingerprints take the whole state in.
            let view = lean.view(&model);
            prop_assert_eq!(view.node(), whole.state().node.as_ref());
            let read: Vec<_> = view.services().map(|s| s.into_owned()).collect();
            let held: Vec<_> = whole.state().services.values().cloned().collect();
            prop_assert_eq!(read, held);
            prop_assert_eq!(quiet_lean.refresh(&model, &changes), quiet.refresh(&model, &changes));
            let expected = Fingerprints::from_state(whole.state().clone());
            prop_assert!(expected.matches(whole.state()));
            prop_assert_eq!(lean.fingerprints(), &expected);
            prop_assert_eq!(quiet_lean.fingerprints(), &expected);
            let endpoints: usize = whole.state().services.values().map(|s| s.endpoints.len()).sum();
            prop_assert_eq!(lean.fingerprints().endpoint_count(), endpoints);
        }
    }
}
