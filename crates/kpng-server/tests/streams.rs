//! The to-api server end to end over a Unix socket: kpng's own clients, and an "old"
//! client that only knows the original kpng's messages.

use std::time::Duration;

use kpng_api::client::{GlobalWatch, LocalWatch, connect};
use kpng_api::{Address, Security};
use kpng_local::{full_state_ops, project_node_state};
use kpng_model::{GlobalModel, Object, Op, Protocol};
use kpng_server::{Hub, ServeOptions, serve};
use kpng_sources::api::Mirror;
use kpng_store::{SourceEvent, StoreWriter, store};
use kpng_testkit::builders::{endpoint, node, service, slice};
use prost::Message;
use tokio::time::timeout;

const HTTP: (&str, Protocol, u16) = ("http", Protocol::Tcp, 80);

fn cluster(endpoints: &[(&str, &str)]) -> Vec<Object> {
    let eps = endpoints.iter().map(|(ip, n)| endpoint(ip, n)).collect();
    vec![
        Object::Node(node("n1", Some("z1"), &["192.168.0.1"])),
        Object::Service(service("ns", "web", &["10.96.0.1"], &[HTTP])),
        Object::EndpointSlice(slice("ns", "web-1", "web", &[("http", Protocol::Tcp, 8080)], eps)),
    ]
}

fn relist(objects: Vec<Object>) -> Vec<SourceEvent> {
    SourceEvent::relist(&kpng_model::Kind::ALL, objects)
}

fn model_of(objects: Vec<Object>) -> GlobalModel {
    let mut model = GlobalModel::new();
    for object in objects {
        model.apply(object);
    }
    model
}

