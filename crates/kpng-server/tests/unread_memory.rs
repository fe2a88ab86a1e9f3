//! A to-api client that never reads costs the server a small fixed amount, whatever the
//! size of the state it asked for. Alone in its test binary: it measures the process's
//! resident memory.

#[path = "support/mod.rs"]
mod support;

use std::time::Duration;

use kpng_api::Security;
use kpng_api::client::{LocalWatch, connect};
use kpng_server::ServeOptions;
use prost::Message;
use support::{cluster, start, unread_stream};

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
    line.trim().trim_end_matches("kB").trim().parse().unwrap()
}

const CLIENTS: usize = 20;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_that_never_read_hold_a_bounded_amount() {
    // The client timeout is out of the picture: this is about what a stuck client holds
    // while it is still connected.
    let options = ServeOptions { client_timeout: Duration::from_secs(3600), ..Default::default() };
    let server = start(cluster(5000, 4), options).await;
    // A reading client of the same node: the node's state exists, and how large it is.
    let channel = connect(&server.address, &Security::default()).await.unwrap();
    let mut reader = LocalWatch::start(channel, "n1", false).await.unwrap();
    let state = reader.next().await.unwrap().unwrap();
    let bytes: usize = state.iter().map(|op| kpng_api::local::encode_op(op).encoded_len()).sum();
    assert!(bytes > 2 << 20, "a state of {bytes} bytes");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let before = rss_kib();

    let mut unread = Vec::new();
    for _ in 0..CLIENTS {
        unread.push(unread_stream(&server.address, "n1").await);
    }
    // Time for the server to send each of them all it can.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let grown = rss_kib().saturating_sub(before);
    assert_eq!(server.stats.connected(), CLIENTS as u64 + 1);
    // Each stuck client: the transport's buffers (a 64 KiB window, a 32 KiB chunk), on
    // both ends here, and a cursor; far below the state it asked for.
    let bound = CLIENTS as u64 * 256;
    assert!(
        grown < bound,
        "{grown} KiB for {CLIENTS} stuck clients (bound {bound} KiB; a state is {} KiB)",
        bytes / 1024
    );
}
