//! A large batch through libnftables in a network namespace of its own: the library's
//! parse of the script (about a kilobyte and a half per element) is freed when the call
//! returns, and the applier gives those pages back to the system, so that `kpng aggregate`
//! does not go on holding its largest batch's peak. Alone in its test binary: it reads the
//! process's resident set, which other tests running beside it would move.

use kpng_aggregator::diff::Script;
use kpng_aggregator::{Applier, LibNftApplier};
use kpng_testkit::netns::Netns;
use kpng_testkit::privileged::require;

/// The process's resident set in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix("VmRSS:")).unwrap();
    line.trim().trim_end_matches("kB").trim().parse().unwrap()
}

/// A table with one map of `n` elements, as one script.
fn large_script(n: u32) -> Script {
    let mut commands = vec![
        "add table ip big".to_string(),
        "add map ip big backends { type ipv4_addr . inet_service : ipv4_addr . inet_service; }"
            .to_string(),
    ];
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let elements: Vec<String> = chunk
            .iter()
            .map(|i| {
                let [_, _, b, c] = i.to_be_bytes();
                format!("10.96.{b}.{c} . 80 : 10.244.{b}.{c} . 8080")
            })
            .collect();
        commands.push(format!("add element ip big backends {{ {} }}", elements.join(", ")));
    }
    Script { commands }
}

#[test]
fn a_large_batch_leaves_no_resident_parse_behind() {
    if !require("a_large_batch_leaves_no_resident_parse_behind", &["nft", "ip"]) {
        return;
    }
    let netns = Netns::new("aggheap");
    let mut applier = LibNftApplier::open(Some(netns.name())).unwrap();
    let script = large_script(60_000);
    let before = rss_kib();
    applier.commit(&script).unwrap();
    let after = rss_kib();
    drop(script);
    let listed = netns.output("nft", &["list", "map", "ip", "big", "backends"]);
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(listed.contains("10.96.234.95 . 80 : 10.244.234.95 . 8080"), "the last element");
    // The parse of 60,000 elements costs libnftables about 90 MiB while it runs; what stays
    // resident once it returned is the allocator's and the library's bookkeeping.
    let grew = after.saturating_sub(before);
    assert!(grew < 24 * 1024, "resident {before} KiB -> {after} KiB after the batch");
}
