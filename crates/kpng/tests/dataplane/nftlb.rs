//! `to-nftlb` with real packets: the Debian package's nftlb daemon in the node namespace,
//! driven by kpng from the manifests; connections from the client namespace through the
//! cluster IP reach the endpoints nftlb was given, follow endpoint changes and the
//! load-balancing annotations (round robin, dnat, persistence, the FTP helper), and `kpng
//! cleanup --backend nftlb` removes the farms.

use std::process::{Child, Stdio};

use kpng_testkit::privileged::require;
use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

use crate::annotations::{CLIENT, annotated_on, answered_directly, direct_endpoints};
use crate::harness::*;

const URL: &str = "http://127.0.0.1:5555";

/// A process of the test's, killed when the test ends, passed or failed.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The farms nftlb lists (`GET /farms`).
fn farms(cluster: &Cluster, key: &str) -> String {
    let header = format!("Key: {key}");
    let out = cluster.node.output("curl", &["-s", "-H", &header, &format!("{URL}/farms")]);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn to_nftlb_serves_cluster_ips_follows_endpoints_and_cleans_up() {
    if !require("to-nftlb with real packets", &["nftlb", "nft", "ip", "curl"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let dir = tempfile::tempdir().unwrap();
    let key = "kpng-test-key";
    let key_file = dir.path().join("nftlb.key");
    std::fs::write(&key_file, format!("{key}\n")).unwrap();
    let nftlb = cluster
        .node
        .command("nftlb", &["-H", "127.0.0.1", "-P", "5555", "-l", "0", "-L", "0"])
        .env("NFTLB_SERVER_KEY", key)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting nftlb");
    let _nftlb = Killed(nftlb);
    wait_until("nftlb's API answers", || farms(&cluster, key).contains("farms"));

    let manifests = dir.path().join("cluster.yaml");
    let write = |text: &str| {
        let tmp = dir.path().join("edit.tmp");
        std::fs::write(&tmp, format!("{NODE_A}{text}")).unwrap();
        std::fs::rename(&tmp, &manifests).unwrap();
    };
    write(&web("10.96.0.90", &[WEB_A, WEB_B]));
    let log_path = dir.path().join("kpng.log");
    let key_path = key_file.display().to_string();
    let input = manifests.display().to_string();
    let args = [
        "file",
        "--input",
        &input,
        "--watch",
        "to-local",
        "--node",
        "node-a",
        "to-nftlb",
        "--nftlb-url",
        URL,
        "--nftlb-key-file",
        &key_path,
        "--nftlb-interface",
        "eth0",
    ];
    let kpng = cluster
        .node
        .command(env!("CARGO_BIN_EXE_kpng"), &args)
        .stderr(std::fs::File::create(&log_path).unwrap())
        .spawn()
        .expect("starting kpng");
    let _kpng = Killed(kpng);
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();

    // Both endpoints, one on this node and one on the other, are reached.
    let answers = |o: &Outcome| matches!(o, Outcome::Answer { .. });
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.90:80");
    assert!(answers(&eventually(probe, answers)), "{}\n{}", log(), farms(&cluster, key));
    let listed = farms(&cluster, key);
    assert!(listed.contains("\"test--web--http\""), "{listed}");
    let names = tcp_names(&cluster.client, "10.96.0.90:80", 24);
    assert_eq!(names, ["web-a", "web-b"].map(String::from).into(), "{}", log());

    // web-b goes: one backend deleted, and every connection reaches web-a.
    write(&web("10.96.0.90", &[WEB_A]));
    wait_until("web-b's backend is gone", || !farms(&cluster, key).contains("10.244.1.10"));
    for _ in 0..8 {
        assert_eq!(reach(&cluster.client, "10.96.0.90:80").0, "web-a", "{}", log());
    }
    assert!(log().contains("nftlb farms updated"), "{}", log());

    // The load-balancing annotations become farm fields: round robin alternates...
    write(&annotated_on("web", "10.96.0.90", &[("scheduler", "rr")], "", &[WEB_A, WEB_B]));
    wait_until("the farm is round robin with both backends", || {
        let listed = farms(&cluster, key);
        listed.contains("\"scheduler\": \"rr\"") && listed.contains("10.244.1.10")
    });
    let names: Vec<String> = (0..8).map(|_| reach(&cluster.client, "10.96.0.90:80").0).collect();
    for pair in names.windows(2) {
        assert_ne!(pair[0], pair[1], "each connection takes the next endpoint: {names:?}");
    }
    // ...and dnat shows the endpoint the client's own address.
    write(&annotated_on("web", "10.96.0.90", &[("mode", "dnat")], "", &[WEB_A]));
    wait_until("the farm is in dnat mode with web-a alone", || {
        let listed = farms(&cluster, key);
        listed.contains("\"mode\": \"dnat\"") && !listed.contains("10.244.1.10")
    });
    for _ in 0..4 {
        assert_eq!(reach(&cluster.client, "10.96.0.90:80"), ("web-a".into(), ip(CLIENT)));
    }

    // persistence: every connection of one client reaches one endpoint.
    let sticky =
        annotated_on("web", "10.96.0.90", &[("persistence", "srcip")], "", &[WEB_A, WEB_B]);
    write(&sticky);
    wait_until("the farm is sticky by source address with both backends", || {
        let listed = farms(&cluster, key);
        listed.contains("\"persistence\": \"srcip") && listed.contains("10.244.1.10")
    });
    let first = reach(&cluster.client, "10.96.0.90:80").0;
    for _ in 0..8 {
        assert_eq!(reach(&cluster.client, "10.96.0.90:80").0, first, "sticky");
    }

    // helper: nftlb's FTP helper carries an active-mode data connection.
    cluster.add_pod("ftp-a", true, 30, &[]);
    kpng_testkit::ftp::serve(&cluster.pod("ftp-a").ns, "ftp-a", 8080);
    let ftp_a: Ep<'_> = ("10.244.0.30", "node-a", true, true, false);
    let files = annotated_on("files", "10.96.0.91", &[("helper", "ftp")], "", &[ftp_a]);
    write(&[sticky.clone(), files.clone()].concat());
    wait_until("the files farm has the FTP helper", || {
        farms(&cluster, key).contains("\"helper\": \"ftp\"")
    });
    let server = "10.96.0.91:80".parse().unwrap();
    let got = kpng_testkit::ftp::retrieve(&cluster.client, server).expect("an active-mode RETR");
    assert!(got.content.starts_with("ftp-a "), "{got:?}");

    // dsr: a farm forwarding at the LAN interface's ingress to the endpoints' link-layer
    // addresses, which answer the client directly.
    let direct = direct_endpoints(&mut cluster, "10.96.0.92");
    write(&[sticky, files, direct].concat());
    wait_until("the direct farm is in dsr mode with both backends", || {
        let listed = farms(&cluster, key);
        listed.contains("\"mode\": \"dsr\"") && listed.contains("192.168.10.4")
    });
    answered_directly(&cluster, "10.96.0.92:80", &|| {
        format!("{}\n{}", log(), farms(&cluster, key))
    });

    // cleanup removes kpng's farms; the cluster IP is no longer served.
    drop(_kpng);
    let cleanup =
        ["cleanup", "--backend", "nftlb", "--nftlb-url", URL, "--nftlb-key-file", &key_path];
    let out = cluster.node.output(env!("CARGO_BIN_EXE_kpng"), &cleanup);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("removed 3 nftlb farms"));
    assert!(!farms(&cluster, key).contains("test--web--http"), "{}", farms(&cluster, key));
    let after = Cluster::tcp(&cluster.client, "10.96.0.90:80");
    assert!(!answers(&after), "nothing serves the cluster IP after cleanup: {after}");
}
