//! kpng over time: restarts, edits while traffic flows, UDP flows, health checks.

use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

use crate::harness::*;

pub fn restart_changes_nothing_and_keeps_established_connections(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = web("10.96.0.10", &[WEB_A]);
    program(&cluster, dp, &manifests, &[]);
    // Hold a connection open through the service.
    let (to_conn, from_test) = std::sync::mpsc::channel::<()>();
    let (to_test, from_conn) = std::sync::mpsc::channel::<Vec<String>>();
    let client = cluster.client.name().to_string();
    let holder = std::thread::spawn(move || {
        use std::io::{BufRead, BufReader, Write};
        let ns = std::fs::File::open(format!("/var/run/netns/{client}")).unwrap();
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let stream = std::net::TcpStream::connect("10.96.0.10:80").unwrap();
        stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut lines = vec![String::new()];
        reader.read_line(&mut lines[0]).unwrap();
        from_test.recv().unwrap();
        (&stream).write_all(b"again\n").unwrap();
        let mut second = String::new();
        let _ = reader.read_line(&mut second);
        lines.push(second);
        to_test.send(lines).unwrap();
    });
    // Restart kpng over the existing table (and programs and maps).
    let stderr = program(&cluster, dp, &manifests, &[]);
    assert!(
        dp.started_without_changes(&stderr),
        "a restart with nothing to change changes nothing: {stderr}"
    );
    to_conn.send(()).unwrap();
    let lines = from_conn.recv().unwrap();
    holder.join().unwrap();
    assert!(lines[0].starts_with("web-a "), "{lines:?}");
    assert!(
        lines[1].starts_with("web-a "),
        "the established connection still works after the restart: {lines:?}"
    );
}

pub fn udp_flows_move_when_their_endpoint_goes(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("dns-a", true, 10, &[8080]);
    cluster.add_pod("dns-b", false, 10, &[8080]);
    let to = |ep: &[(&str, &str, bool, bool, bool)]| {
        [
            service("dns", "  clusterIP: 10.96.0.50\n", DNS_PORT),
            slice("dns-1", "dns", "IPv4", SLICE_DNS, ep),
        ]
        .concat()
    };
    let a = ("10.244.0.10", "node-a", true, true, false);
    let b = ("10.244.1.10", "node-b", true, true, false);

    // A flow created before any rule exists: it leaves the node towards its default route.
    assert_eq!(Cluster::udp(&cluster.client, "10.96.0.51:53", 40001), Outcome::Timeout);

    // The flow to the removed endpoint must move to the remaining one: its entry is deleted.
    program(
        &cluster,
        dp,
        &(to(&[b])
            + &service("late", "  clusterIP: 10.96.0.51\n", DNS_PORT)
            + &slice("late-1", "late", "IPv4", SLICE_DNS, &[a])),
        &[],
    );
    assert_eq!(answer(&Cluster::udp(&cluster.client, "10.96.0.50:53", 40000)).0, "dns-b");
    // The entry that predates the rules is gone too: the same flow now reaches the endpoint.
    assert_eq!(answer(&Cluster::udp(&cluster.client, "10.96.0.51:53", 40001)).0, "dns-a");
    program(&cluster, dp, &to(&[a]), &[]);
    assert_eq!(answer(&Cluster::udp(&cluster.client, "10.96.0.50:53", 40000)).0, "dns-a");

    // Scale to zero while kpng watches the file: the flow is rejected, not blackholed.
    let kpng = Watched::start(&cluster, dp, &to(&[a]));
    let probe = || Cluster::udp(&cluster.client, "10.96.0.50:53", 40002);
    assert_eq!(answer(&eventually(probe, |o| matches!(o, Outcome::Answer { .. }))).0, "dns-a");
    kpng.write(&to(&[]));
    assert_eq!(eventually(probe, |o| *o == Outcome::Refused), Outcome::Refused);
}

