//! The ruleset generation against the kernel, in a network namespace of the test's own:
//! every committed transaction increments it by one. Needs root and `ip` and `nft`; without
//! them the test says so, and fails under `CI=true`.

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
    let name = format!("kpng-gen-{}", std::process::id());
    let ns = Namespace(name.clone());
    assert!(Command::new("ip").args(["netns", "add", &ns.0]).status().unwrap().success());
    let file = std::fs::File::open(format!("/run/netns/{name}")).unwrap();
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
