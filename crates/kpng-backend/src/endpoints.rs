//! Which endpoints serve a service port on this node: the same answer for every dataplane,
//! read from the node state once here rather than in each backend.

use std::collections::BTreeSet;
use std::net::IpAddr;

use kpng_model::local::LocalServiceState;
use kpng_model::{Family, Protocol};

/// An endpoint's address and port.
pub type Target = (IpAddr, u16);

/// The endpoints of `family` in the Cluster set and in the Local set of the service port
/// `name`/`protocol`, each sorted.
pub fn port_sets(
    state: &LocalServiceState,
    family: Family,
    name: &str,
    protocol: Protocol,
) -> (BTreeSet<Target>, BTreeSet<Target>) {
    let (mut cluster, mut local) = (BTreeSet::new(), BTreeSet::new());
    for endpoint in state.endpoints.values().filter(|e| Family::of(&e.ip) == family) {
        for p in endpoint.ports.iter().filter(|p| *p.name == *name && p.protocol == protocol) {
            if p.cluster {
                cluster.insert((endpoint.ip, p.port));
            }
            if p.local {
                local.insert((endpoint.ip, p.port));
            }
        }
    }
    (cluster, local)
}

#[cfg(test)]
mod tests {
    use kpng_model::Endpoints;
    use kpng_model::local::{EndpointPort, LocalEndpoint};

    use super::*;

    fn endpoint(ip: &str, cluster: bool, local: bool, protocol: Protocol) -> LocalEndpoint {
        LocalEndpoint {
            ip: ip.parse().unwrap(),
            local,
            ready: true,
            serving: true,
            terminating: false,
            pod_name: None,
            ports: [EndpointPort { name: "p".into(), protocol, port: 8080, cluster, local }].into(),
        }
    }

    #[test]
    fn sets_are_per_family_port_and_protocol() {
        let endpoints: Endpoints = [
            endpoint("10.0.0.1", true, false, Protocol::Tcp),
            endpoint("10.0.0.2", true, true, Protocol::Tcp),
            endpoint("10.0.0.3", false, false, Protocol::Tcp),
            endpoint("10.0.0.4", true, true, Protocol::Udp),
            endpoint("fd00::1", true, true, Protocol::Tcp),
        ]
        .into_iter()
        .collect();
        let service = crate::bare_service("a", "b");
        let state = LocalServiceState { service, endpoints };
        let (cluster, local) = port_sets(&state, Family::V4, "p", Protocol::Tcp);
        let ip = |s: &str| (s.parse().unwrap(), 8080);
        assert_eq!(cluster, BTreeSet::from([ip("10.0.0.1"), ip("10.0.0.2")]));
        assert_eq!(local, BTreeSet::from([ip("10.0.0.2")]));
    }
}
