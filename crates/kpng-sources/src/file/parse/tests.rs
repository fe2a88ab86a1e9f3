use kpng_model::global::{IpMode, ServiceType, SessionAffinity, TargetPort, TrafficPolicy};
use kpng_model::{Family, Object, Protocol};

use super::*;
use crate::convert::ConvertOptions;

fn parse(text: &str) -> Vec<Object> {
    parse_manifests(text, &ConvertOptions::default()).unwrap_or_else(|e| panic!("{e:?}")).objects
}

fn errors(text: &str) -> Vec<DocumentError> {
    parse_manifests(text, &ConvertOptions::default()).expect_err("input should be rejected")
}

const SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: shop}
spec:
  type: LoadBalancer
  clusterIP: 10.96.0.10
  clusterIPs: [10.96.0.10, "fd00::10"]
  ports:
  - {name: http, port: 80, targetPort: http, nodePort: 30080}
  - {name: dns, port: 53, protocol: UDP}
  externalIPs: ["203.0.113.010", "203.0.113.9"]
  loadBalancerSourceRanges: [" 198.51.100.0/24 ", "10.1.2.3/8"]
  sessionAffinity: ClientIP
  externalTrafficPolicy: Local
  healthCheckNodePort: 32000
status:
  loadBalancer:
    ingress:
    - ip: 192.0.2.1
    - ip: 192.0.2.2
      ipMode: Proxy
    - hostname: lb.example.com
"#;

#[test]
fn service_fields_are_reduced_and_normalised() {
    let objects = parse(SERVICE);
    let Object::Service(svc) = &objects[0] else { panic!("not a service") };
    assert_eq!(svc.key.to_string(), "shop/web");
    assert_eq!(svc.service_type, ServiceType::LoadBalancer);
    assert_eq!(svc.cluster_ip(Family::V6), Some("fd00::10".parse().unwrap()));
    assert_eq!(svc.ports[0].target_port, TargetPort::Name("http".into()));
    assert_eq!(svc.ports[0].node_port, Some(30080));
    assert_eq!(
        (svc.ports[1].protocol, svc.ports[1].target_port.clone()),
        (Protocol::Udp, TargetPort::Number(53))
    );
    let ext: Vec<String> = svc.external_ips().iter().map(|i| i.to_string()).collect();
    assert_eq!(ext, ["203.0.113.9", "203.0.113.10"]);
    let ranges: Vec<String> =
        svc.load_balancer_source_ranges().iter().map(|r| r.to_string()).collect();
    assert_eq!(ranges, ["10.0.0.0/8", "198.51.100.0/24"]);
    assert_eq!(svc.session_affinity, SessionAffinity::ClientIP { timeout_seconds: 10_800 });
    assert_eq!(svc.external_traffic_policy, TrafficPolicy::Local);
    assert_eq!(svc.health_check_node_port, Some(32000));
    assert_eq!(svc.load_balancer_ingress().len(), 2, "hostname-only ingress is dropped");
    assert_eq!(svc.load_balancer_ingress()[1].ip_mode, IpMode::Proxy);
}

