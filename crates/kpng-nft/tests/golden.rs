//! The dry run prints exactly what is committed: the same node state loaded by `nft -f`
//! from the dry-run text and by kpng over netlink, each in a fresh network namespace,
//! reads back identical from the kernel — every set (with nft's description), chain, rule
//! (expression bytes) and element.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use kpng_backend::proxy::LocalDetection;
use kpng_backend::{Backend, ChangeSet};
use kpng_local::{NodeLocal, NodePortSelection, project_node_state_with};
use kpng_model::global::{
    IpMode, LoadBalancerIngress, NatMode, Outside, ServiceCidr, ServiceType, SessionAffinity,
    TrafficPolicy,
};
use kpng_model::{Family, GlobalModel, LocalState, Object, Protocol};
use kpng_netlink::message::NETLINK_NETFILTER;
use kpng_netlink::nftables::dump;
use kpng_netlink::nftables::messages::{ChainMsg, SetMsg};
use kpng_netlink::{NetlinkSocket, ProtoFamily};
use kpng_nft::{DryRunKernel, NetlinkKernel, NftBackend, NftOptions};
use kpng_testkit::builders::{endpoint, node, service, slice};
use kpng_testkit::netns::Netns;
use kpng_testkit::privileged::require;
use kpng_testkit::topology::in_netns;

const HTTP: (&str, Protocol, u16) = ("http", Protocol::Tcp, 80);
const DNS: (&str, Protocol, u16) = ("dns", Protocol::Udp, 53);
const SLICE_HTTP: (&str, Protocol, u16) = ("http", Protocol::Tcp, 8080);
const SLICE_DNS: (&str, Protocol, u16) = ("dns", Protocol::Udp, 5353);

/// A node state that uses every kind of element and rule kpng makes, with a ServiceCIDR
/// object over `service_cidrs`.
fn state(nodeports: NodePortSelection, service_cidrs: &[IpNet]) -> LocalState {
    let mut model = GlobalModel::new();
    if !service_cidrs.is_empty() {
        let cidr = ServiceCidr::new("kubernetes", service_cidrs.iter().copied());
        model.apply(Object::ServiceCidr(cidr));
    }
    let mut n = node("a", Some("z1"), &["192.168.10.1", "fd00:10::1"]);
    n.pod_cidrs = vec!["10.244.0.0/24".parse().unwrap(), "fd00:244::/64".parse().unwrap()];
    model.apply(Object::Node(n));
    let mut web = service("ns", "web", &["10.96.0.1", "fd00:96::1"], &[HTTP, DNS]);
    web.service_type = ServiceType::LoadBalancer;
    web.ports[0].node_port = Some(30080);
    web.outside = Outside {
        external_ips: Box::new(["192.0.2.5".parse().unwrap()]),
        load_balancer_ingress: Box::new([LoadBalancerIngress {
            ip: "203.0.113.1".parse().unwrap(),
            ip_mode: IpMode::VIP,
        }]),
        load_balancer_source_ranges: Box::new([
            "198.51.100.0/24".parse().unwrap(),
            "192.168.10.0/24".parse().unwrap(),
        ]),
    }
    .boxed();
    model.apply(Object::Service(web));
    let eps: Vec<_> = (1..=3)
        .map(|i| endpoint(&format!("10.244.0.{i}"), if i == 1 { "a" } else { "b" }))
        .collect();
    model.apply(Object::EndpointSlice(slice("ns", "web-4", "web", &[SLICE_HTTP, SLICE_DNS], eps)));
    model.apply(Object::EndpointSlice(kpng_model::global::EndpointSlice {
        family: Family::V6,
        ..slice("ns", "web-6", "web", &[SLICE_HTTP], vec![endpoint("fd00:244::1", "a")])
    }));
    let mut sticky = service("ns", "sticky", &["10.96.0.2"], &[HTTP]);
    sticky.session_affinity = SessionAffinity::ClientIP { timeout_seconds: 300 };
    sticky.external_traffic_policy = TrafficPolicy::Local;
    sticky.service_type = ServiceType::NodePort;
    sticky.ports[0].node_port = Some(30081);
    model.apply(Object::Service(sticky));
    let eps = vec![endpoint("10.244.0.7", "a"), endpoint("10.244.1.7", "b")];
    model.apply(Object::EndpointSlice(slice("ns", "sticky-1", "sticky", &[SLICE_HTTP], eps)));
    let mut local = service("ns", "local", &["10.96.0.3"], &[HTTP]);
    local.internal_traffic_policy = TrafficPolicy::Local;
    model.apply(Object::Service(local));
    model.apply(Object::EndpointSlice(slice(
        "ns",
        "local-1",
        "local",
        &[SLICE_HTTP],
        vec![endpoint("10.244.0.8", "a")],
    )));
    // Stateless DNAT (both families, both protocols) and direct server return: base
    // chains of their own, rewrites, notrack, dup.
    for (name, ips, mode) in [
        ("stateless", ["10.96.0.5", "fd00:96::5"], NatMode::StatelessDnat),
        ("direct", ["10.96.0.6", "fd00:96::6"], NatMode::Dsr),
    ] {
        let mut svc = service("ns", name, &ips, &[HTTP, DNS]);
        svc.load_balancing.mode = Some(mode);
        model.apply(Object::Service(svc));
        let eps = vec![endpoint("10.244.0.9", "a"), endpoint("192.168.10.9", "b")];
        let slice_name = format!("{name}-1");
        model.apply(Object::EndpointSlice(slice(
            "ns",
            &slice_name,
            name,
            &[SLICE_HTTP, SLICE_DNS],
            eps,
        )));
        model.apply(Object::EndpointSlice(kpng_model::global::EndpointSlice {
            family: Family::V6,
            ..slice(
                "ns",
                &format!("{name}-6"),
                name,
                &[SLICE_HTTP, SLICE_DNS],
                vec![endpoint("fd00:244::9", "a")],
            )
        }));
    }
    // Beyond the pick tree: a count set and a rule of its own.
    model.apply(Object::Service(service("ns", "big", &["10.96.0.4"], &[HTTP])));
    let eps =
        (0..300).map(|i| endpoint(&format!("10.245.{}.{}", i / 200, i % 200 + 1), "b")).collect();
    model.apply(Object::EndpointSlice(slice("ns", "big-1", "big", &[SLICE_HTTP], eps)));
    let addresses = vec!["192.168.10.1".parse().unwrap(), "192.168.20.1".parse().unwrap()];
    project_node_state_with(
        &model,
        "a",
        &NodeLocal { nodeports, addresses, ..NodeLocal::default() },
    )
}

