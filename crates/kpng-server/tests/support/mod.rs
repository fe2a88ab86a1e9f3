//! What the server's integration tests share: a generated cluster, a server on a Unix
//! socket, and clients that read as little as they can.

#![allow(dead_code)]

use std::time::Duration;

use kpng_api::{Address, Security, localv1};
use kpng_model::{Object, Protocol};
use kpng_server::{Hub, ServeOptions, ServerStats, serve};
use kpng_store::{SourceEvent, StoreWriter, store};
use kpng_testkit::builders::{endpoint, node, service, slice};

/// `services` services of `endpoints` endpoints each, over nodes `n0`..`n9`.
pub fn cluster(services: usize, endpoints: usize) -> Vec<Object> {
    let http = ("http", Protocol::Tcp, 80);
    let mut objects: Vec<Object> = (0..10)
        .map(|n| Object::Node(node(&format!("n{n}"), Some("z1"), &[&format!("192.168.0.{n}")])))
        .collect();
    for i in 0..services {
        let (hi, lo) = (i / 250, i % 250);
        let ip = format!("10.96.{hi}.{lo}");
        let name = format!("service-{i}");
        objects.push(Object::Service(service("ns", &name, &[&ip], &[http])));
        let eps = (0..endpoints)
            .map(|j| endpoint(&format!("10.{}.{hi}.{lo}", 100 + j), &format!("n{}", (i + j) % 10)))
            .collect();
        let ports = [("http", Protocol::Tcp, 8080)];
        objects.push(Object::EndpointSlice(slice("ns", &format!("{name}-1"), &name, &ports, eps)));
    }
    objects
}

/// A running server.
pub struct Server {
    _dir: tempfile::TempDir,
    pub address: Address,
    pub writer: StoreWriter,
    pub stats: std::sync::Arc<ServerStats>,
}

/// A server of `objects` on a fresh Unix socket.
pub async fn start(objects: Vec<Object>, options: ServeOptions) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let address = Address::Unix(dir.path().join("kpng.sock"));
    let (mut writer, reader) = store(&kpng_model::Kind::ALL);
    writer.apply(SourceEvent::relist(&kpng_model::Kind::ALL, objects));
    let hub = Hub::new(reader);
    let stats = hub.stats();
    let served = address.clone();
    tokio::spawn(async move {
        serve(hub, &served, &Security::default(), options, std::future::pending()).await.unwrap();
    });
    let Address::Unix(path) = &address else { unreachable!() };
    for _ in 0..500 {
        if path.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Server { _dir: dir, address, writer, stats }
}

/// A channel whose HTTP/2 windows are as small as allowed: a client that does not read
/// holds little, so what the test measures is the server.
pub async fn narrow_channel(address: &Address) -> tonic::transport::Channel {
    let Address::Unix(path) = address else { panic!("a Unix socket") };
    let path = path.clone();
    let connector = tower::service_fn(move |_: tonic::transport::Uri| {
        let path = path.clone();
        async move {
            let stream = tokio::net::UnixStream::connect(path).await?;
            Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
        }
    });
    tonic::transport::Endpoint::from_static("http://kpng.local")
        .initial_stream_window_size(65_535)
        .initial_connection_window_size(65_535)
        .connect_with_connector(connector)
        .await
        .unwrap()
}

/// A node stream whose client asks once and never reads the answer: the response is kept
/// (so the stream stays open) but never polled.
pub async fn unread_stream(
    address: &Address,
    node: &str,
) -> tonic::Response<tonic::Streaming<localv1::OpItem>> {
    let channel = narrow_channel(address).await;
    let request = localv1::WatchReq { node_name: node.to_string(), with_node: false };
    let requests =
        tokio_stream::StreamExt::chain(tokio_stream::iter([request]), tokio_stream::pending());
    let mut client = localv1::sets_client::SetsClient::new(channel);
    client.watch(requests).await.unwrap()
}

/// Waits until `check` holds, at most 20 s.
pub async fn eventually(what: &str, check: impl Fn() -> bool) {
    for _ in 0..400 {
        if check() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: not within 20 s");
}
