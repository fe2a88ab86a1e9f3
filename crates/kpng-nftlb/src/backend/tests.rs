//! The backend against an in-memory nftlb: the calls a change costs, a restart, drift, and
//! farms nftlb answers success for but never installs.

use std::sync::{Arc, Mutex};

use kpng_backend::{Backend, ChangeSet};
use kpng_local::{diff, project_node_state};
use kpng_model::{GlobalModel, Object, Protocol};
use kpng_testkit::builders::{endpoint, node, service, slice};
use serde_json::Value;

use super::*;
use crate::farm::FarmBackend;

/// nftlb in memory: farms by name, each call logged. Farms past `installs` (in creation
/// order) are answered success but never reach the "kernel".
#[derive(Default)]
struct Daemon {
    farms: BTreeMap<String, Farm>,
    created: Vec<String>,
    calls: Vec<String>,
    /// The body of every POST.
    posted: Vec<String>,
    installs: Option<usize>,
}

#[derive(Clone, Default)]
struct Fake(Arc<Mutex<Daemon>>);

impl Fake {
    fn daemon(&self) -> std::sync::MutexGuard<'_, Daemon> {
        self.0.lock().unwrap()
    }
}

fn text(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or_default().to_string()
}

impl Api for Fake {
    fn call(&mut self, method: &str, path: &str, body: &str) -> Result<String, NftlbError> {
        let mut d = self.daemon();
        d.calls.push(format!("{method} {path}"));
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        match (method, parts.as_slice()) {
            ("GET", ["farms"]) => {
                let farms: Vec<Value> = d
                    .farms
                    .values()
                    .map(|f| {
                        let mut v = serde_json::to_value(&f.vip).unwrap();
                        v["name"] = f.name.clone().into();
                        v["priority"] = "1".into();
                        v["backends"] =
                            serde_json::to_value(f.backends.values().collect::<Vec<_>>()).unwrap();
                        v
                    })
                    .collect();
                Ok(serde_json::json!({ "farms": farms }).to_string())
            }
            ("POST", ["farms"]) => {
                d.posted.push(body.to_string());
                let v: Value = serde_json::from_str(body).unwrap();
                for farm in v["farms"].as_array().unwrap() {
                    let name = text(farm, "name");
                    if name == POISON {
                        return Err(NftlbError::Refused {
                            method: method.into(),
                            path: path.into(),
                            status: "400".into(),
                            body: "refused".into(),
                        });
                    }
                    if farm.get("family").is_some() {
                        let vip = serde_json::from_value(farm.clone()).unwrap();
                        d.farms.insert(
                            name.clone(),
                            Farm {
                                name: name.clone(),
                                vip,
                                backends: BTreeMap::new(),
                                direct: None,
                            },
                        );
                        d.created.push(name.clone());
                    }
                    let Some(f) = d.farms.get_mut(&name) else {
                        return Err(NftlbError::Refused {
                            method: method.into(),
                            path: path.into(),
                            status: "400".into(),
                            body: "no farm".into(),
                        });
                    };
                    for b in farm["backends"].as_array().into_iter().flatten() {
                        let b: FarmBackend = serde_json::from_value(b.clone()).unwrap();
                        f.backends.insert(b.name.clone(), b);
                    }
                }
                Ok("{\"response\": \"success\"}".into())
            }
            ("DELETE", ["farms", name]) => {
                d.farms.remove(*name);
                d.created.retain(|n| n != name);
                Ok("{}".into())
            }
            ("DELETE", ["farms", name, "backends", backend]) => {
                d.farms.get_mut(*name).unwrap().backends.remove(*backend);
                Ok("{}".into())
            }
            _ => panic!("unexpected call {method} {path}"),
        }
    }
}

impl Installed for Fake {
    fn chains(&mut self, farms: &[&Farm]) -> Result<BTreeMap<String, String>, NftlbError> {
        let d = self.daemon();
        let installed: BTreeSet<&String> =
            d.created.iter().take(d.installs.unwrap_or(usize::MAX)).collect();
        Ok(farms
            .iter()
            .filter(|f| installed.contains(&f.name))
            .filter_map(|asked| Some((asked, d.farms.get(&asked.name)?)))
            .map(|(asked, f)| {
                // A dsr farm's chain forwards to link-layer addresses.
                if let Some(direct) = &asked.direct {
                    let macs: Vec<&String> =
                        f.backends.keys().filter_map(|n| direct.backends.get(n)).collect();
                    let macs: Vec<&str> = macs.iter().map(|m| m.as_str()).collect();
                    return (f.name.clone(), format!("ether daddr set {{ {} }}", macs.join(", ")));
                }
                let targets: Vec<String> =
                    f.backends.values().map(|b| format!("{} . {}", b.ip_addr, b.port)).collect();
                (f.name.clone(), format!("dnat ip to ct mark map {{ {} }}", targets.join(", ")))
            })
            .collect())
    }
}

