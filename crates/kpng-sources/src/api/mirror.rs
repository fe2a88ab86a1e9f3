//! [`Mirror`]: a client's copy of a global stream, turned back into store events.

use std::collections::BTreeMap;

use kpng_model::global::{InvalidKey, is_for_proxy};
use kpng_model::{EndpointSlice, Kind, Object, ObjectRef, SliceKey};
use kpng_store::SourceEvent;

use kpng_api::WireError;
use kpng_api::global::{
    decode_node, decode_service, decode_service_cidr, decode_slice, slice_key_of,
};
use kpng_api::localv1;

/// A client's copy of a global stream, turned back into store events.
///
/// The copy holds the encoded items, so a change to one endpoint re-decodes only its slice.
/// Services and slices labelled for a proxy other than the receiving one (see
/// [`is_for_proxy`]) become deletions: a `kpng api --service-proxy-name NAME` keeps the
/// same objects a kube source with that name would.
#[derive(Debug, Default, Clone)]
pub struct Mirror {
    services: BTreeMap<String, Vec<u8>>,
    pub(super) nodes: BTreeMap<String, Vec<u8>>,
    service_cidrs: BTreeMap<String, Vec<u8>>,
    endpoints: BTreeMap<SliceKey, BTreeMap<String, Vec<u8>>>,
    /// The receiving proxy's name (`None`: the default proxy).
    proxy: Option<String>,
}

/// An object a change set touched.
enum Touched {
    Service(String),
    Node(String),
    ServiceCidr(String),
    Slice(SliceKey),
}

impl Mirror {
    /// An empty mirror for the proxy named `proxy` (`None`: the default proxy).
    pub fn for_proxy(proxy: Option<String>) -> Self {
        Mirror { proxy, ..Mirror::default() }
    }

    /// Applies one change set's items (without `Sync`) and returns the store events that
    /// bring a store to the mirrored model: after a `Reset`, one relist of every kind.
    /// Nothing is applied when an item is invalid.
    pub fn apply(&mut self, items: &[localv1::OpItem]) -> Result<Vec<SourceEvent>, WireError> {
        let mut next = self.clone();
        let mut reset = false;
        let mut touched = Vec::new();
        for item in items {
            use localv1::op_item::Op as WireOp;
            let (reference, bytes) = match &item.op {
                Some(WireOp::Reset(_)) => {
                    next = Mirror::for_proxy(self.proxy.clone());
                    reset = true;
                    continue;
                }
                Some(WireOp::Sync(_)) => continue,
                Some(WireOp::Set(value)) => {
                    let reference = value
                        .r#ref
                        .as_ref()
                        .ok_or_else(|| WireError::new("", "ref", "Set without Ref"))?;
                    (reference, Some(value.bytes.clone()))
                }
                Some(WireOp::Delete(reference)) => (reference, None),
                None => return Err(WireError::new("", "op", "no op in OpItem")),
            };
            touched.push(next.put(reference, bytes)?);
        }
        let events = match reset {
            true => SourceEvent::relist(&Kind::ALL, next.objects()?),
            false => next.events(touched)?,
        };
        *self = next;
        Ok(events)
    }

