//! The fake API server answers kube-rs as the real one does.

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::Service;
use kpng_testkit::apiserver::{FakeApiServer, Resource};
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use serde_json::json;

fn service(name: &str, labels: serde_json::Value) -> serde_json::Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": { "name": name, "namespace": "ns", "labels": labels },
        "spec": { "clusterIP": "10.96.0.1", "ports": [{ "port": 80 }] },
    })
}

async fn api(server: &FakeApiServer) -> Api<Service> {
    let config = kube::Config::new(server.url().parse().unwrap());
    Api::all(kube::Client::try_from(config).unwrap())
}

fn names(list: &[Service]) -> Vec<String> {
    list.iter().map(|s| s.metadata.name.clone().unwrap_or_default()).collect()
}

#[tokio::test]
async fn lists_with_selectors_and_watches_from_a_version() {
    let server = FakeApiServer::start(Duration::from_millis(100)).await.unwrap();
    server.apply(service("a", json!({})));
    server.apply(service("b", json!({ "service.kubernetes.io/headless": "" })));
    let api = api(&server).await;
    let selected =
        api.list(&ListParams::default().labels("!service.kubernetes.io/headless")).await.unwrap();
    assert_eq!(names(&selected.items), ["a"]);
    let all = api.list(&ListParams::default()).await.unwrap();
    assert_eq!(names(&all.items), ["a", "b"]);
    let version = all.metadata.resource_version.unwrap();

    let mut events =
        api.watch(&WatchParams::default().disable_bookmarks(), &version).await.unwrap().boxed();
    server.apply(service("c", json!({})));
    server.touch(Resource::Services, "ns", "a");
    server.delete(Resource::Services, "ns", "b");
    let mut seen = Vec::new();
    while seen.len() < 3 {
        match events.try_next().await.unwrap().unwrap() {
            WatchEvent::Added(s) => seen.push(format!("added {}", s.metadata.name.unwrap())),
            WatchEvent::Modified(s) => seen.push(format!("modified {}", s.metadata.name.unwrap())),
            WatchEvent::Deleted(s) => seen.push(format!("deleted {}", s.metadata.name.unwrap())),
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, ["added c", "modified a", "deleted b"]);
    // A watch resumed from an earlier version replays what came after it.
    let mut replay =
        api.watch(&WatchParams::default().disable_bookmarks(), &version).await.unwrap().boxed();
    assert!(matches!(replay.try_next().await.unwrap().unwrap(), WatchEvent::Added(_)));
}

#[tokio::test]
async fn bookmarks_gone_and_disconnects() {
    let server = FakeApiServer::start(Duration::from_millis(50)).await.unwrap();
    server.apply(service("a", json!({})));
    let api = api(&server).await;
    let version = server.revision().to_string();
    let mut marks = api.watch(&WatchParams::default(), &version).await.unwrap().boxed();
    assert!(matches!(marks.try_next().await.unwrap().unwrap(), WatchEvent::Bookmark(_)));

    // After a compaction, old versions are gone.
    server.apply(service("b", json!({})));
    server.compact();
    let mut stale = api.watch(&WatchParams::default(), &version).await.unwrap().boxed();
    match stale.try_next().await.unwrap().unwrap() {
        WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }

    // A disconnect ends open watches.
    let mut open =
        api.watch(&WatchParams::default(), &server.revision().to_string()).await.unwrap().boxed();
    server.disconnect();
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        while let Ok(Some(_)) = open.try_next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the watch did not end");
}

#[tokio::test]
async fn lists_in_pages_with_continue_tokens() {
    let server = FakeApiServer::start(Duration::from_secs(5)).await.unwrap();
    for i in 0..5 {
        server.apply(service(&format!("s{i}"), json!({})));
    }
    let api = api(&server).await;
    let first = api.list(&ListParams::default().limit(2)).await.unwrap();
    assert_eq!(names(&first.items), ["s0", "s1"]);
    let version = first.metadata.resource_version.clone();
    let token = first.metadata.continue_.clone().expect("a continue token after a full page");
    let second = api.list(&ListParams::default().limit(2).continue_token(&token)).await.unwrap();
    assert_eq!(names(&second.items), ["s2", "s3"]);
    assert_eq!(second.metadata.resource_version, version, "pages keep the list's version");
    let token = second.metadata.continue_.clone().unwrap();
    let last = api.list(&ListParams::default().limit(2).continue_token(&token)).await.unwrap();
    assert_eq!(names(&last.items), ["s4"]);
    assert_eq!(last.metadata.continue_, None, "no token after the last page");
    let bad = api.list(&ListParams::default().limit(2).continue_token("nonsense")).await;
    assert!(bad.is_err(), "a malformed token is refused");
}