pub fn updates_apply_while_traffic_flows(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let (a, b) = (WEB_A, WEB_B);
    let web = |eps: &[Ep<'_>]| web("10.96.0.60", eps);
    let kpng = Watched::start(&cluster, dp, &web(&[a]));
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.60:80");
    let is = |name: &'static str| move |o: &Outcome| matches!(o, Outcome::Answer { name: n, .. } if n == name);
    assert!(is("web-a")(&eventually(probe, is("web-a"))));

    // Endpoint added: the new one starts answering.
    kpng.write(&web(&[a, b]));
    assert!(is("web-b")(&eventually(probe, is("web-b"))));
    // Endpoint removed: only the other one answers from then on.
    kpng.write(&web(&[b]));
    // Wait until the kernel holds the one-endpoint state, then every probe must agree.
    wait_until("the removal is applied", || slots(&cluster, dp, "10.96.0.60 . tcp . 80") == 1);
    for _ in 0..10 {
        assert!(is("web-b")(&probe()));
    }
    // Service deleted: its address is no longer a service (the node routes it away).
    kpng.write("");
    assert_eq!(eventually(probe, |o| *o == Outcome::Timeout), Outcome::Timeout);
}

pub fn health_check_node_ports_follow_local_endpoints_and_ports(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let web = |hc_port: u16, endpoints: &[(&str, &str, bool, bool, bool)]| {
        service(
            "lb",
            &format!(
                "  type: LoadBalancer\n  clusterIP: 10.96.0.90\n  externalTrafficPolicy: Local\n  healthCheckNodePort: {hc_port}\n"
            ),
            "  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30090}\n",
        ) + "status:\n  loadBalancer:\n    ingress: [{ip: 203.0.113.90}]\n"
            + &slice("lb-1", "lb", "IPv4", SLICE_HTTP, endpoints)
    };
    let a = ("10.244.0.10", "node-a", true, true, false);
    let b = ("10.244.1.10", "node-b", true, true, false);
    let kpng = Watched::start(&cluster, dp, &web(32100, &[a, b]));
    // What a load balancer's health check sees, from outside the node.
    let check = |port: u16| {
        let url = format!("http://192.168.10.1:{port}/healthz");
        let out = cluster.client.output("curl", &["-s", "-i", "--max-time", "2", &url]);
        String::from_utf8_lossy(&out.stdout).replace("\r\n", "\n")
    };
    let wait = |port: u16, want: &str| {
        let start = std::time::Instant::now();
        loop {
            let got = check(port);
            if got.contains(want) {
                return got;
            }
            assert!(
                start.elapsed().as_secs() < 20,
                "port {port}: want {want:?}, got {got:?}\n{}",
                kpng.log()
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    };
    let ok = wait(32100, "HTTP/1.1 200");
    assert!(ok.contains("x-load-balancing-endpoint-weight: 1"), "{ok}");
    assert!(ok.contains("\"localEndpoints\":1"), "{ok}");
    assert!(ok.contains("\"name\":\"lb\""), "{ok}");

    // No local endpoint left: 503, weight 0.
    kpng.write(&web(32100, &[b]));
    let down = wait(32100, "HTTP/1.1 503");
    assert!(down.contains("x-load-balancing-endpoint-weight: 0"), "{down}");
    assert!(down.contains("\"localEndpoints\":0"), "{down}");

    // The port moves: the new one answers, the old one is closed.
    kpng.write(&web(32101, &[a]));
    wait(32101, "HTTP/1.1 200");
    let start = std::time::Instant::now();
    while !check(32100).is_empty() {
        assert!(start.elapsed().as_secs() < 20, "port 32100 still open");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

pub fn a_second_kpng_on_the_node_exits_naming_the_first(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = web("10.96.0.66", &[WEB_A]);
    let first = Watched::start(&cluster, dp, &manifests);
    let probe = || Cluster::tcp(&cluster.client, "10.96.0.66:80");
    let answers = |o: &Outcome| matches!(o, Outcome::Answer { .. });
    assert!(answers(&eventually(probe, answers)), "{}", first.log());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, format!("{NODE_A}{manifests}")).unwrap();
    let started = std::time::Instant::now();
    let out = dp.kpng(&cluster, &dp.args(&path, false, &[])).output().expect("running kpng");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the second kpng must not run: {stderr}");
    assert!(started.elapsed() < std::time::Duration::from_secs(10), "it exits at start");
    assert!(stderr.contains("another kpng already programs"), "{stderr}");
    assert!(stderr.contains(&format!("pid {}", first.pid())), "the holder is named: {stderr}");
    assert!(answers(&probe()), "the first one is undisturbed");
}

/// Conntrack is tuned at start-up as the flags say; a value this network namespace cannot
/// write (the table's size belongs to the host) is a warning, and kpng runs on.
pub fn conntrack_is_tuned_at_start_up(dp: Dataplane) {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    let manifests = web("10.96.0.67", &[WEB_A]);
    let read = |name: &str| {
        let path = format!("/proc/sys/net/netfilter/{name}");
        let out = cluster.node.output("cat", &[&path]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let log = program(
        &cluster,
        dp,
        &manifests,
        &[
            "--conntrack-tcp-timeout-established",
            "2h",
            "--conntrack-udp-timeout",
            "45s",
            "--conntrack-tcp-be-liberal",
            "--conntrack-max-per-core",
            "1",
            "--conntrack-min",
            "1",
        ],
    );
    let warning = log.lines().find(|l| l.contains("nf_conntrack_max"));
    assert!(warning.is_some_and(|l| l.contains("WARN") && l.contains("left as it is")), "{log}");
    assert_eq!(read("nf_conntrack_tcp_timeout_established"), "7200", "{log}");
    assert_eq!(read("nf_conntrack_udp_timeout"), "45", "{log}");
    assert_eq!(read("nf_conntrack_tcp_be_liberal"), "1", "{log}");
    assert!(log.contains("conntrack tuned"), "{log}");
    // 0 leaves a value alone: a second run with other defaults changes nothing it skips.
    let log = program(
        &cluster,
        dp,
        &manifests,
        &["--conntrack-tcp-timeout-established", "0", "--conntrack-udp-timeout", "0"],
    );
    assert_eq!(read("nf_conntrack_tcp_timeout_established"), "7200", "{log}");
    assert_eq!(read("nf_conntrack_udp_timeout"), "45", "{log}");
    assert!(answers_from(&cluster, "10.96.0.67:80"), "the service works: {log}");
}

fn answers_from(cluster: &Cluster, target: &str) -> bool {
    matches!(Cluster::tcp(&cluster.client, target), Outcome::Answer { .. })
}

/// `n` services without endpoints on 10.96.8.0/22, one TCP port each.
fn many_services(n: usize) -> String {
    (0..n)
        .map(|i| {
            let ip = format!("10.96.{}.{}", 8 + i / 250, 1 + i % 250);
            service(&format!("filler-{i}"), &format!("  clusterIP: {ip}\n"), PORT_HTTP)
        })
        .collect()
}

/// `to-ebpf`: a restart adopts the programs and maps; maps outgrown by the cluster are
/// replaced under an established connection; `kpng cleanup --backend` removes exactly
/// what it names.
pub fn maps_grow_under_established_connections_and_cleanup_honours_the_backend(dp: Dataplane) {
    let Dataplane::Ebpf(attachment) = dp else { unreachable!("a to-ebpf scenario") };
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("client", true, 50, &[9999]);
    let manifests = web("10.96.0.10", &[WEB_A]);
    let first = program(&cluster, dp, &manifests, &[]);
    assert!(first.contains("eBPF maps written"), "{first}");
    assert!(attachment.attached().contains("kpng_connect4"), "{}", attachment.attached());

    // A restart over the same state adopts the programs and maps and writes nothing.
    let again = program(&cluster, dp, &manifests, &[]);
    assert!(again.contains("programs already attached; adopted"), "{again}");
    assert!(!again.contains("eBPF maps written"), "{again}");

    // A connection established now survives the maps' growth (1,100 more services
    // outgrow the first 1,024 frontends), and still shows the service as its peer.
    let mut pod = dp.local(&cluster.pod("client").ns);
    let (held, peer) = pod.hold("10.96.0.10:80");
    assert!(matches!(held, Outcome::Answer { .. }), "{held}");
    assert_eq!(peer, "10.96.0.10:80");
    let grown = program(&cluster, dp, &format!("{manifests}{}", many_services(1100)), &[]);
    assert!(grown.contains("growing maps"), "{grown}");
    assert_eq!(pod.again(), (held, peer), "the established connection keeps its endpoint");
    assert_eq!(pod.reach("10.96.0.10:80").2, "10.96.0.10:80");
    assert_eq!(pod.tcp("10.96.11.80:80").0, Outcome::Refused, "a new service without endpoints");
    let programs = attachment.attached().matches("kpng_").count();
    assert_eq!(programs, 8, "the old programs are detached: {}", attachment.attached());
    let generations: Vec<String> = std::fs::read_dir(attachment.pins())
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("maps-"))
        .collect();
    assert_eq!(generations, ["maps-2"]);
    assert_eq!(conntrack(&cluster, &["-s", "10.244.0.50", "--dst-nat"]), Vec::<String>::new());

    let pins = attachment.pins().display().to_string();
    let cleanup = |backend: &str| {
        let args = ["cleanup", "--backend", backend, "--bpf-pin-path", &pins].map(String::from);
        let out = dp.kpng(&cluster, &args).output().expect("running kpng cleanup");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    };
    let table = || cluster.node.output("nft", &["list", "table", "ip", "kpng"]).status.success();
    // `--backend nft` removes the tables and leaves the programs, which serve on alone.
    cleanup("nft");
    assert!(!table(), "the nftables table is gone");
    assert!(attachment.attached().contains("kpng_connect4"), "{}", attachment.attached());
    assert_eq!(pod.reach("10.96.0.10:80").0, "web-a");
    // `--backend ebpf` detaches and unpins: nothing of kpng's is left, and the service
    // address is routed away like any other.
    cleanup("ebpf");
    assert!(!attachment.attached().contains("kpng_"), "{}", attachment.attached());
    assert!(!attachment.pins().exists());
    assert_eq!(pod.tcp("10.96.0.10:80").0, Outcome::Timeout);
}
