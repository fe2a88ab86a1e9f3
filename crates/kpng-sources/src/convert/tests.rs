//! The rules of what is proxied, on objects parsed from JSON as the sources parse them.

use kpng_model::ObjectRef;
use serde_json::json;

use super::*;
use crate::schema;

fn service(labels: serde_json::Value, cluster_ips: &[&str]) -> schema::Service {
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop", "labels": labels,
                     "creationTimestamp": "2024-02-29T12:00:00Z"},
        "spec": {"clusterIPs": cluster_ips, "ports": [{"port": 80}]},
    }))
    .unwrap()
}

fn proxied(svc: &schema::Service, proxy: Option<&str>) -> bool {
    let options = ConvertOptions { service_proxy_name: proxy.map(str::to_string) };
    let converted = convert_service(svc, &options, &mut Warnings::new()).unwrap();
    matches!(converted, Converted::Proxied(_))
}

#[test]
fn a_named_proxy_takes_only_its_labelled_objects() {
    let plain = service(json!({}), &["10.96.0.1"]);
    let ours = service(json!({SERVICE_PROXY_NAME_LABEL: "edge"}), &["10.96.0.1"]);
    let other = service(json!({SERVICE_PROXY_NAME_LABEL: "other"}), &["10.96.0.1"]);
    let empty = service(json!({SERVICE_PROXY_NAME_LABEL: ""}), &["10.96.0.1"]);
    assert!(proxied(&plain, None) && !proxied(&plain, Some("edge")), "unlabelled: default only");
    assert!(proxied(&ours, Some("edge")) && !proxied(&ours, None));
    assert!(!proxied(&other, Some("edge")) && !proxied(&other, None));
    assert!(!proxied(&empty, None), "an empty value is a label too");

    let options = ConvertOptions { service_proxy_name: Some("edge".into()) };
    let Converted::Proxied(svc) = convert_service(&ours, &options, &mut Vec::new()).unwrap() else {
        panic!("not proxied")
    };
    assert_eq!(svc.proxy_name.as_deref(), Some("edge"), "the label is kept for the wire");
    assert_eq!(svc.created_at, Some(1_709_208_000));
}

#[test]
fn the_label_selector_says_the_same_as_the_rule() {
    let named = ConvertOptions { service_proxy_name: Some("edge".into()) };
    assert_eq!(
        named.label_selector(),
        "!service.kubernetes.io/headless,service.kubernetes.io/service-proxy-name=edge"
    );
    assert_eq!(
        ConvertOptions::default().label_selector(),
        "!service.kubernetes.io/headless,!service.kubernetes.io/service-proxy-name"
    );
    assert!(check_proxy_name("edge-1.a_b").is_ok());
    for bad in ["", "-edge", "a b", "x,y=z", &"a".repeat(64)] {
        assert!(check_proxy_name(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn cluster_ips_that_cannot_be_service_addresses_are_dropped_with_a_warning() {
    let mut warnings = Warnings::new();
    let svc = service(json!({}), &["127.0.0.1", "fd00::10"]);
    let converted = convert_service(&svc, &ConvertOptions::default(), &mut warnings).unwrap();
    let kept = converted.proxied().unwrap().cluster_ips;
    assert_eq!(kept, ["fd00::10".parse::<std::net::IpAddr>().unwrap()], "IPv6 only");
    assert_eq!(warnings.len(), 1);
    let shown = warnings[0].to_string();
    assert!(shown.contains("shop/web") && shown.contains("spec.clusterIPs[0]"), "{shown}");
    assert!(shown.contains("loopback") && shown.contains("not proxied in IPv4"), "{shown}");

    for (ip, what) in [
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("255.255.255.255", "broadcast"),
        ("224.0.0.1", "multicast"),
        ("ff02::1", "multicast"),
        ("::1", "loopback"),
    ] {
        let mut warnings = Warnings::new();
        let svc = service(json!({}), &[ip]);
        let converted = convert_service(&svc, &ConvertOptions::default(), &mut warnings).unwrap();
        assert!(
            matches!(converted, Converted::Ignored { key: ObjectRef::Service(_), .. }),
            "{ip}: nothing left to proxy"
        );
        assert!(warnings[0].to_string().contains(what), "{ip}: {}", warnings[0]);
    }
}

#[test]
fn service_cidrs_are_read_and_named_on_error() {
    let cidr: schema::ServiceCidr = serde_json::from_value(json!({
        "metadata": {"name": "kubernetes"},
        "spec": {"cidrs": ["10.96.0.0/12", "fd00:96::/112"]},
    }))
    .unwrap();
    let converted = convert_service_cidr(&cidr).unwrap().proxied().unwrap();
    assert_eq!(converted.cidrs.len(), 2);
    let bad: schema::ServiceCidr = serde_json::from_value(json!({
        "metadata": {"name": "extra"}, "spec": {"cidrs": ["10.0.0.0/99"]},
    }))
    .unwrap();
    let error = convert_service_cidr(&bad).unwrap_err().to_string();
    assert!(error.starts_with("ServiceCIDR extra: spec.cidrs[0]: "), "{error}");
}
