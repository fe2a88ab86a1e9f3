//! The backend against an in-memory kernel, over random histories: change sets of every
//! size (the node and every service may go at once), refused commits, restarts that read
//! the table back, and tampering found by verification. After every successful change set
//! the kernel is what a fresh backend makes of the same node state — the same sets, chains,
//! rules and elements (up to slot positions), and the same outcome for every packet to every
//! service address — and a refused commit leaves the kernel exactly as it was.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

use kpng_backend::{Backend, ChangeSet};
use kpng_local::NodeProjector;
use kpng_model::local::LocalServiceState;
use kpng_model::{Changes, Family, GlobalModel, LocalState, Protocol};
use kpng_nft::memory::trace::{Outcome, Packet, trace};
use kpng_nft::memory::{MemoryChain, MemoryTables};
use kpng_nft::objects::{Key, MapName, PickKind, parse_affinity_slot};
use kpng_nft::rules::RuleBuilder;
use kpng_nft::{MemoryKernel, NftBackend, NftOptions};
use kpng_testkit::strategies::{History, arb_mutation};
use proptest::prelude::*;

/// What happens around one change set.
#[derive(Debug, Clone)]
enum Event {
    /// It is applied.
    Apply,
    /// The kernel refuses its commit.
    Fail,
    /// kpng restarts first.
    Restart,
    /// Someone changes the table first; the next verification must notice.
    Tamper(u8),
}

fn arb_event() -> impl Strategy<Value = Event> {
    prop_oneof![
        6 => Just(Event::Apply),
        1 => Just(Event::Fail),
        1 => Just(Event::Restart),
        2 => (0u8..6).prop_map(Event::Tamper),
    ]
}

const NODE: &str = "n0";
const CLIENT_V4: &str = "192.168.99.1";
const CLIENT_V6: &str = "fd00:99::1";

/// Changes the table behind the backend's back; returns whether anything changed.
fn tamper(tables: &mut MemoryTables, how: u8) -> bool {
    let v4 = |name: &str| (Family::V4, name.to_string());
    match how {
        0 => tables.chains.get_mut(&v4("services")).is_some_and(|c| c.rules.pop().is_some()),
        1 => {
            let hijack = RuleBuilder::new(Family::V4).dnat_to("192.0.2.66".parse().unwrap(), 80);
            tables
                .chains
                .get_mut(&v4("nat_prerouting"))
                .map(|c| c.rules.insert(0, hijack))
                .is_some()
        }
        2 => tables.chains.values_mut().any(|c| !std::mem::take(&mut c.rules).is_empty()),
        3 => tables
            .sets
            .iter_mut()
            .find(|(_, s)| !s.elements.is_empty())
            .and_then(|(_, s)| s.elements.pop_first())
            .is_some(),
        4 => {
            let chain = MemoryChain { hook: None, rules: Vec::new() };
            tables.chains.insert((Family::V6, "intruder".into()), chain);
            true
        }
        _ => {
            tables.tables.remove(&Family::V6) && {
                tables.sets.retain(|(f, _), _| *f != Family::V6);
                tables.chains.retain(|(f, _), _| *f != Family::V6);
                true
            }
        }
    }
}

/// A backend's view of `state` from nothing.
fn fresh(state: &LocalState) -> MemoryKernel {
    let kernel = MemoryKernel::new();
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel.clone()));
    backend.apply(&ChangeSet::full(state)).expect("a fresh backend applies any state");
    kernel
}

/// The tables with slot positions and affinity slot numbering forgotten.
fn canonical(
    tables: &MemoryTables,
) -> (BTreeMap<String, BTreeSet<String>>, BTreeMap<String, String>) {
    let mut elements: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for ((family, name), set) in &tables.sets {
        if parse_affinity_slot(name).is_some() {
            continue;
        }
        for (key, value) in &set.elements {
            let key = match key {
                Key::DestSlot(..) | Key::NodePortSlot(..) => format!("{:?}", key.with_slot(0)),
                other => format!("{other:?}"),
            };
            elements
                .entry(format!("{family:?} {name} {key}"))
                .or_default()
                .insert(format!("{value:?}"));
        }
    }
    let mut chains = BTreeMap::new();
    for ((family, name), chain) in &tables.chains {
        if name.starts_with("aff_") {
            continue;
        }
        let rules: Vec<&str> = chain.rules.iter().map(|r| r.text.as_str()).collect();
        chains.insert(format!("{family:?} {name}"), format!("{:?} {rules:?}", chain.hook));
    }
    // Helper objects are named by helper and protocol: compared as they are.
    for ((family, name), spec) in &tables.helpers {
        chains.insert(format!("{family:?} ct helper {name}"), format!("{spec:?}"));
    }
    (elements, chains)
}

