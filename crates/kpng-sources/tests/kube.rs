//! The kube source against the fake API server, in process: malformed objects in lists and
//! watch events, relists after `410 Gone`, ServiceCIDRs, a kind the server does not serve,
//! and the service-proxy-name rule.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kpng_model::{GlobalModel, Kind};
use kpng_sources::ConvertOptions;
use kpng_sources::kube::{KINDS, KubeSource, NodeSelection};
use kpng_store::{StoreReader, store};
use kpng_testkit::apiserver::{FakeApiServer, Resource};
use serde_json::{Value, json};

/// Log lines written while a test runs (the test's runtime is single-threaded, so every
/// task logs through the test's subscriber).
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(tracing::Level::INFO)
            .finish();
        (logs.clone(), tracing::subscriber::set_default(subscriber))
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// Log lines containing every one of `needles`.
    fn count(&self, needles: &[&str]) -> usize {
        self.text().lines().filter(|l| needles.iter().all(|n| l.contains(n))).count()
    }
}

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn service(name: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": name, "namespace": "ns" },
        "spec": { "clusterIP": ip, "ports": [{ "name": "http", "port": 80 }] },
    })
}

fn slice(name: &str, service: &str, ip: &str) -> Value {
    json!({
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": { "name": name, "namespace": "ns",
                      "labels": { "kubernetes.io/service-name": service } },
        "addressType": "IPv4",
        "ports": [{ "name": "http", "port": 8080 }],
        "endpoints": [{ "addresses": [ip] }],
    })
}

/// Starts the source (pages of 2 objects, every node) into a fresh store.
async fn start(server: &FakeApiServer, options: ConvertOptions) -> StoreReader {
    let config = kube::Config::new(server.url().parse().unwrap());
    let client = kube::Client::try_from(config).unwrap();
    let (writer, reader) = store(&KINDS);
    let source = KubeSource::new(client, options, NodeSelection::All).with_page_size(2);
    tokio::spawn(source.run(writer));
    reader
}

/// Waits (at most 10 s) until the model satisfies `done`.
async fn until(reader: &mut StoreReader, what: &str, done: impl Fn(&GlobalModel) -> bool) {
    let wait = async {
        let mut seen = None;
        loop {
            if reader.is_ready() && done(reader.snapshot().model()) {
                return;
            }
            seen = reader.wait_after(seen).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), wait)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"));
}

fn service_names(model: &GlobalModel) -> Vec<String> {
    model.services().map(|s| s.key.name().to_string()).collect()
}

#[tokio::test]
async fn a_malformed_object_in_a_list_is_skipped_and_reported_once() {
    let (logs, _guard) = Logs::capture();
    let server = FakeApiServer::start(Duration::from_millis(100)).await.unwrap();
    server.apply(service("a", "10.96.0.1"));
    let mut bad = service("b", "10.96.0.2");
    bad["spec"]["ports"] = json!("notalist");
    server.apply(bad.clone());
    server.apply(service("c", "10.96.0.3"));
    server.apply(slice("a-1", "a", "10.0.0.1"));
    server.apply(json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "broken", "namespace": "ns"}, "endpoints": 7}));
    let mut reader = start(&server, ConvertOptions::default()).await;
    until(&mut reader, "the good objects are in", |m| {
        service_names(m) == ["a", "c"] && m.len(Kind::EndpointSlice) == 1
    })
    .await;
    assert_eq!(logs.count(&["malformed", "Service", "ns/b", "spec.ports"]), 1, "{}", logs.text());
    assert_eq!(logs.count(&["malformed", "EndpointSlice", "ns/broken", "endpoints"]), 1);
    assert!(!logs.text().contains("10.96.0.3"), "no object body in the logs: {}", logs.text());

    // A relist (410 Gone after a disconnection) meets the same object: not reported again.
    assert!(server.wait_for_watch(Resource::Services, Duration::from_secs(10)).await);
    let lists = server.lists(Resource::Services);
    server.disconnect();
    server.apply(service("d", "10.96.0.4"));
    server.compact();
    until(&mut reader, "the relist is in", |m| service_names(m) == ["a", "c", "d"]).await;
    assert!(server.lists(Resource::Services) > lists, "a relist happened");
    assert_eq!(logs.count(&["malformed", "object=ns/b "]), 1, "{}", logs.text());

    // Fixed, then broken again (a new version): applied, then reported again while its last
    // good version stays in force.
    server.apply(service("b", "10.96.0.2"));
    until(&mut reader, "b is fixed", |m| service_names(m).len() == 4).await;
    server.apply(bad);
    server.apply(service("e", "10.96.0.5"));
    until(&mut reader, "e arrives after b broke", |m| service_names(m).len() == 5).await;
    assert_eq!(logs.count(&["malformed", "object=ns/b "]), 2, "{}", logs.text());
    assert!(service_names(reader.snapshot().model()).contains(&"b".to_string()));
}

