//! [`GlobalModel`]: every proxied object of the cluster, compared by value.

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt;
use std::hash::Hash;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::global::endpoints::Where;
use crate::global::few::Few;
use crate::global::{
    Claim, Claims, EndpointSlice, Node, Placement, PodName, Service, ServiceCidr, ServiceKey,
    SliceKey, SlicePort,
};

/// The kinds of object the model holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Kind {
    /// v1 Service.
    Service,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlice,
    /// v1 Node.
    Node,
    /// networking.k8s.io/v1 ServiceCIDR.
    ServiceCidr,
}

impl Kind {
    /// Every kind, in the order a consumer should apply them.
    pub const ALL: [Kind; 4] = [Kind::Node, Kind::ServiceCidr, Kind::Service, Kind::EndpointSlice];
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Service => "Service",
            Kind::EndpointSlice => "EndpointSlice",
            Kind::Node => "Node",
            Kind::ServiceCidr => "ServiceCIDR",
        })
    }
}

/// One object of the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Object {
    /// A service.
    Service(Service),
    /// An endpoint slice.
    EndpointSlice(EndpointSlice),
    /// A node.
    Node(Node),
    /// A ServiceCIDR.
    ServiceCidr(ServiceCidr),
}

impl Object {
    /// The object's key.
    pub fn object_ref(&self) -> ObjectRef {
        match self {
            Object::Service(s) => ObjectRef::Service(s.key.clone()),
            Object::EndpointSlice(s) => ObjectRef::EndpointSlice(s.key.clone()),
            Object::Node(n) => ObjectRef::Node(n.name.clone()),
            Object::ServiceCidr(c) => ObjectRef::ServiceCidr(c.name.clone()),
        }
    }
}

/// The key of one object of the model.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ObjectRef {
    /// A service's `namespace/name`.
    Service(ServiceKey),
    /// A slice's `namespace/name`.
    EndpointSlice(SliceKey),
    /// A node's name.
    Node(String),
    /// A ServiceCIDR's name.
    ServiceCidr(String),
}

impl ObjectRef {
    /// The kind of object this key names.
    pub fn kind(&self) -> Kind {
        match self {
            ObjectRef::Service(_) => Kind::Service,
            ObjectRef::EndpointSlice(_) => Kind::EndpointSlice,
            ObjectRef::Node(_) => Kind::Node,
            ObjectRef::ServiceCidr(_) => Kind::ServiceCidr,
        }
    }
}

impl fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ObjectRef::Service(k) => write!(f, "Service {k}"),
            ObjectRef::EndpointSlice(k) => write!(f, "EndpointSlice {k}"),
            ObjectRef::Node(n) => write!(f, "Node {n}"),
            ObjectRef::ServiceCidr(n) => write!(f, "ServiceCIDR {n}"),
        }
    }
}

/// What a change to the model can affect downstream: one service (its own object or one of
/// its slices changed), one node, or the set of ServiceCIDRs.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Touched {
    /// The service or one of its slices changed.
    Service(ServiceKey),
    /// The node changed.
    Node(String),
    /// A ServiceCIDR was added, changed or removed: whatever depends on the ranges (the
    /// addresses a node treats as unallocated service IPs) must be recomputed.
    ServiceCidrs,
}

/// Every proxied object of the cluster. Changing an object to a value equal to the one held
/// is not a change.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GlobalModel {
    // Boxed: tree nodes have room for eleven entries and are often half full; a pointer
    // wastes less than a whole object.
    services: BTreeMap<ServiceKey, Box<Service>>,
    slices: BTreeMap<SliceKey, Box<EndpointSlice>>,
    /// The slices of each service, sorted (nearly every service has one).
    slices_by_service: BTreeMap<ServiceKey, Few<SliceKey>>,
    nodes: BTreeMap<String, Node>,
    service_cidrs: BTreeMap<String, ServiceCidr>,
    /// Who claims each destination.
    claims: Claims,
    /// One copy of each (node, zone) pair the endpoints give, of each namespace, of each
    /// port name, and of each pod name's stem.
    names: Names,
}

