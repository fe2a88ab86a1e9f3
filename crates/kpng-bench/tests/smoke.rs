//! A smoke run of the benchmark at a small size: every scenario runs and prints a table
//! that parses. No timing is judged here; the numbers belong to BENCHMARKS.md.

use std::process::Command;

/// The rows of the table that follows the line starting with `title`, split on spaces
/// and `|`, up to the next blank line.
fn table(out: &str, title: &str) -> Vec<Vec<String>> {
    let mut lines = out.lines().skip_while(|l| !l.starts_with(title)).skip(1);
    let header = lines.next().unwrap_or_else(|| panic!("no {title:?} table in:\n{out}"));
    assert!(!header.trim().is_empty(), "{title}: no header");
    lines
        .take_while(|l| !l.trim().is_empty() && !l.starts_with('*'))
        .map(|l| l.split(['|', ' ']).filter(|f| !f.is_empty()).map(String::from).collect())
        .collect()
}

fn number(field: &str) -> f64 {
    field.parse().unwrap_or_else(|_| panic!("not a number: {field:?}"))
}

#[test]
fn every_scenario_runs_and_prints_its_table() {
    if !kpng_testkit::privileged::require(
        "every_scenario_runs_and_prints_its_table",
        &["nft", "ip", "nftlb", "iptables-restore"],
    ) {
        return;
    }
    let kpng = std::path::Path::new(env!("CARGO_BIN_EXE_kpng-bench")).with_file_name("kpng");
    let memory = if kpng.exists() { "300" } else { "0" };
    let storm_rates = if kpng.exists() { "50" } else { "0" };
    let plot = tempfile::NamedTempFile::new().expect("temporary file");
    let out = Command::new(env!("CARGO_BIN_EXE_kpng-bench"))
        .args(["--services", "300", "--repeat", "5", "--reloads", "1"])
        .args(["--churn-rates", "100", "--churn-seconds", "1", "--churn-services", "300"])
        .args(["--memory-services", memory, "--api-streams", "10", "--api-services", "300"])
        .args(["--api-repeat", "2", "--cold-services", memory])
        .args(["--nftlb-services", "20", "--nftlb-repeat", "2"])
        .args(["--dataplane-services", "20,40", "--dataplane-counts", "2,200"])
        .args(["--dataplane-connections", "50", "--dataplane-backends", "nft,iptables"])
        .args(["--iptables-services", "300"])
        .args(["--kube-services", "300"])
        .args(["--restart-stale", "300", "--restart-kept", "30"])
        .args(["--storm-services", "300", "--storm-rates", storm_rates, "--storm-seconds", "1"])
        .args(["--storm-min-sync-periods", "200ms"])
        .args(["--idle-services", memory, "--idle-seconds", "1", "--idle-sync-period", "1s"])
        .args(["--paths-services", memory])
        .arg("--plot")
        .arg(plot.path())
        .output()
        .expect("run kpng-bench");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));

    let changes: Vec<_> = table(&stdout, "nftables backend")
        .into_iter()
        .filter(|r| r.len() > 10 && r[0] != "services")
        .collect();
    let kinds: Vec<String> = changes.iter().map(|r| format!("{} {}", r[6], r[7])).collect();
    assert_eq!(
        kinds,
        ["endpoint add", "endpoint remove", "endpoint replace", "service add", "service delete"]
    );
    for row in &changes {
        assert_eq!(row[0], "300");
        row[8..].iter().for_each(|f| assert!(number(f) >= 0.0));
    }

    let kube: Vec<_> = table(&stdout, "one change through the kube source")
        .into_iter()
        .map(|r| (r[0].clone(), format!("{} {}", r[2], r[3]), r[4..].to_vec()))
        .collect();
    assert_eq!(
        kube.iter().map(|(_, kind, _)| kind.as_str()).collect::<Vec<_>>(),
        ["endpoint add", "endpoint remove", "service add", "service delete"]
    );
    for (services, _, numbers) in &kube {
        assert_eq!(services, "300");
        numbers.iter().for_each(|f| assert!(number(f) > 0.0, "{numbers:?}"));
    }

    let churn = table(&stdout, "churn:");
    assert_eq!(churn.len(), 1, "{churn:?}");
    let dropped = number(&churn[0][churn[0].len() - 2]);
    assert!((0.0..=100.0).contains(&dropped), "{dropped}");
    let revisions_per_event = number(&churn[0][churn[0].len() - 3]);
    assert!((0.0..=100.0).contains(&revisions_per_event), "{revisions_per_event}");

    if memory != "0" {
        let memory = table(&stdout, "memory:");
        assert_eq!(memory.iter().map(|r| r[0].as_str()).collect::<Vec<_>>(), ["0", "300"]);
    }

    if memory != "0" {
        let cold = table(&stdout, "cold start:");
        assert_eq!(cold.len(), 1, "{cold:?}");
        // Time to the sync, the API server's own lists and the sync above them, peak, and
        // the resident set once synced (at most the peak).
        let field = |i: usize| number(&cold[0][i]);
        let (sync, api, above) = (field(2), field(3), field(4));
        assert!(api > 0.0 && (sync - api - above).abs() < 0.2, "{cold:?}");
        let (peak, synced) = (field(5), field(6));
        assert!(sync > 0.0 && synced > 0.0 && synced <= peak, "{cold:?}");
    }

    let restart = table(&stdout, "Restart over a stale table");
    assert_eq!(restart.len(), 1, "{restart:?}");
    assert_eq!((restart[0][0].as_str(), restart[0][1].as_str()), ("300", "30"), "{restart:?}");
    let (before, after) = (number(&restart[0][2]), number(&restart[0][4]));
    assert!(before > after && after > 0.0, "the stale elements went: {restart:?}");
    restart[0][5..].iter().for_each(|f| assert!(number(f) >= 0.0, "{restart:?}"));

    if storm_rates != "0" {
        let storm = table(&stdout, "storm:");
        let runs: Vec<(&str, &str, &str)> =
            storm.iter().map(|r| (r[0].as_str(), r[1].as_str(), r[2].as_str())).collect();
        assert_eq!(runs, [("300", "50", "default"), ("300", "50", "200ms")], "{storm:?}");
        for row in &storm {
            let (events, seen) = (number(&row[3]), number(&row[4]));
            assert!(events == 50.0 && seen > 0.0 && seen <= events, "{row:?}");
            row[5..].iter().for_each(|f| assert!(number(f) >= 0.0, "{row:?}"));
        }
    }

    if memory != "0" {
        let idle = table(&stdout, "idle:");
        assert_eq!(idle.len(), 1, "{idle:?}");
        assert_eq!(idle[0][0], "300", "{idle:?}");
        let repairs = (number(&idle[0][6]), number(&idle[0][7]));
        // Both foreign changes repaired, each within a few verifications of 1 s.
        assert!(repairs.0 < 10.0 && repairs.1 < 10.0, "{idle:?}");
        idle[0][1..].iter().for_each(|f| assert!(number(f) >= 0.0, "{idle:?}"));
    }

    if memory != "0" {
        let paths = table(&stdout, "paths:");
        let processes: Vec<(&str, &str)> =
            paths.iter().map(|r| (r[1].as_str(), r[2].as_str())).collect();
        assert_eq!(
            processes,
            [
                ("one-process", "kpng_kube_to-local_to-nft"),
                ("split", "kpng_kube_to-api"),
                ("split", "kpng_local_to-nft"),
                ("aggregator", "kpng_kube_to-local_to-nft_--aggregator"),
                ("aggregator", "kpng_aggregate"),
            ],
            "{paths:?}"
        );
        for row in &paths {
            let (rss, peak) = (number(&row[3]), number(&row[4]));
            assert!(rss > 1000.0 && peak >= rss, "{row:?}");
        }
    }

    let nftlb = table(&stdout, "nftlb:");
    // Ten values after the operation: nftlb, to-nftlb, to-nft and annotated to-nft (p50,
    // p99 each), then two ratios.
    let operations: Vec<String> = nftlb.iter().map(|r| r[2..r.len() - 10].join(" ")).collect();
    assert_eq!(
        operations,
        [
            "load 20 services",
            "create svc, 10 eps",
            "delete svc, 10 eps",
            "create svc, 50 eps",
            "delete svc, 50 eps",
            "create svc, 100 eps",
            "delete svc, 100 eps",
            "endpoint add",
            "endpoint remove"
        ]
    );
    for row in nftlb.iter() {
        assert_eq!(row[0], "20");
        let values = &row[row.len() - 10..];
        // Annotated to-nft is measured for creations and deletions only.
        let annotated = row.iter().any(|f| f == "svc,");
        for (i, f) in values.iter().enumerate() {
            if (6..8).contains(&i) && !annotated {
                assert_eq!(f, "-", "{row:?}");
            } else {
                assert!(number(f) >= 0.0, "{row:?}");
            }
        }
    }

    // to-iptables: each kind of change, at the size asked for, with its chains written.
    let iptables = table(&stdout, "iptables backend");
    let kinds: Vec<String> = iptables.iter().map(|r| format!("{} {}", r[4], r[5])).collect();
    assert_eq!(kinds, ["endpoint add", "endpoint remove", "service add", "service delete"]);
    for row in &iptables {
        assert_eq!((row[0].as_str(), row[1].as_str()), ("300", "4"), "{row:?}");
        assert!(number(&row[2]) > 0.0 && number(&row[3]) > 0.0, "chains and cold start: {row:?}");
        row[6..].iter().for_each(|f| assert!(number(f) >= 0.0, "{row:?}"));
    }

    // Each backend, size and number of distinct endpoint counts (`--dataplane-counts`).
    let dataplane = table(&stdout, "dataplane:");
    let sizes: Vec<(&str, &str, &str)> =
        dataplane.iter().map(|r| (r[0].as_str(), r[1].as_str(), r[2].as_str())).collect();
    let expected: Vec<(&str, &str, &str)> = ["to-nft", "to-iptables"]
        .into_iter()
        .flat_map(|b| [(b, "20", "2"), (b, "20", "200"), (b, "40", "2"), (b, "40", "200")])
        .collect();
    assert_eq!(sizes, expected, "each backend with each size and count");
    for row in &dataplane {
        assert_eq!(row[3], "50");
        // Latencies are positive; a ratio to the first size can round to 0.00 when the
        // first size had an outlier (timings are not judged here).
        row[4..9].iter().for_each(|f| assert!(number(f) > 0.0, "{row:?}"));
        row[9..].iter().for_each(|f| assert!(number(f) >= 0.0, "{row:?}"));
    }

    // eBPF: one endpoint change through both backends, and a pod's connections by every
    // path; only the nftables path NATs.
    let changes = table(&stdout, "ebpf changes:");
    assert_eq!(changes.iter().map(|r| r[0].as_str()).collect::<Vec<_>>(), ["1000"]);
    let paths = table(&stdout, "ebpf: a pod");
    let paths: Vec<&Vec<String>> = paths.iter().filter(|r| r[1] != "services:").collect();
    let names: Vec<&str> = paths.iter().map(|r| r[1].as_str()).collect();
    assert_eq!(names, ["ebpf", "nft", "direct", "direct+cg"]);
    let nat = |row: &Vec<String>| number(&row[row.len() - 3]);
    assert!(nat(paths[0]) == 0.0 && nat(paths[1]) > 0.0, "{paths:?}");

    let svg = std::fs::read_to_string(plot.path()).expect("the plot was written");
    for section in ["One endpoint added", "Cold start", "nftlb's REST API", "First packet"] {
        assert!(svg.contains(section), "no {section:?} section in the plot");
    }

    let api = table(&stdout, "api:");
    assert_eq!(
        api.iter().map(|r| (r[0].as_str(), r[1].as_str())).collect::<Vec<_>>(),
        [("10", "10"), ("10", "1")]
    );
    for row in &api {
        row[3..].iter().for_each(|f| assert!(number(f) >= 0.0));
    }
}