    /// Stores (`Some`) or removes (`None`) the item `reference` names.
    fn put(
        &mut self,
        reference: &localv1::Ref,
        bytes: Option<Vec<u8>>,
    ) -> Result<Touched, WireError> {
        let path = reference.path.clone();
        let set = localv1::Set::try_from(reference.set).map_err(|_| {
            WireError::new(&path, "ref.set", format!("unknown set {}", reference.set))
        })?;
        let put = |map: &mut BTreeMap<String, Vec<u8>>, path: String| match bytes {
            Some(bytes) => map.insert(path, bytes),
            None => map.remove(&path),
        };
        Ok(match set {
            localv1::Set::GlobalServiceInfos => {
                put(&mut self.services, path.clone());
                Touched::Service(path)
            }
            localv1::Set::GlobalNodeInfos => {
                put(&mut self.nodes, path.clone());
                Touched::Node(path)
            }
            localv1::Set::GlobalServiceCidrInfos => {
                put(&mut self.service_cidrs, path.clone());
                Touched::ServiceCidr(path)
            }
            localv1::Set::GlobalEndpointInfos => {
                let (key, _, _) = slice_key_of(&path)?;
                put(self.endpoints.entry(key.clone()).or_default(), path);
                if self.endpoints.get(&key).is_some_and(BTreeMap::is_empty) {
                    self.endpoints.remove(&key);
                }
                Touched::Slice(key)
            }
            other => {
                let message = format!("{} in a global stream", other.as_str_name());
                return Err(WireError::new(&path, "ref.set", message));
            }
        })
    }

    /// The store events for the touched objects, as they are now.
    fn events(&self, touched: Vec<Touched>) -> Result<Vec<SourceEvent>, WireError> {
        let mut events = Vec::with_capacity(touched.len());
        for t in touched {
            let current = match &t {
                Touched::Service(path) => match self.services.get(path) {
                    Some(bytes) => Some(Object::Service(decode_service(bytes, path)?)),
                    None => None,
                },
                Touched::Node(path) => match self.nodes.get(path) {
                    Some(bytes) => Some(Object::Node(decode_node(bytes, path)?)),
                    None => None,
                },
                Touched::ServiceCidr(path) => match self.service_cidrs.get(path) {
                    Some(bytes) => Some(Object::ServiceCidr(decode_service_cidr(bytes, path)?)),
                    None => None,
                },
                Touched::Slice(key) => self.slice(key)?.map(Object::EndpointSlice),
            };
            events.push(match current.filter(|o| self.admits(o)) {
                Some(object) => SourceEvent::Applied(object),
                None => SourceEvent::Deleted(object_ref(t)?),
            });
        }
        Ok(events)
    }

    /// Whether the receiving proxy handles `object`.
    fn admits(&self, object: &Object) -> bool {
        let label = match object {
            Object::Service(s) => s.proxy_name.as_deref(),
            Object::EndpointSlice(s) => s.proxy_name.as_deref(),
            Object::Node(_) | Object::ServiceCidr(_) => return true,
        };
        is_for_proxy(label, self.proxy.as_deref())
    }

    fn slice(&self, key: &SliceKey) -> Result<Option<EndpointSlice>, WireError> {
        let Some(items) = self.endpoints.get(key) else { return Ok(None) };
        decode_slice(key, items.iter().map(|(p, b)| (p.as_str(), b.as_slice())))
    }

    /// Every mirrored object the receiving proxy handles.
    fn objects(&self) -> Result<Vec<Object>, WireError> {
        let mut objects = Vec::new();
        for (path, bytes) in &self.nodes {
            objects.push(Object::Node(decode_node(bytes, path)?));
        }
        for (path, bytes) in &self.service_cidrs {
            objects.push(Object::ServiceCidr(decode_service_cidr(bytes, path)?));
        }
        for (path, bytes) in &self.services {
            objects.push(Object::Service(decode_service(bytes, path)?));
        }
        for key in self.endpoints.keys() {
            objects.extend(self.slice(key)?.map(Object::EndpointSlice));
        }
        objects.retain(|o| self.admits(o));
        Ok(objects)
    }
}

/// The store key of a touched object.
fn object_ref(touched: Touched) -> Result<ObjectRef, WireError> {
    Ok(match touched {
        Touched::Service(path) => ObjectRef::Service(
            path.parse().map_err(|e: InvalidKey| WireError::new(&path, "path", e.0))?,
        ),
        Touched::Node(path) => ObjectRef::Node(path),
        Touched::ServiceCidr(path) => ObjectRef::ServiceCidr(path),
        Touched::Slice(key) => ObjectRef::EndpointSlice(key),
    })
}
