//! The scenarios: what a pod on the node sees through `to-ebpf`.

use super::*;

/// `web`: dual-stack ClusterIP 10.96.0.10 / fd00:96::10, TCP 80 and UDP 53 to 8080, on
/// web-a (this node) and web-b (the other node); IPv6 only on web-a. `empty`: no endpoint.
fn web_and_empty() -> String {
    [
        service(
            "web",
            "  clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.10, \"fd00:96::10\"]\n",
            PORTS,
        ),
        slice(
            "web-1",
            "web",
            "IPv4",
            SLICE_PORTS,
            &[("10.244.0.10", "node-a"), ("10.244.1.10", "node-b")],
        ),
        slice("web-2", "web", "IPv6", SLICE_PORTS, &[("fd00:244::a", "node-a")]),
        service("empty", "  clusterIP: 10.96.0.11\n", PORTS),
    ]
    .concat()
}

/// A cluster with web-a, web-b and a client pod (10.244.0.50) on the node.
fn cluster_with_client() -> Cluster {
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    cluster.add_pod("client", true, 50, &[9999]);
    cluster
}

#[test]
fn cluster_ips_are_translated_at_connect_without_nat() {
    if !ready("cluster_ips_are_translated_at_connect_without_nat") {
        return;
    }
    let cluster = cluster_with_client();
    let attachment = Attachment::new("translate");
    program(&cluster, &attachment, &web_and_empty());
    assert!(attachment.attached().contains("kpng_connect4"), "{}", attachment.attached());
    let mut pod = Pod::start(&cluster.pod("client").ns, &attachment.cgroup);

    // TCP: both endpoints, port 80 remapped to 8080; the endpoint sees the pod's own
    // address and the pod's getpeername() the service's.
    assert_eq!(names(&mut pod, "10.96.0.10:80", 24), set(&["web-a", "web-b"]));
    let (_, seen, getpeername) = pod.reach("10.96.0.10:80");
    assert_eq!(seen, "10.244.0.50".parse::<IpAddr>().unwrap());
    assert_eq!(getpeername, "10.96.0.10:80");

    // UDP, connected and unconnected: replies come from the service address.
    let udp = pod.udp("10.96.0.10:53");
    assert!(matches!(&udp, Outcome::Answer { name, .. } if name.starts_with("web-")), "{udp}");
    let (outcome, from) = pod.sendto("10.96.0.10:53");
    assert!(matches!(&outcome, Outcome::Answer { name, .. } if name.starts_with("web-")));
    assert_eq!(from, "10.96.0.10:53", "the reply appears to come from the service");

    // No endpoint, or a port the service does not define: refused at connect()/sendmsg().
    assert_eq!(pod.tcp("10.96.0.11:80").0, Outcome::Refused);
    assert_eq!(pod.sendto("10.96.0.11:53").0, Outcome::Refused);
    assert_eq!(pod.tcp("10.96.0.10:81").0, Outcome::Refused);

    // An IPv6 socket naming the IPv4 service through a v4-mapped address.
    let (name, _, getpeername) = pod.reach("[::ffff:10.96.0.10]:80");
    assert!(name.starts_with("web-"), "{name}");
    assert_eq!(getpeername, "[::ffff:10.96.0.10]:80");

    // IPv6: only web-a has an IPv6 address.
    let (name, _, getpeername) = pod.reach("[fd00:96::10]:80");
    assert_eq!((name.as_str(), getpeername.as_str()), ("web-a", "[fd00:96::10]:80"));

    // The node's conntrack saw the pod's flows, none of them NATed; the same service
    // reached from outside the cgroup (the client host, through nftables) is.
    assert!(!conntrack(&cluster, &["-s", "10.244.0.50"]).is_empty());
    assert_eq!(conntrack(&cluster, &["-s", "10.244.0.50", "--dst-nat"]), Vec::<String>::new());
    assert_eq!(conntrack(&cluster, &["-d", "10.96.0.10"]), Vec::<String>::new());
    let outside = Cluster::tcp(&cluster.client, "10.96.0.10:80");
    assert!(matches!(outside, Outcome::Answer { .. }), "{outside}");
    assert!(!conntrack(&cluster, &["-d", "10.96.0.10", "--dst-nat"]).is_empty());
}

/// kpng with `--watch` in the node namespace, `to-ebpf` then `to-nft`; stopped on drop.
struct Watched {
    dir: tempfile::TempDir,
    child: Child,
}

impl Watched {
    fn start(cluster: &Cluster, attachment: &Attachment, manifests: &str) -> Watched {
        Watched::start_with(cluster, attachment, manifests, &[])
    }

