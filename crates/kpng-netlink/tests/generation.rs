//! The ruleset generation against the kernel, in a network namespace of the test's own:
//! every committed transaction increments it by one, and only the kernel's announcements
//! of commits count. Needs root and `ip` and `nft`; without them the test says so, and
//! fails under `CI=true`.

use std::process::Command;

use kpng_netlink::NetlinkSocket;
use kpng_netlink::message::NETLINK_NETFILTER;
use kpng_netlink::nftables::dump;

fn privileged() -> bool {
    use std::os::unix::fs::MetadataExt;
    let tools = ["ip", "nft"].iter().all(|t| Command::new(t).arg("-V").output().is_ok());
    if tools && std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return true;
    }
    let message = "generation: needs root, ip and nft";
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        panic!("{message} (CI=true: privileged tests must run)");
    }
    eprintln!("skipped: {message}");
    false
}

/// A network namespace removed on drop.
struct Namespace(String);

impl Namespace {
    /// A new namespace named after `prefix` and this process, and its file.
    fn add(prefix: &str) -> (Namespace, std::fs::File) {
        let ns = Namespace(format!("{prefix}-{}", std::process::id()));
        assert!(Command::new("ip").args(["netns", "add", &ns.0]).status().unwrap().success());
        let file = std::fs::File::open(format!("/run/netns/{}", ns.0)).unwrap();
        (ns, file)
    }
}

impl Drop for Namespace {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

#[test]
fn every_committed_transaction_increments_the_generation() {
    if !privileged() {
        return;
    }
    let (ns, file) = Namespace::add("kpng-gen");
    let name = ns.0.clone();
    let mut socket = NetlinkSocket::open_in(NETLINK_NETFILTER, &file).unwrap();
    let generation = |socket: &mut NetlinkSocket| {
        dump::generation(&socket.get(&dump::generation_request()).unwrap()).unwrap()
    };
    let first = generation(&mut socket);
    assert_eq!(generation(&mut socket), first, "asking commits nothing");
    let nft = |args: &[&str]| {
        let status = Command::new("ip").args(["netns", "exec", &name, "nft"]).args(args).status();
        assert!(status.unwrap().success(), "nft {args:?}");
    };
    nft(&["add", "table", "ip", "t"]);
    assert_eq!(generation(&mut socket), first.wrapping_add(1));
    nft(&["add table ip u; add table ip v"]);
    assert_eq!(generation(&mut socket), first.wrapping_add(2), "one transaction, one step");
}

/// A privileged process may send to the nf_tables notification group too: an announcement
/// that a generation touched nothing, sent after the kernel's own, would hide that commit
/// from kpng. Only the kernel's announcements count.
#[test]
fn announcements_are_taken_from_the_kernel_alone() {
    use kpng_netlink::message::{NFNL_SUBSYS_NFTABLES, ProtoFamily, request};
    use kpng_netlink::nftables::announce::{Announcements, NFNLGRP_NFTABLES, Touched};
    use kpng_netlink::nftables::msg;

    if !privileged() {
        return;
    }
    let (_ns, file) = Namespace::add("kpng-ann");
    // Sockets open in the namespace of the thread that opens them.
    let touched = std::thread::spawn(move || {
        nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut announcements = Announcements::open("kpng").unwrap();
        let mut asker = NetlinkSocket::open(NETLINK_NETFILTER).unwrap();
        let known = dump::generation(&asker.get(&dump::generation_request()).unwrap()).unwrap();
        let status = Command::new("nft")
            .args(["add table ip kpng; add set ip kpng s { type ipv4_addr; }"])
            .status();
        assert!(status.unwrap().success());
        let now = known.wrapping_add(1);
        // The forger: its own socket, sending "generation `now` touched nothing" to the group.
        let forged = request(NFNL_SUBSYS_NFTABLES, msg::NEWGEN, 0, ProtoFamily::Unspec, |buf| {
            buf.extend_from_slice(&8u16.to_ne_bytes());
            buf.extend_from_slice(&1u16.to_ne_bytes()); // NFTA_GEN_ID
            buf.extend_from_slice(&now.to_be_bytes());
        });
        let mut forger = netlink_sys::Socket::new(NETLINK_NETFILTER).unwrap();
        forger.bind_auto().unwrap();
        let group = netlink_sys::SocketAddr::new(0, 1 << (NFNLGRP_NFTABLES - 1));
        assert_eq!(forger.send_to(&forged, &group, 0).unwrap(), forged.len());
        announcements.touched(known, now).unwrap()
    });
    let touched = touched.join().unwrap();
    assert!(!matches!(touched, Touched::Nothing), "the forged announcement counted: {touched:?}");
}
