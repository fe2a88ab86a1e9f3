//! to-iptables passes kpng's conformance suite, one table of one family at a time as
//! `iptables-restore` commits them ([`Unit::Group`](kpng_backend::reconcile::Unit)): over
//! tables in memory, and (as root, in a network namespace of the test's own) over the
//! kernel's through `iptables-nft` and `iptables-legacy`.

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

#[test]
fn to_iptables_passes_the_suite_in_memory() {
    kpng_conformance::run(&Iptables(MemoryKernel::new()), 64);
}

/// Runs the suite over `mode`'s tables in a new network namespace of this thread (and the
/// commands it runs), which goes with the thread.
fn on_the_kernel(test: &str, mode: Mode) {
    if !kpng_testkit::privileged::require(test, &[&mode.command(Family::V4, "restore")]) {
        return;
    }
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("a network namespace");
    kpng_conformance::run(&Iptables(mode), 12);
}

#[test]
fn to_iptables_passes_the_suite_through_iptables_nft() {
    on_the_kernel("to_iptables_passes_the_suite_through_iptables_nft", Mode::Nft);
}

#[test]
fn to_iptables_passes_the_suite_through_iptables_legacy() {
    on_the_kernel("to_iptables_passes_the_suite_through_iptables_legacy", Mode::Legacy);
}