    fn start_with(
        cluster: &Cluster,
        attachment: &Attachment,
        manifests: &str,
        extra: &[&str],
    ) -> Watched {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.yaml");
        std::fs::write(&path, format!("{NODE_A}{manifests}")).unwrap();
        let mut args: Vec<String> =
            ["file", "--input", path.to_str().unwrap(), "--watch"].map(String::from).to_vec();
        args.extend(["--min-sync-period", "0"].map(String::from));
        args.extend(extra.iter().map(|a| a.to_string()));
        args.extend(["to-local", "--node", "node-a"].map(String::from));
        args.extend(attachment.args());
        args.push("to-nft".into());
        let log = std::fs::File::create(dir.path().join("kpng.log")).unwrap();
        let child = in_node(cluster, &args).stderr(log).spawn().unwrap();
        Watched { dir, child }
    }

    /// Replaces the manifests the way editors do (write, then rename).
    fn write(&self, manifests: &str) {
        let tmp = self.dir.path().join("edit.tmp");
        std::fs::write(&tmp, format!("{NODE_A}{manifests}")).unwrap();
        std::fs::rename(&tmp, self.dir.path().join("cluster.yaml")).unwrap();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kpng.log")).unwrap_or_default()
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

const HTTP: &str = "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n";
const SLICE_HTTP: &str = "- {name: http, protocol: TCP, port: 8080}\n";

/// `local` (internalTrafficPolicy Local) on web-a and web-b, `nolocal` (the same) on
/// web-b only, `sticky` (ClientIP affinity) and `web` on `endpoints`.
fn policies(sticky: &[(&str, &str)], web: &[(&str, &str)]) -> String {
    let both = [("10.244.0.10", "node-a"), ("10.244.1.10", "node-b")];
    [
        service("local", "  clusterIP: 10.96.0.20\n  internalTrafficPolicy: Local\n", HTTP),
        slice("local-1", "local", "IPv4", SLICE_HTTP, &both),
        service("nolocal", "  clusterIP: 10.96.0.21\n  internalTrafficPolicy: Local\n", HTTP),
        slice("nolocal-1", "nolocal", "IPv4", SLICE_HTTP, &both[1..]),
        service(
            "sticky",
            "  clusterIP: 10.96.0.22\n  sessionAffinity: ClientIP\n  sessionAffinityConfig: {clientIP: {timeoutSeconds: 60}}\n",
            HTTP,
        ),
        slice("sticky-1", "sticky", "IPv4", SLICE_HTTP, sticky),
        service("web", "  clusterIP: 10.96.0.23\n", HTTP),
        slice("web-1", "web", "IPv4", SLICE_HTTP, web),
    ]
    .concat()
}

#[test]
fn traffic_policies_affinity_and_endpoint_changes_while_connecting() {
    if !ready("traffic_policies_affinity_and_endpoint_changes_while_connecting") {
        return;
    }
    let mut cluster = cluster_with_client();
    cluster.add_pod("web-c", true, 12, &[8080]);
    let attachment = Attachment::new("policies");
    let (a, b, c) =
        (("10.244.0.10", "node-a"), ("10.244.1.10", "node-b"), ("10.244.0.12", "node-a"));
    let kpng = Watched::start(&cluster, &attachment, &policies(&[a, b], &[a, b]));
    wait_until("kpng attached its programs", || attachment.attached().contains("kpng_connect4"));
    let mut pod = Pod::start(&cluster.pod("client").ns, &attachment.cgroup);
    wait_until("the maps hold web", || pod.tcp("10.96.0.23:80").0 != Outcome::Refused);

    // internalTrafficPolicy Local: the local endpoint only; none local: dropped.
    assert_eq!(names(&mut pod, "10.96.0.20:80", 12), set(&["web-a"]));
    assert_eq!(pod.tcp("10.96.0.21:80").0, Outcome::Timeout, "no local endpoint: dropped");

    // ClientIP affinity: one endpoint, every time.
    let sticky = names(&mut pod, "10.96.0.22:80", 12);
    assert_eq!(sticky.len(), 1, "{sticky:?}");
    let chosen = sticky.into_iter().next().unwrap();

    // Endpoints leave while the pod keeps connecting: every connection succeeds, and
    // neither web-b nor the sticky endpoint that left is chosen again.
    let remaining = if chosen == "web-a" { b } else { a };
    kpng.write(&policies(&[remaining], &[a]));
    let mut quiet = 0;
    let start = Instant::now();
    while quiet < 16 {
        assert!(start.elapsed() < Duration::from_secs(30), "web-b still chosen: {}", kpng.log());
        let (name, ..) = pod.reach("10.96.0.23:80");
        quiet = if name == "web-b" { 0 } else { quiet + 1 };
    }
    let sticky = names(&mut pod, "10.96.0.22:80", 8);
    let expected = if chosen == "web-a" { "web-b" } else { "web-a" };
    assert_eq!(sticky, set(&[expected]), "the endpoint that left is not reused");

    // An endpoint joins while the pod keeps connecting.
    kpng.write(&policies(&[remaining], &[a, c]));
    let mut seen = BTreeSet::new();
    while !seen.contains("web-c") {
        assert!(start.elapsed() < Duration::from_secs(60), "web-c never chosen: {}", kpng.log());
        seen.insert(pod.reach("10.96.0.23:80").0);
    }
    assert!(!seen.contains("web-b"), "{seen:?}");
    // Every one of those connections was translated at connect(), none NATed.
    assert_eq!(conntrack(&cluster, &["-s", "10.244.0.50", "--dst-nat"]), Vec::<String>::new());
}

/// `n` services without endpoints on 10.96.8.0/22, one TCP port each.
fn many_services(n: usize) -> String {
    (0..n)
        .map(|i| {
            let ip = format!("10.96.{}.{}", 8 + i / 250, 1 + i % 250);
            service(&format!("filler-{i}"), &format!("  clusterIP: {ip}\n"), HTTP)
        })
        .collect()
}

#[test]
fn restarts_adopt_growth_keeps_connections_and_cleanup_detaches() {
    if !ready("restarts_adopt_growth_keeps_connections_and_cleanup_detaches") {
        return;
    }
    let cluster = cluster_with_client();
    let attachment = Attachment::new("lifecycle");
    let manifests = web_and_empty();
    let first = program(&cluster, &attachment, &manifests);
    assert!(first.contains("eBPF maps written"), "{first}");

    // A restart over the same state adopts the programs and maps and writes nothing.
    let again = program(&cluster, &attachment, &manifests);
    assert!(again.contains("programs already attached; adopted"), "{again}");
    assert!(!again.contains("eBPF maps written"), "{again}");

    // A connection established now survives the maps' growth (1,100 more services
    // outgrow the first 1,024 frontends), and still shows the service as its peer.
    let mut pod = Pod::start(&cluster.pod("client").ns, &attachment.cgroup);
    let (held, peer) = pod.hold("10.96.0.10:80");
    assert!(matches!(held, Outcome::Answer { .. }), "{held}");
    assert_eq!(peer, "10.96.0.10:80");
    let grown = program(&cluster, &attachment, &format!("{manifests}{}", many_services(1100)));
    assert!(grown.contains("growing maps"), "{grown}");
    let (after, peer) = pod.again();
    assert_eq!(after, held, "the established connection keeps its endpoint");
    assert_eq!(peer, "10.96.0.10:80");
    assert_eq!(pod.reach("10.96.0.10:80").2, "10.96.0.10:80");
    assert_eq!(pod.tcp("10.96.11.80:80").0, Outcome::Refused, "a new service without endpoints");
    let programs = attachment.attached().matches("kpng_").count();
    assert_eq!(programs, 8, "the old programs are detached: {}", attachment.attached());
    let generations: Vec<String> = std::fs::read_dir(&attachment.pins)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("maps-"))
        .collect();
    assert_eq!(generations, ["maps-2"]);

    assert_eq!(conntrack(&cluster, &["-s", "10.244.0.50", "--dst-nat"]), Vec::<String>::new());

    // Cleanup detaches and unpins; the pod's connections then take the nftables path.
    let pins = attachment.pins.to_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["cleanup", "--backend", "ebpf", "--bpf-pin-path", pins])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!attachment.attached().contains("kpng_"), "{}", attachment.attached());
    assert!(!attachment.pins.exists());
    let (_, _, getpeername) = pod.reach("10.96.0.10:80");
    assert_eq!(getpeername, "10.96.0.10:80");
    assert!(!conntrack(&cluster, &["-s", "10.244.0.50", "--dst-nat"]).is_empty());
}