/// A farm name the in-memory nftlb refuses.
const POISON: &str = "poison";

fn backend(fake: &Fake) -> NftlbBackend {
    NftlbBackend::new(Box::new(fake.clone()), Box::new(fake.clone()))
}

/// Sets the endpoints of service `name` (one slice of that name, port http to 8080).
fn set_endpoints(model: &mut GlobalModel, name: &str, ips: &[String]) {
    let eps = ips.iter().map(|ip| endpoint(ip, "n0")).collect();
    model.apply(Object::EndpointSlice(slice(
        "ns",
        name,
        name,
        &[("http", Protocol::Tcp, 8080)],
        eps,
    )));
}

fn model(services: usize, endpoints: usize) -> GlobalModel {
    let mut model = GlobalModel::new();
    model.apply(Object::Node(node("n0", None, &["192.168.0.1"])));
    for s in 0..services {
        let name = format!("s{s}");
        let ip = format!("10.96.0.{}", s + 1);
        model.apply(Object::Service(service("ns", &name, &[&ip], &[("http", Protocol::Tcp, 80)])));
        let ips: Vec<String> = (0..endpoints).map(|e| format!("10.1.{s}.{e}")).collect();
        set_endpoints(&mut model, &name, &ips);
    }
    model
}

#[test]
fn an_endpoint_change_adds_or_deletes_that_backend_only() {
    let fake = Fake::default();
    let mut b = backend(&fake);
    let mut model = model(3, 2);
    let before = project_node_state(&model, "n0");
    b.apply(&ChangeSet::full(&before)).unwrap();
    assert_eq!(fake.daemon().calls, ["GET /farms", "POST /farms"], "new farms in one call");
    assert_eq!(fake.daemon().farms.len(), 3);
    assert_eq!(fake.daemon().farms["ns--s1--http"].backends.len(), 2);

    set_endpoints(&mut model, "s1", &["10.1.1.0", "10.1.1.1", "10.1.1.9"].map(String::from));
    let added = project_node_state(&model, "n0");
    fake.daemon().calls.clear();
    b.apply(&ChangeSet::changes(&diff(&before, &added), &added)).unwrap();
    assert_eq!(fake.daemon().calls, ["POST /farms"], "one backend added, no farm recreated");
    assert_eq!(fake.daemon().farms["ns--s1--http"].backends.len(), 3);

    set_endpoints(&mut model, "s1", &["10.1.1.0", "10.1.1.9"].map(String::from));
    let removed = project_node_state(&model, "n0");
    fake.daemon().calls.clear();
    b.apply(&ChangeSet::changes(&diff(&added, &removed), &removed)).unwrap();
    assert_eq!(fake.daemon().calls.len(), 1, "{:?}", fake.daemon().calls);
    assert!(fake.daemon().calls[0].starts_with("DELETE /farms/ns--s1--http/backends/"));

    // A deleted service deletes its farm.
    model.delete(&kpng_model::global::ObjectRef::Service(ServiceKey::new("ns", "s2")));
    let deleted = project_node_state(&model, "n0");
    fake.daemon().calls.clear();
    b.apply(&ChangeSet::changes(&diff(&removed, &deleted), &deleted)).unwrap();
    assert_eq!(fake.daemon().calls, ["DELETE /farms/ns--s2--http"]);
    assert!(kpng_conformance::finds_no_drift(b.stats(), &mut b), "nftlb holds what kpng applied");
}

