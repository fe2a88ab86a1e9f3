//! Synthetic clusters as Kubernetes manifests.
//!
//! [`generate`] builds N services with M endpoints each over K nodes in Z zones, with a
//! realistic mix: most services ClusterIP/TCP, every 10th NodePort, every 20th LoadBalancer
//! (with source ranges), every 8th dual-stack, every 5th with an extra UDP port. Pods are
//! spread round-robin over the nodes. The output is deterministic for a given spec.

use serde_json::{Value, json};

/// The shape of a synthetic cluster.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClusterSpec {
    /// Number of services.
    pub services: usize,
    /// Endpoints per service.
    pub endpoints: usize,
    /// Number of nodes.
    pub nodes: usize,
    /// Number of zones the nodes are spread over.
    pub zones: usize,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec { services: 1000, endpoints: 4, nodes: 3, zones: 2 }
    }
}

/// The name of node `i`.
pub fn node_name(i: usize) -> String {
    format!("node-{i}")
}

fn v4(base: [u8; 1], i: usize) -> String {
    format!("{}.{}.{}.{}", base[0], (i >> 16) & 0xff, (i >> 8) & 0xff, i & 0xff)
}

fn v6(prefix: &str, i: usize) -> String {
    format!("{prefix}{:x}:{:x}", i >> 16, i & 0xffff)
}

/// The cluster IP (IPv4) of service `i`.
pub fn service_ip(i: usize) -> String {
    v4([10], 0x60_0000 + i)
}

/// The IPv4 address of endpoint `j` of service `i` in `spec`.
pub fn endpoint_ip(spec: &ClusterSpec, i: usize, j: usize) -> String {
    v4([10], 0x80_0000 + i * spec.endpoints + j)
}

fn node(spec: &ClusterSpec, i: usize) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node_name(i),
            "labels": {
                "kubernetes.io/hostname": node_name(i),
                "topology.kubernetes.io/zone": format!("zone-{}", i % spec.zones.max(1)),
            },
        },
        "spec": { "podCIDRs": [format!("10.{}.0.0/16", 128 + i % 64)] },
        "status": { "addresses": [
            { "type": "InternalIP", "address": format!("192.168.{}.{}", i / 250, 1 + i % 250) },
            { "type": "Hostname", "address": node_name(i) },
        ] },
    })
}

fn service(i: usize) -> Value {
    let name = format!("svc-{i}");
    let dual = i % 8 == 7;
    let kind = if i % 20 == 19 {
        "LoadBalancer"
    } else if i % 10 == 9 {
        "NodePort"
    } else {
        "ClusterIP"
    };
    let mut ports =
        vec![json!({ "name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080 })];
    if i % 5 == 4 {
        ports.push(json!({ "name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353 }));
    }
    if kind != "ClusterIP" {
        for (k, port) in ports.iter_mut().enumerate() {
            // Distinct up to 17,768 NodePort services: a cluster that large is given a
            // wider range than the default 30000-32767 (`--service-node-port-range`).
            port["nodePort"] = json!(30000 + ((i / 10) * 2 + k) % 35536);
        }
    }
    let mut cluster_ips = vec![service_ip(i)];
    if dual {
        cluster_ips.push(v6("fd00:96::", i));
    }
    let mut svc = json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name, "namespace": format!("ns-{}", i % 10) },
        "spec": {
            "type": kind,
            "clusterIP": cluster_ips[0],
            "clusterIPs": cluster_ips,
            "ipFamilies": if dual { json!(["IPv4", "IPv6"]) } else { json!(["IPv4"]) },
            "ports": ports,
        },
    });
    if kind == "LoadBalancer" {
        svc["spec"]["loadBalancerSourceRanges"] = json!(["203.0.113.0/24"]);
        svc["status"] = json!({ "loadBalancer": { "ingress": [{ "ip": v4([198], 0x12_0000 + i), "ipMode": "VIP" }] } });
    }
    svc
}

fn slice(spec: &ClusterSpec, i: usize, family: &str) -> Value {
    let svc = format!("svc-{i}");
    let mut ports = vec![json!({ "name": "http", "protocol": "TCP", "port": 8080 })];
    if i % 5 == 4 {
        ports.push(json!({ "name": "dns", "protocol": "UDP", "port": 5353 }));
    }
    let endpoints: Vec<Value> = (0..spec.endpoints)
        .map(|j| {
            let n = (i * spec.endpoints + j) % spec.nodes.max(1);
            let address = if family == "IPv4" {
                endpoint_ip(spec, i, j)
            } else {
                v6("fd00:244::", i * spec.endpoints + j)
            };
            json!({
                "addresses": [address],
                "conditions": { "ready": true, "serving": true, "terminating": false },
                "nodeName": node_name(n),
                "zone": format!("zone-{}", n % spec.zones.max(1)),
                "targetRef": { "kind": "Pod", "name": format!("{svc}-{j}"), "namespace": format!("ns-{}", i % 10) },
            })
        })
        .collect();
    let suffix = if family == "IPv4" { "v4" } else { "v6" };
    json!({
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": format!("{svc}-{suffix}"),
            "namespace": format!("ns-{}", i % 10),
            "labels": { "kubernetes.io/service-name": svc },
        },
        "addressType": family,
        "ports": ports,
        "endpoints": endpoints,
    })
}

/// Every object of the cluster: nodes, then per service the Service and its slices.
pub fn generate(spec: &ClusterSpec) -> Vec<Value> {
    let mut objects: Vec<Value> = (0..spec.nodes).map(|i| node(spec, i)).collect();
    for i in 0..spec.services {
        objects.push(service(i));
        objects.push(slice(spec, i, "IPv4"));
        if i % 8 == 7 {
            objects.push(slice(spec, i, "IPv6"));
        }
    }
    objects
}

/// The cluster as multi-document YAML.
pub fn to_yaml(objects: &[Value]) -> Result<String, serde_saphyr::ser::Error> {
    let mut out = String::new();
    for object in objects {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(object)?);
    }
    Ok(out)
}

/// The cluster as one `kind: List` YAML document, as `kubectl get svc,endpointslices,nodes
/// -A -o yaml` prints it.
pub fn to_yaml_list(objects: &[Value]) -> Result<String, serde_saphyr::ser::Error> {
    let list = json!({
        "apiVersion": "v1",
        "items": objects,
        "kind": "List",
        "metadata": { "resourceVersion": "" },
    });
    serde_saphyr::to_string(&list)
}

/// The cluster as a `kind: List` JSON document.
pub fn to_json_list(objects: &[Value]) -> String {
    json!({ "apiVersion": "v1", "kind": "List", "items": objects }).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_ports_are_distinct_in_a_large_cluster() {
        let spec = ClusterSpec { services: 30_000, endpoints: 1, nodes: 3, zones: 2 };
        let mut seen = std::collections::BTreeSet::new();
        let mut count = 0;
        for object in generate(&spec).iter().filter(|o| o["kind"] == "Service") {
            for port in object["spec"]["ports"].as_array().into_iter().flatten() {
                if let Some(node_port) = port["nodePort"].as_u64() {
                    count += 1;
                    assert!((30000..=65535).contains(&node_port), "{node_port}");
                    assert!(seen.insert(node_port), "NodePort {node_port} given twice");
                }
            }
        }
        // Every 10th service, one or two ports each.
        assert!(count > 3_000, "{count}");
    }
}
