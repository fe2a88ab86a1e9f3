//! The deployment files, rendered as an operator renders them (`kubectl kustomize`): every
//! object parses with a known apiVersion and kind, selectors match labels, volume mounts
//! name volumes, every kpng container's arguments are accepted by kpng's own parser, RBAC
//! grants what the kube source reads, and the kubeadm patch changes only the image.

#[path = "support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use kpng_testkit::privileged::require;
use serde_json::Value;
use support::{binary, example, run};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// The layouts an operator applies, and kubeadm's DaemonSet with kpng's image.
const LAYOUTS: [&str; 6] = [
    "overlays/nftables",
    "overlays/iptables",
    "overlays/ebpf",
    "overlays/aggregated",
    "overlays/split",
    "kubeadm",
];

fn documents(text: &str, what: &str) -> Vec<Value> {
    text.split("\n---")
        .filter(|d| d.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .map(|d| {
            serde_saphyr::from_str::<Value>(d)
                .unwrap_or_else(|e| panic!("{what}: invalid YAML: {e}\n{d}"))
        })
        .collect()
}

/// `kubectl kustomize DIR`: the objects a layout creates; `None` without kubectl (said, and
/// a failure under `CI=true`).
fn render(dir: &str) -> Option<Vec<Value>> {
    if !require(&format!("rendering deploy/{dir}"), &["kubectl"]) {
        return None;
    }
    let out =
        Command::new("kubectl").arg("kustomize").arg(deploy_dir().join(dir)).output().unwrap();
    assert!(out.status.success(), "{dir}: {}", String::from_utf8_lossy(&out.stderr));
    Some(documents(&String::from_utf8_lossy(&out.stdout), dir))
}

/// The apiVersion and kind of every object the layouts may create.
const KNOWN: &[(&str, &str)] = &[
    ("v1", "ServiceAccount"),
    ("v1", "ConfigMap"),
    ("v1", "Service"),
    ("rbac.authorization.k8s.io/v1", "ClusterRole"),
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"),
    ("apps/v1", "DaemonSet"),
    ("apps/v1", "Deployment"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
];

fn pod_spec(object: &Value) -> Option<&Value> {
    matches!(object["kind"].as_str(), Some("DaemonSet" | "Deployment"))
        .then(|| &object["spec"]["template"]["spec"])
}

fn containers(pod: &Value) -> impl Iterator<Item = &Value> {
    ["initContainers", "containers"]
        .into_iter()
        .flat_map(move |k| pod[k].as_array().into_iter().flatten())
}

#[test]
fn every_layout_renders_objects_that_hold_together() {
    for layout in LAYOUTS {
        let Some(objects) = render(layout) else { return };
        assert!(!objects.is_empty(), "{layout}: nothing rendered");
        for object in &objects {
            let (api, kind) = (object["apiVersion"].as_str(), object["kind"].as_str());
            let name = object["metadata"]["name"].as_str().unwrap_or_default();
            assert!(
                KNOWN.iter().any(|(a, k)| Some(*a) == api && Some(*k) == kind),
                "{layout}: unknown {api:?} {kind:?} ({name})"
            );
            let Some(pod) = pod_spec(object) else { continue };
            let selector = object["spec"]["selector"]["matchLabels"].as_object().unwrap();
            let labels = &object["spec"]["template"]["metadata"]["labels"];
            for (key, value) in selector {
                assert_eq!(
                    &labels[key], value,
                    "{layout}: {name}'s selector does not match its pods"
                );
            }
            let volumes: Vec<&str> = pod["volumes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v["name"].as_str())
                .collect();
            for container in containers(pod) {
                for mount in container["volumeMounts"].as_array().into_iter().flatten() {
                    let volume = mount["name"].as_str().unwrap();
                    assert!(
                        volumes.contains(&volume),
                        "{layout}: {name} mounts {volume}, which is no volume"
                    );
                }
            }
        }
    }
}

#[test]
fn kpngs_own_daemon_sets_probe_health_and_get_their_node_name() {
    for layout in &LAYOUTS[..5] {
        let Some(objects) = render(layout) else { return };
        for object in objects.iter().filter(|o| o["kind"] == "DaemonSet") {
            let container = &object["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez", "{layout}");
            assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz", "{layout}");
            let env = container["env"].as_array().unwrap();
            assert!(env.iter().any(|e| e["name"] == "NODE_NAME"), "{layout}");
            let caps = container["securityContext"]["capabilities"]["add"].as_array().unwrap();
            assert!(caps.contains(&"NET_ADMIN".into()), "{layout}: {caps:?}");
            assert_ne!(
                container["securityContext"]["privileged"], true,
                "{layout}: main container privileged"
            );
        }
    }
}

/// The config the layouts mount, written where a test can point `--config` at it.
fn config_file(dir: &Path) -> PathBuf {
    let objects = render("overlays/nftables").unwrap();
    let config = objects.iter().find(|o| o["kind"] == "ConfigMap").unwrap();
    let path = dir.join("config.yaml");
    std::fs::write(&path, config["data"]["config.yaml"].as_str().unwrap()).unwrap();
    path
}

#[test]
fn every_containers_arguments_are_accepted_by_kpngs_parser() {
    if !require("every_containers_arguments_are_accepted_by_kpngs_parser", &["kubectl"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = config_file(dir.path());
    let kube_proxy = dir.path().join("kube-proxy");
    std::os::unix::fs::symlink(binary(), &kube_proxy).unwrap();
    for layout in LAYOUTS {
        let objects = render(layout).unwrap();
        for pod in objects.iter().filter_map(pod_spec) {
            for container in containers(pod) {
                let mut words: Vec<String> = container["command"]
                    .as_array()
                    .into_iter()
                    .chain(container["args"].as_array())
                    .flatten()
                    .map(|w| w.as_str().unwrap().to_string())
                    .map(|w| w.replace("/etc/kpng/config.yaml", config.to_str().unwrap()))
                    .map(|w| w.replace("$(KPNG_API_ADDRESS)", "tcp://192.0.2.10:10259"))
                    .map(|w| w.replace("$(NODE_NAME)", "node-a"))
                    .collect();
                let program = match words.first().map(String::as_str) {
                    Some("/usr/local/bin/kube-proxy") => kube_proxy.clone(),
                    _ => PathBuf::from(binary()),
                };
                if program == kube_proxy {
                    words.remove(0);
                }
                // Everything is parsed before --help answers.
                words.push("--help".into());
                let out = Command::new(&program).args(&words).output().unwrap();
                let name = container["name"].as_str().unwrap_or_default();
                assert!(
                    out.status.success(),
                    "{layout}: container {name}: {words:?} refused:\n{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

#[test]
fn the_kubeadm_patch_changes_the_image_and_nothing_else() {
    let Some(objects) = render("kubeadm") else { return };
    let text =
        std::fs::read_to_string(deploy_dir().join("kubeadm/kube-proxy-daemonset.yaml")).unwrap();
    let kubeadms = documents(&text, "kubeadm's DaemonSet").remove(0);
    let mut patched = objects.into_iter().find(|o| o["kind"] == "DaemonSet").unwrap();
    let container = &mut patched["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "kpng:latest");
    container["image"] = kubeadms["spec"]["template"]["spec"]["containers"][0]["image"].clone();
    assert_eq!(patched, kubeadms);
}

#[test]
fn the_configmap_is_a_config_kpng_accepts() {
    if !require("the_configmap_is_a_config_kpng_accepts", &["kubectl"]) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = config_file(dir.path());
    let out = run(&[
        "--config",
        path.to_str().unwrap(),
        "file",
        "--input",
        &example(),
        "to-local",
        "--node",
        "node-a",
        "to-json",
        "--once",
    ]);
    assert!(out.status.success(), "{}", out.stderr);
    assert!(out.stdout.starts_with("{\"op\":\"reset\"}"), "{}", out.stdout);
}

#[test]
fn the_cluster_role_lets_the_kube_source_list_and_watch_every_kind_it_reads() {
    use kpng_sources::kube::resource::Resource;
    let Some(objects) = render("overlays/nftables") else { return };
    let role = objects.iter().find(|d| d["kind"] == "ClusterRole").expect("a ClusterRole");
    let rules = role["rules"].as_array().unwrap();
    let options = kpng_sources::ConvertOptions::default();
    let nodes = kpng_sources::kube::NodeSelection::All;
    for kind in kpng_sources::kube::KINDS {
        let path = Resource::new(kind, &options, &nodes).path;
        // "/api/v1/services" or "/apis/<group>/v1/<resource>".
        let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
        let (group, resource) = match parts[..] {
            ["api", _, resource] => ("", resource),
            ["apis", group, _, resource] => (group, resource),
            _ => panic!("unexpected path {path}"),
        };
        let granted = rules.iter().any(|rule| {
            let has = |field: &str, value: &str| {
                rule[field].as_array().unwrap().iter().any(|v| v == value)
            };
            has("apiGroups", group)
                && has("resources", resource)
                && has("verbs", "list")
                && has("verbs", "watch")
        });
        assert!(granted, "no list/watch on {group}/{resource}");
    }
}
