//! The deployment files: valid manifests, and a config that kpng accepts.

#[path = "support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};

use serde_json::Value;
use support::{example, run};

fn deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

fn documents(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    text.split("\n---")
        .filter(|d| d.lines().any(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#')))
        .map(|d| {
            serde_saphyr::from_str::<Value>(d)
                .unwrap_or_else(|e| panic!("{}: invalid YAML: {e}", path.display()))
        })
        .collect()
}

fn all_documents() -> Vec<(PathBuf, Value)> {
    let mut out = Vec::new();
    for dir in [deploy_dir(), deploy_dir().join("split")] {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "yaml") {
                out.extend(documents(&path).into_iter().map(|d| (path.clone(), d)));
            }
        }
    }
    out
}

#[test]
fn every_manifest_names_its_kind_and_object() {
    let docs = all_documents();
    assert!(docs.len() >= 8, "{} documents", docs.len());
    for (path, doc) in &docs {
        for field in ["apiVersion", "kind"] {
            assert!(doc[field].is_string(), "{}: no {field}", path.display());
        }
        assert!(doc["metadata"]["name"].is_string(), "{}: no name", path.display());
    }
    // Every kpng container has probes on its health port and gets its node name.
    for (path, doc) in docs.iter().filter(|(_, d)| d["kind"] == "DaemonSet") {
        let container = &doc["spec"]["template"]["spec"]["containers"][0];
        assert!(container["livenessProbe"]["httpGet"]["path"] == "/livez", "{}", path.display());
        assert!(container["readinessProbe"]["httpGet"]["path"] == "/readyz", "{}", path.display());
        let env = container["env"].as_array().unwrap();
        assert!(env.iter().any(|e| e["name"] == "NODE_NAME"), "{}", path.display());
        let caps = &container["securityContext"]["capabilities"]["add"];
        assert_eq!(caps, &serde_json::json!(["NET_ADMIN", "NET_RAW"]), "{}", path.display());
    }
}

#[test]
fn the_configmap_is_a_config_kpng_accepts() {
    let docs = documents(&deploy_dir().join("configmap.yaml"));
    let config = docs[0]["data"]["config.yaml"].as_str().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.yaml");
    std::fs::write(&path, config).unwrap();
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
    let docs = documents(&deploy_dir().join("rbac.yaml"));
    let role = docs.iter().find(|d| d["kind"] == "ClusterRole").expect("a ClusterRole");
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
