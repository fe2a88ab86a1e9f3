use std::collections::BTreeMap;

use kpng_local::project_node_state;
use kpng_model::global::{
    IpMode, LoadBalancerIngress, NodeAddress, NodeAddressKind, ServicePort, SessionAffinity,
    TargetPort, TrafficPolicy,
};
use kpng_model::{GlobalModel, Node, Object, Service, ServiceCidr, ServiceKey};
use kpng_store::{SourceEvent, store};
use kpng_testkit::strategies::{NODES, arb_mutation, build};
use proptest::prelude::*;
use prost::Message;

use super::*;
use crate::{globalv1, localv1};

/// What a default proxy's mirror of `model` holds: no slice without endpoints (they have no
/// item on the wire), no service or slice labelled for another proxy.
fn mirrorable(model: &GlobalModel) -> GlobalModel {
    let mut out = GlobalModel::new();
    for object in model.objects() {
        let keep = match &object {
            Object::EndpointSlice(s) => !s.endpoints.is_empty() && s.proxy_name.is_none(),
            Object::Service(s) => s.proxy_name.is_none(),
            Object::Node(_) | Object::ServiceCidr(_) => true,
        };
        if keep {
            out.apply(object);
        }
    }
    out
}

fn reset_and(items: &[GlobalItem]) -> Vec<localv1::OpItem> {
    let mut ops =
        vec![localv1::OpItem { op: Some(localv1::op_item::Op::Reset(localv1::EmptyOp {})) }];
    ops.extend(set_ops(items));
    ops
}

fn set_ops(items: &[GlobalItem]) -> Vec<localv1::OpItem> {
    items.iter().map(GlobalItem::set_op).collect()
}

/// The model a store holds after `events`.
fn stored(events: Vec<SourceEvent>) -> GlobalModel {
    let (mut writer, reader) = store(&[]);
    writer.apply(events);
    reader.snapshot().model().clone()
}

proptest! {
    /// What a node must enforce is the same from the original model and from its mirror,
    /// whether the mirror was built at once or changed incrementally.
    #[test]
    fn a_mirrored_model_projects_like_the_original(
        a in proptest::collection::vec(arb_mutation(), 0..20),
        b in proptest::collection::vec(arb_mutation(), 0..20),
    ) {
        let (ma, mb) = (build(&a), build(&b));
        let mut mirror = Mirror::default();
        let mut ops = vec![localv1::OpItem { op: Some(localv1::op_item::Op::Reset(localv1::EmptyOp {})) }];
        ops.extend(set_ops(&model_items(&ma)));
        let mut events = mirror.apply(&ops).unwrap();
        // From a to b: delete what b lacks, set what differs.
        let old: BTreeMap<(localv1::Set, String), Vec<u8>> =
            model_items(&ma).into_iter().map(|i| ((i.set, i.path), i.bytes)).collect();
        let new: BTreeMap<(localv1::Set, String), Vec<u8>> =
            model_items(&mb).into_iter().map(|i| ((i.set, i.path), i.bytes)).collect();
        let mut step = Vec::new();
        for (set, path) in old.keys().filter(|k| !new.contains_key(*k)) {
            step.push(delete_op(*set, path));
        }
        for ((set, path), bytes) in &new {
            if old.get(&(*set, path.clone())) != Some(bytes) {
                let item = GlobalItem { set: *set, path: path.clone(), bytes: bytes.clone() };
                step.push(item.set_op());
            }
        }
        events.extend(mirror.apply(&step).unwrap());
        let mirrored = stored(events);
        let mut expected = mirrorable(&mb);
        for node in NODES {
            prop_assert_eq!(project_node_state(&mirrored, node), project_node_state(&expected, node));
        }
        // Every field round-trips (ServiceCIDRs and creation times included); slices come
        // back with their endpoints in address order (copies of one address in theirs).
        let sorted: Vec<Object> = expected.objects().filter_map(|o| match o {
            Object::EndpointSlice(mut s) => {
                s.endpoints.sort_by_key(|e| e.address);
                Some(Object::EndpointSlice(s))
            }
            _ => None,
        }).collect();
        for o in sorted {
            expected.apply(o);
        }
        prop_assert_eq!(mirrored, expected);
    }

    /// A mirror for a named proxy keeps exactly the services and slices labelled with its
    /// name, and a default one exactly the unlabelled ones.
    #[test]
    fn a_mirror_keeps_what_its_proxy_handles(
        mutations in proptest::collection::vec(arb_mutation(), 0..20),
        named in any::<bool>(),
    ) {
        let model = build(&mutations);
        let proxy = named.then(|| "other".to_string());
        let mut mirror = Mirror::for_proxy(proxy.clone());
        let mirrored = stored(mirror.apply(&reset_and(&model_items(&model))).unwrap());
        for s in mirrored.services() {
            prop_assert_eq!(&s.proxy_name, &proxy);
        }
        for s in mirrored.slices() {
            prop_assert_eq!(&s.proxy_name, &proxy);
        }
        let kept = model.services().filter(|s| s.proxy_name == proxy).count();
        prop_assert_eq!(mirrored.services().count(), kept);
        prop_assert_eq!(mirrored.service_cidrs().count(), model.service_cidrs().count());
    }
}

