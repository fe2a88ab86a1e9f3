//! The to-api server against greedy clients: a cap on connections, and a watchdog that cuts
//! a client that stops reading or never asks for anything.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use kpng_api::Security;
use kpng_api::client::{LocalWatch, connect};
use kpng_model::{Object, Op, Protocol};
use kpng_server::ServeOptions;
use kpng_store::SourceEvent;
use kpng_testkit::builders::{endpoint, slice};
use support::{cluster, eventually, start, unread_stream};
use tokio::io::AsyncReadExt;
use tokio::time::timeout;

#[tokio::test]
async fn a_client_that_stops_reading_is_dropped() {
    let options = ServeOptions { client_timeout: Duration::from_millis(500), ..Default::default() };
    // A state far larger than what the client's windows and the server's buffers hold.
    let server = start(cluster(2000, 4), options).await;
    let mut unread = unread_stream(&server.address, "n1").await;
    eventually("the stuck client is dropped", || server.stats.dropped() == 1).await;
    eventually("its stream is gone", || server.stats.connected() == 0).await;
    // What it finally reads ends with an error, never with the answer's Sync.
    let stream = unread.get_mut();
    let ended = timeout(Duration::from_secs(10), async {
        loop {
            match stream.message().await {
                Ok(Some(item)) => {
                    let sync = matches!(item.op, Some(kpng_api::localv1::op_item::Op::Sync(_)));
                    assert!(!sync, "the whole answer never left the server");
                }
                Ok(None) | Err(_) => return,
            }
        }
    });
    ended.await.expect("the stream ends");
    // A client that reads is served as before.
    let channel = connect(&server.address, &Security::default()).await.unwrap();
    let mut watch = LocalWatch::start(channel, "n1", false).await.unwrap();
    let first = timeout(Duration::from_secs(20), watch.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.len(), 1 + 2000 * 5, "reset, 2,000 services and 8,000 endpoints");
}

#[tokio::test]
async fn a_client_that_stops_reading_holds_up_no_other_client_of_its_node() {
    // The stuck client stays connected for the whole test.
    let options = ServeOptions { client_timeout: Duration::from_secs(3600), ..Default::default() };
    let mut server = start(cluster(2000, 4), options).await;
    let _unread = unread_stream(&server.address, "n1").await;
    eventually("the stuck client's stream is open", || server.stats.connected() == 1).await;
    // Another client of the same node, hence of the same shared state, is served...
    let channel = connect(&server.address, &Security::default()).await.unwrap();
    let mut watch = LocalWatch::start(channel, "n1", false).await.unwrap();
    let first = timeout(Duration::from_secs(20), watch.next()).await.unwrap().unwrap().unwrap();
    assert_eq!(first.len(), 1 + 2000 * 5, "reset, 2,000 services and 8,000 endpoints");
    // ...and so are the changes after it, while the stuck client still holds its answer.
    let ports = [("http", Protocol::Tcp, 8080)];
    let endpoints = vec![endpoint("10.200.0.1", "n1")];
    let changed = slice("ns", "service-0-1", "service-0", &ports, endpoints);
    server.writer.apply(vec![SourceEvent::Applied(Object::EndpointSlice(changed))]);
    let next = timeout(Duration::from_secs(10), watch.next()).await.unwrap().unwrap().unwrap();
    assert!(!next.is_empty() && !matches!(next[0], Op::Reset), "only the change: {next:?}");
    assert_eq!(server.stats.connected(), 2, "the stuck client is still there");
    assert_eq!(server.stats.dropped(), 0);
}

#[tokio::test]
async fn a_connection_that_asks_for_nothing_is_closed() {
    let options = ServeOptions { client_timeout: Duration::from_millis(300), ..Default::default() };
    let server = start(cluster(1, 1), options).await;
    let kpng_api::Address::Unix(path) = &server.address else { unreachable!() };
    let mut silent = tokio::net::UnixStream::connect(path).await.unwrap();
    let mut buffer = Vec::new();
    let read = timeout(Duration::from_secs(10), silent.read_to_end(&mut buffer)).await;
    assert!(read.is_ok(), "the server closed the connection");
    assert_eq!(server.stats.dropped(), 1);
}

/// A node stream that got its first state, or why not.
async fn served(address: &kpng_api::Address, node: &str) -> Result<LocalWatch, String> {
    let channel = connect(address, &Security::default()).await.map_err(|e| e.to_string())?;
    let mut watch = LocalWatch::start(channel, node, false).await.map_err(|e| e.to_string())?;
    match timeout(Duration::from_secs(5), watch.next()).await {
        Ok(Ok(Some(_))) => Ok(watch),
        Ok(Ok(None)) => Err("the stream ended".into()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer".into()),
    }
}

#[tokio::test]
async fn clients_beyond_the_cap_are_refused_until_one_leaves() {
    let options = ServeOptions { max_clients: 2, ..Default::default() };
    let server = start(cluster(3, 2), options).await;
    let first = served(&server.address, "n1").await.expect("first client served");
    let _second = served(&server.address, "n2").await.expect("second client served");
    assert!(served(&server.address, "n3").await.is_err(), "a third is refused");
    assert!(server.stats.refused() >= 1);
    drop(first);
    eventually("the first client's stream ends", || server.stats.connected() == 1).await;
    let mut admitted = None;
    for _ in 0..50 {
        if let Ok(watch) = served(&server.address, "n3").await {
            admitted = Some(watch);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(admitted.is_some(), "a new client takes the freed slot");
}
