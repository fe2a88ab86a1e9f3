//! `sock_diag` against the kernel: a connected UDP socket on loopback is found by its
//! addresses and cookie, and destroying it is what its owner sees. Needs root
//! (`CAP_NET_ADMIN`); without it the test says so, and fails under `CI=true`.

use std::net::UdpSocket;

use kpng_netlink::NetlinkSocket;
use kpng_netlink::sock_diag::{self, NETLINK_SOCK_DIAG};

fn privileged() -> bool {
    use std::os::unix::fs::MetadataExt;
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return true;
    }
    let message = "sock_diag: destroying sockets needs root";
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{message} (CI=true: privileged tests must run)");
    }
    eprintln!("skipped: {message}");
    false
}

#[test]
fn a_destroyed_connected_udp_socket_fails_for_its_owner() {
    if !privileged() {
        return;
    }
    let server = UdpSocket::bind("127.0.0.1:0").unwrap();
    let client = UdpSocket::bind("127.0.0.1:0").unwrap();
    client.connect(server.local_addr().unwrap()).unwrap();
    let bystander = UdpSocket::bind("127.0.0.1:0").unwrap();
    bystander.connect(server.local_addr().unwrap()).unwrap();

    let netns = std::fs::File::open("/proc/self/ns/net").unwrap();
    let mut socket = NetlinkSocket::open_in(NETLINK_SOCK_DIAG, &netns).unwrap();
    let dumped = socket.dump(&sock_diag::dump_connected_udp(false)).unwrap();
    let sockets: Vec<_> = dumped.iter().filter_map(|b| sock_diag::udp_socket(b)).collect();
    let ours = sockets
        .iter()
        .find(|s| s.local == client.local_addr().unwrap())
        .expect("the connected socket is dumped");
    assert_eq!(ours.remote, server.local_addr().unwrap());
    assert!(
        !sockets.iter().any(|s| s.local == server.local_addr().unwrap()),
        "an unconnected socket is not dumped"
    );

    let codes = socket.requests(&[sock_diag::destroy(ours)]).unwrap();
    assert_eq!(codes, [0], "the kernel destroyed it");
    client.set_read_timeout(Some(std::time::Duration::from_secs(1))).unwrap();
    let error = client.recv(&mut [0u8; 16]).unwrap_err();
    assert_eq!(error.raw_os_error(), Some(nix::errno::Errno::ECONNABORTED as i32), "{error}");
    // The other socket to the same server is untouched.
    bystander.send(b"still here").unwrap();
    let mut buf = [0u8; 16];
    let (n, from) = server.recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"still here"[..], bystander.local_addr().unwrap()));

    // A stale cookie names no socket.
    let mut gone = *ours;
    gone.cookie ^= 1;
    let codes = socket.requests(&[sock_diag::destroy(&gone)]).unwrap();
    assert_ne!(codes, [0]);
}