/// Packets to every address and port of every service, from outside, from the node, and
/// from a pod.
fn packets(state: &LocalState) -> Vec<Packet> {
    let node_addresses: Vec<IpAddr> =
        state.node.as_ref().map(|n| n.nodeport_addresses.addresses.clone()).unwrap_or_default();
    let mut packets = Vec::new();
    for service in state.services.values() {
        let svc = &service.service;
        for port in &svc.ports {
            for family in Family::ALL {
                let Some(cluster_ip) = svc.cluster_ip(family) else { continue };
                let mut targets = vec![(cluster_ip, port.port)];
                let externals = svc.external_ips().iter().chain(svc.load_balancer_ips());
                targets.extend(
                    externals.filter(|ip| Family::of(ip) == family).map(|ip| (*ip, port.port)),
                );
                if let Some(node_port) = port.node_port {
                    let addrs = node_addresses.iter().filter(|ip| Family::of(ip) == family);
                    targets.extend(addrs.map(|ip| (*ip, node_port)));
                }
                let client: IpAddr = match family {
                    Family::V4 => CLIENT_V4.parse().unwrap(),
                    Family::V6 => CLIENT_V6.parse().unwrap(),
                };
                let own = node_addresses.iter().copied().find(|ip| Family::of(ip) == family);
                for (dst, dport) in targets {
                    for from_node in [false, true] {
                        packets.push(Packet {
                            src: if from_node { own.unwrap_or(client) } else { client },
                            dst,
                            protocol: port.protocol,
                            sport: 40000,
                            dport,
                            iif: if from_node { String::new() } else { "eth0".into() },
                            from_node,
                            local_addresses: node_addresses.clone(),
                        });
                    }
                }
            }
        }
    }
    packets
}

/// The outcome a ClusterIP packet from outside must have, from the node state alone.
fn expected_cluster_ip(
    service: &LocalServiceState,
    family: Family,
    port: usize,
) -> BTreeSet<Outcome> {
    let svc = &service.service;
    let p = &svc.ports[port];
    // Direct server return sends the packet unchanged: to the endpoint, at the service port.
    let direct = svc.load_balancing.mode == Some(kpng_model::global::NatMode::Dsr);
    let endpoints: BTreeSet<(IpAddr, u16)> = service
        .endpoints
        .values()
        .filter(|e| Family::of(&e.ip) == family)
        .flat_map(|e| {
            e.ports
                .iter()
                .filter(|ep| *ep.name == *p.name && ep.protocol == p.protocol)
                .filter(|ep| if svc.internal_local { ep.local } else { ep.cluster })
                .map(move |ep| (e.ip, if direct { p.port } else { ep.port }))
        })
        .collect();
    if endpoints.is_empty() {
        let outcome =
            if *p.has_endpoints.get(family) { Outcome::Dropped } else { Outcome::Rejected };
        return BTreeSet::from([outcome]);
    }
    // `mode: snat` masquerades every connection; otherwise one from outside is not (the
    // backend has no local-traffic detector here).
    let masquerade = svc.load_balancing.mode == Some(kpng_model::global::NatMode::Snat);
    endpoints.into_iter().map(|e| Outcome::Passed { dnat: Some(e), masquerade }).collect()
}

