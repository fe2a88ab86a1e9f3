//! `to-iptables` faults and tampering: a refused restore is retried and the chains rebuilt,
//! a flushed chain and deleted or foreign rules are repaired at the next verification, and
//! `kpng cleanup --backend iptables` removes exactly kpng's chains.

use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

use crate::harness::*;

/// The chain a ClusterIP destination's leaf rule jumps to (`KPNG-SVC-*`), and that leaf.
fn pick_chain(cluster: &Cluster, ip: &str, port: u16) -> Option<(String, String)> {
    let entry = format!("-d {ip}/32 -p tcp -m tcp --dport {port} -j ");
    iptables_nat(cluster).into_iter().find_map(|(chain, rules)| {
        let target = rules.iter().find_map(|r| r.strip_prefix(&entry))?.to_string();
        chain.starts_with("KPNG-SH-").then_some((chain, target))
    })
}

fn iptables(cluster: &Cluster, args: &[&str]) {
    let out = cluster.node.output("iptables", args);
    assert!(out.status.success(), "iptables {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

pub fn a_refused_restore_is_retried_and_the_chains_rebuilt(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let (a, b) = (WEB_A, WEB_B);
    let web = |eps: &[Ep<'_>]| web("10.96.0.80", eps);
    let kpng = Watched::start(&cluster, dp, &web(&[a, b]));
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.80:80");
    let answers = |o: &Outcome| matches!(o, Outcome::Answer { .. });
    assert!(answers(&eventually(probe, answers)), "{}", kpng.log());
    wait_until("both endpoints are in", || slots(&cluster, dp, "10.96.0.80 . tcp . 80") == 2);

    // Someone else's rule jumps to web-b's endpoint chain: the restore that deletes that
    // chain is refused by the kernel as a whole.
    let (_, pick) = pick_chain(&cluster, "10.96.0.80", 80).expect("the service's leaf rule");
    let nat = iptables_nat(&cluster);
    let sep_b = nat[&pick]
        .iter()
        .filter_map(|r| r.rsplit("-j ").next())
        .find(|sep| {
            nat.get(*sep).is_some_and(|rules| rules.iter().any(|r| r.contains("10.244.1.10:8080")))
        })
        .expect("web-b's endpoint chain")
        .to_string();
    iptables(&cluster, &["-t", "nat", "-A", "OUTPUT", "-d", "192.0.2.1/32", "-j", &sep_b]);
    kpng.write(&web(&[a]));
    wait_until("the failure is logged", || kpng.log().contains("change set failed"));
    let log = kpng.log();
    assert!(log.contains(&format!("(\"-X {sep_b}\")")), "the refused input line is named:\n{log}");
    // What was in force stays in force: both endpoints still answer.
    assert_eq!(slots(&cluster, dp, "10.96.0.80 . tcp . 80"), 2);
    assert!(answers(&probe()));

    // The foreign reference goes: the retry, from what the kernel holds, converges.
    iptables(&cluster, &["-t", "nat", "-D", "OUTPUT", "-d", "192.0.2.1/32", "-j", &sep_b]);
    wait_until("the chains are rebuilt", || slots(&cluster, dp, "10.96.0.80 . tcp . 80") == 1);
    assert!(!iptables_nat(&cluster).contains_key(&sep_b), "the endpoint chain is gone");
    for _ in 0..8 {
        assert_eq!(answer(&probe()).0, "web-a");
    }
}

pub fn a_flushed_chain_is_repaired_at_the_next_verification(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let kpng =
        Watched::start_with(&cluster, dp, &web("10.96.0.80", &[WEB_A]), &["--sync-period", "1s"]);
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.80:80");
    let answers = |o: &Outcome| matches!(o, Outcome::Answer { .. });
    assert!(answers(&eventually(probe, answers)), "{}", kpng.log());

    // Someone flushes the dispatch chain: no service is reached any more.
    let rules = || iptables_nat(&cluster).get("KPNG-SERVICES").map_or(0, Vec::len);
    assert!(rules() > 0, "the services chain has rules");
    iptables(&cluster, &["-t", "nat", "-F", "KPNG-SERVICES"]);
    assert_eq!(rules(), 0, "flushed");
    wait_until("the chain is repaired", || kpng.log().contains(DRIFT) && rules() > 0);
    assert!(drift_named(&kpng.log(), "KPNG-SERVICES"), "{}", kpng.log());
    assert!(answers(&eventually(probe, answers)), "{}", kpng.log());
    // The repaired chains read back as committed: later verifications find nothing.
    std::thread::sleep(std::time::Duration::from_secs(3));
    assert_eq!(kpng.log().matches(DRIFT).count(), 1, "{}", kpng.log());
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

    // The service's rule in its leaf goes: the service is no longer dispatched.
    let (leaf, pick) = pick_chain(&cluster, "10.96.0.85", 80).expect("the leaf rule");
    let rule = format!("-d 10.96.0.85/32 -p tcp -m tcp --dport 80 -j {pick}");
    let mut delete = vec!["-t", "nat", "-D", &leaf];
    delete.extend(rule.split(' '));
    iptables(&cluster, &delete);
    assert!(pick_chain(&cluster, "10.96.0.85", 80).is_none());
    wait_until("the deleted rule is back", || pick_chain(&cluster, "10.96.0.85", 80).is_some());
    assert!(drift_named(&kpng.log(), &leaf), "{}", kpng.log());
    assert!(is_a(&eventually(probe, is_a)));

    // A foreign rule in kpng's chain hijacks the service to web-b.
    let hijack =
        "-d 10.96.0.85/32 -p tcp -m tcp --dport 80 -j DNAT --to-destination 10.244.1.10:8080";
    let mut insert = vec!["-t", "nat", "-I", "KPNG-SERVICES", "1"];
    insert.extend(hijack.split(' '));
    iptables(&cluster, &insert);
    wait_until("the foreign rule is gone", || {
        !iptables_nat(&cluster)["KPNG-SERVICES"].iter().any(|r| r.contains("10.244.1.10"))
    });
    for _ in 0..6 {
        assert!(is_a(&probe()), "traffic is kpng's again");
    }
}

pub fn cleanup_removes_exactly_kpngs_chains(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    program(&cluster, dp, &web("10.96.0.10", &[WEB_A]), &[]);
    assert_eq!(reach(&cluster.client, "10.96.0.10:80").0, "web-a");
    // Someone else's chain and rule, which cleanup must leave.
    iptables(&cluster, &["-t", "nat", "-N", "OTHER-CHAIN"]);
    iptables(&cluster, &["-t", "nat", "-A", "PREROUTING", "-j", "OTHER-CHAIN"]);
    let cleanup = |backend: &str| {
        let args = ["cleanup", "--backend", backend].map(String::from);
        let out = dp.kpng(&cluster, &args).output().expect("running kpng cleanup");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    // `--backend nft` leaves iptables' chains.
    cleanup("nft");
    assert!(iptables_nat(&cluster).contains_key("KPNG-SERVICES"));
    cleanup("iptables");
    let saved =
        |cmd: &str| String::from_utf8_lossy(&cluster.node.output(cmd, &[]).stdout).into_owned();
    for cmd in ["iptables-save", "ip6tables-save"] {
        assert!(!saved(cmd).contains("KPNG"), "{cmd}: {}", saved(cmd));
    }
    assert!(saved("iptables-save").contains("-A PREROUTING -j OTHER-CHAIN"));
    assert_eq!(Cluster::tcp(&cluster.client, "10.96.0.10:80"), Outcome::Timeout);
}

pub fn the_legacy_variant_serves_restarts_and_cleans_up(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = web("10.96.0.12", &[WEB_A]);
    let legacy = ["--iptables-mode", "legacy"];
    program(&cluster, dp, &manifests, &legacy);
    let saved = |cmd: &str| {
        String::from_utf8_lossy(&cluster.node.output(cmd, &["-t", "nat"]).stdout).into_owned()
    };
    assert!(
        saved("iptables-legacy-save").contains(":KPNG-SERVICES"),
        "{}",
        saved("iptables-legacy-save")
    );
    assert!(!saved("iptables-nft-save").contains("KPNG"), "nothing in the other variant");
    assert_eq!(reach(&cluster.client, "10.96.0.12:80").0, "web-a");
    let log = program(&cluster, dp, &manifests, &legacy);
    assert!(log.contains("already holds this state"), "a restart reads the legacy tables: {log}");
    let out = dp.kpng(&cluster, &["cleanup", "--backend", "iptables"].map(String::from)).output();
    let out = out.expect("running kpng cleanup");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!saved("iptables-legacy-save").contains("KPNG"), "{}", saved("iptables-legacy-save"));
    assert_eq!(Cluster::tcp(&cluster.client, "10.96.0.12:80"), Outcome::Timeout);
}

pub fn auto_mode_follows_the_variant_the_kubelet_uses(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    // Earlier runs left kpng's chains in both variants.
    let manifests = web("10.96.0.13", &[WEB_A]);
    program(&cluster, dp, &manifests, &["--iptables-mode", "nft"]);
    program(&cluster, dp, &manifests, &["--iptables-mode", "legacy"]);
    // The kubelet of this node uses iptables-legacy (the system's iptables is nf_tables).
    let out = cluster.node.output("iptables-legacy", &["-t", "mangle", "-N", "KUBE-IPTABLES-HINT"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let log = program(&cluster, dp, &manifests, &[]);
    assert!(log.contains("the kubelet's chains are in iptables-legacy"), "{log}");
    assert!(log.contains("kpng's chains are in both variants"), "{log}");
    let saved = |cmd: &str| {
        String::from_utf8_lossy(&cluster.node.output(cmd, &["-t", "nat"]).stdout).into_owned()
    };
    assert!(saved("iptables-legacy-save").contains(":KPNG-SERVICES"), "{log}");
    assert!(!saved("iptables-nft-save").contains("KPNG"), "nothing in the other variant");
    assert_eq!(reach(&cluster.client, "10.96.0.13:80").0, "web-a");
}

/// `to-iptables` on the legacy variant: while another process holds the xtables lock, the
/// restore waits for it and kpng says so, naming the lock.
pub fn waiting_for_the_xtables_lock_is_logged_with_its_path(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let dir = tempfile::tempdir().unwrap();
    let lock = dir.path().join("xtables.lock");
    std::fs::write(&lock, "").unwrap();
    // Another process holds the lock for a while.
    let mut holder = std::process::Command::new("flock")
        .arg(&lock)
        .args(["sleep", "2"])
        .spawn()
        .expect("running flock");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, format!("{NODE_A}{}", web("10.96.0.14", &[WEB_A]))).unwrap();
    let args = dp.args(&path, false, &["--once", "--iptables-mode", "legacy"]);
    let out = dp.kpng(&cluster, &args).env("XTABLES_LOCKFILE", &lock).output().unwrap();
    let _ = holder.wait();
    let log = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{log}");
    let said = format!("lock={}", lock.display());
    assert!(log.contains("holds the xtables lock; waiting for it") && log.contains(&said), "{log}");
    assert_eq!(reach(&cluster.client, "10.96.0.14:80").0, "web-a");
}

/// `--localhost-nodeports`: IPv4 NodePorts on 127.0.0.1 too, as kube-proxy's iptables mode
/// accepts them. `route_localnet` makes 127.0.0.0/8 routable, so a neighbour could send
/// datagrams to the node's own loopback services: kpng drops what arrives from elsewhere
/// for 127.0.0.0/8 and is not NodePort traffic.
pub fn localhost_node_ports_and_the_martians_they_let_in(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = [
        service(
            "web",
            "  type: NodePort\n  clusterIP: 10.96.0.92\n",
            "  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30092}\n",
        ),
        slice("web-1", "web", "IPv4", SLICE_HTTP, &[WEB_A]),
    ]
    .concat();
    let everywhere = ["--nodeport-addresses", "0.0.0.0/0"];
    program(&cluster, dp, &manifests, &everywhere);
    assert_eq!(Cluster::tcp(&cluster.node, "127.0.0.1:30092"), Outcome::Refused, "off by default");

    // A UDP service of the node's own, on its loopback, and a neighbour that routes
    // 127.0.0.1 to the node (its own loopback route removed).
    let datagrams = udp_receiver(&cluster.node, 7777);
    let client = &cluster.client;
    client.ip(&["route", "del", "local", "127.0.0.0/8", "dev", "lo", "table", "local"]);
    client.ip(&["route", "del", "local", "127.0.0.1", "dev", "lo", "table", "local"]);
    client.ip(&["route", "add", "127.0.0.1/32", "via", "192.168.10.1", "src", "192.168.10.100"]);
    let send = |text: &'static str| {
        kpng_testkit::topology::in_netns(client, move || {
            let socket = std::net::UdpSocket::bind("192.168.10.100:0").unwrap();
            socket.send_to(text.as_bytes(), "127.0.0.1:7777").unwrap();
        })
    };
    let got = |want: &str| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match datagrams.recv_timeout(left) {
                Ok(text) if text == want => return true,
                Ok(_) => continue,
                Err(_) => return false,
            }
        }
        false
    };
    // What route_localnet alone lets in.
    cluster.node.sysctl("net.ipv4.conf.all.route_localnet", "1");
    send("exposed");
    assert!(got("exposed"), "the test's neighbour cannot reach the node's loopback");

    program(&cluster, dp, &manifests, &[&everywhere[..], &["--localhost-nodeports"]].concat());
    assert_eq!(reach(&cluster.node, "127.0.0.1:30092").0, "web-a");
    send("dropped");
    assert!(!got("dropped"), "a neighbour's datagram reached the node's loopback service");
}

/// The datagrams a UDP socket on `port` of `ns` receives.
fn udp_receiver(ns: &kpng_testkit::netns::Netns, port: u16) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    let (bound, ready) = std::sync::mpsc::channel();
    kpng_testkit::topology::spawn_in_netns(ns, move || {
        let socket = std::net::UdpSocket::bind(("0.0.0.0", port)).unwrap();
        let _ = bound.send(());
        let mut buf = [0u8; 64];
        while let Ok(n) = socket.recv(&mut buf) {
            if tx.send(String::from_utf8_lossy(&buf[..n]).into_owned()).is_err() {
                return;
            }
        }
    });
    ready.recv().unwrap();
    rx
}

/// Whether the log reports drift whose first object names `chain`.
fn drift_named(log: &str, chain: &str) -> bool {
    log.lines().any(|l| l.contains("no longer holds what kpng committed") && l.contains(chain))
}