#[test]
fn a_restart_over_the_same_farms_calls_nothing_and_foreign_farms_go() {
    let fake = Fake::default();
    let state = project_node_state(&model(4, 3), "n0");
    backend(&fake).apply(&ChangeSet::full(&state)).unwrap();
    fake.daemon().calls.clear();
    backend(&fake).apply(&ChangeSet::full(&state)).unwrap();
    assert_eq!(fake.daemon().calls, ["GET /farms"]);

    // Someone adds a farm and deletes a backend: the next start or verification repairs.
    let mut b = backend(&fake);
    b.apply(&ChangeSet::full(&state)).unwrap();
    {
        let mut d = fake.daemon();
        let mut other = d.farms["ns--s0--http"].clone();
        other.name = "other--http".into();
        d.farms.insert(other.name.clone(), other);
        let s3 = d.farms.get_mut("ns--s3--http").unwrap();
        let first = s3.backends.keys().next().unwrap().clone();
        s3.backends.remove(&first);
    }
    fake.daemon().calls.clear();
    assert!(b.verify().unwrap(), "the verification repairs what it found");
    assert_eq!(b.stats().drifts.load(std::sync::atomic::Ordering::Relaxed), 1, "drift unseen");
    let d = fake.daemon();
    assert!(!d.farms.contains_key("other--http"));
    assert_eq!(d.farms["ns--s3--http"].backends.len(), 3);
    // The read, then the two farms that differ, and nothing else.
    assert_eq!(d.calls.len(), 3, "{:?}", d.calls);
    assert_eq!(d.calls[0], "GET /farms");
}

#[test]
fn a_farm_nftlb_answers_for_but_never_installs_fails_the_change_by_name() {
    let fake = Fake::default();
    fake.daemon().installs = Some(2);
    let state = project_node_state(&model(3, 1), "n0");
    let mut b = backend(&fake);
    let error = b.apply(&ChangeSet::full(&state)).unwrap_err();
    let text = kpng_backend::error_chain(&error);
    assert!(text.contains("ns--s2--http") && text.contains("does not hold"), "{text}");
    // The retry lists the farms again rather than trusting what it sent.
    fake.daemon().installs = None;
    fake.daemon().calls.clear();
    b.apply(&ChangeSet::full(&state)).unwrap();
    assert_eq!(fake.daemon().calls.first().map(String::as_str), Some("GET /farms"));
}

#[test]
fn farms_are_named_per_namespace_service_port_and_family() {
    let mut model = GlobalModel::new();
    model.apply(Object::Node(node("n0", None, &["192.168.0.1"])));
    model.apply(Object::Service(service(
        "shop",
        "web",
        &["10.96.0.5", "fd00::5"],
        &[("", Protocol::Udp, 53)],
    )));
    model.apply(Object::EndpointSlice(slice(
        "shop",
        "w",
        "web",
        &[("", Protocol::Udp, 5353)],
        vec![endpoint("10.1.0.1", "n0")],
    )));
    let state = project_node_state(&model, "n0");
    let farms = farms_of(&state.services[&ServiceKey::new("shop", "web")], false);
    let names: Vec<&str> = farms.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["shop--web--default", "shop--web--default--ipv6"]);
    assert_eq!(farms[0].vip.protocol, "udp");
    assert_eq!(farms[0].vip.virtual_ports, "53");
    let backend = farms[0].backends.values().next().unwrap();
    assert_eq!((backend.ip_addr.as_str(), backend.port.as_str()), ("10.1.0.1", "5353"));
    assert!(farms[1].backends.is_empty(), "no IPv6 endpoint");
}

/// Service `ns/s0` of [`model`] with these settings and ClientIP affinity of `affinity`
/// seconds.
fn annotated(lb: LoadBalancing, affinity: Option<u32>) -> GlobalModel {
    let mut model = model(2, 2);
    let mut svc = service("ns", "s0", &["10.96.0.1"], &[("http", Protocol::Tcp, 80)]);
    svc.load_balancing = lb;
    if let Some(timeout_seconds) = affinity {
        svc.session_affinity = kpng_model::global::SessionAffinity::ClientIP { timeout_seconds };
    }
    model.apply(Object::Service(svc));
    model
}

fn vip_of(model: &GlobalModel) -> crate::farm::Vip {
    let state = project_node_state(model, "n0");
    farms_of(&state.services[&ServiceKey::new("ns", "s0")], false).remove(0).vip
}

