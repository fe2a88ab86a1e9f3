//! What `to-nft --aggregator` publishes, over random histories: every transaction the
//! backend makes is both applied to an in-memory kernel and translated into aggregator
//! updates, and after every change set the state the aggregator builds from those updates
//! (applied in order, as it applies them) holds exactly what the in-memory kernel holds:
//! the same tables, sets with the same elements, chains with the same rules. Restarts and
//! refused commits publish the tables whole, as the aggregator kernel does.

use std::collections::{BTreeMap, BTreeSet};

use kpng_aggregator::{State, Update};
use kpng_backend::{Backend, ChangeSet};
use kpng_local::NodeProjector;
use kpng_model::{Changes, GlobalModel};
use kpng_nft::aggregated::translate;
use kpng_nft::memory::MemoryTables;
use kpng_nft::objects::table_family;
use kpng_nft::plan::Plan;
use kpng_nft::text::element_text;
use kpng_nft::{Kernel, KernelContents, MemoryKernel, NftBackend, NftError, NftOptions};
use kpng_testkit::strategies::{Mutation, arb_mutation};
use proptest::prelude::*;

/// The in-memory kernel and, beside it, what the aggregator was told.
#[derive(Clone, Default)]
struct Tee {
    kernel: MemoryKernel,
    shared: std::sync::Arc<std::sync::Mutex<Published>>,
}

#[derive(Default)]
struct Published {
    /// The producer's state as the translation keeps it.
    translated: State,
    /// The state the aggregator builds from the publications.
    aggregator: State,
    /// Publications made whole.
    wholes: usize,
}

impl Kernel for Tee {
    fn commit(&mut self, plan: &Plan<'_>) -> Result<(), NftError> {
        self.kernel.commit(plan)?;
        let mut published = self.shared.lock().unwrap();
        let updates = translate(&mut published.translated, plan)?;
        for update in updates {
            assert!(
                !matches!(update, Update::Whole(_)),
                "a transaction publishes its changes only"
            );
            published.aggregator.apply(update).expect("every update names an object that exists");
        }
        Ok(())
    }

    fn replace(&mut self, plan: &Plan<'_>) -> Result<(), NftError> {
        let mut fresh = MemoryKernel::new();
        fresh.commit(plan)?;
        *self.kernel.tables() = fresh.tables().clone();
        let mut published = self.shared.lock().unwrap();
        let mut state = State::default();
        translate(&mut state, plan)?;
        published.translated = state.clone();
        published.aggregator.apply(Update::Whole(state)).unwrap();
        published.wholes += 1;
        Ok(())
    }

    fn read(&mut self) -> Result<Option<KernelContents>, NftError> {
        Ok(None)
    }

    fn ct_helpers(&self) -> bool {
        false
    }
}

type Shape = (BTreeMap<String, BTreeSet<String>>, BTreeMap<String, Vec<String>>);

fn collapse(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// Sets with their elements and chains with their rules, as nft text.
fn of_kernel(tables: &MemoryTables) -> Shape {
    let mut sets = BTreeMap::new();
    for ((family, name), set) in &tables.sets {
        let elements = set.elements.iter().map(|(k, v)| collapse(&element_text(k, v))).collect();
        sets.insert(format!("{} kpng {name}", table_family(*family)), elements);
    }
    let mut chains = BTreeMap::new();
    for ((family, name), chain) in &tables.chains {
        let rules = chain.rules.iter().map(|r| collapse(&r.text)).collect();
        chains.insert(format!("{} kpng {name}", table_family(*family)), rules);
    }
    (sets, chains)
}

fn of_state(state: &State) -> Shape {
    let mut sets = BTreeMap::new();
    let mut chains = BTreeMap::new();
    for (key, table) in &state.tables {
        for (name, set) in &table.sets {
            sets.insert(format!("{key} {name}"), set.elements.clone());
        }
        for (name, chain) in &table.chains {
            chains.insert(format!("{key} {name}"), chain.rules.clone());
        }
    }
    (sets, chains)
}

const NODE: &str = "n0";

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn the_aggregator_is_told_exactly_what_the_kernel_would_hold(
        history in prop::collection::vec((prop::collection::vec(arb_mutation(), 1..8), 0u8..8), 1..7)
    ) {
        let tee = Tee::default();
        let mut backend = NftBackend::new(NftOptions::default(), Box::new(tee.clone()));
        let mut projector = NodeProjector::new(NODE);
        let mut model = GlobalModel::new();
        let mut first = true;
        let mut needs_reset = true;
        for (mutations, event) in history {
            let mut touched = BTreeSet::new();
            for m in &mutations {
                touched.extend(Mutation::apply_to(m, &mut model));
            }
            let changes = if first { Changes::All } else { Changes::Touched(touched) };
            first = false;
            let ops = projector.update(&model, &changes);
            let state = projector.state().clone();
            match event {
                0 => tee.kernel.fail_next(1),
                1 => {
                    backend = NftBackend::new(NftOptions::default(), Box::new(tee.clone()));
                    needs_reset = true;
                }
                _ => {}
            }
            let changes = if needs_reset { ChangeSet::full(&state) } else { ChangeSet::changes(&ops, &state) };
            let wholes = tee.shared.lock().unwrap().wholes;
            match backend.apply(&changes) {
                Ok(()) => {
                    let published = tee.shared.lock().unwrap();
                    if needs_reset {
                        prop_assert_eq!(published.wholes, wholes + 1, "a reset publishes the tables whole");
                    }
                    needs_reset = false;
                    prop_assert_eq!(&published.aggregator, &published.translated);
                    prop_assert_eq!(of_state(&published.aggregator), of_kernel(&tee.kernel.tables()));
                }
                Err(_) => needs_reset = true,
            }
        }
    }
}

#[test]
fn the_helper_annotation_is_reported_and_not_rendered() {
    use kpng_model::global::{AnnotationKey, Helper, LoadBalancing};
    let backend = NftBackend::new(NftOptions::default(), Box::new(Tee::default()));
    let lb = LoadBalancing { helper: Some(Helper::Ftp), ..LoadBalancing::default() };
    assert_eq!(backend.unsupported(&lb), vec![(AnnotationKey::Helper, "ftp")]);
    let direct = NftBackend::new(NftOptions::default(), Box::new(MemoryKernel::new()));
    assert!(direct.unsupported(&lb).is_empty());
}