/// One copy of each name: the endpoints of a cluster name a few hundred nodes (each with
/// its zone) a hundred thousand times, its services and slices a few hundred namespaces,
/// and their ports a few names (`http`, `dns`, ...); the pods of one owner share the stem
/// of their names ([`crate::global::PodName`]). Not part of the model's value: any two are
/// equal.
#[derive(Debug, Clone, Default)]
struct Names {
    names: Interned<str>,
    /// The stems of pod names.
    stems: Interned<Box<str>>,
    /// The endpoints' (node, zone) pairs.
    places: Interned<Where>,
    /// The slices' lists of ports.
    ports: Interned<[SlicePort]>,
}

impl PartialEq for Names {
    fn eq(&self, _: &Names) -> bool {
        true
    }
}

impl Eq for Names {}

impl Names {
    /// Replaces `name` by the shared copy of it (the first one seen is the one shared).
    fn share_one(&mut self, name: &mut Arc<str>) {
        self.names.share(name);
    }

    /// Replaces `ports` by the shared copy of the list, whose names are shared.
    fn share_ports(&mut self, ports: &mut Arc<[SlicePort]>) {
        if !self.ports.replace(ports) {
            let mut named = ports.to_vec();
            for port in &mut named {
                self.share_one(&mut port.name);
            }
            *ports = named.into();
            self.ports.share(ports);
        }
    }

    /// Replaces `placement` by the shared copy of it.
    fn share_place(&mut self, placement: &mut Placement) {
        if let Some(place) = placement.shared() {
            self.places.share(place);
        }
    }

    /// Replaces the stem of `pod` by the shared copy of it.
    fn share_stem(&mut self, pod: &mut PodName) {
        if let Some(stem) = pod.shared_stem() {
            self.stems.share(stem);
        }
    }
}

/// One copy of each value shared, forgetting those nothing else holds as the table grows.
#[derive(Debug)]
struct Interned<T: ?Sized> {
    known: HashSet<Arc<T>>,
    /// How many were known after the last sweep of those no object uses.
    swept: usize,
}

impl<T: ?Sized> Default for Interned<T> {
    fn default() -> Self {
        Interned { known: HashSet::new(), swept: 0 }
    }
}

impl<T: ?Sized> Clone for Interned<T> {
    fn clone(&self) -> Self {
        Interned { known: self.known.clone(), swept: self.swept }
    }
}

impl<T: ?Sized + Hash + Eq> Interned<T> {
    /// Replaces `value` by the shared copy of it, if one is known. Whether one was.
    fn replace(&self, value: &mut Arc<T>) -> bool {
        let known = self.known.get(value);
        if let Some(known) = known {
            *value = known.clone();
        }
        known.is_some()
    }

    /// Replaces `value` by the shared copy of it.
    fn share(&mut self, value: &mut Arc<T>) {
        if self.replace(value) {
            return;
        }
        if self.known.len() >= 2 * self.swept.max(64) {
            // Values only this table holds: no object has them any more.
            self.known.retain(|known| Arc::strong_count(known) > 1);
            self.swept = self.known.len();
        }
        self.known.insert(value.clone());
    }
}