#[tokio::test]
async fn malformed_watch_events_are_skipped_and_the_watch_goes_on() {
    let (logs, _guard) = Logs::capture();
    let server = FakeApiServer::start(Duration::from_millis(100)).await.unwrap();
    server.apply(service("a", "10.96.0.1"));
    server.apply(service("c", "10.96.0.3"));
    let mut reader = start(&server, ConvertOptions::default()).await;
    until(&mut reader, "listed", |m| service_names(m) == ["a", "c"]).await;
    assert!(server.wait_for_watch(Resource::Services, Duration::from_secs(10)).await);
    let lists = server.lists(Resource::Services);

    // A line that is not JSON, then an object that does not fit the schema.
    server.send_raw(Resource::Services, "{\"type\": \"ADDED\", \"object\": {not json");
    let mut bad = service("a", "10.96.0.9");
    bad["spec"]["ports"] = json!([{ "port": "eighty" }]);
    server.apply(bad);
    server.apply(service("d", "10.96.0.4"));
    until(&mut reader, "d arrives", |m| service_names(m) == ["a", "c", "d"]).await;
    let a = reader.snapshot().model().services().next().cloned().unwrap();
    assert_eq!(a.cluster_ips[0].to_string(), "10.96.0.1", "a's last good version stays");
    assert_eq!(logs.count(&["cannot be parsed", "Service"]), 1, "{}", logs.text());
    assert_eq!(logs.count(&["malformed", "ns/a", "spec.ports[0].port"]), 1, "{}", logs.text());

    // A DELETED event with a malformed body still deletes: only the name is read.
    let deleted = json!({"type": "DELETED", "object": {"kind": "Service",
        "metadata": {"name": "c", "namespace": "ns", "resourceVersion": "999"},
        "spec": {"ports": "notalist"}}});
    server.send_raw(Resource::Services, &deleted.to_string());
    until(&mut reader, "c is deleted", |m| service_names(m) == ["a", "d"]).await;
    assert_eq!(server.lists(Resource::Services), lists, "no relist was needed");
}

#[tokio::test]
async fn a_relist_after_410_streams_pages_and_deletes_what_vanished() {
    let server = FakeApiServer::start(Duration::from_millis(100)).await.unwrap();
    for i in 0..7 {
        server.apply(service(&format!("s{i}"), &format!("10.96.0.{}", 10 + i)));
    }
    let mut reader = start(&server, ConvertOptions::default()).await;
    until(&mut reader, "listed", |m| m.len(Kind::Service) == 7).await;
    assert_eq!(server.lists(Resource::Services), 4, "7 services in pages of 2");

    assert!(server.wait_for_watch(Resource::Services, Duration::from_secs(10)).await);
    server.disconnect();
    server.delete(Resource::Services, "ns", "s1");
    server.delete(Resource::Services, "ns", "s5");
    server.compact();
    until(&mut reader, "the relist deleted s1 and s5", |m| m.len(Kind::Service) == 5).await;
    assert_eq!(service_names(reader.snapshot().model()), ["s0", "s2", "s3", "s4", "s6"]);
    assert_eq!(server.lists(Resource::Services), 7, "3 more pages");
}

#[tokio::test]
async fn service_cidrs_are_watched_and_an_unserved_kind_does_not_block_readiness() {
    let cidr = |cidrs: Value| {
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "ServiceCIDR",
               "metadata": {"name": "kubernetes"}, "spec": {"cidrs": cidrs}})
    };
    let server = FakeApiServer::start(Duration::from_millis(100)).await.unwrap();
    server.apply(service("a", "10.96.0.1"));
    server.apply(cidr(json!(["10.96.0.0/16"])));
    let mut reader = start(&server, ConvertOptions::default()).await;
    until(&mut reader, "the ServiceCIDR is in", |m| m.service_cidrs().count() == 1).await;
    server.apply(cidr(json!(["10.96.0.0/16", "fd00:96::/112"])));
    until(&mut reader, "both ranges", |m| {
        m.service_cidrs().next().is_some_and(|c| c.cidrs.len() == 2)
    })
    .await;

    // A server without the resource (404): ready all the same, with no ServiceCIDR.
    let old = FakeApiServer::start(Duration::from_millis(100)).await.unwrap();
    old.apply(service("a", "10.96.0.1"));
    old.hide(Resource::ServiceCidrs, true);
    let mut reader = start(&old, ConvertOptions::default()).await;
    until(&mut reader, "ready without ServiceCIDRs", |m| m.len(Kind::Service) == 1).await;
    assert_eq!(reader.snapshot().model().service_cidrs().count(), 0);

    // A server that serves them as v1beta1 only (Kubernetes 1.31 and 1.32): read there.
    let beta = FakeApiServer::start(Duration::from_millis(100)).await.unwrap();
    beta.apply(service("a", "10.96.0.1"));
    beta.apply(cidr(json!(["10.96.0.0/16"])));
    beta.hide(Resource::ServiceCidrs, true);
    beta.serve_service_cidrs_v1beta1(true);
    let mut reader = start(&beta, ConvertOptions::default()).await;
    until(&mut reader, "the v1beta1 ServiceCIDR is in", |m| m.service_cidrs().count() == 1).await;
    beta.apply(cidr(json!(["10.96.0.0/16", "fd00:96::/112"])));
    until(&mut reader, "followed by its watch", |m| {
        m.service_cidrs().next().is_some_and(|c| c.cidrs.len() == 2)
    })
    .await;
}

#[tokio::test]
async fn a_named_proxy_takes_only_its_labelled_services() {
    let server = FakeApiServer::start(Duration::from_millis(100)).await.unwrap();
    let label = "service.kubernetes.io/service-proxy-name";
    for (name, value) in [("plain", None), ("ours", Some("edge")), ("theirs", Some("other"))] {
        let mut svc = service(name, "10.96.0.1");
        if let Some(value) = value {
            svc["metadata"]["labels"] = json!({ label: value });
        }
        server.apply(svc);
    }
    let options = ConvertOptions { service_proxy_name: Some("edge".into()) };
    let mut reader = start(&server, options).await;
    until(&mut reader, "listed", |m| m.len(Kind::Service) == 1).await;
    let model = reader.snapshot().model().clone();
    let ours = model.services().next().unwrap();
    assert_eq!((&**ours.key.name(), ours.proxy_name.as_deref()), ("ours", Some("edge")));
    let mut reader = start(&server, ConvertOptions::default()).await;
    until(&mut reader, "listed", |m| m.len(Kind::Service) == 1).await;
    assert_eq!(service_names(reader.snapshot().model()), ["plain"]);
}
