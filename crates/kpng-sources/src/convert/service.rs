//! v1 Service → [`Service`].

use std::net::IpAddr;

use kpng_model::global::{
    DEFAULT_AFFINITY_TIMEOUT_SECONDS, IpMode, LoadBalancerIngress, Outside, ProxyName, Service,
    ServiceKey, ServicePort, ServiceType, SessionAffinity, TargetPort, TrafficPolicy,
};
use kpng_model::net::{parse_cidr, parse_ip};
use kpng_model::{Family, ObjectRef, Protocol};

use super::load_balancing::load_balancing;
use super::{
    ConvertError, ConvertOptions, Converted, FieldError, SERVICE_PROXY_NAME_LABEL, Warnings,
    ignored_by_labels, unix_seconds,
};
use crate::schema::service::{IntOrString, ServiceSpec, ServiceStatus};
use crate::schema::{ObjectMeta, Service as ServiceObject};

/// Converts a Service. Ignored: ExternalName services, headless services (no usable
/// cluster IP), and services labelled as headless or not for this proxy. Cluster IPs that
/// cannot be service addresses (unspecified, loopback, multicast, broadcast) are dropped
/// with a warning: the service is not proxied in that family.
pub fn convert_service(
    svc: &ServiceObject,
    options: &ConvertOptions,
    warnings: &mut Warnings,
) -> Result<Converted<Service>, ConvertError> {
    let namespace = svc.metadata.namespace.clone().unwrap_or_else(|| "default".to_string());
    let name = svc.metadata.name.clone().unwrap_or_default();
    let error = |error: FieldError| ConvertError {
        kind: "Service",
        namespace: Some(namespace.clone()),
        name: name.clone(),
        error,
    };
    if name.is_empty() {
        return Err(error(FieldError::new("metadata.name", "missing")));
    }
    let key = ServiceKey::new(namespace.clone(), name.clone());
    let ignored =
        |reason: String| Ok(Converted::Ignored { key: ObjectRef::Service(key.clone()), reason });
    if let Some(reason) = ignored_by_labels(&svc.metadata.labels, options) {
        return ignored(reason);
    }
    let Some(spec) = &svc.spec else { return ignored("no spec".into()) };
    let service_type = match spec.type_.as_deref().unwrap_or("ClusterIP") {
        "ClusterIP" | "" => ServiceType::ClusterIP,
        "NodePort" => ServiceType::NodePort,
        "LoadBalancer" => ServiceType::LoadBalancer,
        "ExternalName" => return ignored("type ExternalName".into()),
        other => {
            let reason = format!("unknown service type {other:?}");
            return Err(error(FieldError::new("spec.type", reason)));
        }
    };
    let (cluster_ips, doubtful) = cluster_ips(spec).map_err(error)?;
    warnings.extend(doubtful.into_iter().map(error));
    if cluster_ips.is_empty() {
        return ignored("headless (no usable cluster IP)".into());
    }
    let reduced = reduce(key, service_type, cluster_ips, spec, svc.status.as_ref(), &svc.metadata);
    let mut service = reduced.map_err(error)?;
    let mut rejected = Vec::new();
    service.load_balancing = load_balancing(&svc.metadata.annotations, spec, &mut rejected);
    warnings.extend(rejected.into_iter().map(error));
    Ok(Converted::Proxied(service))
}

/// The service from its checked type and cluster IPs, and the rest of its fields.
fn reduce(
    key: ServiceKey,
    service_type: ServiceType,
    cluster_ips: Vec<IpAddr>,
    spec: &ServiceSpec,
    status: Option<&ServiceStatus>,
    metadata: &ObjectMeta,
) -> Result<Service, FieldError> {
    let external_traffic_policy =
        policy(spec.external_traffic_policy.as_deref(), "spec.externalTrafficPolicy")?;
    let health_check_node_port = match spec.health_check_node_port {
        Some(p)
            if service_type == ServiceType::LoadBalancer
                && external_traffic_policy == TrafficPolicy::Local =>
        {
            port_number(p, || "spec.healthCheckNodePort".into())?
        }
        _ => None,
    };
    let created_at = metadata
        .creation_timestamp
        .as_deref()
        .map(|t| unix_seconds(t).map_err(|e| FieldError::new("metadata.creationTimestamp", e)))
        .transpose()?;
    Ok(Service {
        key,
        service_type,
        cluster_ips: cluster_ips.into(),
        ports: ports(spec)?.into(),
        outside: Outside {
            external_ips: ips(spec.external_ips.as_deref(), "spec.externalIPs")?.into(),
            load_balancer_ingress: ingress(status)?.into(),
            load_balancer_source_ranges: source_ranges(spec)?.into(),
        }
        .boxed(),
        session_affinity: affinity(spec)?,
        internal_traffic_policy: policy(
            spec.internal_traffic_policy.as_deref(),
            "spec.internalTrafficPolicy",
        )?,
        external_traffic_policy,
        health_check_node_port,
        proxy_name: metadata.labels.get(SERVICE_PROXY_NAME_LABEL).map(ProxyName::from),
        created_at,
        load_balancing: Default::default(),
    })
}