impl GlobalModel {
    /// An empty model.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `object`, replacing the object with the same key. Returns what the change
    /// touched, or `None` when the model already held an equal object.
    pub fn apply(&mut self, object: Object) -> Option<Vec<Touched>> {
        match object {
            Object::Service(mut service) => {
                let known = self.services.get_key_value(&service.key);
                if known.map(|(_, s)| &**s) == Some(&service) {
                    return None;
                }
                // Every copy of a key shares one copy of its parts: the key held already,
                // or a new one whose namespace is shared.
                match known {
                    Some((key, _)) => service.key = key.clone(),
                    None => {
                        let mut namespace = service.key.namespace().clone();
                        self.names.share_one(&mut namespace);
                        if !Arc::ptr_eq(&namespace, service.key.namespace()) {
                            service.key = ServiceKey::new(namespace, service.key.name().clone());
                        }
                    }
                }
                let old = known.map(|(_, s)| s);
                for port in &mut service.ports {
                    self.names.share_one(&mut port.name);
                    if let crate::global::TargetPort::Name(name) = &mut port.target_port {
                        self.names.share_one(name);
                    }
                }
                let before = old.map(|s| s.claims()).unwrap_or_default();
                let after = service.claims();
                let mut rivals = self.claims.update(&service.key, &before, &after);
                if old.is_some_and(|o| o.created_at != service.created_at) {
                    // A new seniority (the object was re-created under the same name): who
                    // holds each destination it kept may change too.
                    for claim in &after {
                        rivals.extend(self.claims.claimants(claim).iter().cloned());
                    }
                    rivals.remove(&service.key);
                }
                let key = service.key.clone();
                self.services.insert(key.clone(), Box::new(service));
                let mut touched = vec![Touched::Service(key)];
                touched.extend(rivals.into_iter().map(Touched::Service));
                Some(touched)
            }
            Object::EndpointSlice(slice) => {
                if self.slices.get(&slice.key).map(|s| &**s) == Some(&slice) {
                    return None;
                }
                let mut slice = slice;
                self.names.share_one(&mut slice.key.namespace);
                self.names.share_ports(&mut slice.ports);
                let mut service = slice.service_key();
                if let Some((known, _)) = self.services.get_key_value(&service) {
                    slice.service_name = known.name().clone();
                    service = known.clone();
                }
                for endpoint in &mut slice.endpoints {
                    self.names.share_place(&mut endpoint.placement);
                    if let Some(pod) = &mut endpoint.pod_name {
                        self.names.share_stem(pod);
                    }
                }
                let mut touched = self.remove_slice(&slice.key);
                match self.slices_by_service.entry(service.clone()) {
                    Entry::Vacant(entry) => {
                        entry.insert(Few::One(slice.key.clone()));
                    }
                    Entry::Occupied(mut entry) => entry.get_mut().add(&slice.key),
                }
                self.slices.insert(slice.key.clone(), Box::new(slice));
                touched.retain(|t| t != &Touched::Service(service.clone()));
                touched.push(Touched::Service(service));
                Some(touched)
            }
            Object::Node(node) => {
                if self.nodes.get(&node.name) == Some(&node) {
                    return None;
                }
                let name = node.name.clone();
                self.nodes.insert(name.clone(), node);
                Some(vec![Touched::Node(name)])
            }
            Object::ServiceCidr(cidr) => {
                if self.service_cidrs.get(&cidr.name) == Some(&cidr) {
                    return None;
                }
                self.service_cidrs.insert(cidr.name.clone(), cidr);
                Some(vec![Touched::ServiceCidrs])
            }
        }
    }

    /// Removes the object named by `key`. Returns what the removal touched, or `None` when
    /// there was no such object.
    pub fn delete(&mut self, key: &ObjectRef) -> Option<Vec<Touched>> {
        let touched = match key {
            ObjectRef::Service(k) => {
                let old = self.services.remove(k)?;
                let rivals = self.claims.update(k, &old.claims(), &[]);
                let mut touched = vec![Touched::Service(k.clone())];
                touched.extend(rivals.into_iter().map(Touched::Service));
                touched
            }
            ObjectRef::EndpointSlice(k) => self.remove_slice(k),
            ObjectRef::Node(name) => {
                self.nodes.remove(name)?;
                vec![Touched::Node(name.clone())]
            }
            ObjectRef::ServiceCidr(name) => {
                self.service_cidrs.remove(name)?;
                vec![Touched::ServiceCidrs]
            }
        };
        (!touched.is_empty()).then_some(touched)
    }

    fn remove_slice(&mut self, key: &SliceKey) -> Vec<Touched> {
        let Some(old) = self.slices.remove(key) else { return Vec::new() };
        let service = old.service_key();
        if let Some(keys) = self.slices_by_service.get_mut(&service)
            && !keys.remove(key)
        {
            self.slices_by_service.remove(&service);
        }
        vec![Touched::Service(service)]
    }

    /// Rebuilds the model's indexes of `kind` (and the claims, for services) with full
    /// tree nodes. Objects listed in key order, as an API server lists them, grow trees
    /// whose nodes are half full; after a list, rebuilding them in one pass holds the same
    /// entries in about half the nodes. Changes nothing the model holds.
    pub fn compact(&mut self, kind: Kind) {
        use crate::global::claims::compacted;
        match kind {
            Kind::Service => {
                self.services = compacted(std::mem::take(&mut self.services));
                self.claims.compact();
            }
            Kind::EndpointSlice => {
                self.slices = compacted(std::mem::take(&mut self.slices));
                self.slices_by_service = compacted(std::mem::take(&mut self.slices_by_service));
            }
            Kind::Node => self.nodes = compacted(std::mem::take(&mut self.nodes)),
            Kind::ServiceCidr => {
                self.service_cidrs = compacted(std::mem::take(&mut self.service_cidrs));
            }
        }
    }

