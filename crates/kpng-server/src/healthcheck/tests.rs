//! The health-check servers on listeners the test binds (port 0, no rebinding race), and a
//! port that cannot be bound reported until it is no longer wanted.

use std::io::{Read, Write};
use std::net::Ipv4Addr;

use kpng_model::global::{ServiceType, TrafficPolicy};
use kpng_model::{GlobalModel, LocalState, Object, Protocol};
use kpng_testkit::builders::{endpoint, service, slice};

use super::*;

/// A LoadBalancer service with externalTrafficPolicy Local whose health check is on `port`,
/// with one endpoint on node `n1`.
fn objects(name: &str, port: u16, ip: &str) -> Vec<Object> {
    let mut svc = service("ns", name, &[ip], &[("http", Protocol::Tcp, 80)]);
    svc.service_type = ServiceType::LoadBalancer;
    svc.external_traffic_policy = TrafficPolicy::Local;
    svc.ports[0].node_port = Some(30_000 + port % 1000);
    svc.health_check_node_port = Some(port);
    let endpoints = vec![endpoint(&format!("10.1.{}.1", port % 200), "n1")];
    let ports = [("http", Protocol::Tcp, 8080)];
    let slice = slice("ns", &format!("{name}-1"), name, &ports, endpoints);
    vec![Object::Service(svc), Object::EndpointSlice(slice)]
}

fn state(objects: Vec<Object>) -> LocalState {
    let mut model = GlobalModel::new();
    for object in objects {
        model.apply(object);
    }
    kpng_local::project_node_state(&model, "n1")
}

fn get(port: u16) -> std::io::Result<String> {
    let mut stream = std::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET / HTTP/1.0\r\n\r\n")?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer)?;
    Ok(answer)
}

async fn eventually(what: &str, check: impl Fn() -> bool) {
    for _ in 0..200 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 10 s");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_answer_on_given_listeners_and_report_ports_in_use() {
    let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let free = listener.local_addr().unwrap().port();
    let busy = if free == u16::MAX { free - 1 } else { free + 1 };
    let given = Arc::new(Mutex::new(Some(listener)));
    let bind: Binder = Arc::new(move |address: SocketAddr| {
        if address.port() == free
            && let Some(listener) = given.lock().unwrap().take()
        {
            return Ok(listener);
        }
        Err(std::io::ErrorKind::AddrInUse.into())
    });
    let problems = BindProblems::default();
    let mut backend = HealthCheckBackend::new(HealthCheckOptions {
        address: Ipv4Addr::LOCALHOST.into(),
        proxy: None,
        runtime: tokio::runtime::Handle::current(),
        limits: HttpLimits::new(8, Duration::from_secs(5)),
        problems: problems.clone(),
        bind,
    });
    let mut both = objects("a", free, "10.96.0.1");
    both.extend(objects("b", busy, "10.96.0.2"));
    let both = state(both);
    backend.apply(&ChangeSet::full(&both)).unwrap();

    let answer = tokio::task::spawn_blocking(move || get(free)).await.unwrap().unwrap();
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.to_lowercase().contains("x-load-balancing-endpoint-weight: 1"), "{answer}");
    assert!(answer.contains("\"localEndpoints\":1"), "{answer}");
    let address = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), busy);
    eventually("the busy port is reported", || problems.list().iter().any(|(a, _)| *a == address))
        .await;

    // The service whose port is busy goes away: its report goes with it.
    let only_a = state(objects("a", free, "10.96.0.1"));
    backend.apply(&ChangeSet::full(&only_a)).unwrap();
    eventually("the report is withdrawn", || problems.list().is_empty()).await;
}

/// A backend whose ports can never be bound: what it wants is in its table all the same.
fn unbound() -> HealthCheckBackend {
    HealthCheckBackend::new(HealthCheckOptions {
        address: Ipv4Addr::LOCALHOST.into(),
        proxy: None,
        runtime: tokio::runtime::Handle::current(),
        limits: HttpLimits::new(8, Duration::from_secs(5)),
        problems: BindProblems::default(),
        bind: Arc::new(|_| Err(std::io::ErrorKind::AddrInUse.into())),
    })
}

/// The ports a backend answers for, with what it answers, and the ports it serves.
fn answers(backend: &HealthCheckBackend) -> (Vec<(u16, Entry)>, Vec<u16>) {
    let table = backend.table.lock().unwrap();
    let mut entries: Vec<(u16, Entry)> = table.iter().map(|(p, e)| (*p, e.clone())).collect();
    entries.sort_by_key(|(port, _)| *port);
    let mut servers: Vec<u16> = backend.servers.keys().copied().collect();
    servers.sort_unstable();
    (entries, servers)
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]

    /// Each change set looks at the services it touched only, and leaves the table a
    /// reset over the same state would.
    #[test]
    fn each_change_leaves_what_a_reset_would(
        history in proptest::collection::vec(
            proptest::collection::vec(kpng_testkit::strategies::arb_mutation(), 1..8),
            1..8,
        )
    ) {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let _entered = runtime.enter();
        let mut backend = unbound();
        let mut projector = kpng_local::NodeProjector::new("n0");
        let mut model = kpng_testkit::strategies::History::default();
        for (step, mutations) in history.iter().enumerate() {
            let changes = model.step(mutations);
            let ops = projector.update(&model.model, &changes);
            let state = projector.state();
            let changes = match step {
                0 => ChangeSet::full(state),
                _ => ChangeSet::changes(&ops, state),
            };
            backend.apply(&changes).unwrap();
            let mut fresh = unbound();
            fresh.apply(&ChangeSet::full(state)).unwrap();
            proptest::prop_assert_eq!(answers(&backend), answers(&fresh));
        }
    }
}