#[test]
fn services_no_proxy_handles_are_skipped() {
    let text = r#"
apiVersion: v1
kind: Service
metadata: {name: ext}
spec: {type: ExternalName, externalName: example.com}
---
apiVersion: v1
kind: Service
metadata: {name: headless}
spec: {clusterIP: None, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: other, labels: {service.kubernetes.io/service-proxy-name: someone-else}}
spec: {clusterIP: 10.96.0.2, ports: [{port: 80}]}
---
apiVersion: v1
kind: Service
metadata: {name: marked, labels: {service.kubernetes.io/headless: ""}}
spec: {clusterIP: 10.96.0.3, ports: [{port: 80}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
---
apiVersion: v1
kind: Service
metadata: {name: ok}
spec: {clusterIP: 10.96.0.4, ports: [{port: 80}], healthCheckNodePort: 32000}
"#;
    let objects = parse(text);
    assert_eq!(objects.len(), 1);
    let Object::Service(svc) = &objects[0] else { panic!() };
    assert_eq!(svc.key.to_string(), "default/ok");
    assert_eq!(svc.health_check_node_port, None, "only LoadBalancer + Local keeps it");

    // A named proxy takes exactly the objects labelled with its name.
    let named = ConvertOptions { service_proxy_name: Some("someone-else".into()) };
    let objects = parse_manifests(text, &named).unwrap().objects;
    let keys: Vec<String> = objects.iter().map(|o| o.object_ref().to_string()).collect();
    assert_eq!(keys, ["Service default/other"]);
}

const SLICE: &str = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-abc
  namespace: shop
  labels: {kubernetes.io/service-name: web}
  annotations: {endpoints.kubernetes.io/last-change-trigger-time: "2026-01-01T00:00:00Z"}
addressType: IPv4
ports:
- {name: http, port: 8080}
- {name: nonumber}
endpoints:
- addresses: ["10.0.0.01", "10.0.0.99"]
  nodeName: node-a
  zone: z1
  hints: {forZones: [{name: z1}], forNodes: [{name: node-a}]}
  targetRef: {kind: Pod, name: web-1, namespace: shop}
- addresses: ["10.0.0.2"]
  conditions: {ready: false, serving: true, terminating: true}
- addresses: []
"#;

#[test]
fn slices_default_conditions_and_use_the_first_address() {
    let objects = parse(SLICE);
    let Object::EndpointSlice(slice) = &objects[0] else { panic!() };
    assert_eq!(slice.service_key().to_string(), "shop/web");
    assert_eq!(slice.ports.len(), 1, "ports without a number are ignored");
    assert_eq!((slice.ports[0].protocol, slice.ports[0].port), (Protocol::Tcp, 8080));
    assert_eq!(slice.endpoints.len(), 2, "endpoints without addresses are ignored");
    let first = &slice.endpoints[0];
    assert_eq!(first.address.to_string(), "10.0.0.1");
    assert!(first.ready && first.serving && !first.terminating);
    assert_eq!(
        (first.zone_hints().to_vec(), first.node_hints().to_vec()),
        (vec!["z1".into()], vec!["node-a".into()])
    );
    assert_eq!(first.pod_name.as_ref().map(ToString::to_string).as_deref(), Some("web-1"));
    let second = &slice.endpoints[1];
    assert!(!second.ready && second.serving && second.terminating);
    assert_eq!(slice.trigger_time.as_deref(), Some("2026-01-01T00:00:00Z"));
}

#[test]
fn slices_without_service_or_with_fqdn_are_skipped() {
    let text = r#"
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: orphan}
addressType: IPv4
endpoints: []
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata: {name: fqdn, labels: {kubernetes.io/service-name: web}}
addressType: FQDN
endpoints: [{addresses: [example.com]}]
"#;
    assert!(parse(text).is_empty());
}

#[test]
fn lists_and_json_are_accepted() {
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- {}\n- {}\n",
        serde_json::to_string(&serde_saphyr::from_str::<serde_json::Value>(SERVICE).unwrap())
            .unwrap(),
        serde_json::to_string(&serde_saphyr::from_str::<serde_json::Value>(SLICE).unwrap())
            .unwrap(),
    );
    assert_eq!(parse(&list).len(), 2);
    let json = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": [
        serde_saphyr::from_str::<serde_json::Value>(SERVICE).unwrap()
    ]});
    assert_eq!(parse(&json.to_string()).len(), 1);
}

#[test]
fn nodes_keep_what_matters() {
    let text = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/zone: z1, team: blue}
  deletionTimestamp: "2026-01-01T00:00:00Z"
spec:
  podCIDRs: [10.244.1.0/24]
  taints: [{key: ToBeDeletedByClusterAutoscaler, effect: NoSchedule}]
status:
  addresses:
  - {type: Hostname, address: node-a}
  - {type: InternalIP, address: 192.168.1.10}
"#;
    let Object::Node(node) = &parse(text)[0] else { panic!() };
    assert_eq!(node.zone(), Some("z1"));
    assert!(!node.labels.contains_key("team"));
    assert_eq!(node.addresses.len(), 1);
    assert!(node.deleting && node.to_be_deleted);
    assert_eq!(node.pod_cidrs[0].to_string(), "10.244.1.0/24");
}

