//! to-iptables passes kpng's conformance suite, one table of one family at a time as
//! `iptables-restore` commits them ([`Unit::Group`](kpng_backend::reconcile::Unit)): over
//! tables in memory, and (as root, in a network namespace of the test's own) over the
//! kernel's through `iptables-nft` and `iptables-legacy`; and an upgrade over the chains
//! the previous release wrote (a fixture) writes nothing.

use kpng_conformance::{Key as KeyOf, Subject, Value as ValueOf};
use kpng_iptables::backend::IptablesKernel;
use kpng_iptables::names::ChainName;
use kpng_iptables::render::Table;
use kpng_iptables::state::{IptablesRender, Key, Rules};
use kpng_iptables::{CommandKernel, IptablesOptions, Kernel, MemoryKernel, Mode, Snapshot};
use kpng_model::Family;

fn options() -> IptablesOptions {
    IptablesOptions {
        cluster_cidrs: vec!["10.244.0.0/16".parse().unwrap()],
        full_read_share: 1,
        ..IptablesOptions::default()
    }
}

/// The tables behind the subject.
trait Tables {
    fn kernel(&self) -> Box<dyn Kernel>;
    fn wipe(&self);
}

/// Tables in memory, shared by every opening.
impl Tables for MemoryKernel {
    fn kernel(&self) -> Box<dyn Kernel> {
        Box::new(self.clone())
    }

    fn wipe(&self) {
        for family in Family::ALL {
            self.set_snapshot(family, Snapshot::default());
        }
    }
}

/// The kernel's tables, through one variant's commands (in the test thread's own
/// network namespace).
impl Tables for Mode {
    fn kernel(&self) -> Box<dyn Kernel> {
        Box::new(CommandKernel::new(*self).expect("the iptables commands run"))
    }

    fn wipe(&self) {
        kpng_iptables::kernel::cleanup(*self).expect("kpng's chains are removed");
    }
}

struct Iptables<T>(T);

impl<T: Tables> Subject for Iptables<T> {
    type Render = IptablesRender;
    type Kernel = IptablesKernel;

    fn name(&self) -> &'static str {
        "to-iptables"
    }

    fn render(&self) -> IptablesRender {
        IptablesRender::new(options())
    }

    fn open(&self) -> IptablesKernel {
        // Small batches: larger plans go through several restores.
        IptablesKernel::new(self.0.kernel(), 16, 1)
    }

    fn wipe(&self) {
        self.0.wipe();
    }

    /// IPv4's nat table (the first section of its restore) refuses a jump to a chain that
    /// does not exist.
    fn poison(&self) -> (KeyOf<Self>, ValueOf<Self>) {
        let key = Key::Chain(Family::V4, Table::Nat, ChainName::new("KPNG-POISON").unwrap());
        (key, Rules::new(["-j KPNG-NOWHERE"]))
    }

    fn foreign(&self) -> (KeyOf<Self>, ValueOf<Self>) {
        let key = Key::Chain(Family::V6, Table::Nat, ChainName::new("KPNG-FOREIGN").unwrap());
        (key, Rules::new(["-j RETURN"]))
    }

    fn changed(&self, key: &KeyOf<Self>, _: &ValueOf<Self>) -> Option<ValueOf<Self>> {
        match key {
            Key::Chain(..) => Some(Rules::new(["-j RETURN"])),
            Key::Hook(..) => None,
        }
    }
}

/// What the previous release wrote for the suite's second state, as restore input per
/// family: `KPNG_WRITE_FIXTURES=1` writes the current release's instead (when cutting one).
const PREVIOUS: &str = "tests/fixtures/previous-release.save";

/// The restore input that writes `snapshot` (a family's), hooks inserted as kpng does.
fn restore_input(snapshot: &Snapshot) -> String {
    let mut out = String::new();
    for table in Table::ALL {
        let chains = snapshot.chains.iter().filter(|((t, _), _)| *t == table);
        out.push_str(&format!("*{}\n", table.as_str()));
        for ((_, chain), _) in chains.clone() {
            out.push_str(&format!(":{chain} - [0:0]\n"));
        }
        for (_, builtin, rule) in snapshot.hooks.iter().filter(|(t, _, _)| *t == table) {
            out.push_str(&format!("-I {builtin} 1 {rule}\n"));
        }
        for ((_, chain), rules) in chains {
            rules.iter().for_each(|rule| out.push_str(&format!("-A {chain} {rule}\n")));
        }
        out.push_str("COMMIT\n");
    }
    out
}

/// Each family's part of the fixture.
fn previous_release() -> Vec<(Family, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PREVIOUS);
    if std::env::var("KPNG_WRITE_FIXTURES").is_ok_and(|v| v == "1") {
        let subject = Iptables(MemoryKernel::new());
        let mut backend = kpng_conformance::start(&subject);
        let (_, b) = kpng_conformance::states::pair();
        kpng_backend::Backend::apply(&mut backend, &kpng_backend::ChangeSet::full(&b)).unwrap();
        let text: String = Family::ALL
            .into_iter()
            .map(|f| format!("# {f:?}\n{}", restore_input(&subject.0.snapshot(f))))
            .collect();
        std::fs::write(&path, text).unwrap();
    }
    let text = std::fs::read_to_string(&path).unwrap();
    let mut parts: Vec<(Family, String)> = Vec::new();
    for line in text.lines() {
        match line {
            "# V4" => parts.push((Family::V4, String::new())),
            "# V6" => parts.push((Family::V6, String::new())),
            line => parts.last_mut().expect("a family first").1.push_str(&format!("{line}\n")),
        }
    }
    parts
}

fn upgrade<T: Tables>(subject: &Iptables<T>) {
    kpng_conformance::upgrade_writes_nothing(subject, || {
        let mut kernel = subject.0.kernel();
        for (family, input) in previous_release() {
            kernel.restore(family, &input).expect("the previous release's chains restore");
        }
    });
}

#[test]
fn to_iptables_passes_the_suite_in_memory() {
    let subject = Iptables(MemoryKernel::new());
    kpng_conformance::run(&subject, 64);
    upgrade(&subject);
}

/// Runs the suite over `mode`'s tables in a new network namespace of this thread (and the
/// commands it runs), which goes with the thread.
fn on_the_kernel(test: &str, mode: Mode) {
    if !kpng_testkit::privileged::require(test, &[&mode.command(Family::V4, "restore")]) {
        return;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a network namespace");
    kpng_conformance::run(&Iptables(mode), 12);
    upgrade(&Iptables(mode));
}

#[test]
fn to_iptables_passes_the_suite_through_iptables_nft() {
    on_the_kernel("to_iptables_passes_the_suite_through_iptables_nft", Mode::Nft);
}

#[test]
fn to_iptables_passes_the_suite_through_iptables_legacy() {
    on_the_kernel("to_iptables_passes_the_suite_through_iptables_legacy", Mode::Legacy);
}
