//! Helpers shared by the conversions: errors, IP sets, protocols.

use std::net::IpAddr;

use ipnet::IpNet;
use kpng_model::{Family, Protocol};

use crate::localv1;

/// A message that does not describe a valid object: which object (its path), which field,
/// and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: field {field}: {message}")]
pub struct WireError {
    /// The object's path in the stream (`namespace/name`, ...).
    pub path: String,
    /// The offending field.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl WireError {
    /// An error about `field` of the object at `path`.
    pub fn new(path: &str, field: &str, message: impl Into<String>) -> Self {
        WireError { path: path.to_string(), field: field.to_string(), message: message.into() }
    }
}

/// Addresses as an `IPSet`: textual, by family, sorted, without duplicates.
pub fn ip_set(ips: &[IpAddr]) -> localv1::IpSet {
    let mut sorted = ips.to_vec();
    sorted.sort();
    sorted.dedup();
    let (v4, v6): (Vec<IpAddr>, Vec<IpAddr>) =
        sorted.into_iter().partition(|ip| Family::of(ip) == Family::V4);
    localv1::IpSet {
        v4: v4.iter().map(ToString::to_string).collect(),
        v6: v6.iter().map(ToString::to_string).collect(),
    }
}

/// One textual address.
pub fn parse_ip(text: &str, path: &str, field: &str) -> Result<IpAddr, WireError> {
    text.parse().map_err(|_| WireError::new(path, field, format!("invalid IP {text:?}")))
}

/// The addresses of an `IPSet`, sorted (IPv4 first); each in the right family's list.
pub fn parse_ips(
    set: Option<&localv1::IpSet>,
    path: &str,
    field: &str,
) -> Result<Vec<IpAddr>, WireError> {
    let Some(set) = set else { return Ok(Vec::new()) };
    let mut out = Vec::with_capacity(set.v4.len() + set.v6.len());
    for (family, texts, name) in [(Family::V4, &set.v4, "v4"), (Family::V6, &set.v6, "v6")] {
        for text in texts {
            // The field's name is made only for an error: this runs for every address of
            // every item a client receives.
            let at = || format!("{field}.{name}");
            let ip: IpAddr = text
                .parse()
                .map_err(|_| WireError::new(path, &at(), format!("invalid IP {text:?}")))?;
            if Family::of(&ip) != family {
                return Err(WireError::new(path, &at(), format!("{ip} is not {family:?}")));
            }
            out.push(ip);
        }
    }
    if out.len() > 1 {
        out.sort();
        out.dedup();
    }
    Ok(out)
}

/// Textual CIDRs.
pub fn parse_nets<'a>(
    texts: impl IntoIterator<Item = &'a String>,
    path: &str,
    field: &str,
) -> Result<Vec<IpNet>, WireError> {
    texts
        .into_iter()
        .map(|t| t.parse().map_err(|_| WireError::new(path, field, format!("invalid CIDR {t:?}"))))
        .collect()
}

/// A protocol on the wire.
pub fn wire_protocol(protocol: Protocol) -> localv1::Protocol {
    match protocol {
        Protocol::Tcp => localv1::Protocol::Tcp,
        Protocol::Udp => localv1::Protocol::Udp,
        Protocol::Sctp => localv1::Protocol::Sctp,
    }
}

/// A protocol from the wire.
pub fn protocol(value: i32, path: &str, field: &str) -> Result<Protocol, WireError> {
    protocol_at(value, path, || field.to_string())
}

/// [`protocol`], naming the field (made by `field`) only when the value is wrong.
pub fn protocol_at(
    value: i32,
    path: &str,
    field: impl FnOnce() -> String,
) -> Result<Protocol, WireError> {
    match localv1::Protocol::try_from(value) {
        Ok(localv1::Protocol::Tcp) => Ok(Protocol::Tcp),
        Ok(localv1::Protocol::Udp) => Ok(Protocol::Udp),
        Ok(localv1::Protocol::Sctp) => Ok(Protocol::Sctp),
        _ => Err(WireError::new(path, &field(), format!("unknown protocol {value}"))),
    }
}

/// A port number (1-65535 in practice; 0 is "none" for optional ports).
pub fn port(value: i32, path: &str, field: &str) -> Result<u16, WireError> {
    port_at(value, path, || field.to_string())
}

/// [`port`], naming the field (made by `field`) only when the value is wrong.
pub fn port_at(value: i32, path: &str, field: impl FnOnce() -> String) -> Result<u16, WireError> {
    u16::try_from(value)
        .map_err(|_| WireError::new(path, &field(), format!("port {value} out of range")))
}

/// An optional port: 0 is none.
pub fn optional_port(value: i32, path: &str, field: &str) -> Result<Option<u16>, WireError> {
    Ok(if value == 0 { None } else { Some(port(value, path, field)?) })
}

/// A message from its encoding, for the object at `path`.
pub fn decode<M: prost::Message + Default>(bytes: &[u8], path: &str) -> Result<M, WireError> {
    M::decode(bytes).map_err(|e| WireError::new(path, "bytes", e.to_string()))
}

/// A service type from its name.
pub fn service_type(text: &str, path: &str) -> Result<kpng_model::global::ServiceType, WireError> {
    use kpng_model::global::ServiceType;
    match text {
        "ClusterIP" | "" => Ok(ServiceType::ClusterIP),
        "NodePort" => Ok(ServiceType::NodePort),
        "LoadBalancer" => Ok(ServiceType::LoadBalancer),
        other => Err(WireError::new(path, "type", format!("unknown type {other:?}"))),
    }
}

/// Source ranges as the original's IP filters: one filter on the load-balancer IPs.
pub fn ip_filters(ranges: &[IpNet], lb_ips: &localv1::IpSet) -> Vec<localv1::IpFilter> {
    if ranges.is_empty() {
        return Vec::new();
    }
    vec![localv1::IpFilter {
        target_ips: Some(lb_ips.clone()),
        source_ranges: ranges.iter().map(ToString::to_string).collect(),
    }]
}

/// The source ranges of every IP filter.
pub fn source_ranges(filters: &[localv1::IpFilter], path: &str) -> Result<Vec<IpNet>, WireError> {
    parse_nets(filters.iter().flat_map(|f| &f.source_ranges), path, "ipFilters.sourceRanges")
}

/// ClientIP affinity with `timeout` seconds, if any.
pub fn client_ip(timeout: Option<u32>) -> Option<localv1::service::SessionAffinity> {
    timeout.map(|t| {
        localv1::service::SessionAffinity::ClientIp(localv1::ClientIpAffinity {
            timeout_seconds: i32::try_from(t).unwrap_or(i32::MAX),
        })
    })
}

/// The ClientIP affinity timeout, if the service has affinity.
pub fn affinity_timeout(
    affinity: &Option<localv1::service::SessionAffinity>,
    path: &str,
) -> Result<Option<u32>, WireError> {
    match affinity {
        Some(localv1::service::SessionAffinity::ClientIp(a)) => u32::try_from(a.timeout_seconds)
            .map(Some)
            .map_err(|_| WireError::new(path, "clientIP.timeoutSeconds", "negative timeout")),
        None => Ok(None),
    }
}
