//! Faults and tampering: refused transactions and damaged tables are repaired.

use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

use crate::harness::*;

pub fn a_rejected_transaction_is_retried_and_the_table_rebuilt(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let (a, b) = (WEB_A, WEB_B);
    let web = |eps: &[Ep<'_>]| web("10.96.0.80", eps);
    let kpng = Watched::start(&cluster, dp, &web(&[a, b]));
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.80:80");
    assert!(matches!(
        eventually(probe, |o| matches!(o, Outcome::Answer { .. })),
        Outcome::Answer { .. }
    ));

    // Someone removes one of kpng's elements behind its back: kpng's next transaction,
    // which deletes that element, is rejected by the kernel as a whole.
    cluster.node.exec(
        "nft",
        &[
            "delete",
            "element",
            "ip",
            "kpng",
            // Two endpoints: the map of counts up to 2.
            "cluster_backends_2",
            "{ 10.96.0.80 . tcp . 80 . 1 : 10.244.1.10 . 8080 }",
        ],
    );
    kpng.write(&web(&[a]));
    wait_until("the failure is logged", || kpng.log().contains("change set failed"));
    let log = kpng.log();
    // Through an aggregator, nft's refusal comes back as the aggregator's, quoting the
    // command.
    let refused = match dp {
        Dataplane::Aggregated(_) => "the aggregator refused revision",
        _ => "the kernel rejected `delete element ip kpng",
    };
    assert!(
        log.contains(refused) && log.contains("delete element ip kpng"),
        "the failing operation is named:\n{log}"
    );
    // The retry starts from what the kernel holds and converges: a transaction commits
    // after the failure, and only web-a remains.
    wait_until("a transaction commits after the failure", || {
        let log = kpng.log();
        let failed = log.find("change set failed").unwrap_or(log.len());
        log[failed..].contains("nftables transaction committed")
    });
    wait_until("the table is repaired", || slots(&cluster, dp, "10.96.0.80 . tcp . 80") == 1);
    for _ in 0..8 {
        assert_eq!(answer(&probe()).0, "web-a");
    }
}

pub fn a_flushed_table_is_repaired_at_the_next_verification(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = web("10.96.0.80", &[WEB_A]);
    let kpng = Watched::start_with(&cluster, dp, &manifests, &["--sync-period", "1s"]);
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.80:80");
    let answers = |o: &Outcome| matches!(o, Outcome::Answer { .. });
    assert!(answers(&eventually(probe, answers)), "{}", kpng.log());

    // Someone flushes kpng's table: its rules are gone.
    let rules = || {
        let out = cluster.node.output("nft", &["-a", "list", "chain", "ip", "kpng", "services"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines().filter(|l| l.contains("# handle") && !l.contains("chain ")).count()
    };
    assert!(rules() > 0, "the services chain has rules");
    let out = cluster.node.output("nft", &["flush", "table", "ip", "kpng"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(rules(), 0, "flushed");
    // The next verification notices and puts everything back.
    let start = std::time::Instant::now();
    while !(kpng.log().contains(DRIFT) && rules() > 0) {
        assert!(
            start.elapsed().as_secs() < 30,
            "not repaired; rules {}; log:\n{}",
            rules(),
            kpng.log()
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(answers(&eventually(probe, answers)), "{}", kpng.log());
}

/// The handle of the first rule of `chain` (in the node's `ip kpng`) whose text contains
/// `needle`.
fn rule_handle(cluster: &Cluster, chain: &str, needle: &str) -> Option<String> {
    let out = cluster.node.output("nft", &["-a", "list", "chain", "ip", "kpng", chain]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.contains(needle))
        .and_then(|l| l.rsplit("# handle ").next().map(|h| h.trim().to_string()))
}

pub fn deleted_and_foreign_rules_are_repaired(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let kpng =
        Watched::start_with(&cluster, dp, &web("10.96.0.85", &[WEB_A]), &["--sync-period", "1s"]);
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.85:80");
    let is_a = |o: &Outcome| matches!(o, Outcome::Answer { name, .. } if name == "web-a");
    assert!(is_a(&eventually(probe, is_a)), "{}", kpng.log());

    // A rule of kpng's goes: services are no longer dispatched.
    let handle =
        rule_handle(&cluster, "services", "@cluster_dests goto pick_cluster").expect("the rule");
    cluster.node.exec("nft", &["delete", "rule", "ip", "kpng", "services", "handle", &handle]);
    assert!(rule_handle(&cluster, "services", "@cluster_dests goto pick_cluster").is_none());
    wait_until("the deleted rule is back", || {
        rule_handle(&cluster, "services", "@cluster_dests goto pick_cluster").is_some()
    });
    assert!(kpng.log().contains("chain ip services"), "what differed is logged:\n{}", kpng.log());
    assert!(is_a(&eventually(probe, is_a)));

    // A foreign rule hijacks the service to web-b.
    let hijack = "ip daddr 10.96.0.85 tcp dport 80 dnat to 10.244.1.10:8080";
    let insert = format!("insert rule ip kpng nat_prerouting {hijack}");
    cluster.node.exec("nft", &insert.split(' ').collect::<Vec<_>>());
    wait_until("the foreign rule is gone", || {
        rule_handle(&cluster, "nat_prerouting", "10.244.1.10").is_none()
    });
    assert!(kpng.log().contains("chain ip nat_prerouting"), "{}", kpng.log());
    for _ in 0..6 {
        assert!(is_a(&probe()), "traffic is kpng's again");
    }
}

/// Holds a table of `name` owned by a netlink socket in `ns` (the kernel then refuses
/// everyone else's changes to it) until the returned sender is dropped.
fn hold_table(ns: &kpng_testkit::netns::Netns, name: &'static str) -> std::sync::mpsc::Sender<()> {
    use kpng_netlink::nftables::objects::{TABLE_OWNER, Table};
    let path = format!("/var/run/netns/{}", ns.name());
    let (release, released) = std::sync::mpsc::channel::<()>();
    let (held, ready) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&path).unwrap();
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut socket =
            kpng_netlink::NetlinkSocket::open(kpng_netlink::message::NETLINK_NETFILTER).unwrap();
        let mut batch = kpng_netlink::Batch::new(socket.seq());
        Table { family: kpng_netlink::ProtoFamily::Ipv4, name }
            .add_with_flags(&mut batch, TABLE_OWNER);
        held.send(socket.commit(batch.finish()).map_err(|e| e.to_string())).unwrap();
        let _ = released.recv();
        drop(socket);
    });
    ready.recv().unwrap().expect("an owned table");
    release
}

pub fn a_refused_repair_keeps_every_rule_in_force(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = [
        service(
            "dual",
            "  clusterIP: 10.96.0.86\n  clusterIPs: [10.96.0.86, \"fd00:96::86\"]\n",
            PORT_HTTP,
        ),
        slice("dual-4", "dual", "IPv4", SLICE_HTTP, &[WEB_A]),
        slice(
            "dual-6",
            "dual",
            "IPv6",
            SLICE_HTTP,
            &[("fd00:244::a", "node-a", true, true, false)],
        ),
    ]
    .concat();
    let kpng = Watched::start_with(&cluster, dp, &manifests, &["--sync-period", "1s"]);
    let v4 = || Cluster::tcp(&cluster.client, "10.96.0.86:80");
    let v6 = || Cluster::tcp(&cluster.client, "[fd00:96::86]:80");
    let answers = |o: &Outcome| matches!(o, Outcome::Answer { .. });
    assert!(
        answers(&eventually(v4, answers)) && answers(&eventually(v6, answers)),
        "{}",
        kpng.log()
    );

    // Someone deletes the IPv4 table and holds one of that name: kpng's repair is refused.
    cluster.node.exec("nft", &["delete", "table", "ip", "kpng"]);
    let holder = hold_table(&cluster.node, "kpng");
    wait_until("a repair is refused", || kpng.log().contains("change set failed"));
    assert!(kpng.log().contains("Operation not permitted"), "{}", kpng.log());
    // The other family's rules stay in force throughout.
    for _ in 0..4 {
        assert!(answers(&v6()), "IPv6 keeps working while IPv4 cannot be repaired");
    }
    // The holder goes (its table with it): the retried repair succeeds.
    drop(holder);
    assert!(answers(&eventually(v4, answers)), "{}", kpng.log());
    assert!(answers(&v6()));
}

/// `to-ebpf`: its programs and maps removed behind its back (`kpng cleanup --backend
/// ebpf`) are installed again at the next verification.
pub fn programs_and_maps_removed_behind_kpngs_back_are_restored(dp: Dataplane) {
    let Dataplane::Ebpf(attachment) = dp else { unreachable!("a to-ebpf scenario") };
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("client", true, 50, &[9999]);
    let kpng =
        Watched::start_with(&cluster, dp, &web("10.96.0.87", &[WEB_A]), &["--sync-period", "1s"]);
    wait_until("kpng wrote its maps", || kpng.log().contains("eBPF maps written"));
    assert!(attachment.attached().contains("kpng_connect4"), "{}", attachment.attached());
    let pins = attachment.pins().display().to_string();
    let args = ["cleanup", "--backend", "ebpf", "--bpf-pin-path", &pins].map(String::from);
    let out = dp.kpng(&cluster, &args).output().expect("running kpng cleanup");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!attachment.attached().contains("kpng_"), "{}", attachment.attached());

    // The next verification finds the programs and maps gone and installs them again.
    wait_until("kpng restored its programs and maps", || {
        kpng.log().matches("eBPF maps written").count() >= 2
    });
    assert!(attachment.attached().contains("kpng_connect4"), "{}", kpng.log());
    let mut pod = dp.local(&cluster.pod("client").ns);
    cluster.node.output("conntrack", &["-F"]);
    assert_eq!(pod.reach("10.96.0.87:80").2, "10.96.0.87:80");
    let nated = conntrack(&cluster, &["-s", "10.244.0.50", "--dst-nat"]);
    assert!(nated.is_empty(), "translated at connect() again: {nated:?}\n{}", kpng.log());
}

/// The id of the link pinned at `pin`, as `bpftool` shows it.
fn link_id(pin: &std::path::Path) -> String {
    let out = std::process::Command::new("bpftool")
        .args(["-j", "link", "show", "pinned"])
        .arg(pin)
        .output()
        .expect("running bpftool");
    let shown: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("bpftool's answer ({e}): {out:?}"));
    shown["id"].to_string()
}

/// Detaches the link pinned at `pin` with `bpftool`, leaving its pin in place.
fn detach(pin: &std::path::Path) {
    let out = std::process::Command::new("bpftool")
        .args(["link", "detach", "id", &link_id(pin)])
        .output()
        .expect("running bpftool");
    assert!(out.status.success(), "{out:?}");
}

/// `to-ebpf`: a program detached behind kpng's back (`bpftool link detach`, its pin left in
/// place) is attached again at the next verification, and so are the programs of a cgroup
/// removed and created again at the same path; a restart over a detached link attaches it
/// instead of adopting it.
pub fn detached_programs_and_a_recreated_cgroup_are_attached_again(dp: Dataplane) {
    let Dataplane::Ebpf(attachment) = dp else { unreachable!("a to-ebpf scenario") };
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("client", true, 50, &[9999]);
    let manifests = web("10.96.0.88", &[WEB_A]);
    let kpng = Watched::start_with(&cluster, dp, &manifests, &["--sync-period", "1s"]);
    wait_until("kpng wrote its maps", || kpng.log().contains("eBPF maps written"));
    let translated = |what: &str, log: &str| {
        let mut pod = dp.local(&cluster.pod("client").ns);
        cluster.node.output("conntrack", &["-F"]);
        assert_eq!(pod.reach("10.96.0.88:80").2, "10.96.0.88:80", "{what}");
        let nated = conntrack(&cluster, &["-s", "10.244.0.50", "--dst-nat"]);
        assert!(nated.is_empty(), "{what}: translated at connect(): {nated:?}\n{log}");
    };
    translated("at first", &kpng.log());
    let cgroup = attachment.cgroup();
    let pin = || {
        let id = kpng_ebpf::support::cgroup_id(&cgroup).expect("the cgroup's id");
        attachment.pins().join(format!("links-{id}")).join("kpng_connect4")
    };

    // Detached, its pin left in place: the kernel no longer runs it.
    detach(&pin());
    assert!(!attachment.attached().contains("kpng_connect4"), "{}", attachment.attached());
    wait_until("the program runs again", || attachment.attached().contains("kpng_connect4"));
    let log = kpng.log();
    assert!(log.contains("programs detached behind kpng's back"), "{log}");
    assert!(log.contains("no longer runs on the cgroup: attaching it again"), "{log}");
    translated("after the detach", &log);

    // The cgroup removed and created again at the same path: a new cgroup, without programs.
    std::fs::remove_dir(&cgroup).expect("removing the test's cgroup (no process left in it)");
    std::fs::create_dir(&cgroup).expect("creating it again");
    wait_until("kpng attached to the new cgroup", || {
        kpng.log().contains("the cgroup was created again")
            && attachment.attached().contains("kpng_connect4")
    });
    translated("in the cgroup created again", &kpng.log());

    // Stopped while its link is detached, kpng starts again and attaches it.
    drop(kpng);
    detach(&pin());
    let kpng = Watched::start_with(&cluster, dp, &manifests, &["--sync-period", "1s"]);
    wait_until("the program runs again", || attachment.attached().contains("kpng_connect4"));
    wait_until("kpng said so", || kpng.log().contains("attaching it again"));
    translated("after a restart over a detached link", &kpng.log());
}

/// While the ruleset generation is still the one kpng's tables (or, with `to-iptables`,
/// its iptables-nft chains) were known at, a verification reads nothing back; another
/// process's transaction makes the next one read kpng's objects back (and find them
/// intact).
pub fn idle_verifications_read_nothing_back_until_another_transaction(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = [
        service("web", "  clusterIP: 10.96.0.93\n", PORT_HTTP),
        slice("web-1", "web", "IPv4", SLICE_HTTP, &[WEB_A]),
    ]
    .concat();
    let kpng = Watched::start_with(&cluster, dp, &manifests, &["--sync-period", "200ms"]);
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.93:80");
    let is_a = |o: &Outcome| matches!(o, Outcome::Answer { name, .. } if name == "web-a");
    assert!(is_a(&eventually(probe, is_a)), "{}", kpng.log());
    let metric = |name: &str| -> u64 {
        let out = cluster
            .node
            .output("curl", &["-s", "--max-time", "2", "http://127.0.0.1:10249/metrics"]);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    };
    let prefix = match dp {
        Dataplane::Iptables => "kpng_iptables",
        _ => "kpng_nft",
    };
    let skipped = &format!("{prefix}_verification_readbacks_skipped_total");
    let readbacks = &format!("{prefix}_verification_readbacks_total");
    let repairs = "kpng_drift_repairs_total";
    wait_until("idle verifications skip", || metric(skipped) >= 3);
    let (read_before, skipped_before) = (metric(readbacks), metric(skipped));
    wait_until("more idle verifications", || metric(skipped) >= skipped_before + 5);
    assert_eq!(
        metric(readbacks),
        read_before,
        "an idle verification read the tables back\n{}",
        kpng.log()
    );

    // Another process's transaction: the next verification reads back, finds kpng's
    // tables as committed, and repairs nothing.
    let out = cluster.node.output("nft", &["add", "table", "ip", "someone-else"]);
    assert!(out.status.success());
    wait_until("a read-back after the foreign transaction", || metric(readbacks) > read_before);
    assert_eq!(metric(repairs), 0, "{}", kpng.log());
    let skipped_after = metric(skipped);
    wait_until("skipping again", || metric(skipped) >= skipped_after + 3);
    assert_eq!(reach(&cluster.client, "10.96.0.93:80").0, "web-a");
}
