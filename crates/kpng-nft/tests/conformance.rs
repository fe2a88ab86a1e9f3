//! to-nft passes kpng's conformance suite, each plan one nf_tables transaction
//! ([`Unit::Plan`](kpng_backend::reconcile::Unit)): over tables in memory, and (as root, in
//! a network namespace of the test's own) over the kernel's, through netlink, where an
//! upgrade over the tables the previous release wrote (a fixture, loaded with `nft -f`)
//! writes nothing, and one over an older layout migrates in place.

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

    /// Endpoints by destination, whatever their slots (in the backends maps, and in the
    /// names of affinity groups' slot chains and sets).
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
                _ => without_slots(&format!("{k:?} = {v:?}")),
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

/// What releases with one backends map per pick kind (read by every pick rule of the
/// kind) wrote for the suite's second state: an upgrade moves the elements into the maps of
/// their counts' buckets.
const ONE_MAP_PER_KIND: &str = "tests/fixtures/one-backends-map-per-kind.nft";

/// What the previous release wrote for the suite's second state, as `nft -f` input:
/// `KPNG_WRITE_FIXTURES=1` writes the current release's instead (when cutting one).
const PREVIOUS: &str = "tests/fixtures/previous-release.nft";

fn previous_release() -> std::path::PathBuf {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PREVIOUS);
    if std::env::var("KPNG_WRITE_FIXTURES").is_ok_and(|v| v == "1") {
        let subject = Nft { at: Where::Memory(MemoryKernel::new()), split: 50_000 };
        let mut backend = kpng_nft::NftBackend::new(
            subject.render().options().clone(),
            Box::new(MemoryKernel::new()),
        );
        let (_, b) = kpng_conformance::states::pair();
        kpng_backend::Backend::apply(&mut backend, &kpng_backend::ChangeSet::full(&b)).unwrap();
        std::fs::write(&path, backend.ruleset()).unwrap();
    }
    path
}

/// Runs the suite over the kernel's tables in a new network namespace of this thread
/// (and the `nft` it runs).
#[test]
fn to_nft_passes_the_suite_on_the_kernel() {
    let test = "to_nft_passes_the_suite_on_the_kernel";
    if !kpng_testkit::privileged::require(test, &["nft"]) {
        return;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a network namespace");
    let subject = Nft { at: Where::Netlink, split: 16 };
    kpng_conformance::run(&subject, 12);
    let install = |path: std::path::PathBuf| {
        move || {
            let status = std::process::Command::new("nft").arg("-f").arg(&path).status();
            assert!(status.expect("nft runs").success(), "{} loads", path.display());
        }
    };
    kpng_conformance::upgrade_writes_nothing(&subject, install(previous_release()));
    let older = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(ONE_MAP_PER_KIND);
    kpng_conformance::upgrade_migrates(&subject, install(older));
}

/// `text` with every affinity slot name (`aff_<16 hex digits>_<slot>`) without its slot.
fn without_slots(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("aff_") {
        let (before, name) = rest.split_at(at);
        out.push_str(before);
        let hex = name.get(4..20).filter(|h| h.chars().all(|c| c.is_ascii_hexdigit()));
        let slot = name.get(20..).filter(|s| s.starts_with('_'));
        match (hex, slot) {
            (Some(hex), Some(slot)) => {
                let digits = slot[1..].chars().take_while(char::is_ascii_digit).count();
                out.push_str(&format!("aff_{hex}_N"));
                rest = &name[21 + digits..];
            }
            _ => {
                out.push_str("aff_");
                rest = &name[4..];
            }
        }
    }
    out.push_str(rest);
    out
}