/// `spec.clusterIPs` (or `spec.clusterIP`), at most one per family; empty when headless.
/// Addresses that cannot be service addresses, or whose family `spec.ipFamilies` does not
/// list, are left out and returned as warnings.
fn cluster_ips(spec: &ServiceSpec) -> Result<(Vec<IpAddr>, Vec<FieldError>), FieldError> {
    let (field, texts): (&str, Vec<&String>) = match &spec.cluster_ips {
        Some(ips) if !ips.is_empty() => ("spec.clusterIPs", ips.iter().collect()),
        _ => ("spec.clusterIP", spec.cluster_ip.iter().collect()),
    };
    let (mut out, mut doubtful): (Vec<IpAddr>, Vec<FieldError>) = (Vec::new(), Vec::new());
    for (i, text) in texts.into_iter().enumerate() {
        if text.is_empty() || text == "None" {
            continue;
        }
        // Named only when something is wrong: formatting it for every address costs more
        // than parsing the address.
        let at = || {
            if field == "spec.clusterIPs" { format!("{field}[{i}]") } else { field.to_string() }
        };
        let ip = parse_ip(text).map_err(|e| FieldError::new(at(), e))?;
        let family = Family::of(&ip);
        if let Some(families) = spec.ip_families.as_ref().filter(|f| !f.is_empty())
            && !families.iter().any(|f| f.as_str() == family_name(family))
        {
            let reason = format!(
                "{ip} is {family} but spec.ipFamilies is [{}]: ignored (the service is not \
                 proxied in {family})",
                families.join(", ")
            );
            doubtful.push(FieldError::new(at(), reason));
        } else if let Some(what) = not_a_service_address(&ip) {
            let family = Family::of(&ip);
            let reason = format!(
                "{ip} is {what}, not a service address: ignored (the service is not proxied \
                 in {family})"
            );
            doubtful.push(FieldError::new(at(), reason));
        } else if !out.iter().any(|o| Family::of(o) == Family::of(&ip)) {
            out.push(ip);
        }
    }
    out.shrink_to_fit();
    Ok((out, doubtful))
}

/// A family as `spec.ipFamilies` names it.
fn family_name(family: Family) -> &'static str {
    match family {
        Family::V4 => "IPv4",
        Family::V6 => "IPv6",
    }
}

/// What makes `ip` unusable as a service address, if anything.
fn not_a_service_address(ip: &IpAddr) -> Option<&'static str> {
    if ip.is_unspecified() {
        Some("the unspecified address")
    } else if ip.is_loopback() {
        Some("a loopback address")
    } else if ip.is_multicast() {
        Some("a multicast address")
    } else if matches!(ip, IpAddr::V4(v4) if v4.is_broadcast()) {
        Some("the broadcast address")
    } else {
        None
    }
}

/// A port number; 0 means none. `field` names the field when the number is out of range.
fn port_number(value: i64, field: impl FnOnce() -> String) -> Result<Option<u16>, FieldError> {
    match value {
        0 => Ok(None),
        1..=65535 => Ok(Some(value as u16)),
        _ => Err(FieldError::new(field(), format!("port {value} out of range 1-65535"))),
    }
}

/// Parses a protocol field; absent means TCP. `field` names the field when it is invalid.
pub(crate) fn protocol(
    value: Option<&str>,
    field: impl FnOnce() -> String,
) -> Result<Protocol, FieldError> {
    value.unwrap_or("TCP").parse().map_err(|e| FieldError::new(field(), e))
}

