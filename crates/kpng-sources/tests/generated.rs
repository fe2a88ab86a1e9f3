//! Synthetic clusters from the testkit parse completely, in every output format.

use kpng_model::Object;
use kpng_sources::ConvertOptions;
use kpng_sources::file::parse_manifests;
use kpng_testkit::generate::{ClusterSpec, generate, to_json_list, to_yaml};

#[test]
fn generated_clusters_parse_in_yaml_and_json() {
    let spec = ClusterSpec { services: 40, endpoints: 3, nodes: 4, zones: 2 };
    let objects = generate(&spec);
    let yaml =
        parse_manifests(&to_yaml(&objects).unwrap(), &ConvertOptions::default()).unwrap().objects;
    let json =
        parse_manifests(&to_json_list(&objects), &ConvertOptions::default()).unwrap().objects;
    assert_eq!(yaml, json);
    assert_eq!(yaml.len(), objects.len());
    let services = yaml.iter().filter(|o| matches!(o, Object::Service(_))).count();
    let dual =
        yaml.iter().filter(|o| matches!(o, Object::Service(s) if s.cluster_ips.len() == 2)).count();
    assert_eq!((services, dual), (40, 5));
}
