//! The bounded HTTP server against slow and greedy clients, over real sockets on port 0.

use std::time::Duration;

use axum::routing::get;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::*;

async fn server(limits: &HttpLimits) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let router = Router::new().route("/healthz", get(|| async { "ok" }));
    tokio::spawn(serve_http("test", listener, router, limits.clone()));
    address
}

/// A client that sends part of a request head and then nothing.
async fn slow_client(address: SocketAddr) -> TcpStream {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").await.unwrap();
    stream
}

async fn get_healthz(address: SocketAddr) -> String {
    let mut stream = TcpStream::connect(address).await.unwrap();
    stream.write_all(b"GET /healthz HTTP/1.0\r\nHost: x\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_string(&mut answer))
        .await
        .expect("an answer in time")
        .unwrap();
    answer
}

/// Reads until the server closes the connection; what was read.
async fn until_closed(stream: &mut TcpStream) -> Vec<u8> {
    let mut read = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(20), stream.read_to_end(&mut read))
        .await
        .expect("the server closed the connection");
    read
}

#[tokio::test]
async fn a_slow_header_is_cut_after_the_timeout() {
    let limits = HttpLimits::new(16, Duration::from_millis(300));
    let address = server(&limits).await;
    let mut slow = slow_client(address).await;
    let started = std::time::Instant::now();
    until_closed(&mut slow).await;
    assert!(started.elapsed() >= Duration::from_millis(250), "cut by the timeout, not at once");
    // A client that never sends a byte is cut too.
    let mut silent = TcpStream::connect(address).await.unwrap();
    until_closed(&mut silent).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(limits.open_connections(), 0, "their slots are back");
}

#[tokio::test]
async fn a_prompt_client_is_served_while_slow_ones_fill_the_budget() {
    // A long header timeout: only the budget protects the prompt client.
    let limits = HttpLimits::new(8, Duration::from_secs(60));
    let address = server(&limits).await;
    let mut slow = Vec::new();
    for _ in 0..40 {
        slow.push(slow_client(address).await);
    }
    let answer = get_healthz(address).await;
    assert!(answer.starts_with("HTTP/1.0 200"), "{answer}");
    assert!(answer.ends_with("ok"), "{answer}");
    assert!(limits.open_connections() <= 8, "never more than the budget");
    assert!(limits.evicted() >= 32, "the oldest slow clients made room: {}", limits.evicted());
    // The earliest slow clients were closed to make room.
    let closed = until_closed(&mut slow[0]).await;
    assert!(closed.is_empty(), "no answer to an unfinished request");
}

#[tokio::test]
async fn servers_share_one_budget() {
    let limits = HttpLimits::new(4, Duration::from_secs(60));
    let (a, b) = (server(&limits).await, server(&limits).await);
    let mut slow = Vec::new();
    for _ in 0..4 {
        slow.push(slow_client(a).await);
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(limits.open_connections(), 4);
    // A client of the other server takes the place of the oldest slow one.
    assert!(get_healthz(b).await.starts_with("HTTP/1.0 200"));
    assert!(limits.open_connections() <= 4);
    assert_eq!(limits.evicted(), 1);
}

#[tokio::test(start_paused = true)]
async fn an_address_in_use_is_reported_until_it_is_bound() {
    let problems = BindProblems::default();
    let tries = Arc::new(AtomicU64::new(0));
    let counted = tries.clone();
    let bind: Binder = Arc::new(move |_| match counted.fetch_add(1, Ordering::Relaxed) {
        0 | 1 => Err(io::Error::from(io::ErrorKind::AddrInUse)),
        _ => std::net::TcpListener::bind("127.0.0.1:0"),
    });
    let address: SocketAddr = "127.0.0.1:10249".parse().unwrap();
    let binding = {
        let (problems, bind) = (problems.clone(), bind.clone());
        tokio::spawn(async move { bind_retrying("metrics", address, &problems, &bind).await })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;
    let listed = problems.list();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].0, address);
    assert!(listed[0].1.starts_with("metrics: "), "{}", listed[0].1);
    binding.await.unwrap();
    assert_eq!(tries.load(Ordering::Relaxed), 3);
    assert!(problems.list().is_empty(), "cleared once bound");
}

/// Connections end by themselves (their clients leave, or they time out) while others
/// are closed to make room: the two must not trip over each other. A plain test with a
/// runtime of its own: a stalled runtime cannot be shut down, so it is left behind.
#[test]
fn evictions_racing_closing_connections_never_stall_the_server() {
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let limits = HttpLimits::new(4, Duration::from_millis(5));
    let address = runtime.block_on(server(&limits));
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::Write;
        let mut kept = std::collections::VecDeque::new();
        for _ in 0..10_000 {
            let Ok(mut stream) = std::net::TcpStream::connect(address) else { return };
            let _ = stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n");
            // A few stay a little longer: the budget stays full.
            kept.push_back(stream);
            if kept.len() > 8 {
                kept.pop_front();
            }
        }
        let answer = runtime.block_on(get_healthz(address));
        let _ = done.send(answer);
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(answer) => assert!(answer.starts_with("HTTP/1.0 200"), "{answer}"),
        Err(_) => panic!("the server stopped accepting connections"),
    }
}
