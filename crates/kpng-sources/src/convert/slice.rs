//! discovery.k8s.io/v1 EndpointSlice → [`EndpointSlice`].

use k8s_openapi::api::discovery::v1 as discovery;
use kpng_model::global::{Endpoint, EndpointSlice, SliceKey, SlicePort};
use kpng_model::net::parse_ip;
use kpng_model::{Family, ObjectRef};

use super::service::protocol;
use super::{
    ConvertError, ConvertOptions, Converted, FieldError, SERVICE_NAME_LABEL,
    TRIGGER_TIME_ANNOTATION, ignored_by_labels,
};

/// Converts an EndpointSlice. Ignored: slices without a `kubernetes.io/service-name`
/// label, FQDN slices, and slices labelled for another proxy or as headless.
pub fn convert_slice(
    slice: &discovery::EndpointSlice,
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
    let labels = slice.metadata.labels.as_ref();
    if let Some(reason) = ignored_by_labels(labels, options) {
        return ignored(reason);
    }
    let Some(service_name) =
        labels.and_then(|l| l.get(SERVICE_NAME_LABEL)).filter(|s| !s.is_empty())
    else {
        return ignored(format!("no {SERVICE_NAME_LABEL} label"));
    };
    let family = match slice.address_type.as_str() {
        "IPv4" => Family::V4,
        "IPv6" => Family::V6,
        "FQDN" => return ignored("addressType FQDN".into()),
        other => {
            return Err(error(FieldError::new(
                "addressType",
                format!("unknown address type {other:?}"),
            )));
        }
    };
    let mut ports = Vec::new();
    for (i, p) in slice.ports.iter().flatten().enumerate() {
        let Some(number) = p.port else { continue };
        let port = u16::try_from(number).ok().filter(|n| *n != 0).ok_or_else(|| {
            error(FieldError::new(
                format!("ports[{i}].port"),
                format!("port {number} out of range 1-65535"),
            ))
        })?;
        ports.push(SlicePort {
            name: p.name.clone().unwrap_or_default(),
            protocol: protocol(p.protocol.as_deref(), &format!("ports[{i}].protocol"))
                .map_err(error)?,
            port,
        });
    }
    let mut endpoints = Vec::new();
    for (i, e) in slice.endpoints.iter().enumerate() {
        if let Some(endpoint) = convert_endpoint(e, i, family).map_err(error)? {
            endpoints.push(endpoint);
        }
    }
    // Objects stay in the model for their lifetime: no spare capacity.
    ports.shrink_to_fit();
    endpoints.shrink_to_fit();
    Ok(Converted::Proxied(EndpointSlice {
        key,
        service_name: service_name.clone(),
        family,
        ports,
        endpoints,
        trigger_time: slice
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(TRIGGER_TIME_ANNOTATION))
            .cloned(),
        proxy_name: labels.and_then(|l| l.get(super::SERVICE_PROXY_NAME_LABEL)).cloned(),
    }))
}

fn convert_endpoint(
    e: &discovery::Endpoint,
    i: usize,
    family: Family,
) -> Result<Option<Endpoint>, FieldError> {
    let Some(text) = e.addresses.first() else { return Ok(None) };
    let field = format!("endpoints[{i}].addresses[0]");
    let address = parse_ip(text).map_err(|err| FieldError::new(field.clone(), err))?;
    if Family::of(&address) != family {
        return Err(FieldError::new(
            field,
            format!("{address} is not an {family} address as addressType says"),
        ));
    }
    let conditions = e.conditions.as_ref();
    let hints = e.hints.as_ref();
    let mut zone_hints: Vec<String> = hints
        .and_then(|h| h.for_zones.as_ref())
        .into_iter()
        .flatten()
        .map(|z| z.name.clone())
        .collect();
    let mut node_hints: Vec<String> = hints
        .and_then(|h| h.for_nodes.as_ref())
        .into_iter()
        .flatten()
        .map(|n| n.name.clone())
        .collect();
    zone_hints.sort();
    zone_hints.dedup();
    node_hints.sort();
    node_hints.dedup();
    Ok(Some(Endpoint {
        address,
        ready: conditions.and_then(|c| c.ready).unwrap_or(true),
        serving: conditions.and_then(|c| c.serving).unwrap_or(true),
        terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
        node_name: e.node_name.clone().filter(|n| !n.is_empty()),
        zone: e.zone.clone().filter(|z| !z.is_empty()),
        zone_hints,
        node_hints,
        pod_name: e
            .target_ref
            .as_ref()
            .filter(|r| r.kind.as_deref() == Some("Pod"))
            .and_then(|r| r.name.clone()),
    }))
}