#[test]
fn annotations_become_the_farm_fields_of_the_same_name() {
    use kpng_model::global::{Helper, LogPath, Persistence, PersistenceKey, Scheduler};
    let plain = vip_of(&annotated(LoadBalancing::default(), None));
    let fields = |v: &crate::farm::Vip| {
        [&v.mode, &v.scheduler, &v.sched_param, &v.persistence, &v.persist_ttl, &v.helper, &v.log]
            .map(|s| s.clone())
    };
    assert_eq!(fields(&plain), ["snat", "weight", "none", "none", "60", "none", "none"]);

    let persistence = Some(Persistence { key: PersistenceKey::SrcIpDstPort, timeout_seconds: 5 });
    let all = LoadBalancing {
        scheduler: Some(Scheduler::RoundRobin),
        persistence,
        mode: Some(NatMode::Dnat),
        helper: Some(Helper::Ftp),
        log: Some(LogPath::Forward),
    };
    let vip = vip_of(&annotated(all, Some(30)));
    assert_eq!(fields(&vip), ["dnat", "rr", "none", "srcip dstport", "5", "ftp", "forward"]);

    // `hash` hashes the persistence key, with no stickiness.
    let hashed = LoadBalancing { scheduler: Some(Scheduler::Hash), persistence, ..all };
    let vip = vip_of(&annotated(hashed, None));
    assert_eq!((vip.scheduler.as_str(), vip.sched_param.as_str()), ("hash", "srcip dstport"));
    assert_eq!(vip.persistence, "none");

    // ClientIP affinity alone is srcip persistence with its timeout.
    let vip = vip_of(&annotated(LoadBalancing::default(), Some(30)));
    assert_eq!((vip.persistence.as_str(), vip.persist_ttl.as_str()), ("srcip", "30"));

    // The modes a farm cannot express here are said, the others not.
    let b = backend(&Fake::default());
    let dsr = LoadBalancing { mode: Some(NatMode::Dsr), ..LoadBalancing::default() };
    assert_eq!(b.unsupported(&dsr), [(AnnotationKey::Mode, "dsr")]);
    assert!(b.unsupported(&all).is_empty());
}

#[test]
fn an_annotation_change_recreates_that_farm_only() {
    let fake = Fake::default();
    let mut b = backend(&fake);
    let before = project_node_state(&annotated(LoadBalancing::default(), None), "n0");
    b.apply(&ChangeSet::full(&before)).unwrap();
    let rr = LoadBalancing {
        scheduler: Some(kpng_model::global::Scheduler::RoundRobin),
        ..LoadBalancing::default()
    };
    let after = project_node_state(&annotated(rr, None), "n0");
    fake.daemon().calls.clear();
    b.apply(&ChangeSet::changes(&diff(&before, &after), &after)).unwrap();
    assert_eq!(fake.daemon().calls, ["DELETE /farms/ns--s0--http", "POST /farms"]);
    assert_eq!(fake.daemon().farms["ns--s0--http"].vip.scheduler, "rr");
    assert_eq!(fake.daemon().farms["ns--s0--http"].backends.len(), 2);
    assert!(kpng_conformance::finds_no_drift(b.stats(), &mut b));
}

#[test]
fn nftlbs_own_listing_reads_as_the_farm_kpng_wants() {
    // As nftlb 1.0.7 lists a farm: more fields, and a trailing space after some values.
    let listed = r#"{"farms": [{"name": "ns--s0--http", "family": "ipv4",
        "virtual-addr": "10.96.0.1", "virtual-ports": "80", "source-addr": "", "mode": "snat",
        "protocol": "tcp", "scheduler": "weight", "sched-param": "none",
        "persistence": "srcip ", "persist-ttl": "30", "helper": "none", "log": "forward ",
        "log-rtlimit": "0/second", "state": "up", "backends": []}]}"#;
    let listing: crate::farm::Listing = serde_json::from_str(listed).unwrap();
    let farm = Farm::from(listing.farms.into_iter().next().unwrap());
    let lb = LoadBalancing {
        log: Some(kpng_model::global::LogPath::Forward),
        ..LoadBalancing::default()
    };
    assert_eq!(farm.vip, vip_of(&annotated(lb, Some(30))));
}

/// Neighbours on `eth0` with addresses from their last octet; 10.1.0.9 is no neighbour.
struct Links;

impl crate::link::LinkLayer for Links {
    fn resolve(&mut self, ips: &[IpAddr]) -> Result<crate::link::Resolved, String> {
        if let Some(ip) = ips.iter().find(|ip| ip.to_string() == "10.1.0.9") {
            return Err(format!("{ip} has no link-layer address"));
        }
        let mac = |ip: &IpAddr| match ip {
            IpAddr::V4(v4) => format!("02:00:00:00:01:{:02x}", v4.octets()[3]),
            IpAddr::V6(_) => "02:00:00:00:02:00".to_string(),
        };
        Ok(crate::link::Resolved {
            oface: "eth0".into(),
            oface_mac: "02:00:00:00:00:01".into(),
            macs: ips.iter().map(|ip| (*ip, mac(ip))).collect(),
        })
    }
}

