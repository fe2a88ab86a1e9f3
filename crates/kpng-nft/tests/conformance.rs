//! to-nft passes kpng's conformance suite, each plan one nf_tables transaction
//! ([`Unit::Plan`](kpng_backend::reconcile::Unit)): over tables in memory, and (as root, in
//! a network namespace of the test's own) over the kernel's, through netlink.

use std::collections::HashMap;

use kpng_conformance::{Key as KeyOf, Subject, Value as ValueOf};
use kpng_model::Family;
use kpng_netlink::nftables::ChainSpec;
use kpng_nft::entry::{EntryKey, EntryValue, LayoutName, LayoutValue};
use kpng_nft::instance::{NftRender, Tables};
use kpng_nft::objects::{Key, Value};
use kpng_nft::rules::RuleBuilder;
use kpng_nft::{Kernel, MemoryKernel, NetlinkKernel, NftOptions};

/// Where the tables are.
#[derive(Clone)]
enum Where {
    Memory(MemoryKernel),
    Netlink,
}

struct Nft {
    at: Where,
    /// Elements per transaction of a cold start: small, so the suite's loads are split.
    split: usize,
}

fn chain(name: &str, rules: Vec<kpng_nft::rules::Rule>) -> LayoutValue {
    LayoutValue::Chain(ChainSpec { name: name.into(), hook: None }, rules)
}

impl Subject for Nft {
    type Render = NftRender;
    type Kernel = Tables;

    fn name(&self) -> &'static str {
        "to-nft"
    }

    fn render(&self) -> NftRender {
        let options = NftOptions {
            cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
            ..NftOptions::default()
        };
        NftRender::new(options, true)
    }

    fn open(&self) -> Tables {
        let kernel: Box<dyn Kernel> = match &self.at {
            Where::Memory(memory) => Box::new(memory.clone()),
            Where::Netlink => Box::new(NetlinkKernel::open().expect("netlink")),
        };
        Tables::new(kernel, self.split, Default::default())
    }

    fn wipe(&self) {
        match &self.at {
            Where::Memory(memory) => *memory.tables() = Default::default(),
            Where::Netlink => {
                kpng_nft::cleanup().expect("kpng's tables are removed");
            }
        }
    }

    /// A chain whose rule jumps to a chain that does not exist.
    fn poison(&self) -> (KeyOf<Self>, ValueOf<Self>) {
        let rule = RuleBuilder::new(Family::V4).jump("kpng_nowhere");
        let key = EntryKey::layout(LayoutName::Chain(Family::V4, "kpng_poison".into()));
        (key, EntryValue::layout(chain("kpng_poison", vec![rule])))
    }

    fn foreign(&self) -> (KeyOf<Self>, ValueOf<Self>) {
        let key = EntryKey::layout(LayoutName::Chain(Family::V6, "foreign".into()));
        (key, EntryValue::layout(chain("foreign", Vec::new())))
    }

    fn changed(&self, key: &KeyOf<Self>, value: &ValueOf<Self>) -> Option<ValueOf<Self>> {
        match (key.as_layout(), value.as_element()) {
            (None, Some(Value::Endpoint(ip, port))) => {
                Some(EntryValue::element(Value::Endpoint(ip, port.wrapping_add(1))))
            }
            (Some(LayoutName::Chain(_, name)), _) => {
                let rule = RuleBuilder::new(key.as_layout()?.family()).masquerade();
                Some(EntryValue::layout(chain(name, vec![rule])))
            }
            _ => None,
        }
    }

    /// Endpoints by destination, whatever their slots.
    fn canonical(&self, objects: &HashMap<KeyOf<Self>, ValueOf<Self>>) -> Vec<String> {
        let mut out: Vec<String> = objects
            .iter()
            .map(|(k, v)| match k.as_element() {
                Some(id) if id.key.slot().is_some() => {
                    let key = match id.key {
                        Key::DestSlot(dest, _) => format!("{dest:?}"),
                        other => format!("{:?}", other.with_slot(0)),
                    };
                    format!("{:?} {} {key} = {v:?}", id.family, id.map)
                }
                _ => format!("{k:?} = {v:?}"),
            })
            .collect();
        out.sort();
        out
    }
}

#[test]
fn to_nft_passes_the_suite_in_memory() {
    for split in [4, 50_000] {
        kpng_conformance::run(&Nft { at: Where::Memory(MemoryKernel::new()), split }, 48);
    }
}

/// Runs the suite over the kernel's tables in a new network namespace of this thread.
#[test]
fn to_nft_passes_the_suite_on_the_kernel() {
    let test = "to_nft_passes_the_suite_on_the_kernel";
    if !kpng_testkit::privileged::require(test, &[]) {
        return;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a network namespace");
    kpng_conformance::run(&Nft { at: Where::Netlink, split: 16 }, 12);
}
