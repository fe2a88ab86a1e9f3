use kpng_local::project_node_state;
use kpng_store::store;
use kpng_testkit::strategies::{NODES, arb_mutation, build};
use proptest::prelude::*;

use super::*;

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
        for node in NODES {
            prop_assert_eq!(project_node_state(&mirrored, node), project_node_state(&mb, node));
        }
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
        created_at: None,
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