#[test]
fn the_memory_split_counts_bytes_allocations_and_chunks() {
    let out = Command::new(env!("CARGO_BIN_EXE_kpng-memory-split"))
        .args(["--services", "2000"])
        .output()
        .expect("run kpng-memory-split");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let row = |title: &str| -> Vec<String> {
        let rows: Vec<_> =
            table(&stdout, title).into_iter().filter(|r| r[0] != "services").collect();
        assert_eq!(rows.len(), 1, "{title}:\n{stdout}");
        assert_eq!(rows[0][..2], ["2000", "4"], "{stdout}");
        rows[0][2..].to_vec()
    };
    // Six layers, each "held (peak)" and "allocations chunks".
    let held = row("where the memory goes");
    let counted = row("allocations each step left live");
    assert_eq!((held.len(), counted.len()), (12, 12), "{stdout}");
    // The fingerprints the runner keeps cost less than the node state they stand for.
    assert!(number(&held[4]) < number(&held[2]) / 2.0, "{stdout}");
    for layer in 0..6 {
        let bytes = number(&held[2 * layer]);
        let peak = number(held[2 * layer + 1].trim_matches(['(', ')']));
        let allocations = number(counted[2 * layer].trim_end_matches('k'));
        let chunks = number(&counted[2 * layer + 1]);
        assert!(bytes > 0.0 && peak >= bytes, "layer {layer}: {stdout}");
        assert!(allocations > 0.0, "layer {layer}: {stdout}");
        // Every chunk is larger than what it holds.
        assert!(chunks >= bytes, "layer {layer}: {stdout}");
    }
}
