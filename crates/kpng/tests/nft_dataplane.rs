//! Real packets through a real kernel: kpng programs a node namespace with `to-nft`, and
//! clients in other namespaces talk to pods through it.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpng_testkit::privileged::require;
use kpng_testkit::probe::Outcome;
use kpng_testkit::topology::Cluster;

const NODE_A: &str = r#"
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {topology.kubernetes.io/zone: zone-1}
spec:
  podCIDRs: [10.244.0.0/24, "fd00:244::/64"]
status:
  addresses:
  - {type: InternalIP, address: 192.168.10.1}
  - {type: InternalIP, address: "fd00:10::1"}
"#;

/// A Service manifest.
fn service(name: &str, extra: &str, ports: &str) -> String {
    format!(
        "---\napiVersion: v1\nkind: Service\nmetadata: {{name: {name}, namespace: test}}\nspec:\n{extra}  ports:\n{ports}"
    )
}

/// An EndpointSlice manifest with `(ip, node, ready, serving, terminating)` endpoints.
fn slice(
    name: &str,
    service: &str,
    family: &str,
    ports: &str,
    endpoints: &[(&str, &str, bool, bool, bool)],
) -> String {
    let mut text = format!(
        "---\napiVersion: discovery.k8s.io/v1\nkind: EndpointSlice\nmetadata:\n  name: {name}\n  namespace: test\n  labels: {{kubernetes.io/service-name: {service}}}\naddressType: {family}\nports:\n{ports}endpoints:\n"
    );
    for (ip, node, ready, serving, terminating) in endpoints {
        text.push_str(&format!(
            "- addresses: [\"{ip}\"]\n  nodeName: {node}\n  conditions: {{ready: {ready}, serving: {serving}, terminating: {terminating}}}\n"
        ));
    }
    text
}

/// Runs kpng once in the node namespace over `manifests`.
fn program(cluster: &Cluster, manifests: &str, extra: &[&str]) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cluster.yaml");
    std::fs::write(&path, format!("{NODE_A}{manifests}")).unwrap();
    let mut args = vec![
        "file",
        "--input",
        path.to_str().unwrap(),
        "to-local",
        "--node",
        "node-a",
        "to-nft",
        "--once",
    ];
    args.extend_from_slice(extra);
    let out = cluster.node.output(env!("CARGO_BIN_EXE_kpng"), &args);
    assert!(out.status.success(), "kpng failed: {}", String::from_utf8_lossy(&out.stderr));
}

fn answer(outcome: &Outcome) -> (String, IpAddr) {
    match outcome {
        Outcome::Answer { name, peer } => (name.clone(), *peer),
        other => panic!("expected an answer, got {other}"),
    }
}

/// The endpoints that answered `n` TCP probes.
fn tcp_names(from: &kpng_testkit::netns::Netns, target: &str, n: usize) -> BTreeSet<String> {
    (0..n).map(|_| answer(&Cluster::tcp(from, target)).0).collect()
}

const HTTP_PORTS: &str = "  - {name: http, protocol: TCP, port: 80, targetPort: 8080}\n  - {name: dns, protocol: UDP, port: 53, targetPort: 8080}\n";
const NODE_PORTS: &str = "  - {name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080}\n  - {name: dns, protocol: UDP, port: 53, targetPort: 8080, nodePort: 30053}\n";
const SLICE_PORTS: &str =
    "- {name: http, protocol: TCP, port: 8080}\n- {name: dns, protocol: UDP, port: 8080}\n";

#[test]
fn cluster_ip_node_port_and_rejects() {
    if !require("cluster_ip_node_port_and_rejects", &["nft", "ip"]) {
        return;
    }
    let mut cluster = Cluster::new();
    cluster.add_pod("web-a", true, 10, &[8080]);
    cluster.add_pod("web-b", false, 10, &[8080]);
    let manifests = [
        service("web", "  type: NodePort\n  clusterIP: 10.96.0.10\n", NODE_PORTS),
        slice(
            "web-1",
            "web",
            "IPv4",
            SLICE_PORTS,
            &[
                ("10.244.0.10", "node-a", true, true, false),
                ("10.244.1.10", "node-b", true, true, false),
            ],
        ),
        service("empty", "  clusterIP: 10.96.0.11\n", HTTP_PORTS),
    ]
    .concat();
    program(&cluster, &manifests, &[]);

    // ClusterIP over TCP reaches both endpoints (random choice), port remapped 80 -> 8080;
    // the client is outside the pod network, so it is masqueraded to the node's address.
    let names = tcp_names(&cluster.client, "10.96.0.10:80", 24);
    assert_eq!(names, BTreeSet::from(["web-a".to_string(), "web-b".to_string()]));
    let (_, peer) = answer(&Cluster::tcp(&cluster.client, "10.96.0.10:80"));
    assert_eq!(
        peer,
        "192.168.10.1".parse::<IpAddr>().unwrap(),
        "ClusterIP traffic from outside is masqueraded"
    );

    // UDP on the same ClusterIP.
    let (name, _) = answer(&Cluster::udp(&cluster.client, "10.96.0.10:53", 0));
    assert!(name.starts_with("web-"), "{name}");

    // A port the service does not define is rejected, and so is a service without endpoints.
    assert_eq!(Cluster::tcp(&cluster.client, "10.96.0.10:81"), Outcome::Refused);
    assert_eq!(Cluster::tcp(&cluster.client, "10.96.0.11:80"), Outcome::Refused);
    assert_eq!(Cluster::udp(&cluster.client, "10.96.0.11:53", 0), Outcome::Refused);

    // NodePort on the node's primary address, both protocols.
    let names = tcp_names(&cluster.client, "192.168.10.1:30080", 24);
    assert_eq!(names, BTreeSet::from(["web-a".to_string(), "web-b".to_string()]));
    let (name, _) = answer(&Cluster::udp(&cluster.client, "192.168.10.1:30053", 0));
    assert!(name.starts_with("web-"), "{name}");

    // From a local pod, ClusterIP traffic keeps the pod's address, except when the pod
    // reaches itself (hairpin), which is masqueraded.
    let pod_ip: IpAddr = "10.244.0.10".parse().unwrap();
    let mut seen = BTreeSet::new();
    for _ in 0..24 {
        let (name, peer) = answer(&Cluster::tcp(&cluster.pod("web-a").ns, "10.96.0.10:80"));
        match name.as_str() {
            "web-b" => {
                assert_eq!(peer, pod_ip, "pod traffic to a remote endpoint is not masqueraded")
            }
            _ => assert_ne!(peer, pod_ip, "hairpin traffic is masqueraded"),
        }
        seen.insert(name);
    }
    assert_eq!(seen.len(), 2);
}