fn check_against_fresh(kernel: &MemoryKernel, state: &LocalState) -> Result<(), TestCaseError> {
    let reference = fresh(state);
    let (ours, theirs) = (kernel.tables(), reference.tables());
    prop_assert_eq!(canonical(&ours), canonical(&theirs));
    for packet in packets(state) {
        prop_assert_eq!(trace(&ours, &packet), trace(&theirs, &packet), "{:?}", packet);
    }
    for service in state.services.values() {
        for family in Family::ALL {
            let Some(cluster_ip) = service.service.cluster_ip(family) else { continue };
            for (i, port) in service.service.ports.iter().enumerate() {
                if port.yielded.contains(&cluster_ip) {
                    continue; // an older service holds it: its own expectation applies
                }
                let client = if family == Family::V4 { CLIENT_V4 } else { CLIENT_V6 };
                let packet = Packet {
                    src: client.parse().unwrap(),
                    dst: cluster_ip,
                    protocol: port.protocol,
                    sport: 40000,
                    dport: port.port,
                    iif: "eth0".into(),
                    from_node: false,
                    local_addresses: Vec::new(),
                };
                let got = trace(&ours, &packet);
                prop_assert_eq!(
                    got,
                    expected_cluster_ip(service, family, i),
                    "{}",
                    service.service.key
                );
            }
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn the_kernel_always_ends_as_a_fresh_backend_makes_it(
        history in prop::collection::vec((prop::collection::vec(arb_mutation(), 1..8), arb_event()), 1..7)
    ) {
        let kernel = MemoryKernel::new();
        let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel.clone()));
        let mut projector = NodeProjector::new(NODE);
        let mut model = History::default();
        let mut needs_reset = true;
        for (mutations, event) in history {
            let changes = model.step(&mutations);
            let ops = projector.update(&model.model, &changes);
            let state = projector.state().clone();
            match event {
                Event::Apply => {}
                Event::Fail => kernel.fail_next(1),
                Event::Restart => {
                    backend = NftBackend::new(NftOptions::default(), Box::new(kernel.clone()));
                    needs_reset = true;
                }
                Event::Tamper(how) => {
                    if !needs_reset && tamper(&mut kernel.tables(), how) {
                        let stats = backend.template_stats();
                        let drifts = || stats.drifts.load(std::sync::atomic::Ordering::Relaxed);
                        let before = drifts();
                        // Repaired in place (the kernel holds the state before the ops
                        // again), or the whole state is due: also when the repair's commit
                        // met a failure injected for a change that had nothing to commit.
                        let held = backend.verify();
                        prop_assert_eq!(drifts(), before + 1, "tampering {} went unnoticed", how);
                        needs_reset = !matches!(held, Ok(true));
                    }
                }
            }
            let before = kernel.tables().clone();
            let changes = if needs_reset { ChangeSet::full(&state) } else { ChangeSet::changes(&ops, &state) };
            match backend.apply(&changes) {
                Ok(()) => {
                    needs_reset = false;
                    check_against_fresh(&kernel, &state)?;
                    prop_assert!(kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend), "a fresh verification finds nothing");
                }
                Err(_) => {
                    let after = kernel.tables().clone();
                    let contents = |t: &MemoryTables| (t.tables.clone(), t.sets.clone(), t.chains.clone());
                    prop_assert_eq!(contents(&after), contents(&before), "a refused commit changes nothing");
                    needs_reset = true;
                }
            }
        }
    }
}

/// A model holding the node and, for each `(name, cluster IP)`, a service with port
/// `http` (TCP 80).
fn node_and_services(services: &[(&str, &str)]) -> GlobalModel {
    use kpng_testkit::builders::{node, service};
    let mut model = GlobalModel::new();
    model.apply(kpng_model::Object::Node(node(NODE, None, &["10.0.0.200"])));
    for (name, ip) in services {
        let ports = &[("http", Protocol::Tcp, 80)];
        model.apply(kpng_model::Object::Service(service("ns", name, &[ip], ports)));
    }
    model
}

#[test]
fn removing_the_node_and_every_service_at_once_empties_the_table() {
    use kpng_testkit::builders::{endpoint, slice};
    let mut model =
        node_and_services(&[("a", "10.96.0.1"), ("b", "10.96.0.2"), ("c", "10.96.0.3")]);
    for name in ["a", "b", "c"] {
        let eps = vec![endpoint("10.244.0.1", NODE), endpoint("10.244.1.1", "other")];
        model.apply(kpng_model::Object::EndpointSlice(slice(
            "ns",
            &format!("{name}-1"),
            name,
            &[("http", Protocol::Tcp, 8080)],
            eps,
        )));
    }
    let kernel = MemoryKernel::new();
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel.clone()));
    let mut projector = NodeProjector::new(NODE);
    projector.update(&model, &Changes::All);
    backend.apply(&ChangeSet::full(projector.state())).unwrap();
    assert!(!kernel.tables().elements().is_empty());
    // One change set: the node and every service (and slice) deleted.
    let mut touched = BTreeSet::new();
    for key in model
        .keys(kpng_model::Kind::EndpointSlice)
        .into_iter()
        .chain(model.keys(kpng_model::Kind::Service))
        .chain(model.keys(kpng_model::Kind::Node))
    {
        touched.extend(model.delete(&key).unwrap());
    }
    let ops = projector.update(&model, &Changes::Touched(touched));
    backend.apply(&ChangeSet::changes(&ops, projector.state())).unwrap();
    let left: Vec<String> = kernel.tables().elements().iter().map(|e| format!("{e:?}")).collect();
    assert!(left.is_empty(), "left behind: {left:#?}");
    let _ = MapName::ClusterIps;
}

