use std::net::IpAddr;

use super::*;
use crate::{ConntrackTable, Entry};
use kpng_netlink::NetlinkError;

fn update(serving: &[&str], required: bool) -> Update {
    Update { serving: serving.iter().map(|s| s.parse().unwrap()).collect(), required }
}

/// A table holding `entries` whose dumps fail while `failures` is above zero, each dump
/// taking `slow` and counted in `dumps`.
#[derive(Default)]
struct Fake {
    entries: Arc<std::sync::Mutex<Vec<Entry>>>,
    failures: usize,
    slow: Duration,
    dumps: Arc<AtomicU64>,
}

impl ConntrackTable for Fake {
    fn dump(
        &mut self,
        _: Family,
        _: Option<IpAddr>,
        _: Option<u16>,
    ) -> Result<Vec<Entry>, NetlinkError> {
        self.dumps.fetch_add(1, Ordering::Relaxed);
        std::thread::sleep(self.slow);
        if self.failures > 0 {
            self.failures -= 1;
            let error = std::io::Error::from_raw_os_error(nix::errno::Errno::ENOBUFS as i32);
            return Err(NetlinkError::Io { op: "receive", source: error });
        }
        Ok(self.entries.lock().unwrap().clone())
    }

    fn delete(&mut self, doomed: &[Entry]) -> Result<usize, NetlinkError> {
        self.entries.lock().unwrap().retain(|e| !doomed.contains(e));
        Ok(doomed.len())
    }

    fn local_addresses(&mut self) -> Result<Vec<IpAddr>, NetlinkError> {
        Ok(Vec::new())
    }
}

fn entry(dst: &str, reply: &str) -> Entry {
    Entry {
        orig_src: "10.244.9.9:4000".parse().unwrap(),
        orig_dst: dst.parse().unwrap(),
        reply_src: reply.parse().unwrap(),
        zone: 0,
    }
}

#[test]
fn a_failed_cleanup_is_counted_and_retried_until_it_succeeds() {
    let entries = Arc::new(std::sync::Mutex::new(vec![
        entry("10.96.0.10:53", "10.244.0.5:53"),
        entry("10.96.0.10:53", "10.244.1.5:53"),
    ]));
    let table = Fake { entries: entries.clone(), failures: 2, ..Fake::default() };
    let stats = Arc::new(CleanerStats::default());
    let (sender, receiver) = std::sync::mpsc::channel();
    let cleanup = Cleanup::new(Box::new(table), stats.clone());
    let thread = std::thread::spawn(move || cleanup.run(receiver));
    let dns = UdpTarget::Dest("10.96.0.10:53".parse().unwrap());
    let check = [(dns, update(&["10.244.0.5:53"], true))];
    sender.send(Work::Check(check.into_iter().collect(), NodePortAddresses::default())).unwrap();
    // Two failures, retried after 0.5 s and then 1 s, without anything new arriving.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while stats.deleted.load(Ordering::Relaxed) == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(stats.failures.load(Ordering::Relaxed), 2);
    assert_eq!(stats.deleted.load(Ordering::Relaxed), 1);
    let left: Vec<String> =
        entries.lock().unwrap().iter().map(|e| e.reply_src.to_string()).collect();
    assert_eq!(left, ["10.244.0.5:53"], "the serving endpoint's flow is kept");
    drop(sender);
    thread.join().unwrap();
}

#[test]
fn a_pending_check_follows_the_endpoints_that_joined_meanwhile() {
    let table = Fake::default();
    let mut cleanup = Cleanup::new(Box::new(table), Arc::default());
    let (dns, web) = (
        UdpTarget::Dest("10.96.0.10:53".parse().unwrap()),
        UdpTarget::Dest("10.96.0.20:53".parse().unwrap()),
    );
    let nodeports = NodePortAddresses::default();
    let first = [(dns, update(&["10.244.0.5:53"], true))];
    cleanup.merge(Work::Check(first.into_iter().collect(), nodeports.clone()));
    // Say that cleanup failed: it stays pending. Then an endpoint joins both services.
    let joined = [
        (dns, update(&["10.244.0.5:53", "10.244.1.5:53"], false)),
        (web, update(&["10.244.1.6:53"], false)),
    ];
    cleanup.merge(Work::Check(joined.into_iter().collect(), nodeports));
    assert_eq!(cleanup.pending.len(), 1, "a join alone calls for no check");
    assert_eq!(cleanup.pending[&dns].len(), 2, "the new endpoint's flows are kept");
}

#[test]
fn under_a_storm_cleanups_rest_and_take_what_arrived_meanwhile_in_one_pass() {
    // A cleanup of 20 ms rests a second: 40 changes 5 ms apart come in one pass after the
    // first (one after each, about ten in all, without the rest).
    let entries = Arc::new(std::sync::Mutex::new(vec![entry("10.96.0.10:53", "10.244.0.0:53")]));
    let dumps = Arc::new(AtomicU64::new(0));
    let slow = Duration::from_millis(20);
    let table = Fake { entries: entries.clone(), slow, dumps: dumps.clone(), ..Fake::default() };
    let (sender, receiver) = std::sync::mpsc::channel();
    let thread =
        std::thread::spawn(move || Cleanup::new(Box::new(table), Arc::default()).run(receiver));
    let dns = UdpTarget::Dest("10.96.0.10:53".parse().unwrap());
    for i in 0..40 {
        let serving = format!("10.244.0.{i}:53");
        let check = [(dns, update(&[serving.as_str()], true))];
        sender
            .send(Work::Check(check.into_iter().collect(), NodePortAddresses::default()))
            .unwrap();
        std::thread::sleep(Duration::from_millis(5));
    }
    let during = dumps.load(Ordering::Relaxed);
    assert!((1..=3).contains(&during), "{during} cleanups while 40 changes came");
    // The first change kept the flow; a later one, cleaned after a rest, removes it.
    drop(sender);
    thread.join().unwrap();
    assert!(entries.lock().unwrap().is_empty(), "the stale flow is removed");
}