#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// What the kernel holds of kpng's tables, raw.
#[derive(Debug, PartialEq, Eq)]
struct Held {
    sets: BTreeMap<(u8, String), SetMsg>,
    chains: BTreeMap<(u8, String), ChainMsg>,
    rules: BTreeMap<(u8, String), Vec<Vec<u8>>>,
    elements: BTreeMap<(u8, String), BTreeSet<String>>,
}

fn read_back() -> Held {
    let mut socket = NetlinkSocket::open(NETLINK_NETFILTER).unwrap();
    let mut held = Held {
        sets: BTreeMap::new(),
        chains: BTreeMap::new(),
        rules: BTreeMap::new(),
        elements: BTreeMap::new(),
    };
    for (n, family) in [(4u8, ProtoFamily::Ipv4), (6, ProtoFamily::Ipv6)] {
        for body in socket.dump(&dump::sets_request(family, "kpng")).unwrap() {
            // Handles number objects in the order they were made: not compared.
            let set = SetMsg { handle: None, ..dump::set(&body).unwrap() };
            let mut elements = BTreeSet::new();
            for body in socket.dump(&dump::elements_request(family, "kpng", &set.name)).unwrap() {
                elements.extend(dump::elements(&body).iter().map(|e| format!("{e:?}")));
            }
            held.elements.insert((n, set.name.clone()), elements);
            held.sets.insert((n, set.name.clone()), set);
        }
        for body in socket.dump(&dump::chains_request(family, "kpng")).unwrap() {
            let chain = ChainMsg { handle: None, ..dump::chain(&body).unwrap() };
            if chain.table != "kpng" {
                continue;
            }
            held.chains.insert((n, chain.name.clone()), chain);
        }
        for body in socket.dump(&dump::rules_request(family, "kpng", None)).unwrap() {
            let rule = dump::rule(&body).unwrap();
            // The expressions as the kernel dumped them, not as decoded.
            let attributes = kpng_netlink::attr::parse(&body[4..]);
            let raw = kpng_netlink::attr::find(&attributes, 4).unwrap_or_default().to_vec();
            held.rules.entry((n, rule.chain.clone())).or_default().push(raw);
        }
    }
    held
}