struct Server {
    _dir: tempfile::TempDir,
    address: Address,
    writer: StoreWriter,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

async fn start(objects: Vec<Object>) -> Server {
    let dir = tempfile::tempdir().unwrap();
    let address = Address::Unix(dir.path().join("sub/kpng.sock"));
    let (mut writer, reader) = store(&kpng_model::Kind::ALL);
    writer.apply(relist(objects));
    let hub = Hub::new(reader);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let served = address.clone();
    let task = tokio::spawn(async move {
        let shutdown = async {
            let _ = stopped.await;
        };
        serve(hub, &served, &Security::default(), ServeOptions::default(), shutdown).await.unwrap();
    });
    let Address::Unix(path) = &address else { unreachable!() };
    for _ in 0..100 {
        if path.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Server { _dir: dir, address, writer, stop: Some(stop), task }
}

async fn local(server: &Server, node: &str, with_node: bool) -> LocalWatch {
    let channel = connect(&server.address, &Security::default()).await.unwrap();
    LocalWatch::start(channel, node, with_node).await.unwrap()
}

async fn next(watch: &mut LocalWatch) -> Vec<Op> {
    timeout(Duration::from_secs(5), watch.next())
        .await
        .expect("a change set in time")
        .unwrap()
        .unwrap()
}

#[tokio::test]
async fn node_streams_send_the_state_then_differences() {
    let mut server = start(cluster(&[("10.1.0.1", "n1")])).await;
    let Address::Unix(path) = &server.address else { unreachable!() };
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(path).unwrap().permissions().mode() & 0o777, 0o600);

    let expected = project_node_state(&model_of(cluster(&[("10.1.0.1", "n1")])), "n1");
    let mut with_node = local(&server, "n1", true).await;
    let first = next(&mut with_node).await;
    assert_eq!(first, full_state_ops(&expected).collect::<Vec<_>>());
    // Without the extension, the node item is left out.
    let mut plain = local(&server, "n1", false).await;
    let first = next(&mut plain).await;
    assert_eq!(first.len(), 3, "reset, service, endpoint: {first:?}");
    assert!(!first.iter().any(|op| matches!(op, Op::Set(kpng_model::Item::Node(_)))));

    // One endpoint added: both clients get exactly that.
    server.writer.apply(relist(cluster(&[("10.1.0.1", "n1"), ("10.1.0.2", "n2")])));
    for watch in [&mut with_node, &mut plain] {
        let ops = next(watch).await;
        assert!(
            matches!(&ops[..], [Op::Set(kpng_model::Item::Endpoint { endpoint, .. })] if endpoint.ip.to_string() == "10.1.0.2"),
            "{ops:?}"
        );
    }
    // A revision that changes nothing for the node sends nothing.
    let mut other = cluster(&[("10.1.0.1", "n1"), ("10.1.0.2", "n2")]);
    other.push(Object::Node(node("n9", None, &["192.168.0.9"])));
    server.writer.apply(relist(other));
    assert!(timeout(Duration::from_millis(300), plain.next()).await.is_err(), "no change set");

    server.stop.take().unwrap().send(()).unwrap();
    drop(with_node);
    drop(plain);
    timeout(Duration::from_secs(5), server.task).await.unwrap().unwrap();
    assert!(!path.exists(), "the socket is removed at exit");
}

#[tokio::test]
async fn the_global_stream_mirrors_the_model() {
    let mut server = start(cluster(&[("10.1.0.1", "n1")])).await;
    let channel = connect(&server.address, &Security::default()).await.unwrap();
    let mut watch = GlobalWatch::start(channel).await.unwrap();
    let (mut mirror_writer, mirror) = store(&kpng_model::Kind::ALL);
    let mut mirrored = Mirror::default();
    let items =
        timeout(Duration::from_secs(5), watch.next_items()).await.unwrap().unwrap().unwrap();
    mirror_writer.apply(mirrored.apply(&items).unwrap());
    assert_eq!(mirror.snapshot().model(), &model_of(cluster(&[("10.1.0.1", "n1")])));

    let changed = cluster(&[("10.1.0.5", "n2")]);
    server.writer.apply(relist(changed.clone()));
    let items =
        timeout(Duration::from_secs(5), watch.next_items()).await.unwrap().unwrap().unwrap();
    assert_eq!(items.len(), 2, "one endpoint deleted, one set: {items:?}");
    mirror_writer.apply(mirrored.apply(&items).unwrap());
    assert_eq!(mirror.snapshot().model(), &model_of(changed.clone()));

    // A ServiceCIDR appears: one item of its own, mirrored exactly.
    let cidr = kpng_testkit::builders::service_cidr("kubernetes", &["10.96.0.0/16"]);
    server.writer.apply([SourceEvent::Applied(Object::ServiceCidr(cidr.clone()))]);
    let items =
        timeout(Duration::from_secs(5), watch.next_items()).await.unwrap().unwrap().unwrap();
    assert_eq!(items.len(), 1, "{items:?}");
    mirror_writer.apply(mirrored.apply(&items).unwrap());
    let mut with_cidr = changed;
    with_cidr.push(Object::ServiceCidr(cidr));
    assert_eq!(mirror.snapshot().model(), &model_of(with_cidr.clone()));
    server.writer.apply(relist(with_cidr[..3].to_vec()));
    let items =
        timeout(Duration::from_secs(5), watch.next_items()).await.unwrap().unwrap().unwrap();
    mirror_writer.apply(mirrored.apply(&items).unwrap());
    assert_eq!(mirror.snapshot().model().service_cidrs().count(), 0, "deleted: {items:?}");
}

/// The original kpng's messages, exactly as its field table lists them (no extensions).
mod original {
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct WatchReq {
        #[prost(string, tag = "1")]
        pub node_name: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct OpItem {
        #[prost(oneof = "Op", tags = "1, 2, 3, 4")]
        pub op: Option<Op>,
    }
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Op {
        #[prost(message, tag = "1")]
        Sync(EmptyOp),
        #[prost(message, tag = "2")]
        Set(Value),
        #[prost(message, tag = "3")]
        Delete(Ref),
        #[prost(message, tag = "4")]
        Reset(EmptyOp),
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct EmptyOp {}
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Ref {
        #[prost(int32, tag = "1")]
        pub set: i32,
        #[prost(string, tag = "2")]
        pub path: String,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Value {
        #[prost(message, optional, tag = "1")]
        pub r#ref: Option<Ref>,
        #[prost(bytes = "vec", tag = "2")]
        pub bytes: Vec<u8>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Service {
        #[prost(string, tag = "1")]
        pub namespace: String,
        #[prost(string, tag = "2")]
        pub name: String,
        #[prost(string, tag = "3")]
        pub r#type: String,
        #[prost(message, optional, tag = "4")]
        pub ips: Option<ServiceIps>,
        #[prost(message, repeated, tag = "6")]
        pub ports: Vec<PortMapping>,
        #[prost(bool, tag = "7")]
        pub external_traffic_to_local: bool,
        #[prost(bool, tag = "12")]
        pub internal_traffic_to_local: bool,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct ServiceIps {
        #[prost(message, optional, tag = "1")]
        pub cluster_ips: Option<IpSet>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct IpSet {
        #[prost(string, repeated, tag = "1")]
        pub v4: Vec<String>,
        #[prost(string, repeated, tag = "2")]
        pub v6: Vec<String>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PortMapping {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(int32, tag = "2")]
        pub protocol: i32,
        #[prost(int32, tag = "3")]
        pub port: i32,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct Endpoint {
        #[prost(message, optional, tag = "2")]
        pub ips: Option<IpSet>,
        #[prost(bool, tag = "3")]
        pub local: bool,
        #[prost(message, repeated, tag = "4")]
        pub port_overrides: Vec<PortName>,
    }
    #[derive(Clone, PartialEq, prost::Message)]
    pub struct PortName {
        #[prost(string, tag = "1")]
        pub name: String,
        #[prost(int32, tag = "2")]
        pub port: i32,
    }
}

/// A client generated from the original definitions decodes our stream: raw gRPC framing
/// over the same socket, no kpng code on the client side.
#[tokio::test]
async fn an_original_client_decodes_the_node_stream() {
    let server = start(cluster(&[("10.1.0.1", "n1")])).await;
    let channel = connect(&server.address, &Security::default()).await.unwrap();
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::channel(1);
    tx.send(original::WatchReq { node_name: "n1".into() }).await.unwrap();
    let path = http::uri::PathAndQuery::from_static("/localv1.Sets/Watch");
    let codec = tonic_prost::ProstCodec::<original::WatchReq, original::OpItem>::default();
    let request = tonic::Request::new(tokio_stream::wrappers::ReceiverStream::new(rx));
    let mut stream = grpc.streaming(request, path, codec).await.unwrap().into_inner();
    let mut items = Vec::new();
    loop {
        let item =
            timeout(Duration::from_secs(5), stream.message()).await.unwrap().unwrap().unwrap();
        if matches!(item.op, Some(original::Op::Sync(_))) {
            break;
        }
        items.push(item);
    }
    assert!(matches!(items[0].op, Some(original::Op::Reset(_))));
    let Some(original::Op::Set(service)) = &items[1].op else { panic!("{:?}", items[1]) };
    let reference = service.r#ref.as_ref().unwrap();
    assert_eq!((reference.set, reference.path.as_str()), (1, "ns/web"));
    let decoded = original::Service::decode(service.bytes.as_slice()).unwrap();
    assert_eq!((decoded.namespace.as_str(), decoded.name.as_str()), ("ns", "web"));
    assert_eq!(decoded.r#type, "ClusterIP");
    assert_eq!(decoded.ips.unwrap().cluster_ips.unwrap().v4, ["10.96.0.1"]);
    assert_eq!(decoded.ports[0].name, "http");
    assert_eq!((decoded.ports[0].protocol, decoded.ports[0].port), (1, 80));
    let Some(original::Op::Set(endpoint)) = &items[2].op else { panic!("{:?}", items[2]) };
    let reference = endpoint.r#ref.as_ref().unwrap();
    assert_eq!((reference.set, reference.path.as_str()), (2, "ns/web/10.1.0.1"));
    let decoded = original::Endpoint::decode(endpoint.bytes.as_slice()).unwrap();
    assert_eq!(decoded.ips.unwrap().v4, ["10.1.0.1"]);
    assert!(decoded.local);
    assert_eq!(decoded.port_overrides[0].port, 8080);
    assert_eq!(items.len(), 3, "no node item for a client that did not ask");
}
