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
use kpng_nft::aggregated::{translate, translate_whole};
use kpng_nft::memory::MemoryTables;
use kpng_nft::objects::table_family;
use kpng_nft::plan::{AllElements, Plan};
use kpng_nft::text::element_text;
use kpng_nft::{Kernel, KernelContents, MemoryKernel, NftBackend, NftError, NftOptions};
use kpng_testkit::strategies::{History, arb_mutation};
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
    /// Read-backs of the kernel.
    reads: usize,
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

    fn replace(&mut self, layout: &Plan<'_>, elements: AllElements<'_>) -> Result<(), NftError> {
        let all: Vec<_> = elements.collect();
        let mut fresh = MemoryKernel::new();
        fresh.replace(layout, &mut all.iter().copied())?;
        *self.kernel.tables() = fresh.tables().clone();
        let mut published = self.shared.lock().unwrap();
        let (whole, layout) = translate_whole(layout, &mut all.into_iter())?;
        published.translated = layout;
        published.aggregator.apply(Update::Whole(whole)).unwrap();
        published.wholes += 1;
        Ok(())
    }

    fn read(&mut self) -> Result<Option<KernelContents>, NftError> {
        self.shared.lock().unwrap().reads += 1;
        self.kernel.read()
    }

    fn publishes_whole(&self) -> bool {
        true
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

/// `state`'s tables, sets and chains, without the sets' elements.
fn without_elements(state: &State) -> State {
    let mut layout = state.clone();
    for table in layout.tables.values_mut() {
        table.sets.values_mut().for_each(|set| set.elements.clear());
    }
    layout
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
        let mut model = History::default();
        let mut needs_reset = true;
        for (mutations, event) in history {
            let changes = model.step(&mutations);
            let ops = projector.update(&model.model, &changes);
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
                    // The producer keeps the layout the aggregator holds, and no element.
                    prop_assert_eq!(&without_elements(&published.aggregator), &published.translated);
                    prop_assert_eq!(of_state(&published.aggregator), of_kernel(&tee.kernel.tables()));
                }
                Err(_) => needs_reset = true,
            }
        }
    }
}