fn compare(options: NftOptions, nodeports: NodePortSelection, service_cidrs: &[IpNet]) {
    let state = state(nodeports, service_cidrs);
    let out = Captured::default();
    let mut dry = NftBackend::new(options.clone(), Box::new(DryRunKernel::new(out.clone())));
    dry.apply(&ChangeSet::full(&state)).unwrap();
    let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
    // A dry run has nothing to verify: no drift, nothing printed again.
    assert!(kpng_conformance::finds_no_drift(dry.template_stats(), &mut dry));
    assert_eq!(out.0.lock().unwrap().len(), text.len());

    let by_nft = Netns::new("gold-nft");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("dry-run.nft");
    std::fs::write(&path, &text).unwrap();
    by_nft.exec("nft", &["-f", path.to_str().unwrap()]);
    let by_netlink = Netns::new("gold-nl");
    let netlink_state = state.clone();
    in_netns(&by_netlink, move || {
        let kernel = NetlinkKernel::open().unwrap();
        let mut backend = NftBackend::new(options, Box::new(kernel));
        backend.apply(&ChangeSet::full(&netlink_state)).unwrap();
    });
    let (a, b) = (in_netns(&by_nft, read_back), in_netns(&by_netlink, read_back));
    assert!(a.chains.len() > 2000, "the pick trees: {} chains", a.chains.len());
    assert!(a.elements.values().map(BTreeSet::len).sum::<usize>() > 300);
    for (name, rules) in &a.rules {
        let theirs = b.rules.get(name).cloned().unwrap_or_default();
        for (i, (nft, kpng)) in
            rules.iter().zip(theirs.iter().chain(std::iter::repeat(&Vec::new()))).enumerate()
        {
            let show = |raw: &[u8]| {
                kpng_netlink::nftables::expr::decode_all(raw)
                    .iter()
                    .map(|e| e.as_ref().map_or("?".into(), ToString::to_string))
                    .collect::<Vec<_>>()
                    .join(" | ")
            };
            assert!(
                nft == kpng,
                "chain {name:?} rule {i}:\n nft:  {}\n kpng: {}",
                show(nft),
                show(kpng)
            );
        }
        assert_eq!(rules.len(), theirs.len(), "chain {name:?}");
    }
    assert_eq!(a.rules.len(), b.rules.len());
    let differing: Vec<String> = a
        .sets
        .iter()
        .filter(|(name, set)| b.sets.get(*name) != Some(*set))
        .map(|(name, set)| format!("{name:?}: nft {set:?}, kpng {:?}", b.sets.get(name)))
        .collect();
    assert!(differing.is_empty(), "sets differ:\n{}", differing.join("\n"));
    assert_eq!(a.sets.len(), b.sets.len());
    assert_eq!(a.chains, b.chains);
    assert_eq!(a.elements, b.elements);
}

#[test]
fn the_dry_run_is_what_the_kernel_receives() {
    if !require("the_dry_run_is_what_the_kernel_receives", &["nft", "ip"]) {
        return;
    }
    compare(NftOptions::default(), NodePortSelection::Primary, &[]);
    let nets = |list: &[&str]| list.iter().map(|s| s.parse::<IpNet>().unwrap()).collect::<Vec<_>>();
    compare(
        NftOptions {
            masquerade_all: true,
            masquerade_bit: 3,
            local_detection: LocalDetection::InterfaceNamePrefix("veth".into()),
            cluster_cidrs: Vec::new(),
            ..NftOptions::default()
        },
        NodePortSelection::Cidrs(nets(&["0.0.0.0/0", "fd00:10::/64"])),
        &nets(&["10.96.0.0/12", "fd00:96::/112"]),
    );
    compare(
        NftOptions {
            local_detection: LocalDetection::BridgeInterface("cbr0".into()),
            ..NftOptions::default()
        },
        NodePortSelection::Cidrs(nets(&["192.168.20.0/24"])),
        &[],
    );
}

