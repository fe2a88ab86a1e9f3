use kpng_model::global::{
    Helper, IpMode, LoadBalancerIngress, LoadBalancing, LogPath, NatMode, NodeAddress,
    NodeAddressKind, Outside, Persistence, PersistenceKey, Scheduler, ServicePort, SessionAffinity,
    TargetPort, TrafficPolicy,
};
use kpng_model::{Node, Service, ServiceCidr, ServiceKey};
use prost::Message;

use super::*;
use crate::{globalv1, localv1};

#[test]
fn services_and_nodes_round_trip_exactly() {
    let service = Service {
        key: ServiceKey::new("ns", "lb"),
        service_type: kpng_model::global::ServiceType::LoadBalancer,
        cluster_ips: vec!["10.96.0.5".parse().unwrap(), "fd00::5".parse().unwrap()].into(),
        ports: vec![ServicePort {
            name: "http".into(),
            protocol: kpng_model::Protocol::Tcp,
            port: 80,
            node_port: Some(30080),
            target_port: TargetPort::Name("web".into()),
        }]
        .into(),
        outside: Outside {
            external_ips: vec!["192.0.2.9".parse().unwrap()].into(),
            load_balancer_ingress: vec![
                LoadBalancerIngress { ip: "198.51.100.1".parse().unwrap(), ip_mode: IpMode::VIP },
                LoadBalancerIngress { ip: "198.51.100.2".parse().unwrap(), ip_mode: IpMode::Proxy },
            ]
            .into(),
            load_balancer_source_ranges: vec!["203.0.113.0/24".parse().unwrap()].into(),
        }
        .boxed(),
        session_affinity: SessionAffinity::ClientIP { timeout_seconds: 60 },
        internal_traffic_policy: TrafficPolicy::Cluster,
        external_traffic_policy: TrafficPolicy::Local,
        health_check_node_port: Some(31000),
        proxy_name: Some("edge".into()),
        created_at: Some(1_700_000_000),
        load_balancing: LoadBalancing {
            scheduler: Some(Scheduler::RoundRobin),
            persistence: Some(Persistence {
                key: PersistenceKey::SrcIpSrcPort,
                timeout_seconds: 5,
            }),
            mode: Some(NatMode::Snat),
            helper: Some(Helper::Tftp),
            log: Some(LogPath::Forward),
        },
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
fn service_cidrs_round_trip() {
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
}
