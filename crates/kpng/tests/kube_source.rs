//! kpng's kube source against the fake API server, through the real binary.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use kpng_testkit::apiserver::{FakeApiServer, Resource};
use serde_json::{Value, json};
use support::{Kpng, example, summarize};

/// The example cluster's objects as JSON.
fn example_objects() -> Vec<Value> {
    let text = std::fs::read_to_string(example()).unwrap();
    text.split("\n---\n")
        .filter_map(|doc| serde_saphyr::from_str::<Value>(doc).ok())
        .filter(|v| v.get("kind").is_some())
        .collect()
}

/// The example cluster's node-a stream, read from the file: the reference.
fn file_reference() -> Vec<Value> {
    let args = ["file", "--input", &example(), "to-local", "--node", "node-a", "to-json", "--once"];
    let file = support::run(&args);
    file.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

fn summary(ops: &[Value]) -> Vec<String> {
    ops.iter().map(summarize).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_source_streams_the_node_state_and_only_real_changes() {
    let server = FakeApiServer::start(Duration::from_millis(200)).await.unwrap();
    for object in example_objects() {
        server.apply(object);
    }
    let reference = file_reference();

    let url = server.url();
    let mut kpng =
        Kpng::spawn(&["kube", "--server", &url, "to-local", "--node", "node-a", "to-json"]);
    let first = tokio::task::block_in_place(|| kpng.next_change_set());
    assert_eq!(summary(&first), summary(&reference), "the API gives the same state as the file");

    // A no-op update (resourceVersion only), then a real change: only the change arrives.
    server.touch(Resource::Services, "shop", "legacy");
    server.touch(Resource::EndpointSlices, "shop", "checkout-m3n4b");
    let mut cart = example_objects().into_iter().find(|o| o["metadata"]["name"] == "cart").unwrap();
    cart["spec"]["ports"][0]["port"] = json!(9001);
    server.apply(cart);
    let change = tokio::task::block_in_place(|| kpng.next_change_set());
    assert_eq!(summary(&change), ["set service shop/cart", "sync"]);

    // Disconnected, then the history is compacted while an object goes away: the watch
    // gets 410 Gone, relists, and deletes exactly the vanished object.
    server.disconnect();
    server.delete(Resource::Services, "shop", "empty");
    server.compact();
    let change = tokio::task::block_in_place(|| kpng.next_change_set());
    assert_eq!(summary(&change), ["delete service shop/empty", "sync"]);

    // A malformed object is reported (namespace/name and field) and skipped; the rest applies.
    let mut bad =
        example_objects().into_iter().find(|o| o["metadata"]["name"] == "legacy").unwrap();
    bad["spec"]["externalIPs"] = json!(["192.0.2.500"]);
    server.apply(bad);
    let mut web =
        example_objects().into_iter().find(|o| o["metadata"]["name"] == "web-v4-q9w8e").unwrap();
    web["endpoints"][0]["addresses"] = json!(["10.244.0.11"]);
    server.apply(web);
    let change = tokio::task::block_in_place(|| kpng.next_change_set());
    assert_eq!(
        summary(&change),
        ["delete endpoint shop/web 10.244.0.10", "set endpoint shop/web 10.244.0.11", "sync"]
    );
    tokio::task::block_in_place(|| kpng.wait_stderr("shop/legacy"));
    assert!(kpng.stderr().contains("spec.externalIPs[0]"), "{}", kpng.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_is_emitted_before_every_initial_list() {
    let server = FakeApiServer::start(Duration::from_millis(200)).await.unwrap();
    for object in example_objects() {
        server.apply(object);
    }
    // Services and EndpointSlices list fine; Nodes are refused, as without the RBAC grant.
    server.forbid(Resource::Nodes, true);
    let url = server.url();
    let kpng = Kpng::spawn(&["kube", "--server", &url, "to-local", "--node", "node-a", "to-json"]);
    tokio::task::block_in_place(|| kpng.wait_stderr("the fake server refuses it"));
    // Give the other lists time to complete and a retry or two to fail.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(kpng.try_line(), None, "emitted before the Node list completed");
    assert!(kpng.stderr().contains("Node"), "the refused kind is named: {}", kpng.stderr());

    server.forbid(Resource::Nodes, false);
    let mut kpng = kpng;
    let first = tokio::task::block_in_place(|| kpng.next_change_set());
    assert_eq!(
        summary(&first),
        summary(&file_reference()),
        "the full state, once, after all lists"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_updates_and_deletion_move_topology_hints() {
    let server = FakeApiServer::start(Duration::from_millis(200)).await.unwrap();
    for object in example_objects() {
        server.apply(object);
    }
    let url = server.url();
    let mut kpng =
        Kpng::spawn(&["kube", "--server", &url, "to-local", "--node", "node-a", "to-json"]);
    let first = tokio::task::block_in_place(|| kpng.next_change_set());
    assert_eq!(summary(&first), summary(&file_reference()));

    let node_a = server.get(Resource::Nodes, "", "node-a").unwrap();
    // Another node's change is not even watched.
    let mut node_c = server.get(Resource::Nodes, "", "node-c").unwrap();
    node_c["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("zone-9");
    server.apply(node_c);
    // node-a moves to zone-2: kube-dns follows the zone-2 hint.
    let mut moved = node_a.clone();
    moved["metadata"]["labels"]["topology.kubernetes.io/zone"] = json!("zone-2");
    server.apply(moved);
    let change = tokio::task::block_in_place(|| kpng.next_change_set());
    assert_eq!(
        summary(&change),
        [
            "set node",
            "set endpoint kube-system/kube-dns 10.244.0.5",
            "set endpoint kube-system/kube-dns 10.244.2.7",
            "sync"
        ],
        "node-c's change is not in it; node-a's zone moves the hints (the zone-1 pod still \
         serves, so it stays listed for its UDP port, unpicked)"
    );
    // node-a deleted: no zone, so hints are ignored and every endpoint is used.
    server.delete(Resource::Nodes, "", "node-a");
    let change = tokio::task::block_in_place(|| kpng.next_change_set());
    assert_eq!(
        summary(&change),
        ["delete node", "set endpoint kube-system/kube-dns 10.244.0.5", "sync"]
    );
    // node-a back in zone-1: the original state.
    server.apply(node_a);
    let change = tokio::task::block_in_place(|| kpng.next_change_set());
    assert_eq!(
        summary(&change),
        ["set node", "set endpoint kube-system/kube-dns 10.244.2.7", "sync"]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_malformed_service_in_the_list_does_not_hold_back_the_rest() {
    let server = FakeApiServer::start(Duration::from_millis(200)).await.unwrap();
    for object in example_objects() {
        server.apply(object);
    }
    let mut bad = example_objects().into_iter().find(|o| o["metadata"]["name"] == "cart").unwrap();
    bad["spec"]["ports"] = json!("notalist");
    server.apply(bad);
    let url = server.url();
    let mut kpng =
        Kpng::spawn(&["kube", "--server", &url, "to-local", "--node", "node-a", "to-json"]);
    // Ready with everything else: the state of the file without shop/cart.
    let first = tokio::task::block_in_place(|| kpng.next_change_set());
    let without_cart: Vec<String> =
        summary(&file_reference()).into_iter().filter(|op| !op.contains("shop/cart")).collect();
    assert_eq!(summary(&first), without_cart);
    let stderr = kpng.stderr();
    let reports: Vec<&str> = stderr.lines().filter(|l| l.contains("malformed")).collect();
    assert_eq!(reports.len(), 1, "reported once: {stderr}");
    for needle in ["Service", "shop/cart", "spec.ports", "notalist"] {
        assert!(reports[0].contains(needle), "{needle:?} not in {}", reports[0]);
    }
    assert!(!stderr.contains("shop/legacy"), "no list body in the logs: {stderr}");
}
