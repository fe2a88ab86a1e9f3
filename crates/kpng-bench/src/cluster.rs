//! The synthetic cluster as model objects, and single changes to it.

use std::collections::BTreeSet;

use kpng_local::NodeProjector;
use kpng_model::global::{Endpoint, EndpointSlice, SliceKey};
use kpng_model::{Changes, GlobalModel, Object, ObjectRef, ServiceKey, Touched};
use kpng_sources::ConvertOptions;
use kpng_sources::object::{Input, kind_of, read_object};
use kpng_testkit::generate::{ClusterSpec, generate};

/// Every object of the generated cluster, converted as a source would.
pub fn objects(spec: &ClusterSpec) -> anyhow::Result<Vec<Object>> {
    let options = ConvertOptions::default();
    let mut objects = Vec::new();
    for value in generate(spec) {
        let text = |field: &str| value[field].as_str().unwrap_or_default().to_string();
        let Some(kind) = kind_of(&text("apiVersion"), &text("kind")) else { continue };
        let object = read_object(kind, Input::Value(&value), &options, &mut Vec::new())?;
        objects.extend(object.proxied());
    }
    Ok(objects)
}

/// The generated cluster of `spec` as a model, and node `node-0`'s state projected from it.
pub fn projected(spec: &ClusterSpec) -> anyhow::Result<(GlobalModel, NodeProjector)> {
    let mut model = GlobalModel::new();
    for object in objects(spec)? {
        model.apply(object);
    }
    let mut projector = NodeProjector::new("node-0");
    projector.update(&model, &Changes::All);
    Ok((model, projector))
}

/// Applies `object` to `model` and returns what it touched.
pub fn apply(model: &mut GlobalModel, object: Object) -> BTreeSet<Touched> {
    model.apply(object).unwrap_or_default().into_iter().collect()
}

/// Deletes `key` from `model` and returns what it touched.
pub fn delete(model: &mut GlobalModel, key: &ObjectRef) -> BTreeSet<Touched> {
    model.delete(key).unwrap_or_default().into_iter().collect()
}

/// The IPv4 slice of generated service `i`.
pub fn slice_of(model: &GlobalModel, i: usize) -> EndpointSlice {
    let key = ServiceKey::new(format!("ns-{}", i % 10), format!("svc-{i}"));
    model.slices_of(&key).find(|s| s.key.name.ends_with("-v4")).cloned().expect("generated slice")
}

/// `slice` with `endpoint` added last.
pub fn push_endpoint(slice: &mut EndpointSlice, endpoint: Endpoint) {
    slice.endpoints = [&slice.endpoints[..], &[endpoint]].concat().into();
}

/// `slice` without its last endpoint.
pub fn pop_endpoint(slice: &mut EndpointSlice) {
    let kept = slice.endpoints.len().saturating_sub(1);
    slice.endpoints = slice.endpoints[..kept].into();
}

/// A ready endpoint at `10.250.x.y` on node `node`.
pub fn extra_endpoint(n: usize, node: &str) -> Endpoint {
    kpng_testkit::builders::endpoint(&format!("10.250.{}.{}", (n >> 8) & 0xff, n & 0xff), node)
}

/// A new service `bench/extra-<n>` with `endpoints` endpoints, and its slice.
pub fn extra_service(model: &GlobalModel, n: usize, endpoints: usize) -> (Object, Object) {
    let mut slice = slice_of(model, 0);
    let template = model.service(&slice.service_key()).cloned().expect("generated service");
    let mut service = template;
    service.key = ServiceKey::new("bench", format!("extra-{n}"));
    service.cluster_ips = [std::net::IpAddr::from([10, 99, (n >> 8) as u8, n as u8])].into();
    let mut ports = Vec::from(std::mem::take(&mut service.ports));
    ports.truncate(1);
    for port in &mut ports {
        port.node_port = None;
    }
    service.ports = ports.into();
    slice.key = SliceKey::new("bench", format!("extra-{n}-v4"));
    slice.service_name = format!("extra-{n}").into();
    slice.endpoints = (0..endpoints).map(|j| extra_endpoint(n * 8 + j, "node-1")).collect();
    (Object::Service(service), Object::EndpointSlice(slice))
}
