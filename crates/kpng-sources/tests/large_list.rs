//! A cluster's listing as one large YAML `List` (what `kubectl get svc,endpointslices,nodes
//! -A -o yaml` prints) loads, although it is more than the YAML parser's default budget.

use kpng_model::Object;
use kpng_sources::ConvertOptions;
use kpng_sources::file::parse_manifests;
use kpng_testkit::generate::{ClusterSpec, generate, to_yaml_list};

#[test]
fn a_large_yaml_list_loads() {
    let spec = ClusterSpec { services: 3000, endpoints: 4, nodes: 3, zones: 2 };
    let objects = generate(&spec);
    let yaml = to_yaml_list(&objects).unwrap();
    // The parser's default budget (250,000 nodes) refuses it...
    assert!(serde_saphyr::from_str::<serde_json::Value>(&yaml).is_err());
    // ...kpng's, sized from the document, does not.
    let manifests = parse_manifests(&yaml, &ConvertOptions::default()).unwrap();
    assert_eq!(manifests.objects.len(), objects.len());
    let services = manifests.objects.iter().filter(|o| matches!(o, Object::Service(_))).count();
    assert_eq!(services, 3000);
    assert!(!manifests.empty_list && manifests.warnings.is_empty());
}