#[test]
fn services_and_nodes_round_trip_exactly() {
    let service = Service {
        key: ServiceKey::new("ns", "lb"),
        service_type: kpng_model::global::ServiceType::LoadBalancer,
        cluster_ips: vec!["10.96.0.5".parse().unwrap(), "fd00::5".parse().unwrap()],
        ports: vec![ServicePort {
            name: "http".into(),
            protocol: kpng_model::Protocol::Tcp,
            port: 80,
            node_port: Some(30080),
            target_port: TargetPort::Name("web".into()),
        }],
        external_ips: vec!["192.0.2.9".parse().unwrap()],
        load_balancer_ingress: vec![
            LoadBalancerIngress { ip: "198.51.100.1".parse().unwrap(), ip_mode: IpMode::VIP },
            LoadBalancerIngress { ip: "198.51.100.2".parse().unwrap(), ip_mode: IpMode::Proxy },
        ],
        load_balancer_source_ranges: vec!["203.0.113.0/24".parse().unwrap()],
        session_affinity: SessionAffinity::ClientIP { timeout_seconds: 60 },
        internal_traffic_policy: TrafficPolicy::Cluster,
        external_traffic_policy: TrafficPolicy::Local,
        health_check_node_port: Some(31000),
        proxy_name: Some("edge".into()),
        created_at: Some(1_700_000_000),
    };
    let item = service_item(&service);
    assert_eq!((item.set, item.path.as_str()), (localv1::Set::GlobalServiceInfos, "ns/lb"));
    assert_eq!(decode_service(&item.bytes, &item.path).unwrap(), service);
    let info = globalv1::ServiceInfo::decode(item.bytes.as_slice()).unwrap();
    assert_ne!(info.hash, 0);
    assert_eq!(service_item(&service).bytes, item.bytes, "deterministic encoding");

    let node = Node {
        name: "n1".into(),
        labels: [(kpng_model::global::ZONE_LABEL.to_string(), "z1".to_string())].into(),
        addresses: vec![NodeAddress {
            kind: NodeAddressKind::InternalIP,
            ip: "192.168.0.1".parse().unwrap(),
        }],
        pod_cidrs: vec!["10.244.1.0/24".parse().unwrap()],
        deleting: false,
        to_be_deleted: true,
    };
    let item = node_item(&node);
    assert_eq!(decode_node(&item.bytes, "n1").unwrap(), node);
    let info = globalv1::NodeInfo::decode(item.bytes.as_slice()).unwrap();
    assert_eq!(info.node.unwrap().topology.unwrap().zone, "z1");
}

#[test]
fn the_proxy_name_travels_in_the_original_labels_field() {
    let mut service = kpng_testkit::builders::service("ns", "a", &["10.96.0.1"], &[]);
    service.proxy_name = Some("edge".into());
    let info = globalv1::ServiceInfo::decode(service_item(&service).bytes.as_slice()).unwrap();
    let labels = info.service.unwrap().labels;
    assert_eq!(
        labels.get("service.kubernetes.io/service-proxy-name").map(String::as_str),
        Some("edge")
    );
    service.proxy_name = None;
    service.created_at = None;
    let item = service_item(&service);
    let info = globalv1::ServiceInfo::decode(item.bytes.as_slice()).unwrap();
    assert!(info.service.unwrap().labels.is_empty() && info.created_at.is_none());
    assert_eq!(decode_service(&item.bytes, &item.path).unwrap(), service);
}

#[test]
fn service_cidrs_round_trip_and_are_relisted() {
    let cidr = ServiceCidr::new(
        "kubernetes",
        ["10.96.0.0/16".parse().unwrap(), "fd00::/108".parse().unwrap()],
    );
    let item = service_cidr_item(&cidr);
    assert_eq!(
        (item.set, item.path.as_str()),
        (localv1::Set::GlobalServiceCidrInfos, "kubernetes")
    );
    assert_eq!(decode_service_cidr(&item.bytes, &item.path).unwrap(), cidr);
    let mut mirror = Mirror::default();
    let events = mirror.apply(&reset_and(std::slice::from_ref(&item))).unwrap();
    assert!(events.contains(&SourceEvent::Applied(Object::ServiceCidr(cidr.clone()))));
    assert!(events.contains(&SourceEvent::ListDone(kpng_model::Kind::ServiceCidr)));
    let events = mirror.apply(&[delete_op(item.set, "kubernetes")]).unwrap();
    assert_eq!(
        events,
        [SourceEvent::Deleted(kpng_model::ObjectRef::ServiceCidr("kubernetes".into()))]
    );
}

#[test]
fn a_bad_item_changes_nothing_and_is_named() {
    let mut mirror = Mirror::default();
    let good = node_item(&Node {
        name: "n1".into(),
        labels: Default::default(),
        addresses: Vec::new(),
        pod_cidrs: Vec::new(),
        deleting: false,
        to_be_deleted: false,
    });
    assert_eq!(mirror.apply(&[good.set_op()]).unwrap().len(), 1);
    let bad = GlobalItem {
        set: localv1::Set::GlobalEndpointInfos,
        path: "ns/slice/not-an-ip".into(),
        bytes: Vec::new(),
    };
    let error = mirror.apply(&[delete_op(good.set, "n1"), bad.set_op()]).unwrap_err();
    assert_eq!(error.to_string(), "ns/slice/not-an-ip: field path: invalid IP \"not-an-ip\"");
    assert_eq!(mirror.nodes.len(), 1, "the delete before the bad item was not applied");
}
