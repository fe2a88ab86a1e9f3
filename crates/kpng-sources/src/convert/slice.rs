//! discovery.k8s.io/v1 EndpointSlice → [`EndpointSlice`].

use kpng_model::global::{
    Endpoint, EndpointSlice, Hints, Placement, PodName, ProxyName, SliceKey, SlicePort,
};
use kpng_model::net::parse_ip;
use kpng_model::{Family, ObjectRef};

use super::service::protocol;
use super::{
    ConvertError, ConvertOptions, Converted, FieldError, SERVICE_NAME_LABEL,
    SERVICE_PROXY_NAME_LABEL, TRIGGER_TIME_ANNOTATION, ignored_by_labels,
};
use crate::schema::EndpointSlice as SliceObject;
use crate::schema::slice::{Endpoint as EndpointObject, EndpointPort, Named};

/// Converts an EndpointSlice. Ignored: slices without a `kubernetes.io/service-name`
/// label, FQDN slices, and slices labelled as headless or not for this proxy.
pub fn convert_slice(
    slice: &SliceObject,
    options: &ConvertOptions,
) -> Result<Converted<EndpointSlice>, ConvertError> {
    let namespace = slice.metadata.namespace.clone().unwrap_or_else(|| "default".to_string());
    let name = slice.metadata.name.clone().unwrap_or_default();
    let error = |error: FieldError| ConvertError {
        kind: "EndpointSlice",
        namespace: Some(namespace.clone()),
        name: name.clone(),
        error,
    };
    if name.is_empty() {
        return Err(error(FieldError::new("metadata.name", "missing")));
    }
    let key = SliceKey::new(namespace.clone(), name.clone());
    let ignored = |reason: String| {
        Ok(Converted::Ignored { key: ObjectRef::EndpointSlice(key.clone()), reason })
    };
    let labels = &slice.metadata.labels;
    if let Some(reason) = ignored_by_labels(labels, options) {
        return ignored(reason);
    }
    let Some(service_name) = labels.get(SERVICE_NAME_LABEL).filter(|s| !s.is_empty()) else {
        return ignored(format!("no {SERVICE_NAME_LABEL} label"));
    };
    let family = match slice.address_type.as_deref() {
        Some("IPv4") => Family::V4,
        Some("IPv6") => Family::V6,
        Some("FQDN") => return ignored("addressType FQDN".into()),
        Some(other) => {
            let reason = format!("unknown address type {other:?}");
            return Err(error(FieldError::new("addressType", reason)));
        }
        None => return Err(error(FieldError::new("addressType", "missing"))),
    };
    let ports = slice_ports(slice.ports.as_deref().unwrap_or_default()).map_err(error)?;
    let mut endpoints = Vec::new();
    for (i, e) in slice.endpoints.iter().flatten().enumerate() {
        if let Some(endpoint) = convert_endpoint(e, i, family).map_err(error)? {
            endpoints.push(endpoint);
        }
    }
    Ok(Converted::Proxied(EndpointSlice {
        key,
        service_name: std::sync::Arc::from(service_name),
        family,
        ports: ports.into(),
        // Objects stay in the model for their lifetime: no spare capacity.
        endpoints: endpoints.into_boxed_slice(),
        trigger_time: slice.metadata.annotations.get(TRIGGER_TIME_ANNOTATION).map(Box::from),
        proxy_name: labels.get(SERVICE_PROXY_NAME_LABEL).map(ProxyName::from),
    }))
}

/// The slice's ports that have a number.
fn slice_ports(ports: &[EndpointPort]) -> Result<Vec<SlicePort>, FieldError> {
    let mut out = Vec::with_capacity(ports.len());
    for (i, p) in ports.iter().enumerate() {
        let Some(number) = p.port else { continue };
        let port = u16::try_from(number).ok().filter(|n| *n != 0).ok_or_else(|| {
            let reason = format!("port {number} out of range 1-65535");
            FieldError::new(format!("ports[{i}].port"), reason)
        })?;
        out.push(SlicePort {
            name: p.name.as_deref().unwrap_or_default().into(),
            protocol: protocol(p.protocol.as_deref(), || format!("ports[{i}].protocol"))?,
            port,
        });
    }
    Ok(out)
}

fn convert_endpoint(
    e: &EndpointObject,
    i: usize,
    family: Family,
) -> Result<Option<Endpoint>, FieldError> {
    let Some(text) = e.addresses.as_ref().and_then(|a| a.first()) else { return Ok(None) };
    // Named only when something is wrong (a hundred thousand endpoints at a cold start).
    let field = || format!("endpoints[{i}].addresses[0]");
    let address = parse_ip(text).map_err(|err| FieldError::new(field(), err))?;
    if Family::of(&address) != family {
        return Err(FieldError::new(
            field(),
            format!("{address} is not an {family} address as addressType says"),
        ));
    }
    let conditions = e.conditions.as_ref();
    let hints = e.hints.as_ref();
    Ok(Some(Endpoint {
        address,
        ready: conditions.and_then(|c| c.ready).unwrap_or(true),
        serving: conditions.and_then(|c| c.serving).unwrap_or(true),
        terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
        placement: Placement::with_hints(
            e.node_name.as_deref(),
            e.zone.as_deref(),
            Hints::new(
                names(hints.and_then(|h| h.for_zones.as_deref())),
                names(hints.and_then(|h| h.for_nodes.as_deref())),
            ),
        ),
        pod_name: e
            .target_ref
            .as_ref()
            .filter(|r| r.kind.as_deref() == Some("Pod"))
            .and_then(|r| r.name.as_deref().map(PodName::new)),
    }))
}

/// The names of hint entries, sorted, without duplicates or empty names.
fn names(entries: Option<&[Named]>) -> Vec<String> {
    let mut out: Vec<String> = entries
        .unwrap_or_default()
        .iter()
        .filter_map(|n| n.name.clone())
        .filter(|n| !n.is_empty())
        .collect();
    out.sort();
    out.dedup();
    out
}
