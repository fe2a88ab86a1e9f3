//! The reduced global model: what every node's proxy may need to know about the cluster.
//!
//! Sources keep only the fields listed here; everything else in a Kubernetes object (managed
//! fields, status a proxy does not use, labels nobody selects on) is dropped at ingest, so a
//! change to it costs nothing downstream.

mod claims;
mod endpoints;
mod few;
mod load_balancing;
mod model;
mod node;
mod service;
mod service_cidr;

pub use claims::{Claim, Claims};
pub use endpoints::{Endpoint, EndpointSlice, Hints, Placement, PodName, SliceKey, SlicePort};
pub use load_balancing::{
    AnnotationKey, DEFAULT_PERSISTENCE_TIMEOUT_SECONDS, Helper, LOAD_BALANCER_ANNOTATION_PREFIX,
    LoadBalancing, LogPath, NatMode, Persistence, PersistenceKey, Scheduler,
};
pub use model::{Changes, GlobalModel, Kind, ModelDocument, Object, ObjectRef, Touched};
pub use node::{Node, NodeAddress, NodeAddressKind, TO_BE_DELETED_TAINT, ZONE_LABEL};
pub use service::{
    ClusterIps, DEFAULT_AFFINITY_TIMEOUT_SECONDS, InvalidKey, IpMode, LoadBalancerIngress, Outside,
    ProxyName, SERVICE_PROXY_NAME_LABEL, Service, ServiceKey, ServicePort, ServiceType,
    SessionAffinity, TargetPort, TrafficPolicy, is_for_proxy,
};
pub use service_cidr::ServiceCidr;