#[test]
fn other_tables_are_neither_read_nor_touched() {
    if !require("other_tables_are_neither_read_nor_touched", &["nft", "ip"]) {
        return;
    }
    // The kernel answers a dump of one table's chains with every table's chains.
    let ns = Netns::new("foreign");
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.nft");
    let other = "table ip other {\n chain pre {\n type filter hook prerouting priority -400;\n \
                 ip daddr 10.96.0.1 counter\n }\n}\n";
    std::fs::write(&path, other).unwrap();
    ns.exec("nft", &["-f", path.to_str().unwrap()]);
    let state = state(NodePortSelection::Primary, &[]);
    in_netns(&ns, move || {
        let mut first =
            NftBackend::new(NftOptions::default(), Box::new(NetlinkKernel::open().unwrap()));
        first.apply(&ChangeSet::full(&state)).unwrap();
        // A restart reads kpng's tables back: nothing of the other table is taken for
        // kpng's, so there is nothing to change.
        let mut restarted =
            NftBackend::new(NftOptions::default(), Box::new(NetlinkKernel::open().unwrap()));
        restarted.apply(&ChangeSet::full(&state)).unwrap();
        let stats = restarted.stats();
        assert_eq!(stats.transactions.load(std::sync::atomic::Ordering::Relaxed), 0);
    });
    let listed = ns.exec("nft", &["list", "table", "ip", "other"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("ip daddr 10.96.0.1 counter"));
}

/// A node state of `services` ClusterIP services with two endpoints each.
fn many(services: usize) -> LocalState {
    let mut model = GlobalModel::new();
    model.apply(Object::Node(node("a", None, &["192.168.10.1"])));
    for i in 0..services {
        let name = format!("s{i}");
        let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
        model.apply(Object::Service(service("ns", &name, &[&ip], &[HTTP])));
        let eps = vec![endpoint("10.244.0.1", "a"), endpoint("10.244.1.1", "b")];
        model.apply(Object::EndpointSlice(slice(
            "ns",
            &format!("{name}-1"),
            &name,
            &[SLICE_HTTP],
            eps,
        )));
    }
    project_node_state_with(&model, "a", &NodeLocal::default())
}

#[test]
fn a_restart_over_a_far_larger_table_flushes_without_reading_it() {
    if !require("a_restart_over_a_far_larger_table_flushes_without_reading_it", &["nft", "ip"]) {
        return;
    }
    let ns = Netns::new("stale");
    in_netns(&ns, || {
        let open =
            || NftBackend::new(NftOptions::default(), Box::new(NetlinkKernel::open().unwrap()));
        open().apply(&ChangeSet::full(&many(600))).unwrap();
        // Back to a cluster of 20 of them: only the cluster IPs are read, the element sets
        // flushed and refilled in one transaction.
        let small = many(20);
        let mut restarted = open();
        restarted.apply(&ChangeSet::full(&small)).unwrap();
        assert_eq!(restarted.stats().transactions.load(std::sync::atomic::Ordering::Relaxed), 1);
        // The kernel holds exactly what was committed, and a fresh start over it changes
        // nothing.
        assert!(kpng_conformance::finds_no_drift(restarted.template_stats(), &mut restarted));
        let mut again = open();
        again.apply(&ChangeSet::full(&small)).unwrap();
        assert_eq!(again.stats().transactions.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(again.element_count(), restarted.element_count());
    });
}

#[test]
fn a_cold_start_in_transactions_of_whole_services_ends_as_one_run_makes_it() {
    let name = "a_cold_start_in_transactions_of_whole_services_ends_as_one_run_makes_it";
    if !require(name, &["nft", "ip"]) {
        return;
    }
    let cold_start = |ns: &Netns, limit: usize| {
        in_netns(ns, move || {
            let options = NftOptions { cold_start_transaction: limit, ..NftOptions::default() };
            let mut backend = NftBackend::new(options, Box::new(NetlinkKernel::open().unwrap()));
            backend.apply(&ChangeSet::full(&many(150))).unwrap();
            assert!(
                kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend),
                "the kernel holds what was committed"
            );
            backend.stats().transactions.load(std::sync::atomic::Ordering::Relaxed)
        })
    };
    // The skeleton goes first, then the elements: in one transaction, or in several.
    let (one, several) = (Netns::new("cold-one"), Netns::new("cold-several"));
    assert_eq!(cold_start(&one, usize::MAX), 2);
    let transactions = cold_start(&several, 200);
    assert!(transactions >= 4, "{transactions} transactions");
    let (a, b) = (in_netns(&one, read_back), in_netns(&several, read_back));
    assert!(a.elements.values().map(BTreeSet::len).sum::<usize>() > 150 * 4);
    assert_eq!(a, b);
}

/// The kernel over netlink, counting its whole read-backs and the targeted ones.
struct Counted {
    inner: NetlinkKernel,
    whole: Arc<Mutex<(usize, usize)>>,
}

impl kpng_nft::kernel::Kernel for Counted {
    fn commit(&mut self, plan: &kpng_nft::plan::Plan<'_>) -> Result<(), kpng_nft::NftError> {
        self.inner.commit(plan)
    }
    fn read(&mut self) -> Result<Option<kpng_nft::kernel::KernelContents>, kpng_nft::NftError> {
        self.whole.lock().unwrap().0 += 1;
        self.inner.read()
    }
    fn read_unless_stale(
        &mut self,
        stale: &dyn Fn(usize) -> bool,
    ) -> Result<Option<kpng_nft::kernel::KernelContents>, kpng_nft::NftError> {
        self.whole.lock().unwrap().0 += 1;
        self.inner.read_unless_stale(stale)
    }
    fn read_sets_of(
        &mut self,
        sets: &BTreeSet<(Family, kpng_nft::objects::MapName)>,
    ) -> Result<Option<kpng_nft::kernel::KernelContents>, kpng_nft::NftError> {
        self.whole.lock().unwrap().1 += 1;
        self.inner.read_sets_of(sets)
    }
    fn generation(&mut self) -> Result<Option<u32>, kpng_nft::NftError> {
        self.inner.generation()
    }
    fn touched(&mut self, known: u32, now: u32) -> kpng_netlink::nftables::announce::Touched {
        self.inner.touched(known, now)
    }
}

#[test]
fn commits_to_other_tables_are_let_pass_and_commits_to_kpngs_are_read() {
    let name = "commits_to_other_tables_are_let_pass_and_commits_to_kpngs_are_read";
    if !require(name, &["nft", "ip"]) {
        return;
    }
    let ns = Netns::new("announce");
    let state = many(30);
    let nft = |args: &str| {
        let args: Vec<&str> = args.split(' ').collect();
        let out = ns.exec("nft", &args);
        assert!(out.status.success(), "nft {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let counted = |backend: &NftBackend| {
        let stats = backend.template_stats();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        (load(&stats.readbacks), load(&stats.readbacks_skipped), load(&stats.untouched))
    };
    let first = state.clone();
    let reads = Arc::new(Mutex::new((0, 0)));
    let whole = reads.clone();
    let mut backend = in_netns(&ns, move || {
        let kernel = Counted { inner: NetlinkKernel::open().unwrap(), whole };
        let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel));
        backend.apply(&ChangeSet::full(&first)).unwrap();
        backend
    });
    assert_eq!(*reads.lock().unwrap(), (1, 0), "the start reads once");
    // Other processes commit to tables of their own: the announcements say kpng's were
    // left alone, so nothing is read back.
    nft("add table ip other");
    nft("add chain ip other pre { type filter hook prerouting priority -400 ; }");
    nft("add rule ip other pre ip daddr 10.96.0.1 counter");
    assert!(kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend));
    assert_eq!(counted(&backend), (0, 1, 1));
    // kpng's own change after another foreign commit keeps its tables known.
    nft("delete table ip other");
    let (before, after) = (state.clone(), many(31));
    let ops = kpng_local::diff(&before, &after);
    backend.apply(&ChangeSet::changes(&ops, &after)).unwrap();
    assert!(kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend));
    assert_eq!(counted(&backend), (0, 2, 2));
    assert_eq!(*reads.lock().unwrap(), (1, 0), "nothing was read back");
    // A foreign commit to kpng's table: only the set it touched (with the tables' layout)
    // is read back; the deletion is found and written back by the verification itself,
    // without reading everything or rendering every service again.
    let drifts = |backend: &NftBackend| {
        backend.template_stats().drifts.load(std::sync::atomic::Ordering::Relaxed)
    };
    nft("delete element ip kpng cluster_ips { 10.96.0.1 }");
    assert!(backend.verify().unwrap(), "the verification repairs what it found");
    assert_eq!(drifts(&backend), 1, "a deleted cluster IP went unseen");
    assert_eq!(counted(&backend), (1, 2, 2));
    let listed = ns.exec("nft", &["list", "set", "ip", "kpng", "cluster_ips"]);
    assert!(String::from_utf8_lossy(&listed.stdout).contains("10.96.0.1,"), "not repaired");
    // The repair was kpng's only commit: its tables are known right after it.
    assert!(kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend));
    assert_eq!(counted(&backend), (1, 3, 2));
    assert_eq!(*reads.lock().unwrap(), (1, 1), "one targeted read, no whole one");
    // A foreign rule in one of kpng's chains: the rules are read, the rule found.
    nft("insert rule ip kpng nat_prerouting counter");
    assert!(backend.verify().unwrap(), "the verification repairs what it found");
    assert_eq!(drifts(&backend), 2, "a foreign rule went unseen");
    let listed = ns.exec("nft", &["list", "chain", "ip", "kpng", "nat_prerouting"]);
    assert!(!String::from_utf8_lossy(&listed.stdout).contains("counter"), "not repaired");
    assert!(kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend));
    assert_eq!(*reads.lock().unwrap(), (1, 2), "targeted reads alone");
    // A change after the repairs commits over tables known right.
    let last = many(32);
    let ops = kpng_local::diff(&after, &last);
    backend.apply(&ChangeSet::changes(&ops, &last)).unwrap();
    // Everything after the repair is known again: a verification reads nothing.
    assert!(kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend));
    assert_eq!(*reads.lock().unwrap(), (1, 2));
}