/// The memory kernel, counting what each commit asks for and the elements read.
struct Counting {
    inner: MemoryKernel,
    last: std::sync::Arc<std::sync::Mutex<(usize, usize)>>,
    read: std::sync::Arc<std::sync::Mutex<Vec<kpng_nft::objects::ElementId>>>,
}

impl kpng_nft::Kernel for Counting {
    fn commit(&mut self, plan: &kpng_nft::plan::Plan<'_>) -> Result<(), kpng_nft::NftError> {
        let flushes = plan
            .commands
            .iter()
            .filter(|(_, c)| matches!(c, kpng_nft::plan::Command::FlushSet(_)))
            .count();
        *self.last.lock().unwrap() = (flushes, plan.element_count().1);
        self.inner.commit(plan)
    }

    fn read(&mut self) -> Result<Option<kpng_nft::KernelContents>, kpng_nft::NftError> {
        let contents = self.inner.read()?;
        self.note(&contents);
        Ok(contents)
    }

    fn read_unless_stale(
        &mut self,
        stale: &dyn Fn(usize) -> bool,
    ) -> Result<Option<kpng_nft::KernelContents>, kpng_nft::NftError> {
        let contents = self.inner.read_unless_stale(stale)?;
        self.note(&contents);
        Ok(contents)
    }
}

impl Counting {
    fn note(&self, contents: &Option<kpng_nft::KernelContents>) {
        let ids = contents.iter().flat_map(|c| c.elements.iter().map(|(id, _)| *id));
        *self.read.lock().unwrap() = ids.collect();
    }
}

/// A node state with `services` services of two endpoints each.
fn services_state(services: usize) -> LocalState {
    use kpng_testkit::builders::{endpoint, slice};
    let names: Vec<(String, String)> = (0..services)
        .map(|i| (format!("s{i}"), format!("10.96.{}.{}", i / 250, i % 250 + 1)))
        .collect();
    let pairs: Vec<(&str, &str)> = names.iter().map(|(n, ip)| (n.as_str(), ip.as_str())).collect();
    let mut model = node_and_services(&pairs);
    for (name, _) in &names {
        let eps = vec![endpoint("10.244.0.1", NODE), endpoint("10.244.1.1", "other")];
        model.apply(kpng_model::Object::EndpointSlice(slice(
            "ns",
            &format!("{name}-1"),
            name,
            &[("http", Protocol::Tcp, 8080)],
            eps,
        )));
    }
    let mut projector = NodeProjector::new(NODE);
    projector.update(&model, &Changes::All);
    projector.state().clone()
}

#[test]
fn a_restart_over_a_far_larger_table_flushes_what_is_stale() {
    let kernel = MemoryKernel::new();
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel.clone()));
    backend.apply(&ChangeSet::full(&services_state(600))).unwrap();

    // kpng comes back to a cluster of 20 of those services.
    let last = std::sync::Arc::new(std::sync::Mutex::new((0, 0)));
    let read = std::sync::Arc::default();
    let counting =
        Counting { inner: kernel.clone(), last: last.clone(), read: std::sync::Arc::clone(&read) };
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(counting));
    let small = services_state(20);
    backend.apply(&ChangeSet::full(&small)).unwrap();
    let (flushes, deletes) = *last.lock().unwrap();
    assert!(flushes > 0, "the mostly stale sets are flushed");
    assert_eq!(deletes, 0, "not deleted element by element");
    // Only the cluster IPs were read: what the other sets held was going anyway.
    let ids = read.lock().unwrap().clone();
    assert_eq!(ids.len(), 600);
    assert!(ids.iter().all(|id| id.map == MapName::ClusterIps));
    check_against_fresh(&kernel, &small).unwrap();
    assert!(kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend));

    // A restart over a table that is not mostly stale reads it whole and changes nothing.
    let counting =
        Counting { inner: kernel.clone(), last: last.clone(), read: std::sync::Arc::clone(&read) };
    *last.lock().unwrap() = (0, 0);
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(counting));
    backend.apply(&ChangeSet::full(&small)).unwrap();
    assert!(read.lock().unwrap().len() > 20 * 3, "every set read");
    assert_eq!(*last.lock().unwrap(), (0, 0), "nothing committed");
}