/// A producer quiet for longer than the server's client timeout (nothing changed) keeps
/// its connection: its stream is in use, and its next publication goes on it. A connection
/// that opens no stream is still cut. Told to stop, the server does not wait for the
/// producer to leave.
#[test]
fn a_quiet_producer_keeps_its_connection_until_the_server_stops() {
    use kpng_aggregator::client::Publisher;
    use kpng_aggregator::{Family, Publication, Table, TableKey};
    use kpng_api::Security;
    use std::time::Duration;

    let timeout = Duration::from_millis(300);
    let mut aggregator = in_process(Duration::from_secs(30), timeout);
    let stop = aggregator.stop.take().unwrap();
    let InProcess { runtime, handle, address, stats, server, .. } = &mut aggregator;
    let table = |name: &str| {
        let state = State { tables: [(TableKey::new(Family::Ip, name), Table::default())].into() };
        Update::Whole(state)
    };
    runtime.block_on(async {
        let first = Publication { revision: 1, updates: vec![table("quiet")] };
        let mut producer = loop {
            match Publisher::connect(address, &Security::default(), "quiet", first.clone()).await {
                Ok(publisher) => break publisher,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        assert!(producer.wait_for(1).await.unwrap().is_ok());
        // An idle connection beside it: no stream, cut after the timeout.
        let idle =
            tokio::net::UnixStream::connect(address.to_string().trim_start_matches("unix://"))
                .await
                .unwrap();
        tokio::time::sleep(timeout * 6).await;
        assert_eq!(stats.dropped(), 1, "the idle connection is cut, the producer's is not");
        drop(idle);
        let second = Publication { revision: 2, updates: vec![table("quieter")] };
        producer.publish(second).await.unwrap();
        let answer = tokio::time::timeout(Duration::from_secs(10), producer.wait_for(2)).await;
        assert!(answer.expect("answered on the same stream").unwrap().is_ok());
        let (report, _) = handle.observe();
        assert_eq!(report.producers["quiet"].presence, "connected");
        assert_eq!(report.producers["quiet"].stats.publications, 2);
        // Stopping, with the producer still connected.
        stop.send(()).unwrap();
        let stopped = tokio::time::timeout(Duration::from_secs(5), server).await;
        stopped.expect("the server stops with a producer connected").unwrap().unwrap();
        drop(producer);
    });
}

/// A restart reads the kernel back once, to keep each endpoint in its position; a reset
/// after a refused publication takes the positions from what was published, reading
/// nothing (at 100,000 services the read takes the kernel about 25 s).
#[test]
fn only_the_first_reset_reads_back_and_positions_are_kept() {
    let mut model = web_model();
    let mut projector = NodeProjector::new(NODE);
    let mut step = |model: &mut GlobalModel, ips: &[&str]| {
        let touched: BTreeSet<_> = model.apply(web(ips)).unwrap_or_default().into_iter().collect();
        let ops = projector.update(model, &Changes::Touched(touched));
        (ops, projector.state().clone())
    };
    let tee = Tee::default();
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(tee.clone()));
    let (_, state) = step(&mut model, &["10.244.0.1", "10.244.0.2", "10.244.0.3"]);
    backend.apply(&ChangeSet::full(&state)).unwrap();
    // The first endpoint leaves and a fourth takes its slot: not where a fresh render of
    // the same endpoints would put it (in address order, it would come last).
    let (ops, state) = step(&mut model, &["10.244.0.2", "10.244.0.3", "10.244.0.4"]);
    backend.apply(&ChangeSet::changes(&ops, &state)).unwrap();
    let backends =
        |tee: &Tee| of_kernel(&tee.kernel.tables()).0["ip kpng cluster_backends_4"].clone();
    let slot_0 = "10.96.0.1 . tcp . 80 . 0 : 10.244.0.4 . 8080";
    assert!(backends(&tee).contains(slot_0), "{:?}", backends(&tee));

    // A restart reads the kernel back and keeps the positions.
    let reads = tee.shared.lock().unwrap().reads;
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(tee.clone()));
    backend.apply(&ChangeSet::full(&state)).unwrap();
    assert_eq!(tee.shared.lock().unwrap().reads, reads + 1, "a restart reads back");
    assert!(backends(&tee).contains(slot_0), "{:?}", backends(&tee));

    // A refused publication, then a reset: published whole, positions kept, nothing read.
    let (reads, wholes) = {
        let published = tee.shared.lock().unwrap();
        (published.reads, published.wholes)
    };
    tee.kernel.fail_next(1);
    let (ops, state) = step(&mut model, &["10.244.0.2", "10.244.0.3", "10.244.0.4", "10.244.0.5"]);
    assert!(backend.apply(&ChangeSet::changes(&ops, &state)).is_err());
    backend.apply(&ChangeSet::full(&state)).unwrap();
    let published = tee.shared.lock().unwrap();
    assert_eq!((published.reads, published.wholes), (reads, wholes + 1));
    drop(published);
    let held = backends(&tee);
    assert!(held.contains(slot_0), "{held:?}");
    assert!(held.iter().any(|e| e.ends_with(": 10.244.0.5 . 8080")), "{held:?}");
    assert_eq!(held.len(), 4, "{held:?}");
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

/// The node and service `web` (10.96.0.1, TCP 80), without endpoints.
fn web_model() -> GlobalModel {
    use kpng_model::Protocol;
    use kpng_testkit::builders::{node, service};
    let mut model = GlobalModel::new();
    model.apply(kpng_model::Object::Node(node(NODE, None, &["10.0.0.200"])));
    let port = [("http", Protocol::Tcp, 80)];
    model.apply(kpng_model::Object::Service(service("ns", "web", &["10.96.0.1"], &port)));
    model
}

/// `web`'s endpoint slice, with endpoints at `ips` on the node (port 8080).
fn web(ips: &[&str]) -> kpng_model::Object {
    use kpng_model::Protocol;
    use kpng_testkit::builders::{endpoint, slice};
    let eps = ips.iter().map(|ip| endpoint(ip, NODE)).collect();
    let ports = [("http", Protocol::Tcp, 8080)];
    kpng_model::Object::EndpointSlice(slice("ns", "web-1", "web", &ports, eps))
}

/// An aggregator in this process, serving on a unix socket in its own directory and
/// applying to memory, with this producer lease and client timeout.
struct InProcess {
    runtime: tokio::runtime::Runtime,
    handle: kpng_aggregator::daemon::Handle,
    address: kpng_api::Address,
    stats: std::sync::Arc<kpng_server::ServerStats>,
    /// Tells the server to stop.
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// The server's task.
    server: tokio::task::JoinHandle<Result<(), kpng_server::ServeError>>,
    _dir: tempfile::TempDir,
}

fn in_process(lease: std::time::Duration, client_timeout: std::time::Duration) -> InProcess {
    use kpng_aggregator::daemon::{self, DaemonOptions};
    use kpng_aggregator::service::{MAX_UNACKNOWLEDGED, PublishService};
    use kpng_aggregator::{Aggregator, MemoryApplier};
    use kpng_api::Security;
    use kpng_server::{ServeOptions, Served, ServerStats};

    let dir = tempfile::tempdir().unwrap();
    let address: kpng_api::Address =
        format!("unix://{}", dir.path().join("aggregator.sock").display()).parse().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let options = DaemonOptions { lease, ..DaemonOptions::default() };
    let handle = runtime.block_on(async {
        let (handle, _) =
            daemon::spawn(Aggregator::new(lease), Box::new(MemoryApplier::default()), options);
        handle
    });
    let stats = std::sync::Arc::new(ServerStats::default());
    let served = Served {
        routes: PublishService::routes(handle.clone(), MAX_UNACKNOWLEDGED),
        stats: stats.clone(),
        what: "the test's aggregator",
    };
    let serve_options = ServeOptions { max_clients: 8, client_timeout };
    let listen = address.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = runtime.spawn(async move {
        // Stops when told; a sender dropped unused never stops it.
        let shutdown = async move {
            if stopped.await.is_err() {
                std::future::pending::<()>().await;
            }
        };
        let security = Security::default();
        kpng_server::serve_routes(
            served,
            std::future::pending(),
            &listen,
            &security,
            serve_options,
            shutdown,
        )
        .await
    });
    InProcess { runtime, handle, address, stats, stop: Some(stop), server, _dir: dir }
}

/// The backend through a real aggregator (in this process, over a unix socket, applying to
/// memory): refused while another producer holds `ip kpng`, with the reason; published whole
/// and committed once that producer's lease ended; then each change is one publication.
#[test]
fn refusals_are_errors_and_the_tables_are_republished_whole() {
    use kpng_aggregator::client::Publisher;
    use kpng_aggregator::{Family, Publication, Table, TableKey};
    use kpng_api::Security;
    use kpng_nft::{AggregatorKernel, AggregatorTarget};
    use std::time::Duration;

    let lease = Duration::from_millis(300);
    let InProcess { runtime, handle, address, .. } = in_process(lease, Duration::from_secs(30));
    // Another producer takes `ip kpng`, then leaves: the table is its own until its lease ends.
    runtime.block_on(async {
        let kpng_table = TableKey::new(Family::Ip, "kpng");
        let state = State { tables: [(kpng_table, Table::default())].into() };
        let first = Publication { revision: 1, updates: vec![Update::Whole(state)] };
        let mut other = loop {
            match Publisher::connect(&address, &Security::default(), "other", first.clone()).await {
                Ok(publisher) => break publisher,
                Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
            }
        };
        assert!(other.wait_for(1).await.unwrap().is_ok());
    });
    let objects = |producer: &str| {
        let (report, _) = handle.observe();
        report.producers.get(producer).map(|p| (p.presence, p.objects))
    };

    let mut model = web_model();
    model.apply(web(&["10.244.0.1"]));
    let mut projector = NodeProjector::new(NODE);
    projector.update(&model, &Changes::All);

    let target = AggregatorTarget {
        address: address.clone(),
        security: Security::default(),
        producer: "kpng".into(),
    };
    let mut backend =
        NftBackend::new(NftOptions::default(), Box::new(AggregatorKernel::new(target).unwrap()));
    let error = backend.apply(&ChangeSet::full(projector.state())).unwrap_err();
    let chain = kpng_backend::error_chain(&error);
    assert!(chain.contains("table ip kpng belongs to producer other"), "{chain}");

    std::thread::sleep(lease * 3);
    assert_eq!(objects("other"), None, "the other producer's lease ended");
    backend.apply(&ChangeSet::full(projector.state())).unwrap();
    let (presence, before) = objects("kpng").unwrap();
    assert_eq!(presence, "connected");
    assert!(before > 20, "kpng's tables are committed whole: {before} objects");

    // One more endpoint: a few elements more, on the same stream.
    let mut touched = BTreeSet::new();
    touched.extend(model.apply(web(&["10.244.0.1", "10.244.0.2"])).unwrap_or_default());
    let ops = projector.update(&model, &Changes::Touched(touched));
    backend.apply(&ChangeSet::changes(&ops, projector.state())).unwrap();
    let (_, after) = objects("kpng").unwrap();
    assert!(after > before, "{before} -> {after} objects");
    let (report, _) = handle.observe();
    assert_eq!(report.producers["kpng"].stats.publications, 2, "whole, then one change");
}
