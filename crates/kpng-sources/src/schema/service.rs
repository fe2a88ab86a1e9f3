//! v1 `Service`, reduced.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::ObjectMeta;

/// A v1 Service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Service {
    /// `metadata`.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`.
    pub spec: Option<ServiceSpec>,
    /// `status`.
    pub status: Option<ServiceStatus>,
}

/// `spec` of a Service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceSpec {
    /// `spec.type`.
    #[serde(rename = "type")]
    pub type_: Option<String>,
    /// `spec.clusterIP`.
    #[serde(rename = "clusterIP")]
    pub cluster_ip: Option<String>,
    /// `spec.clusterIPs`.
    #[serde(rename = "clusterIPs")]
    pub cluster_ips: Option<Vec<String>>,
    /// `spec.ipFamilies`.
    pub ip_families: Option<Vec<String>>,
    /// `spec.ports`.
    pub ports: Option<Vec<ServicePort>>,
    /// `spec.externalIPs`.
    #[serde(rename = "externalIPs")]
    pub external_ips: Option<Vec<String>>,
    /// `spec.loadBalancerSourceRanges`.
    pub load_balancer_source_ranges: Option<Vec<String>>,
    /// `spec.sessionAffinity`.
    pub session_affinity: Option<String>,
    /// `spec.sessionAffinityConfig`.
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// `spec.internalTrafficPolicy`.
    pub internal_traffic_policy: Option<String>,
    /// `spec.externalTrafficPolicy`.
    pub external_traffic_policy: Option<String>,
    /// `spec.healthCheckNodePort`.
    pub health_check_node_port: Option<i64>,
}

/// One of `spec.ports`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// `name`.
    pub name: Option<String>,
    /// `protocol`.
    pub protocol: Option<String>,
    /// `port`.
    pub port: Option<i64>,
    /// `targetPort`: a number or a name.
    pub target_port: Option<IntOrString>,
    /// `nodePort`.
    pub node_port: Option<i64>,
}

/// A field that holds a number or a string (`targetPort`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IntOrString {
    /// A number.
    Int(i64),
    /// A string.
    String(String),
}

impl<'de> Deserialize<'de> for IntOrString {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct IntOrStringVisitor;
        impl Visitor<'_> for IntOrStringVisitor {
            type Value = IntOrString;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number or name")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<IntOrString, E> {
                Ok(IntOrString::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<IntOrString, E> {
                i64::try_from(v).map(IntOrString::Int).map_err(E::custom)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<IntOrString, E> {
                Ok(IntOrString::String(v.to_string()))
            }
        }
        deserializer.deserialize_any(IntOrStringVisitor)
    }
}

/// `spec.sessionAffinityConfig`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct SessionAffinityConfig {
    /// `clientIP`.
    #[serde(rename = "clientIP")]
    pub client_ip: Option<ClientIpConfig>,
}

/// `spec.sessionAffinityConfig.clientIP`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    /// `timeoutSeconds`.
    pub timeout_seconds: Option<i64>,
}

/// `status` of a Service.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ServiceStatus {
    /// `status.loadBalancer`.
    pub load_balancer: Option<LoadBalancerStatus>,
}

/// `status.loadBalancer`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct LoadBalancerStatus {
    /// `ingress`.
    pub ingress: Option<Vec<LoadBalancerIngress>>,
}

/// One of `status.loadBalancer.ingress`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerIngress {
    /// `ip`.
    pub ip: Option<String>,
    /// `ipMode`.
    pub ip_mode: Option<String>,
}