/// The cluster backends of the kernel: slot → endpoint address.
fn backends(kernel: &MemoryKernel) -> BTreeMap<u32, IpAddr> {
    let elements = kernel.tables().elements();
    elements
        .into_iter()
        .filter(|(id, _)| matches!(id.map, MapName::Backends(PickKind::Cluster, _)))
        .filter_map(|(id, value)| match (id.key.slot(), value) {
            (Some(slot), kpng_nft::objects::Value::Endpoint(ip, _)) => Some((slot, ip)),
            _ => None,
        })
        .collect()
}

#[test]
fn endpoints_keep_their_slots_across_changes() {
    use kpng_testkit::builders::{endpoint, slice};
    let mut model = node_and_services(&[("web", "10.96.0.1")]);
    let apply_endpoints = |model: &mut GlobalModel, ips: &[&str]| {
        let eps = ips.iter().map(|ip| endpoint(ip, "other")).collect();
        let ports = &[("http", Protocol::Tcp, 8080)];
        model.apply(kpng_model::Object::EndpointSlice(slice("ns", "web-1", "web", ports, eps)))
    };
    apply_endpoints(&mut model, &["10.244.1.1", "10.244.1.2", "10.244.1.3", "10.244.1.4"]);
    let kernel = MemoryKernel::new();
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel.clone()));
    let mut projector = NodeProjector::new(NODE);
    projector.update(&model, &Changes::All);
    backend.apply(&ChangeSet::full(projector.state())).unwrap();
    let before = backends(&kernel);
    assert_eq!(before.len(), 4);

    // The endpoint in slot 1 goes: the last one moves into its slot, the others stay.
    let mut left: Vec<String> = before.values().map(|ip| ip.to_string()).collect();
    let gone = left.remove(1);
    let left_refs: Vec<&str> = left.iter().map(String::as_str).collect();
    let touched = apply_endpoints(&mut model, &left_refs).unwrap_or_default();
    let ops = projector.update(&model, &Changes::Touched(touched.into_iter().collect()));
    backend.apply(&ChangeSet::changes(&ops, projector.state())).unwrap();
    let after = backends(&kernel);
    let expected: BTreeMap<u32, IpAddr> =
        BTreeMap::from([(0, before[&0]), (1, before[&3]), (2, before[&2])]);
    assert_eq!(after, expected, "{gone} left slot 1");

    // A new endpoint takes the next slot; nobody moves.
    let mut more = left_refs.clone();
    more.push("10.244.1.9");
    let touched = apply_endpoints(&mut model, &more).unwrap_or_default();
    let ops = projector.update(&model, &Changes::Touched(touched.into_iter().collect()));
    backend.apply(&ChangeSet::changes(&ops, projector.state())).unwrap();
    let mut expected = expected;
    expected.insert(3, "10.244.1.9".parse().unwrap());
    assert_eq!(backends(&kernel), expected);
}

