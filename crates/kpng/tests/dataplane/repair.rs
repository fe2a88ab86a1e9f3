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
            "cluster_backends",
            "{ 10.96.0.80 . tcp . 80 . 1 : 10.244.1.10 . 8080 }",
        ],
    );
    kpng.write(&web(&[a]));
    wait_until("the failure is logged", || kpng.log().contains("change set failed"));
    let log = kpng.log();
    assert!(
        log.contains("the kernel rejected `delete element ip kpng"),
        "the failing operation is named:\n{log}"
    );
    // The retry starts from what the kernel holds and converges: only web-a remains.
    wait_until("the table is repaired", || slots(&cluster, "10.96.0.80 . tcp . 80") == 1);
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
    while !(kpng.log().contains("dataplane drifted") && rules() > 0) {
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