    /// The service named `key`.
    pub fn service(&self, key: &ServiceKey) -> Option<&Service> {
        self.services.get(key).map(|s| &**s)
    }

    /// The slices that name service `key`, in slice-key order.
    pub fn slices_of<'a>(
        &'a self,
        key: &ServiceKey,
    ) -> impl Iterator<Item = &'a EndpointSlice> + 'a {
        self.slices_by_service
            .get(key)
            .map(Few::as_slice)
            .unwrap_or_default()
            .iter()
            .filter_map(|slice_key| self.slices.get(slice_key).map(|s| &**s))
    }

    /// The services claiming `claim`.
    pub fn claimants(&self, claim: &Claim) -> &[ServiceKey] {
        self.claims.claimants(claim)
    }

    /// Whether `service` holds `claim`: no older service claims it too.
    pub fn holds(&self, service: &Service, claim: &Claim) -> bool {
        let mine = service.seniority();
        self.claimants(claim)
            .iter()
            .filter(|k| **k != service.key)
            .filter_map(|k| self.service(k))
            .all(|rival| rival.seniority() > mine)
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> Option<&Node> {
        self.nodes.get(name)
    }

    /// Every service, in key order.
    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.services.values().map(|s| &**s)
    }

    /// Every slice, in key order.
    pub fn slices(&self) -> impl Iterator<Item = &EndpointSlice> {
        self.slices.values().map(|s| &**s)
    }

    /// Every node, in name order.
    pub fn nodes(&self) -> impl Iterator<Item = &Node> {
        self.nodes.values()
    }

    /// Every ServiceCIDR, in name order.
    pub fn service_cidrs(&self) -> impl Iterator<Item = &ServiceCidr> {
        self.service_cidrs.values()
    }

    /// The keys of every object of `kind`.
    pub fn keys(&self, kind: Kind) -> Vec<ObjectRef> {
        match kind {
            Kind::Service => self.services.keys().cloned().map(ObjectRef::Service).collect(),
            Kind::EndpointSlice => {
                self.slices.keys().cloned().map(ObjectRef::EndpointSlice).collect()
            }
            Kind::Node => self.nodes.keys().cloned().map(ObjectRef::Node).collect(),
            Kind::ServiceCidr => {
                self.service_cidrs.keys().cloned().map(ObjectRef::ServiceCidr).collect()
            }
        }
    }

    /// The number of objects of `kind`.
    pub fn len(&self, kind: Kind) -> usize {
        match kind {
            Kind::Service => self.services.len(),
            Kind::EndpointSlice => self.slices.len(),
            Kind::Node => self.nodes.len(),
            Kind::ServiceCidr => self.service_cidrs.len(),
        }
    }

    /// Whether the model holds no object at all.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
            && self.slices.is_empty()
            && self.nodes.is_empty()
            && self.service_cidrs.is_empty()
    }

    /// Every object, in the order of [`Kind::ALL`]: nodes, ServiceCIDRs, services, slices.
    pub fn objects(&self) -> impl Iterator<Item = Object> + '_ {
        let nodes = self.nodes.values().cloned().map(Object::Node);
        let cidrs = self.service_cidrs().cloned().map(Object::ServiceCidr);
        let services = self.services().cloned().map(Object::Service);
        let slices = self.slices().cloned().map(Object::EndpointSlice);
        nodes.chain(cidrs).chain(services).chain(slices)
    }
}

/// The model as a document: what `to-file` writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelDocument {
    /// Every node.
    pub nodes: Vec<Node>,
    /// Every service.
    pub services: Vec<Service>,
    /// Every slice.
    pub endpoint_slices: Vec<EndpointSlice>,
    /// Every ServiceCIDR (absent from documents written before they were modelled).
    #[serde(default)]
    pub service_cidrs: Vec<ServiceCidr>,
}

impl From<&GlobalModel> for ModelDocument {
    fn from(model: &GlobalModel) -> Self {
        ModelDocument {
            nodes: model.nodes.values().cloned().collect(),
            services: model.services().cloned().collect(),
            endpoint_slices: model.slices().cloned().collect(),
            service_cidrs: model.service_cidrs().cloned().collect(),
        }
    }
}

/// What changed in the model between two revisions, as a reader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Changes {
    /// Anything may have changed: recompute everything.
    All,
    /// Only these services, nodes and (as a whole) ServiceCIDRs changed.
    Touched(BTreeSet<Touched>),
}