#[test]
fn an_affinity_groups_slots_are_filed_under_its_live_count() {
    use kpng_model::global::SessionAffinity;
    use kpng_testkit::builders::{endpoint, slice};
    let mut model = node_and_services(&[]);
    let mut web = kpng_testkit::builders::service(
        "ns",
        "web",
        &["10.96.0.1"],
        &[("http", Protocol::Tcp, 80)],
    );
    web.session_affinity = SessionAffinity::ClientIP { timeout_seconds: 10800 };
    model.apply(kpng_model::Object::Service(web));
    let apply_endpoints = |model: &mut GlobalModel, ips: &[&str]| {
        let eps = ips.iter().map(|ip| endpoint(ip, "other")).collect();
        let ports = &[("http", Protocol::Tcp, 8080)];
        model.apply(kpng_model::Object::EndpointSlice(slice("ns", "web-1", "web", ports, eps)))
    };
    apply_endpoints(&mut model, &["10.244.1.1", "10.244.1.2"]);
    let kernel = MemoryKernel::new();
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(kernel.clone()));
    let mut projector = NodeProjector::new(NODE);
    projector.update(&model, &Changes::All);
    backend.apply(&ChangeSet::full(projector.state())).unwrap();
    let maps = |kernel: &MemoryKernel| -> BTreeSet<String> {
        let elements = kernel.tables().elements();
        elements
            .into_iter()
            .filter(|(id, _)| matches!(id.map, MapName::Backends(PickKind::Cluster, _)))
            .map(|(id, _)| id.map.name().into_owned())
            .collect()
    };
    assert_eq!(maps(&kernel), BTreeSet::from(["cluster_backends_2".to_string()]));

    // The endpoint in slot 0 goes: the other keeps slot 1, over a hole.
    let touched = apply_endpoints(&mut model, &["10.244.1.2"]).unwrap_or_default();
    let ops = projector.update(&model, &Changes::Touched(touched.into_iter().collect()));
    backend.apply(&ChangeSet::changes(&ops, projector.state())).unwrap();
    assert_eq!(backends(&kernel), BTreeMap::from([(1, "10.244.1.2".parse().unwrap())]));
    let fresh = fresh(projector.state());
    assert_eq!(maps(&kernel), BTreeSet::from(["cluster_backends_1".to_string()]));
    assert_eq!(maps(&kernel), maps(&fresh), "filed as a fresh load files them");
}

#[test]
fn a_restart_takes_no_slots_from_a_destination_another_service_holds() {
    use kpng_model::global::Outside;
    use kpng_testkit::builders::{endpoint, service, slice};
    let mut model = node_and_services(&[]);
    let ports = &[("http", Protocol::Tcp, 80)];
    // Both name 10.96.0.1:80; the older holds it. The younger also has an external IP.
    let mut older = service("ns", "older", &["10.96.0.1"], ports);
    older.created_at = Some(100);
    let mut younger = service("ns", "younger", &["10.96.0.1"], ports);
    younger.created_at = Some(200);
    younger.outside = Outside {
        external_ips: Box::new(["192.0.2.1".parse().unwrap()]),
        load_balancer_ingress: Box::new([]),
        load_balancer_source_ranges: Box::new([]),
    }
    .boxed();
    model.apply(kpng_model::Object::Service(older));
    model.apply(kpng_model::Object::Service(younger));
    let endpoints = |service: &str, ips: &[&str]| {
        let eps = ips.iter().map(|ip| endpoint(ip, "other")).collect();
        let slice = slice("ns", &format!("{service}-1"), service, ports, eps);
        kpng_model::Object::EndpointSlice(slice)
    };
    // The older one's only endpoint is the one the younger sorts second.
    model.apply(endpoints("older", &["10.244.1.2"]));
    model.apply(endpoints("younger", &["10.244.1.1", "10.244.1.2"]));
    let kernel = MemoryKernel::new();
    let mut projector = NodeProjector::new(NODE);
    projector.update(&model, &Changes::All);
    let state = projector.state();
    NftBackend::new(NftOptions::default(), Box::new(kernel.clone()))
        .apply(&ChangeSet::full(state))
        .unwrap();
    let elements = |kernel: &MemoryKernel| {
        let mut all: Vec<String> =
            (kernel.tables().elements().iter()).map(|e| format!("{e:?}")).collect();
        all.sort();
        all
    };
    let before = elements(&kernel);
    assert!(
        before.iter().any(|e| e.contains("192.0.2.1") && e.contains("Endpoint(10.244.1.2")),
        "the younger service's own destination has its slots: {before:#?}"
    );

    // A restart seeds the younger service's slots from its own destination, not from the
    // one the older holds (which lists 10.244.1.2 in slot 0), so it writes nothing.
    NftBackend::new(NftOptions::default(), Box::new(kernel.clone()))
        .apply(&ChangeSet::full(state))
        .unwrap();
    assert_eq!(elements(&kernel), before);
}

/// The memory kernel, recording the elements each commit adds, and refusing the commit
/// numbered `refuse` (from 1) once.
struct Recording {
    inner: MemoryKernel,
    commits: std::sync::Arc<std::sync::Mutex<Vec<Vec<kpng_nft::objects::ElementId>>>>,
    refuse: Option<usize>,
}