fn ports(spec: &ServiceSpec) -> Result<Vec<ServicePort>, FieldError> {
    let mut out = Vec::new();
    for (i, p) in spec.ports.iter().flatten().enumerate() {
        let at = |f: &str| format!("spec.ports[{i}].{f}");
        let number = p.port.ok_or_else(|| FieldError::new(at("port"), "missing"))?;
        let port = port_number(number, || at("port"))?
            .ok_or_else(|| FieldError::new(at("port"), "must not be 0"))?;
        let target_port = match &p.target_port {
            None => TargetPort::Number(port),
            Some(IntOrString::Int(n)) => {
                TargetPort::Number(port_number(*n, || at("targetPort"))?.unwrap_or(port))
            }
            Some(IntOrString::String(s)) if s.is_empty() => TargetPort::Number(port),
            Some(IntOrString::String(s)) => TargetPort::Name(s.as_str().into()),
        };
        out.push(ServicePort {
            name: p.name.as_deref().unwrap_or_default().into(),
            protocol: protocol(p.protocol.as_deref(), || at("protocol"))?,
            port,
            node_port: p
                .node_port
                .map(|n| port_number(n, || at("nodePort")))
                .transpose()?
                .flatten(),
            target_port,
        });
    }
    out.shrink_to_fit();
    Ok(out)
}

fn ips(values: Option<&[String]>, field: &str) -> Result<Vec<IpAddr>, FieldError> {
    let mut out = values
        .unwrap_or_default()
        .iter()
        .enumerate()
        .map(|(i, text)| parse_ip(text).map_err(|e| FieldError::new(format!("{field}[{i}]"), e)))
        .collect::<Result<Vec<_>, _>>()?;
    out.sort();
    out.dedup();
    out.shrink_to_fit();
    Ok(out)
}

fn ingress(status: Option<&ServiceStatus>) -> Result<Vec<LoadBalancerIngress>, FieldError> {
    let entries = status.and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
    let mut out = Vec::new();
    for (i, entry) in entries.into_iter().flatten().enumerate() {
        let Some(text) = entry.ip.as_deref().filter(|t| !t.is_empty()) else { continue };
        let ip = parse_ip(text)
            .map_err(|e| FieldError::new(format!("status.loadBalancer.ingress[{i}].ip"), e))?;
        let ip_mode = match entry.ip_mode.as_deref() {
            None | Some("VIP") => IpMode::VIP,
            Some("Proxy") => IpMode::Proxy,
            Some(other) => {
                let field = format!("status.loadBalancer.ingress[{i}].ipMode");
                return Err(FieldError::new(
                    field,
                    format!("unknown ipMode {other:?} (expected VIP or Proxy)"),
                ));
            }
        };
        out.push(LoadBalancerIngress { ip, ip_mode });
    }
    out.sort();
    out.dedup();
    out.shrink_to_fit();
    Ok(out)
}

fn source_ranges(spec: &ServiceSpec) -> Result<Vec<ipnet::IpNet>, FieldError> {
    let mut out = Vec::new();
    for (i, text) in spec.load_balancer_source_ranges.iter().flatten().enumerate() {
        if text.trim().is_empty() {
            continue;
        }
        out.push(
            parse_cidr(text)
                .map_err(|e| FieldError::new(format!("spec.loadBalancerSourceRanges[{i}]"), e))?,
        );
    }
    out.sort();
    out.dedup();
    out.shrink_to_fit();
    Ok(out)
}

fn affinity(spec: &ServiceSpec) -> Result<SessionAffinity, FieldError> {
    match spec.session_affinity.as_deref() {
        None | Some("None") | Some("") => Ok(SessionAffinity::None),
        Some("ClientIP") => {
            let timeout = spec
                .session_affinity_config
                .as_ref()
                .and_then(|c| c.client_ip.as_ref())
                .and_then(|c| c.timeout_seconds);
            let timeout_seconds = match timeout {
                None => DEFAULT_AFFINITY_TIMEOUT_SECONDS,
                Some(t @ 1..=86_400) => t as u32,
                Some(t) => {
                    let field = "spec.sessionAffinityConfig.clientIP.timeoutSeconds";
                    return Err(FieldError::new(field, format!("{t} out of range 1-86400")));
                }
            };
            Ok(SessionAffinity::ClientIP { timeout_seconds })
        }
        Some(other) => {
            Err(FieldError::new("spec.sessionAffinity", format!("unknown affinity {other:?}")))
        }
    }
}

fn policy(value: Option<&str>, field: &str) -> Result<TrafficPolicy, FieldError> {
    match value {
        None | Some("") | Some("Cluster") => Ok(TrafficPolicy::Cluster),
        Some("Local") => Ok(TrafficPolicy::Local),
        Some(other) => Err(FieldError::new(field, format!("unknown traffic policy {other:?}"))),
    }
}
