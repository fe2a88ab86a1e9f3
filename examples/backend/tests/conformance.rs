//! The example backend passes kpng's conformance suite: over its file (and an upgrade over
//! the file the previous release wrote), and over the template's in-memory kernel.

use std::collections::HashMap;
use std::net::SocketAddr;

use kpng_backend::reconcile::MemoryKernel;
use kpng_conformance::{Key, Subject, Value};
use kpng_example_backend::{FileKernel, Frontend, Table};
use kpng_model::Protocol;

fn foreign() -> (Frontend, Vec<SocketAddr>) {
    let frontend =
        Frontend { protocol: Protocol::Tcp, ip: Some("192.0.2.99".parse().unwrap()), port: 1 };
    (frontend, vec!["198.51.100.1:1".parse().unwrap()])
}

fn changed(value: &[SocketAddr]) -> Vec<SocketAddr> {
    let mut value = value.to_vec();
    value.push("198.51.100.2:2".parse().unwrap());
    value
}

struct File {
    dir: tempfile::TempDir,
}

impl Subject for File {
    type Render = Table;
    type Kernel = FileKernel;

    fn name(&self) -> &'static str {
        "to-table-file over a file"
    }

    fn render(&self) -> Table {
        Table
    }

    fn open(&self) -> FileKernel {
        FileKernel::new(self.dir.path().join("frontends.table"))
    }

    fn wipe(&self) {
        let _ = std::fs::remove_file(self.open().path());
    }

    fn poison(&self) -> (Key<Self>, Value<Self>) {
        (Frontend { protocol: Protocol::Tcp, ip: None, port: 0 }, Vec::new())
    }

    fn foreign(&self) -> (Key<Self>, Value<Self>) {
        foreign()
    }

    fn changed(&self, _key: &Key<Self>, value: &Value<Self>) -> Option<Value<Self>> {
        Some(changed(value))
    }
}

/// The file the previous release wrote for the suite's second state:
/// `KPNG_WRITE_FIXTURES=1` writes the current release's instead (when cutting one).
const PREVIOUS: &str = "tests/fixtures/previous-release.table";

#[test]
fn the_file_kernel_conforms() {
    let subject = File { dir: tempfile::tempdir().unwrap() };
    kpng_conformance::run(&subject, 48);
    let fixture = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(PREVIOUS);
    if std::env::var("KPNG_WRITE_FIXTURES").is_ok_and(|v| v == "1") {
        kpng_conformance::fresh(&subject, &kpng_conformance::states::pair().1);
        std::fs::copy(subject.open().path(), &fixture).unwrap();
    }
    kpng_conformance::upgrade_writes_nothing(&subject, || {
        std::fs::copy(&fixture, subject.open().path()).unwrap();
    });
}

struct Memory {
    kernel: std::cell::RefCell<MemoryKernel<Frontend, Vec<SocketAddr>>>,
}

impl Memory {
    fn poisoned() -> MemoryKernel<Frontend, Vec<SocketAddr>> {
        let kernel = MemoryKernel::new();
        kernel.refuse(Frontend { protocol: Protocol::Udp, ip: None, port: 0 });
        kernel
    }
}

impl Subject for Memory {
    type Render = Table;
    type Kernel = MemoryKernel<Frontend, Vec<SocketAddr>>;

    fn name(&self) -> &'static str {
        "to-table-file over memory"
    }

    fn render(&self) -> Table {
        Table
    }

    fn open(&self) -> Self::Kernel {
        self.kernel.borrow().clone()
    }

    fn wipe(&self) {
        *self.kernel.borrow_mut() = Memory::poisoned();
    }

    fn poison(&self) -> (Key<Self>, Value<Self>) {
        (Frontend { protocol: Protocol::Udp, ip: None, port: 0 }, Vec::new())
    }

    fn foreign(&self) -> (Key<Self>, Value<Self>) {
        foreign()
    }

    fn changed(&self, _key: &Key<Self>, value: &Value<Self>) -> Option<Value<Self>> {
        Some(changed(value))
    }
}

#[test]
fn the_memory_kernel_conforms() {
    let subject = Memory { kernel: std::cell::RefCell::new(Memory::poisoned()) };
    kpng_conformance::run(&subject, 64);
}

#[test]
fn the_file_reads_as_it_is_written() {
    use kpng_backend::reconcile::Kernel;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t");
    std::fs::write(&path, "tcp [fd00::1]:80 -> [fd00:244::1]:8080 10.0.0.1:80\nudp *:30053 ->\n")
        .unwrap();
    let read = FileKernel::new(&path).read().unwrap().unwrap();
    let v6 = Frontend { protocol: Protocol::Tcp, ip: Some("fd00::1".parse().unwrap()), port: 80 };
    let expected: Vec<SocketAddr> =
        vec!["[fd00:244::1]:8080".parse().unwrap(), "10.0.0.1:80".parse().unwrap()];
    assert_eq!(read.get(&v6), Some(&expected));
    let nodeport = Frontend { protocol: Protocol::Udp, ip: None, port: 30053 };
    assert_eq!(read.get(&nodeport), Some(&Vec::new()));
    std::fs::write(&path, "tcp 10.96.0.1:80 -> 10.0.0.300:80\n").unwrap();
    let error = FileKernel::new(&path).read().unwrap_err().to_string();
    assert!(error.ends_with(":1: invalid endpoint \"10.0.0.300:80\""), "{error}");
    let _: HashMap<_, _> = read;
}