impl kpng_nft::Kernel for Recording {
    fn commit(&mut self, plan: &kpng_nft::plan::Plan<'_>) -> Result<(), kpng_nft::NftError> {
        use kpng_nft::plan::Command;
        let mut commits = self.commits.lock().unwrap();
        if self.refuse == Some(commits.len() + 1) {
            self.refuse = None;
            self.inner.tables().fail_commits = 1;
            return self.inner.commit(plan);
        }
        let mut added = Vec::new();
        for (_, command) in &plan.commands {
            if let Command::Elements { add: true, elements, .. } = command {
                added.extend(elements.iter().map(|(id, _)| id));
            }
        }
        self.inner.commit(plan)?;
        commits.push(added);
        Ok(())
    }

    fn read(&mut self) -> Result<Option<kpng_nft::KernelContents>, kpng_nft::NftError> {
        self.inner.read()
    }
}

/// Whether elements of `map` lead a destination's packets somewhere (a pick, an affinity
/// chain, a drop or reject).
fn is_entry(map: MapName) -> bool {
    use MapName::*;
    matches!(
        map,
        ClusterDests
            | LocalDests
            | ExternalLocalDests
            | NodePortClusterDests
            | NodePortLocalDests
            | RejectDests
            | DropDests
            | RejectNodePorts
            | DropNodePorts
            | AffinityCluster
            | AffinityLocal
            | AffinityNodePortCluster
            | AffinityNodePortLocal
    )
}

/// The destination an element is about, if any.
fn destination(id: &kpng_nft::objects::ElementId) -> Option<kpng_nft::objects::Dest> {
    match id.key {
        Key::Dest(dest) | Key::DestSlot(dest, _) | Key::DestSource(dest, _) => Some(dest),
        _ => None,
    }
}

/// Every destination has all its elements in one transaction (whole services), and its
/// entries lead packets only to what is in.
fn revealed_whole(commits: &[Vec<kpng_nft::objects::ElementId>]) {
    let mut first: BTreeMap<kpng_nft::objects::Dest, usize> = BTreeMap::new();
    for (n, added) in commits.iter().enumerate() {
        for dest in added.iter().filter_map(destination) {
            let at = *first.entry(dest).or_insert(n);
            assert_eq!(at, n, "{dest:?} in transactions {at} and {n}");
        }
    }
    let entries = commits.iter().flatten().filter(|id| is_entry(id.map));
    assert!(entries.filter_map(destination).all(|d| first.contains_key(&d)));
}

#[test]
fn a_large_cold_start_commits_whole_services_in_several_transactions() {
    let state = services_state(40);
    let options = NftOptions { cold_start_transaction: 60, ..NftOptions::default() };
    let commits = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kernel = MemoryKernel::new();
    let recording = Recording { inner: kernel.clone(), commits: commits.clone(), refuse: None };
    let mut backend = NftBackend::new(options.clone(), Box::new(recording));
    backend.apply(&ChangeSet::full(&state)).unwrap();
    let commits = commits.lock().unwrap().clone();
    assert!(commits.len() >= 4, "{} transactions", commits.len());
    // Whole services: no destination is revealed before all it needs is in.
    revealed_whole(&commits);
    let revealed = commits.iter().flatten().filter(|id| id.map == MapName::ClusterDests);
    assert_eq!(revealed.count(), 40);
    // The kernel ends as one transaction makes it; the backend is in sync with it.
    check_against_fresh(&kernel, &state).unwrap();
    assert!(kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend));

    // A refused transaction part way leaves those before it in place; the next change set
    // completes the table.
    let commits = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kernel = MemoryKernel::new();
    let recording = Recording { inner: kernel.clone(), commits: commits.clone(), refuse: Some(3) };
    let mut backend = NftBackend::new(options, Box::new(recording));
    assert!(backend.apply(&ChangeSet::full(&state)).is_err());
    assert_eq!(commits.lock().unwrap().len(), 2);
    let partial = kernel.tables().elements().len();
    assert!(partial > 0 && partial < fresh(&state).tables().elements().len());
    backend.apply(&ChangeSet::full(&state)).unwrap();
    check_against_fresh(&kernel, &state).unwrap();
    assert!(kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend));
}