#[test]
fn dsr_farms_carry_the_link_layer_nftlb_needs() {
    let fake = Fake::default();
    let mut b = backend(&fake).with_direct_return("eth1".into(), Box::new(Links));
    let dsr = LoadBalancing { mode: Some(NatMode::Dsr), ..LoadBalancing::default() };
    assert!(b.unsupported(&dsr).is_empty());
    let mut model = annotated(dsr, None);
    let before = project_node_state(&model, "n0");
    b.apply(&ChangeSet::full(&before)).unwrap();
    let posted: Value = serde_json::from_str(fake.daemon().posted.last().unwrap()).unwrap();
    let farm = posted["farms"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == "ns--s0--http")
        .unwrap()
        .clone();
    let fields = ["mode", "iface", "oface", "ether-addr"].map(|k| text(&farm, k));
    assert_eq!(fields, ["dsr", "eth1", "eth0", "02:00:00:00:00:01"]);
    let backends: Vec<(String, String)> = farm["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| (text(b, "ether-addr"), text(b, "port")))
        .collect();
    // The packet keeps the service port: no target port.
    assert_eq!(
        backends,
        [("02:00:00:00:01:00".to_string(), String::new()), ("02:00:00:00:01:01".into(), "".into())]
    );
    // The other service is an ordinary farm.
    let other = posted["farms"].as_array().unwrap().iter().find(|f| f["name"] == "ns--s1--http");
    assert!(other.unwrap().get("iface").is_none());
    // nftlb does not list the link layer: the farms still read as kpng's.
    assert!(kpng_conformance::finds_no_drift(b.stats(), &mut b));

    // A new endpoint is one backend more, with its address.
    set_endpoints(&mut model, "s0", &["10.1.0.0".into(), "10.1.0.1".into(), "10.1.0.2".into()]);
    let after = project_node_state(&model, "n0");
    fake.daemon().calls.clear();
    b.apply(&ChangeSet::changes(&diff(&before, &after), &after)).unwrap();
    assert_eq!(fake.daemon().calls, ["POST /farms"]);
    assert!(fake.daemon().posted.last().unwrap().contains("\"ether-addr\":\"02:00:00:00:01:02\""));

    // An endpoint that is no neighbour fails the change, naming the farm and the address.
    set_endpoints(&mut model, "s0", &["10.1.0.0".into(), "10.1.0.9".into()]);
    let last = project_node_state(&model, "n0");
    let error = b.apply(&ChangeSet::changes(&diff(&after, &last), &last)).unwrap_err();
    let shown = kpng_backend::error_chain(&error);
    assert!(shown.contains("ns--s0--http") && shown.contains("10.1.0.9"), "{shown}");
}

/// The conformance suite over the in-memory nftlb.
struct Conformance(Fake);

impl Conformance {
    /// A farm of the suite's sample states, under another name.
    fn farm(name: &str) -> Farm {
        let (_, b) = kpng_conformance::states::pair();
        let service = b.services.values().next().expect("a sample service");
        let mut farm = crate::farm::farms_of(service, false).remove(0);
        farm.name = name.to_string();
        farm
    }
}

impl kpng_conformance::Subject for Conformance {
    type Render = NftlbRender;
    type Kernel = NftlbKernel;

    fn name(&self) -> &'static str {
        "to-nftlb over an nftlb in memory"
    }

    fn render(&self) -> NftlbRender {
        NftlbRender { warned: BTreeSet::new(), direct: None }
    }

    fn open(&self) -> NftlbKernel {
        NftlbKernel::new(Box::new(self.0.clone()), Box::new(self.0.clone()))
    }

    fn wipe(&self) {
        *self.0.daemon() = Daemon::default();
    }

    fn poison(&self) -> (FarmName, Farm) {
        (FarmName(POISON.into()), Conformance::farm(POISON))
    }

    fn foreign(&self) -> (FarmName, Farm) {
        (FarmName("foreign".into()), Conformance::farm("foreign"))
    }

    fn changed(&self, _key: &FarmName, farm: &Farm) -> Option<Farm> {
        let mut farm = farm.clone();
        let mut extra = farm.backends.values().next()?.clone();
        extra.name = "extra".into();
        farm.backends.insert(extra.name.clone(), extra);
        Some(farm)
    }
}

#[test]
fn nftlb_in_memory_conforms() {
    kpng_conformance::run(&Conformance(Fake::default()), 64);
}