#[test]
fn programs_removed_behind_kpngs_back_are_restored() {
    if !ready("programs_removed_behind_kpngs_back_are_restored") {
        return;
    }
    let cluster = cluster_with_client();
    let attachment = Attachment::new("repair");
    let kpng =
        Watched::start_with(&cluster, &attachment, &web_and_empty(), &["--sync-period", "1s"]);
    wait_until("kpng attached its programs", || attachment.attached().contains("kpng_connect4"));
    let pins = attachment.pins.to_str().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_kpng"))
        .args(["cleanup", "--backend", "ebpf", "--bpf-pin-path", pins])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(!attachment.attached().contains("kpng_"));
    // The next verification finds the programs and maps gone and installs them again.
    wait_until("kpng restored its programs and maps", || {
        kpng.log().matches("eBPF maps written").count() >= 2
    });
    assert!(attachment.attached().contains("kpng_connect4"), "{}", kpng.log());
    let mut pod = Pod::start(&cluster.pod("client").ns, &attachment.cgroup);
    conntrack(&cluster, &["-F"]);
    assert_eq!(pod.reach("10.96.0.10:80").2, "10.96.0.10:80");
    assert_eq!(
        conntrack(&cluster, &["-s", "10.244.0.50", "--dst-nat"]),
        Vec::<String>::new(),
        "{}",
        kpng.log()
    );
}
