//! The kube source: Services, EndpointSlices, Nodes and ServiceCIDRs from the Kubernetes
//! API.
//!
//! Each kind has its own list/watch loop ([`watcher::KindWatcher`]) on top of raw requests
//! of a `kube::Client`, and the four run at once. A list is read in pages of
//! [`PAGE_SIZE`] objects (`limit`/`continue`), each page's objects handed to the store as
//! soon as the page is read while the next page is already on its way; then the kind is
//! watched (`watch=true&allowWatchBookmarks=true&resourceVersion=...`) until the server
//! closes the watch (it is opened again from the last version seen) or answers `410 Gone`
//! (the kind is listed again). Failures are retried with backoff (0.5 s doubling to 30 s).
//!
//! Objects are parsed into kpng's own types ([`crate::schema`]), which hold only what a
//! proxy reads, and converted like the file source's. A malformed object (a field of the
//! wrong type, an invalid value) is reported once per version, naming its kind,
//! namespace/name and field, and skipped: the rest of its kind is applied, and the
//! object's last good version, if any, stays in force (also through a relist).
//!
//! What the proxy must ignore is dropped by the API server itself through label selectors
//! ([`ConvertOptions::label_selector`]); Nodes are watched by name (this node only) unless
//! every node is wanted. ServiceCIDRs are read as networking.k8s.io/v1beta1 when v1 is not
//! served; a cluster that serves neither (`404`) or does not let the proxy read them
//! (`403`) is treated as having none. An event whose reduced object is
//! unchanged costs no store revision; events that arrive together are applied as one
//! batch. The store releases nothing to sinks before every kind has completed its first
//! list.
//!
//! Requests are paced by a shared token bucket ([`Pacer`]): a list counts once, however
//! many pages it takes, and so does a watch.
//!
//! # Layout
//! - [`resource`]: each kind's API path, selectors, and whether it may be absent.
//! - [`request`]: raw requests: list pages, watch lines, errors classified.
//! - [`decode`]: pages and watch events → store events, malformed objects reported once.
//! - [`watcher`]: one kind's list/watch loop, as a state machine.
//! - [`pace`]: the request pacing (`--kube-api-qps`, `--kube-api-burst`).

pub mod decode;
pub mod pace;
pub mod request;
pub mod resource;
pub mod watcher;

use kpng_model::Kind;
use kpng_store::{SourceEvent, StoreWriter};
use tokio::sync::mpsc;
use tokio::task::JoinSet;

pub use pace::Pacer;

use crate::convert::ConvertOptions;
use decode::Reader;
use resource::Resource;
use watcher::KindWatcher;

/// At most this many events go into one store batch.
const MAX_BATCH: usize = 4096;

/// Objects per list page. Large enough that a relist of tens of thousands of objects is a
/// few dozen round trips, small enough that a page is a few hundred kilobytes.
pub const PAGE_SIZE: usize = 500;

/// Batches of events waiting for the store (each a page or a watch event).
const QUEUE: usize = 16;

/// The kinds this source lists.
pub const KINDS: [Kind; 4] = Kind::ALL;

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
    client: kube::Client,
    options: ConvertOptions,
    nodes: NodeSelection,
    pacer: Pacer,
    page_size: usize,
}

impl KubeSource {
    /// A source reading through `client`, without pacing.
    pub fn new(client: kube::Client, options: ConvertOptions, nodes: NodeSelection) -> Self {
        KubeSource { client, options, nodes, pacer: Pacer::unlimited(), page_size: PAGE_SIZE }
    }

    /// Paces lists and watches with `pacer`.
    pub fn with_pacer(mut self, pacer: Pacer) -> Self {
        self.pacer = pacer;
        self
    }

    /// Lists in pages of `page_size` objects (at least 1).
    pub fn with_page_size(mut self, page_size: usize) -> Self {
        self.page_size = page_size.max(1);
        self
    }

    /// Feeds the store until cancelled. Each kind's loop runs in a task of its own on the
    /// current runtime; the tasks end when this future is dropped.
    #[tracing::instrument(name = "source", skip_all, fields(source = "kube"))]
    pub async fn run(self, mut writer: StoreWriter) {
        let (events, mut received) = mpsc::channel::<Vec<SourceEvent>>(QUEUE);
        let mut loops = JoinSet::new();
        for kind in KINDS {
            let resource = Resource::new(kind, &self.options, &self.nodes);
            let reader = Reader::new(kind, self.options.clone());
            let watcher = KindWatcher::new(
                self.client.clone(),
                resource,
                reader,
                self.pacer.clone(),
                events.clone(),
                self.page_size,
            );
            loops.spawn(watcher.run());
        }
        drop(events);
        while let Some(mut batch) = received.recv().await {
            // Whatever else is ready joins this batch: a burst is one revision.
            while batch.len() < MAX_BATCH {
                match received.try_recv() {
                    Ok(more) => batch.extend(more),
                    Err(_) => break,
                }
            }
            let revision = writer.apply(batch);
            tracing::trace!(?revision, "applied API events");
        }
    }
}
