//! Services ↔ `ServiceInfo`. The service-proxy-name label travels in the original
//! `Service.Labels` map (field 8), the creation time in an extension.

use std::net::IpAddr;

use kpng_model::global::{
    IpMode, LoadBalancerIngress, Outside, SERVICE_PROXY_NAME_LABEL, ServicePort, SessionAffinity,
    TargetPort, TrafficPolicy,
};
use kpng_model::{Service, ServiceKey};

use super::{GlobalItem, with_hash};
use crate::load_balancing::{decode_load_balancing, encode_load_balancing};
use crate::wire::{
    WireError, affinity_timeout, client_ip, decode, ip_filters, ip_set, optional_port, parse_ip,
    parse_ips, port, protocol, service_type, source_ranges, wire_protocol,
};
use crate::{globalv1, localv1};

/// The item of a service.
pub fn service_item(service: &Service) -> GlobalItem {
    let all_lb: Vec<IpAddr> = service.load_balancer_ingress().iter().map(|i| i.ip).collect();
    let wire = localv1::Service {
        namespace: service.key.namespace().to_string(),
        name: service.key.name().to_string(),
        r#type: service.service_type.as_str().to_string(),
        ips: Some(localv1::ServiceIPs {
            cluster_ips: Some(ip_set(&service.cluster_ips)),
            external_ips: Some(ip_set(service.external_ips())),
            headless: false,
            load_balancer_ips: Some(ip_set(&all_lb)),
        }),
        map_ip: false,
        ports: service
            .ports
            .iter()
            .map(|p| localv1::PortMapping {
                name: p.name.to_string(),
                protocol: wire_protocol(p.protocol) as i32,
                port: p.port.into(),
                node_port: p.node_port.map_or(0, i32::from),
                target_port: match &p.target_port {
                    TargetPort::Number(n) => (*n).into(),
                    TargetPort::Name(_) => 0,
                },
                target_port_name: match &p.target_port {
                    TargetPort::Number(_) => String::new(),
                    TargetPort::Name(name) => name.to_string(),
                },
            })
            .collect(),
        external_traffic_to_local: service.external_traffic_policy == TrafficPolicy::Local,
        labels: service
            .proxy_name
            .iter()
            .map(|name| (SERVICE_PROXY_NAME_LABEL.to_string(), name.to_string()))
            .collect(),
        annotations: Default::default(),
        ip_filters: ip_filters(service.load_balancer_source_ranges(), &ip_set(&all_lb)),
        session_affinity: client_ip(match service.session_affinity {
            SessionAffinity::None => None,
            SessionAffinity::ClientIP { timeout_seconds } => Some(timeout_seconds),
        }),
        internal_traffic_to_local: service.internal_traffic_policy == TrafficPolicy::Local,
        health_check_node_port: service.health_check_node_port.map_or(0, i32::from),
        port_endpoints: Vec::new(),
        load_balancing: encode_load_balancing(&service.load_balancing),
    };
    let info = globalv1::ServiceInfo {
        hash: 0,
        service: Some(wire),
        ingress: service
            .load_balancer_ingress()
            .iter()
            .map(|i| globalv1::LoadBalancerIngress {
                ip: i.ip.to_string(),
                ip_mode: match i.ip_mode {
                    IpMode::VIP => "VIP".into(),
                    IpMode::Proxy => "Proxy".into(),
                },
            })
            .collect(),
        created_at: service.created_at,
    };
    GlobalItem {
        set: localv1::Set::GlobalServiceInfos,
        path: crate::local::service_path(&service.key),
        bytes: with_hash(info, |m, h| m.hash = h),
    }
}

/// A service from its item.
pub fn decode_service(bytes: &[u8], path: &str) -> Result<Service, WireError> {
    let info: globalv1::ServiceInfo = decode(bytes, path)?;
    let wire = info.service.ok_or_else(|| WireError::new(path, "service", "missing"))?;
    let key: ServiceKey = path
        .parse()
        .map_err(|e: kpng_model::global::InvalidKey| WireError::new(path, "path", e.0))?;
    let service_type = service_type(&wire.r#type, path)?;
    let ips = wire.ips.clone().unwrap_or_default();
    let mut ports = Vec::with_capacity(wire.ports.len());
    for (i, p) in wire.ports.iter().enumerate() {
        let at = |f: &str| format!("ports[{i}].{f}");
        ports.push(ServicePort {
            name: p.name.as_str().into(),
            protocol: protocol(p.protocol, path, &at("protocol"))?,
            port: port(p.port, path, &at("port"))?,
            node_port: optional_port(p.node_port, path, &at("nodePort"))?,
            target_port: if p.target_port_name.is_empty() {
                TargetPort::Number(port(p.target_port, path, &at("targetPort"))?)
            } else {
                TargetPort::Name(p.target_port_name.as_str().into())
            },
        });
    }
    let mut load_balancer_ingress = Vec::with_capacity(info.ingress.len());
    for (i, entry) in info.ingress.iter().enumerate() {
        let field = format!("ingress[{i}]");
        load_balancer_ingress.push(LoadBalancerIngress {
            ip: parse_ip(&entry.ip, path, &field)?,
            ip_mode: match entry.ip_mode.as_str() {
                "VIP" | "" => IpMode::VIP,
                "Proxy" => IpMode::Proxy,
                other => {
                    return Err(WireError::new(path, &field, format!("unknown ipMode {other:?}")));
                }
            },
        });
    }
    let policy = |local| if local { TrafficPolicy::Local } else { TrafficPolicy::Cluster };
    Ok(Service {
        key,
        service_type,
        cluster_ips: parse_ips(ips.cluster_ips.as_ref(), path, "ips.clusterIPs")?.into(),
        ports: ports.into(),
        outside: Outside {
            external_ips: parse_ips(ips.external_ips.as_ref(), path, "ips.externalIPs")?.into(),
            load_balancer_ingress: load_balancer_ingress.into(),
            load_balancer_source_ranges: source_ranges(&wire.ip_filters, path)?.into(),
        }
        .boxed(),
        session_affinity: match affinity_timeout(&wire.session_affinity, path)? {
            Some(timeout_seconds) => SessionAffinity::ClientIP { timeout_seconds },
            None => SessionAffinity::None,
        },
        internal_traffic_policy: policy(wire.internal_traffic_to_local),
        external_traffic_policy: policy(wire.external_traffic_to_local),
        health_check_node_port: optional_port(
            wire.health_check_node_port,
            path,
            "healthCheckNodePort",
        )?,
        proxy_name: wire.labels.get(SERVICE_PROXY_NAME_LABEL).map(|name| name.as_str().into()),
        created_at: info.created_at,
        load_balancing: decode_load_balancing(wire.load_balancing.as_ref(), path)?,
    })
}