impl Changes {
    /// No change at all.
    pub fn is_empty(&self) -> bool {
        matches!(self, Changes::Touched(t) if t.is_empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::global::{Endpoint, EndpointSlice, SliceKey};
    use crate::net::Family;

    fn slice(name: &str, node: &str) -> EndpointSlice {
        let endpoint = |i: u8| Endpoint {
            address: [10, 244, 0, i].into(),
            ready: true,
            serving: true,
            terminating: false,
            placement: Placement::new(Some(&String::from(node)), Some("zone-a")),
            pod_name: None,
        };
        EndpointSlice {
            key: SliceKey::new("ns", name),
            service_name: "web".into(),
            family: Family::V4,
            ports: Arc::from([]),
            endpoints: Box::from([endpoint(1), endpoint(2)]),
            trigger_time: None,
            proxy_name: None,
        }
    }

    fn places(model: &GlobalModel) -> Vec<Arc<Where>> {
        let key = ServiceKey::new("ns", "web");
        let endpoints = model.slices_of(&key).flat_map(|s| &s.endpoints);
        let mut placements: Vec<Placement> = endpoints.map(|e| e.placement.clone()).collect();
        placements.iter_mut().filter_map(|p| p.shared().cloned()).collect()
    }

    #[test]
    fn endpoints_share_one_copy_of_each_node_and_zone() {
        let mut model = GlobalModel::new();
        model.apply(Object::EndpointSlice(slice("web-1", "node-a")));
        model.apply(Object::EndpointSlice(slice("web-2", "node-a")));
        let held = places(&model);
        assert_eq!(held.len(), 4);
        assert!(held.iter().all(|p| Arc::ptr_eq(p, &held[0])));
        let endpoint = &model.slices().next().unwrap().endpoints[0];
        assert_eq!((endpoint.node_name(), endpoint.zone()), (Some("node-a"), Some("zone-a")));
        // A model holding the same objects is equal, whatever names it has seen.
        let mut other = GlobalModel::new();
        other.apply(Object::EndpointSlice(slice("web-0", "node-b")));
        other.delete(&ObjectRef::EndpointSlice(SliceKey::new("ns", "web-0")));
        other.apply(Object::EndpointSlice(slice("web-1", "node-a")));
        other.apply(Object::EndpointSlice(slice("web-2", "node-a")));
        assert_eq!(model, other);
    }

    #[test]
    fn compaction_keeps_every_object_and_its_indexes() {
        let mut model = GlobalModel::new();
        for i in 0..500 {
            let mut s = slice(&format!("web-{i:03}"), "node-a");
            s.service_name = format!("svc-{}", i / 2).into();
            model.apply(Object::EndpointSlice(s));
        }
        let before = model.clone();
        for kind in Kind::ALL {
            model.compact(kind);
        }
        assert_eq!(model, before);
        let key = ServiceKey::new("ns", "svc-7");
        let names: Vec<&str> = model.slices_of(&key).map(|s| &*s.key.name).collect();
        assert_eq!(names, ["web-014", "web-015"]);
        // Still a working tree: a slice moves to another service.
        let mut moved = slice("web-014", "node-a");
        moved.service_name = "svc-8".into();
        model.apply(Object::EndpointSlice(moved));
        assert_eq!(model.slices_of(&key).count(), 1);
        assert_eq!(model.slices_of(&ServiceKey::new("ns", "svc-8")).count(), 3);
    }

    #[test]
    fn services_and_slices_share_their_namespace_the_service_name_and_port_names_and_target_ports()
    {
        let port = || crate::global::ServicePort {
            name: Arc::from(String::from("http")),
            protocol: crate::net::Protocol::Tcp,
            port: 80,
            node_port: None,
            target_port: crate::global::TargetPort::Name(Arc::from(String::from("http"))),
        };
        let service = |name: &str| Service {
            key: ServiceKey::new(String::from("ns"), String::from(name)),
            service_type: crate::global::ServiceType::ClusterIP,
            cluster_ips: vec![[10, 96, 0, 1].into()].into(),
            ports: vec![port()].into(),
            outside: None,
            session_affinity: Default::default(),
            internal_traffic_policy: Default::default(),
            external_traffic_policy: Default::default(),
            health_check_node_port: None,
            proxy_name: None,
            created_at: None,
            load_balancing: Default::default(),
        };
        let mut model = GlobalModel::new();
        model.apply(Object::Service(service("web")));
        model.apply(Object::Service(service("db")));
        let mut web_slice = slice("web-1", "node-a");
        web_slice.ports = Arc::new([crate::global::SlicePort {
            name: Arc::from(String::from("http")),
            protocol: crate::net::Protocol::Tcp,
            port: 8080,
        }]);
        let mut other_slice = slice("web-2", "node-b");
        other_slice.ports = Arc::from(web_slice.ports.to_vec());
        let mut db_slice = slice("db-1", "node-b");
        db_slice.service_name = "db".into();
        db_slice.ports =
            Arc::new([crate::global::SlicePort { port: 5432, ..web_slice.ports[0].clone() }]);
        model.apply(Object::EndpointSlice(web_slice));
        model.apply(Object::EndpointSlice(other_slice));
        model.apply(Object::EndpointSlice(db_slice));
        let key = ServiceKey::new("ns", "web");
        let (web, db) = (model.service(&key).unwrap(), model.service(&ServiceKey::new("ns", "db")));
        let db = db.unwrap();
        let held = model.slices_of(&key).next().unwrap();
        assert!(Arc::ptr_eq(web.key.namespace(), db.key.namespace()));
        assert!(Arc::ptr_eq(web.key.namespace(), &held.key.namespace));
        assert!(Arc::ptr_eq(web.key.name(), &held.service_name));
        assert!(Arc::ptr_eq(&web.ports[0].name, &db.ports[0].name));
        assert!(Arc::ptr_eq(&web.ports[0].name, &held.ports[0].name));
        // A named target port shares the name too, with the port names of the same text.
        let target = |service: &Service| match &service.ports[0].target_port {
            crate::global::TargetPort::Name(name) => name.clone(),
            crate::global::TargetPort::Number(n) => panic!("target port {n}, not a name"),
        };
        assert!(Arc::ptr_eq(&target(web), &target(db)));
        assert!(Arc::ptr_eq(&target(web), &web.ports[0].name));
        // Two words for the name, two for the target: a port is 40 bytes.
        assert_eq!(std::mem::size_of::<crate::global::ServicePort>(), 40);
        // Equal lists of ports are one list; another list still shares the port's name.
        let other = model.slices_of(&key).nth(1).unwrap();
        assert!(Arc::ptr_eq(&held.ports, &other.ports));
        let db_held = model.slices_of(&ServiceKey::new("ns", "db")).next().unwrap();
        assert_eq!(db_held.ports[0].port, 5432);
        assert!(Arc::ptr_eq(&web.ports[0].name, &db_held.ports[0].name));
    }

    #[test]
    fn pods_of_one_owner_share_the_stem_of_their_names() {
        let mut model = GlobalModel::new();
        for (slice_name, pods) in
            [("web-1", ["web-7d9-aaaaa", "web-7d9-bbbbb"]), ("web-2", ["web-7d9-ccccc", "db-0"])]
        {
            let mut s = slice(slice_name, "node-a");
            for (endpoint, pod) in s.endpoints.iter_mut().zip(pods) {
                endpoint.pod_name = Some(PodName::new(&String::from(pod)));
            }
            model.apply(Object::EndpointSlice(s));
        }
        let mut pods: Vec<PodName> =
            model.slices().flat_map(|s| &s.endpoints).filter_map(|e| e.pod_name.clone()).collect();
        assert_eq!(
            pods.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["web-7d9-aaaaa", "web-7d9-bbbbb", "web-7d9-ccccc", "db-0"]
        );
        let stems: Vec<crate::global::endpoints::Stem> =
            pods.iter_mut().filter_map(|p| p.shared_stem().cloned()).collect();
        assert_eq!(stems.len(), 4);
        assert!(stems[..3].iter().all(|stem| Arc::ptr_eq(stem, &stems[0])));
        assert!(!Arc::ptr_eq(&stems[3], &stems[0]));
    }

    #[test]
    fn names_no_endpoint_gives_are_forgotten() {
        let mut model = GlobalModel::new();
        for i in 0..1000 {
            model.apply(Object::EndpointSlice(slice("web-1", &format!("node-{i}"))));
        }
        // One node is in use; the sweeps keep the table small.
        let kept = model.names.places.known.len();
        assert!(kept < 200, "{kept} places kept");
    }
}
