//! The kube source: Services, EndpointSlices and Nodes from the Kubernetes API.
//!
//! One kube-rs watcher per kind (with backoff, so an unreachable API server is retried,
//! not hammered) feeds the store. What the proxy must ignore is dropped by the API server
//! itself through label selectors (`!service.kubernetes.io/headless`, and
//! `!service.kubernetes.io/service-proxy-name` unless this proxy has a name); Nodes are
//! watched by name (this node only) unless every node is wanted. Each object is reduced at
//! ingest by the same conversion as the file source, so an event whose reduced value is
//! unchanged costs no store revision. Every (re)list is applied as a relist, so objects
//! that vanished while the watch was down are deleted and nothing else is touched. Events
//! that arrive together are applied as one batch (one revision).

use std::fmt::Debug;

use futures::{FutureExt, Stream, StreamExt};
use k8s_openapi::api::core::v1 as core;
use k8s_openapi::api::discovery::v1 as discovery;
use kpng_model::global::SliceKey;
use kpng_model::{Kind, Object, ObjectRef, ServiceKey};
use kpng_store::{SourceEvent, StoreWriter};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, Resource, ResourceExt};
use serde::de::DeserializeOwned;

use crate::convert::{
    ConvertError, ConvertOptions, Converted, HEADLESS_LABEL, SERVICE_PROXY_NAME_LABEL,
    convert_node, convert_service, convert_slice,
};

/// At most this many events go into one batch.
const MAX_BATCH: usize = 4096;

/// Which nodes to watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeSelection {
    /// Only the named node (what a node's proxy needs).
    One(String),
    /// Every node (what a cluster-wide `to-api` needs).
    All,
}

/// The kube source.
pub struct KubeSource {
    client: Client,
    options: ConvertOptions,
    nodes: NodeSelection,
}

/// The kinds this source lists.
pub const KINDS: [Kind; 3] = [Kind::Node, Kind::Service, Kind::EndpointSlice];

type Events = std::pin::Pin<Box<dyn Stream<Item = Vec<SourceEvent>> + Send>>;

impl KubeSource {
    /// A source reading through `client`.
    pub fn new(client: Client, options: ConvertOptions, nodes: NodeSelection) -> Self {
        KubeSource { client, options, nodes }
    }

    fn label_selector(&self) -> String {
        match self.options.service_proxy_name {
            Some(_) => format!("!{HEADLESS_LABEL}"),
            None => format!("!{HEADLESS_LABEL},!{SERVICE_PROXY_NAME_LABEL}"),
        }
    }

    /// Feeds the store until cancelled. Watch errors are logged and retried with backoff.
    pub async fn run(self, mut writer: StoreWriter) {
        let labels = self.label_selector();
        let service_config = watcher::Config::default().labels(&labels);
        let nodes_config = match &self.nodes {
            NodeSelection::One(name) => {
                watcher::Config::default().fields(&format!("metadata.name={name}"))
            }
            NodeSelection::All => watcher::Config::default(),
        };
        let services = watch::<core::Service>(
            Api::all(self.client.clone()),
            service_config.clone(),
            Kind::Service,
            {
                let options = self.options.clone();
                move |s| reported(convert_service(s, &options)).map(|c| c.map(Object::Service))
            },
        );
        let slices = watch::<discovery::EndpointSlice>(
            Api::all(self.client.clone()),
            service_config,
            Kind::EndpointSlice,
            {
                let options = self.options.clone();
                move |s| reported(convert_slice(s, &options)).map(|c| c.map(Object::EndpointSlice))
            },
        );
        let nodes = watch::<core::Node>(
            Api::all(self.client.clone()),
            nodes_config,
            Kind::Node,
            move |n| reported(convert_node(n)).map(|c| c.map(Object::Node)),
        );
        let mut events = futures::stream::select_all([services, slices, nodes]);
        while let Some(mut batch) = events.next().await {
            // Whatever else is ready joins this batch: a burst is one revision.
            while batch.len() < MAX_BATCH {
                match events.next().now_or_never() {
                    Some(Some(more)) => batch.extend(more),
                    _ => break,
                }
            }
            let revision = writer.apply(batch);
            tracing::debug!(?revision, "applied API events");
        }
    }
}

/// A conversion result with errors logged: `None` skips the object.
fn reported<T>(result: Result<Converted<T>, ConvertError>) -> Option<Converted<T>> {
    match result {
        Ok(c) => Some(c),
        Err(e) => {
            tracing::warn!(error = %e, "skipping an invalid object");
            None
        }
    }
}

/// The store key of a Kubernetes object of `kind`.
fn key_of<K: Resource>(kind: Kind, object: &K) -> ObjectRef {
    let namespace = object.namespace().unwrap_or_else(|| "default".into());
    let name = object.name_any();
    match kind {
        Kind::Service => ObjectRef::Service(ServiceKey::new(namespace, name)),
        Kind::EndpointSlice => ObjectRef::EndpointSlice(SliceKey::new(namespace, name)),
        Kind::Node => ObjectRef::Node(name),
        Kind::ServiceCidr => ObjectRef::ServiceCidr(name),
    }
}

fn watch<K>(
    api: Api<K>,
    config: watcher::Config,
    kind: Kind,
    convert: impl Fn(&K) -> Option<Converted<Object>> + Send + 'static,
) -> Events
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + 'static,
{
    let to_event = move |object: &K| match convert(object) {
        Some(Converted::Proxied(o)) => Some(SourceEvent::Applied(o)),
        Some(Converted::Ignored { key, .. }) => Some(SourceEvent::Deleted(key)),
        None => None,
    };
    watcher::watcher(api, config)
        .default_backoff()
        .filter_map(move |event| {
            let events = match event {
                Ok(Event::Init) => vec![SourceEvent::ListStarted(kind)],
                Ok(Event::InitApply(o)) | Ok(Event::Apply(o)) => to_event(&o).into_iter().collect(),
                Ok(Event::InitDone) => vec![SourceEvent::ListDone(kind)],
                Ok(Event::Delete(o)) => vec![SourceEvent::Deleted(key_of(kind, &o))],
                Err(e) => {
                    tracing::warn!(%kind, error = %e, "watch failed; retrying with backoff");
                    Vec::new()
                }
            };
            futures::future::ready((!events.is_empty()).then_some(events))
        })
        .boxed()
}