#[test]
fn a_cold_start_part_brings_what_its_services_add_to_the_layout() {
    use kpng_model::global::SessionAffinity;
    use kpng_testkit::builders::{endpoint, service, slice};
    // The last services in key order need a count set beyond the pick tree and an affinity
    // group: their part, not the first, must create them before adding their elements.
    let mut model = node_and_services(&[]);
    for i in 0..40 {
        let name = format!("s{i:02}");
        let ip = format!("10.96.0.{}", i + 1);
        let mut svc = service("ns", &name, &[&ip], &[("http", Protocol::Tcp, 80)]);
        let large = i >= 38;
        if i == 39 {
            svc.session_affinity = SessionAffinity::ClientIP { timeout_seconds: 60 };
        }
        model.apply(kpng_model::Object::Service(svc));
        let count = if large { 257 } else { 2 };
        let eps = (0..count)
            .map(|e| endpoint(&format!("10.{}.{}.{}", 200 + i, e / 250, e % 250 + 1), "other"))
            .collect();
        let ports = &[("http", Protocol::Tcp, 8080)];
        model.apply(kpng_model::Object::EndpointSlice(slice(
            "ns",
            &format!("{name}-1"),
            &name,
            ports,
            eps,
        )));
    }
    let mut projector = NodeProjector::new(NODE);
    projector.update(&model, &Changes::All);
    let state = projector.state().clone();

    let options = NftOptions { cold_start_transaction: 60, ..NftOptions::default() };
    let commits = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let kernel = MemoryKernel::new();
    let recording = Recording { inner: kernel.clone(), commits: commits.clone(), refuse: None };
    let mut backend = NftBackend::new(options, Box::new(recording));
    backend.apply(&ChangeSet::full(&state)).unwrap();
    // The large services are last, in transactions of their own, which bring their count
    // set and affinity chains.
    let commits = commits.lock().unwrap().clone();
    let large = commits.iter().position(|added| {
        added.iter().any(|id| destination(id).is_some_and(|d| d.ip.to_string() == "10.96.0.39"))
    });
    assert!(large.is_some_and(|at| at >= 3), "{large:?} of {}", commits.len());
    revealed_whole(&commits);
    // The tables are those one transaction makes (tracing packets through hundreds of
    // endpoints is left to the smaller states).
    assert_eq!(canonical(&kernel.tables()), canonical(&fresh(&state).tables()));
    assert!(kpng_conformance::finds_no_drift(backend.template_stats(), &mut backend));
}

/// The memory kernel as an aggregator is seen: it takes whole tables at every reset.
struct Whole {
    inner: MemoryKernel,
    /// Whole publications and changes received.
    received: std::sync::Arc<std::sync::Mutex<(usize, usize)>>,
}

impl kpng_nft::Kernel for Whole {
    fn commit(&mut self, plan: &kpng_nft::plan::Plan<'_>) -> Result<(), kpng_nft::NftError> {
        self.received.lock().unwrap().1 += 1;
        self.inner.commit(plan)
    }

    fn replace(
        &mut self,
        layout: &kpng_nft::plan::Plan<'_>,
        elements: kpng_nft::plan::AllElements<'_>,
    ) -> Result<(), kpng_nft::NftError> {
        self.received.lock().unwrap().0 += 1;
        // A whole publication replaces what was there.
        *self.inner.tables() = MemoryTables::default();
        self.inner.replace(layout, elements)
    }

    fn read(&mut self) -> Result<Option<kpng_nft::KernelContents>, kpng_nft::NftError> {
        self.inner.read()
    }

    fn publishes_whole(&self) -> bool {
        true
    }
}

#[test]
fn a_kernel_taking_whole_tables_gets_them_at_each_reset_and_every_change_after() {
    let (before, after) = (services_state(3), services_state(4));
    let kernel = MemoryKernel::new();
    let received = std::sync::Arc::new(std::sync::Mutex::new((0, 0)));
    let open = || Whole { inner: kernel.clone(), received: received.clone() };
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(open()));
    backend.apply(&ChangeSet::full(&before)).unwrap();
    assert_eq!(*received.lock().unwrap(), (1, 0), "the first load goes whole");
    // A restart over what was published: the whole tables again, though nothing differs.
    let mut backend = NftBackend::new(NftOptions::default(), Box::new(open()));
    backend.apply(&ChangeSet::full(&before)).unwrap();
    assert_eq!(*received.lock().unwrap(), (2, 0), "a restart publishes whole");
    // The change after it is published as a change.
    let ops = kpng_local::diff(&before, &after);
    backend.apply(&ChangeSet::changes(&ops, &after)).unwrap();
    assert_eq!(*received.lock().unwrap(), (2, 1), "the change after a restart went out");
    check_against_fresh(&kernel, &after).unwrap();
}
