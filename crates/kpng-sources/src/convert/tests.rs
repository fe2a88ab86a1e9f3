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
    assert_eq!(*kept, ["fd00::10".parse::<std::net::IpAddr>().unwrap()], "IPv6 only");
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

/// A Service with these annotations and spec fields besides its cluster IP and port.
fn annotated(annotations: serde_json::Value, spec: serde_json::Value) -> schema::Service {
    let mut full = json!({"clusterIPs": ["10.96.0.1"], "ports": [{"port": 80}]});
    full.as_object_mut().unwrap().extend(spec.as_object().unwrap().clone());
    serde_json::from_value(json!({
        "metadata": {"name": "web", "namespace": "shop", "annotations": annotations},
        "spec": full,
    }))
    .unwrap()
}

fn balancing(svc: &schema::Service) -> (kpng_model::global::LoadBalancing, Vec<String>) {
    let mut warnings = Warnings::new();
    let converted = convert_service(svc, &ConvertOptions::default(), &mut warnings).unwrap();
    let Converted::Proxied(svc) = converted else { panic!("not proxied") };
    (svc.load_balancing, warnings.iter().map(ToString::to_string).collect())
}

const PREFIX: &str = "service.kubernetes.io/kube-nftlb-load-balancer-";

#[test]
fn every_load_balancing_value_is_read() {
    use kpng_model::global::{Helper, LogPath, NatMode, PersistenceKey, Scheduler};
    let one = |key: &str, value: &str| {
        let (lb, warnings) =
            balancing(&annotated(json!({format!("{PREFIX}{key}"): value}), json!({})));
        assert!(warnings.is_empty(), "{key}={value}: {warnings:?}");
        lb
    };
    for (scheduler, text) in Scheduler::ALL {
        assert_eq!(one("scheduler", text).scheduler, Some(*scheduler));
    }
    for (key, text) in PersistenceKey::ALL {
        let persistence = one("persistence", text).persistence.unwrap();
        assert_eq!(
            (persistence.key, persistence.timeout_seconds),
            (*key, 60),
            "kube-nftlb's default"
        );
    }
    for (mode, text) in NatMode::ALL {
        assert_eq!(one("mode", text).mode, Some(*mode));
    }
    for (helper, text) in Helper::ALL {
        assert_eq!(one("helper", text).helper, Some(*helper));
    }
    for (log, text) in LogPath::ALL {
        assert_eq!(one("log", text).log, Some(*log));
    }
    for key in ["persistence", "helper", "log"] {
        assert!(one(key, "none").is_default(), "{key}: none is the default");
    }
}

#[test]
fn the_persistence_timeout_comes_from_the_affinity_config() {
    let svc = annotated(
        json!({format!("{PREFIX}persistence"): "srcip"}),
        json!({"sessionAffinity": "ClientIP", "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 7}}}),
    );
    let (lb, warnings) = balancing(&svc);
    assert!(warnings.is_empty(), "{warnings:?}");
    assert_eq!(lb.persistence.unwrap().timeout_seconds, 7);
}

#[test]
fn unknown_keys_and_values_are_warnings_and_the_rest_is_kept() {
    let before = rejected_annotations();
    let svc = annotated(
        json!({
            format!("{PREFIX}scheduler"): "weight",
            format!("{PREFIX}colour"): "blue",
            format!("{PREFIX}log"): "forward",
            "example.com/other": "x",
        }),
        json!({}),
    );
    let (lb, warnings) = balancing(&svc);
    assert_eq!(lb.scheduler, None, "an unknown value leaves the default");
    assert_eq!(lb.log, Some(kpng_model::global::LogPath::Forward));
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    let joined = warnings.join("\n");
    assert!(
        joined.contains(
            "Service shop/web: metadata.annotations[\"service.kubernetes.io/kube-nftlb-load-balancer-scheduler\"]: \
             unknown scheduler \"weight\" (expected \"rr\", \"symhash\" or \"hash\")"
        ),
        "{joined}"
    );
    assert!(joined.contains("unknown setting \"colour\" (expected \"scheduler\", \"persistence\", \"mode\", \"helper\" or \"log\")"), "{joined}");
    assert!(rejected_annotations() >= before + 2);
}

#[test]
fn a_cluster_ip_of_a_family_ip_families_does_not_list_is_dropped_with_a_warning() {
    let mut svc = service(json!({}), &["10.96.0.50", "fd00::50"]);
    svc.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into()]);
    let mut warnings = Warnings::new();
    let converted = convert_service(&svc, &ConvertOptions::default(), &mut warnings).unwrap();
    let kept = converted.proxied().unwrap().cluster_ips;
    assert_eq!(*kept, ["10.96.0.50".parse::<std::net::IpAddr>().unwrap()]);
    let shown = warnings[0].to_string();
    assert!(shown.contains("shop/web") && shown.contains("spec.clusterIPs[1]"), "{shown}");
    assert!(shown.contains("spec.ipFamilies is [IPv4]"), "{shown}");
    // Both families listed, or none given: both kept.
    for families in [Some(vec!["IPv4".into(), "IPv6".into()]), None] {
        svc.spec.as_mut().unwrap().ip_families = families;
        let mut warnings = Warnings::new();
        let converted = convert_service(&svc, &ConvertOptions::default(), &mut warnings).unwrap();
        assert_eq!(converted.proxied().unwrap().cluster_ips.len(), 2);
        assert!(warnings.is_empty());
    }
}