#[test]
fn errors_name_document_object_and_field() {
    let text = format!("{SERVICE}---\n{}", SLICE.replace("10.0.0.2\"", "10.0.0.x\""));
    let errs = errors(&text);
    assert_eq!(errs.len(), 1);
    let e = &errs[0];
    assert_eq!(e.document, 2);
    assert_eq!(e.kind.as_deref(), Some("EndpointSlice"));
    assert_eq!(e.object.as_deref(), Some("shop/web-abc"));
    assert_eq!(e.field.as_deref(), Some("endpoints[1].addresses[0]"));
    let shown = e.to_string();
    assert!(
        shown.contains("document 2")
            && shown.contains("shop/web-abc")
            && shown.contains("10.0.0.x"),
        "{shown}"
    );

    let bad_protocol = SERVICE.replace("protocol: UDP", "protocol: ICMP");
    let e = &errors(&bad_protocol)[0];
    assert_eq!(e.field.as_deref(), Some("spec.ports[1].protocol"));

    let bad_type = SERVICE.replace("port: 53,", "port: fifty,");
    let e = &errors(&bad_type)[0];
    assert_eq!(e.field.as_deref(), Some("spec.ports[1].port"), "{e}");

    let bad_yaml = "apiVersion: v1\nkind: Service\n---\nkey: [unclosed\n";
    let errs = errors(bad_yaml);
    assert_eq!(errs.len(), 2, "one error per bad document, in order: {errs:?}");
    assert_eq!(errs[0].field.as_deref(), Some("metadata.name"));
    assert!(errs[1].reason.starts_with("invalid YAML"), "{}", errs[1]);
    assert_eq!((errs[1].document, errs[1].line), (2, 3));
}

#[test]
fn duplicates_are_reported_and_the_later_one_is_kept() {
    let later = SERVICE.replace(
        "clusterIP: 10.96.0.10\n  clusterIPs: [10.96.0.10, \"fd00::10\"]",
        "clusterIP: 10.96.0.11",
    );
    let text = format!("{SERVICE}---\n{later}");
    let manifests = parse_manifests(&text, &ConvertOptions::default()).unwrap();
    assert_eq!(manifests.objects.len(), 1);
    let Object::Service(svc) = &manifests.objects[0] else { panic!() };
    assert_eq!(svc.cluster_ips[0].to_string(), "10.96.0.11", "the later copy");
    assert_eq!(manifests.warnings.len(), 1, "{:?}", manifests.warnings);
    let warning = &manifests.warnings[0];
    assert!(warning.starts_with("document 2 (line "), "{warning}");
    assert!(warning.contains("Service shop/web appears again (first in document 1"), "{warning}");
    assert!(warning.contains("the later one is kept"), "{warning}");
}

#[test]
fn an_empty_list_is_explicit_and_a_null_one_is_not() {
    let empty = parse("apiVersion: v1\nkind: List\nitems: []\n");
    assert!(empty.is_empty());
    let m = parse_manifests("apiVersion: v1\nkind: List\nitems: []\n", &ConvertOptions::default());
    assert!(m.unwrap().empty_list);
    let cut = parse_manifests("apiVersion: v1\nkind: List\nitems:\n", &ConvertOptions::default());
    assert!(!cut.unwrap().empty_list, "items: null is how a cut listing ends");
    let none = parse_manifests("# nothing\n---\n", &ConvertOptions::default()).unwrap();
    assert_eq!((none.documents, none.empty_list), (0, false));
}

#[test]
fn yaml_bombs_and_deep_nesting_are_refused_with_the_limit_named() {
    let mut bomb = String::from("a: &a [x, x, x, x, x, x, x, x, x, x]\n");
    for (prev, name) in ["a", "b", "c", "d", "e", "f", "g", "h"]
        .iter()
        .zip(["b", "c", "d", "e", "f", "g", "h", "i"])
    {
        let refs = vec![format!("*{prev}"); 10].join(", ");
        bomb.push_str(&format!("{name}: &{name} [{refs}]\n"));
    }
    let e = &errors(&bomb)[0];
    assert!(e.reason.contains("kpng's limit") && e.reason.contains("YAML bomb?"), "{e}");

    let deep = format!("key: {}{}\n", "[".repeat(100), "]".repeat(100));
    let e = &errors(&deep)[0];
    assert!(e.reason.contains("more than 64 levels deep (kpng's limit)"), "{e}");

    let deep_json = format!("{}{}", "[".repeat(300), "]".repeat(300));
    let e = &errors(&deep_json)[0];
    assert!(e.reason.contains("128 levels"), "{e}");
}

#[test]
fn control_characters_in_names_are_escaped_in_messages() {
    let text = SERVICE
        .replace("name: web,", "name: \"web\\e[31m\\n\",")
        .replace("protocol: UDP", "protocol: ICMP");
    let shown = errors(&text)[0].to_string();
    assert!(shown.contains("shop/web\\u{1b}[31m\\n"), "{shown}");
    assert!(!shown.contains('\u{1b}'), "{shown}");
}
