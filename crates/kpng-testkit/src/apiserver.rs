//! A fake Kubernetes API server: real HTTP list and watch for Services, EndpointSlices,
//! Nodes and ServiceCIDRs, driven by a scenario API, for tests and benchmarks of the kube
//! source.
//!
//! What it serves, as the real API server does:
//! - `GET /api/v1/services`, `/apis/discovery.k8s.io/v1/endpointslices`, `/api/v1/nodes`,
//!   `/apis/networking.k8s.io/v1/servicecidrs`: a list (`kind: ServiceList`...) with the
//!   current `resourceVersion`;
//! - the same with `watch=true`: a chunked stream of newline-separated events (`ADDED`,
//!   `MODIFIED`, `DELETED`, and `BOOKMARK` when `allowWatchBookmarks=true`) after the given
//!   `resourceVersion`; a version older than the retained history gets a `410 Gone` `ERROR`
//!   event, as after an etcd compaction;
//! - `limit` and `continue` for lists in pages (later pages show the objects as they are
//!   then, where the real server keeps the first page's snapshot; a token from before a
//!   compaction gets `410 Gone`);
//! - `labelSelector` (`key`, `!key`, `key=value`, `key!=value`) and `fieldSelector`
//!   (`metadata.name=...`).
//!
//! The scenario API changes objects ([`FakeApiServer::apply`], [`FakeApiServer::delete`]),
//! makes no-op updates that only bump `resourceVersion` ([`FakeApiServer::touch`]), drops
//! every open watch ([`FakeApiServer::disconnect`]), forgets history
//! ([`FakeApiServer::compact`]), refuses a kind with 403 ([`FakeApiServer::forbid`]),
//! answers 404 for a kind as a server without that resource does
//! ([`FakeApiServer::hide`]), and sends a raw line to the open watches of a kind
//! ([`FakeApiServer::send_raw`]). Objects are stored as given, so a test can serve a
//! malformed one. It counts list requests ([`FakeApiServer::lists`]) and open watches
//! ([`FakeApiServer::watches`]).

mod http;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::routing::get;
use serde_json::{Value, json};
use tokio::sync::{broadcast, watch};

/// The kinds the server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// v1 Service.
    Services,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlices,
    /// v1 Node.
    Nodes,
    /// networking.k8s.io/v1 ServiceCIDR.
    ServiceCidrs,
}

impl Resource {
    /// The resource of an object, from its `kind`.
    pub fn of(object: &Value) -> Option<Resource> {
        match object.get("kind")?.as_str()? {
            "Service" => Some(Resource::Services),
            "EndpointSlice" => Some(Resource::EndpointSlices),
            "Node" => Some(Resource::Nodes),
            "ServiceCIDR" => Some(Resource::ServiceCidrs),
            _ => None,
        }
    }

    fn list_kind(self) -> (&'static str, &'static str) {
        match self {
            Resource::Services => ("v1", "ServiceList"),
            Resource::EndpointSlices => ("discovery.k8s.io/v1", "EndpointSliceList"),
            Resource::Nodes => ("v1", "NodeList"),
            Resource::ServiceCidrs => ("networking.k8s.io/v1", "ServiceCIDRList"),
        }
    }
}

type ObjectKey = (Resource, String, String);

/// An object as stored: its value (for selectors) and its JSON text, what is served (kept
/// from the change, as the real server's watch cache keeps encoded objects).
#[derive(Debug)]
struct Stored {
    value: Value,
    text: String,
}

impl Stored {
    fn new(value: Value) -> Arc<Stored> {
        let text = value.to_string();
        Arc::new(Stored { value, text })
    }
}

#[derive(Debug)]
struct Event {
    revision: u64,
    resource: Resource,
    kind: &'static str,
    object: Arc<Stored>,
    /// A line sent as is to the open watches of `resource` (not recorded in history).
    raw: Option<String>,
}

#[derive(Debug, Default)]
struct Inner {
    revision: u64,
    objects: BTreeMap<ObjectKey, Arc<Stored>>,
    history: VecDeque<Arc<Event>>,
    /// Watches from a version older than this get 410 Gone.
    oldest: u64,
    /// Kinds whose lists and watches are answered 403 Forbidden, as without RBAC.
    forbidden: BTreeSet<Resource>,
    /// Kinds answered 404 Not Found, as by a server that does not serve them.
    hidden: BTreeSet<Resource>,
    /// Whether ServiceCIDRs are served as networking.k8s.io/v1beta1 too.
    beta_service_cidrs: bool,
    /// List requests answered (pages included), by kind.
    lists: BTreeMap<Resource, u64>,
    /// Watch streams open now, by kind.
    watches: BTreeMap<Resource, usize>,
}

struct Shared {
    inner: Mutex<Inner>,
    events: broadcast::Sender<Arc<Event>>,
    disconnects: watch::Sender<u64>,
    bookmark_every: Duration,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A running fake API server on a loopback port; stops when dropped.
pub struct FakeApiServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeApiServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn key_of(object: &Value) -> Option<ObjectKey> {
    let resource = Resource::of(object)?;
    let meta = object.get("metadata")?;
    let name = meta.get("name")?.as_str()?.to_string();
    let namespace = meta.get("namespace").and_then(Value::as_str).unwrap_or_default().to_string();
    Some((resource, namespace, name))
}

impl FakeApiServer {
    /// Starts a server on 127.0.0.1 with no objects, sending bookmarks every `bookmark_every`
    /// to watches that asked for them.
    pub async fn start(bookmark_every: Duration) -> std::io::Result<FakeApiServer> {
        Self::start_on(0, bookmark_every).await
    }

    /// Like [`FakeApiServer::start`], on a given port (0: any).
    pub async fn start_on(port: u16, bookmark_every: Duration) -> std::io::Result<FakeApiServer> {
        let (events, _) = broadcast::channel(4096);
        let (disconnects, _) = watch::channel(0);
        let shared = Arc::new(Shared {
            inner: Mutex::new(Inner::default()),
            events,
            disconnects,
            bookmark_every,
        });
        let app = Router::new()
            .route("/api/v1/services", get(http::services))
            .route("/apis/discovery.k8s.io/v1/endpointslices", get(http::slices))
            .route("/api/v1/nodes", get(http::nodes))
            .route("/apis/networking.k8s.io/v1/servicecidrs", get(http::service_cidrs))
            .route("/apis/networking.k8s.io/v1beta1/servicecidrs", get(http::service_cidrs_v1beta1))
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        let addr = listener.local_addr()?;
        // Like the real API server: watch events leave at once, not after the client's
        // delayed acknowledgement of the previous write (Nagle's algorithm).
        let listener = axum::serve::ListenerExt::tap_io(listener, |tcp| {
            let _ = tcp.set_nodelay(true);
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(FakeApiServer { addr, shared, task })
    }

    /// The server's URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The current resource version.
    pub fn revision(&self) -> u64 {
        self.shared.lock().revision
    }

    fn record(&self, resource: Resource, kind: &'static str, mut object: Value) -> u64 {
        let mut inner = self.shared.lock();
        inner.revision += 1;
        let revision = inner.revision;
        if let Some(meta) = object.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.insert("resourceVersion".into(), json!(revision.to_string()));
        }
        let key = key_of(&object);
        let object = Stored::new(object);
        if let Some(key) = key {
            match kind {
                "DELETED" => inner.objects.remove(&key),
                _ => inner.objects.insert(key, object.clone()),
            };
        }
        let event = Arc::new(Event { revision, resource, kind, object, raw: None });
        inner.history.push_back(event.clone());
        let _ = self.shared.events.send(event);
        revision
    }

    /// Creates or replaces an object (any JSON with `kind` and `metadata.name`, valid or
    /// not). Returns its new resource version.
    pub fn apply(&self, object: Value) -> u64 {
        let Some(key) = key_of(&object) else {
            panic!("objects need kind and metadata.name: {object}")
        };
        let exists = self.shared.lock().objects.contains_key(&key);
        self.record(key.0, if exists { "MODIFIED" } else { "ADDED" }, object)
    }

    /// The stored object, as served.
    pub fn get(&self, resource: Resource, namespace: &str, name: &str) -> Option<Value> {
        self.shared
            .lock()
            .objects
            .get(&(resource, namespace.to_string(), name.to_string()))
            .map(|stored| stored.value.clone())
    }

    /// Deletes an object. Returns the new resource version, or `None` if there was none.
    pub fn delete(&self, resource: Resource, namespace: &str, name: &str) -> Option<u64> {
        let object = self.get(resource, namespace, name)?;
        Some(self.record(resource, "DELETED", object))
    }

    /// A no-op update: the object is sent again with only a new resource version.
    pub fn touch(&self, resource: Resource, namespace: &str, name: &str) -> Option<u64> {
        let object = self.get(resource, namespace, name)?;
        Some(self.record(resource, "MODIFIED", object))
    }

    /// Ends every open watch stream.
    pub fn disconnect(&self) {
        self.shared.disconnects.send_modify(|n| *n += 1);
    }

    /// Answers lists and watches of `resource` with 403 Forbidden (as a cluster without the
    /// RBAC grant does) while `forbidden` is true.
    pub fn forbid(&self, resource: Resource, forbidden: bool) {
        let mut inner = self.shared.lock();
        if forbidden {
            inner.forbidden.insert(resource);
        } else {
            inner.forbidden.remove(&resource);
        }
    }

    /// Answers lists and watches of `resource` with 404 Not Found (as a server that does not
    /// serve the resource does) while `hidden` is true.
    pub fn hide(&self, resource: Resource, hidden: bool) {
        let mut inner = self.shared.lock();
        if hidden {
            inner.hidden.insert(resource);
        } else {
            inner.hidden.remove(&resource);
        }
    }

    /// Serves ServiceCIDRs as networking.k8s.io/v1beta1 too (the same objects) while `served`
    /// is true, whether v1 is hidden or not, as a server of Kubernetes 1.31 and 1.32 does.
    pub fn serve_service_cidrs_v1beta1(&self, served: bool) {
        self.shared.lock().beta_service_cidrs = served;
    }

    /// Sends `line` as is (plus a newline) to every open watch of `resource`: a malformed
    /// watch event. It is not recorded: a later watch does not see it.
    pub fn send_raw(&self, resource: Resource, line: &str) {
        let revision = self.shared.lock().revision;
        let event = Event {
            revision,
            resource,
            kind: "RAW",
            object: Stored::new(Value::Null),
            raw: Some(line.to_string()),
        };
        let _ = self.shared.events.send(Arc::new(event));
    }

    /// The list requests (each page counts) answered for `resource` so far.
    pub fn lists(&self, resource: Resource) -> u64 {
        self.shared.lock().lists.get(&resource).copied().unwrap_or(0)
    }

    /// The watch streams of `resource` open now.
    pub fn watches(&self, resource: Resource) -> usize {
        self.shared.lock().watches.get(&resource).copied().unwrap_or(0)
    }

    /// Waits (at most `timeout`) until a watch of `resource` is open; false if none came.
    pub async fn wait_for_watch(&self, resource: Resource, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while self.watches(resource) == 0 {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        true
    }

    /// Forgets the event history: watches from any older version get 410 Gone.
    pub fn compact(&self) {
        let mut inner = self.shared.lock();
        inner.history.clear();
        inner.oldest = inner.revision;
    }
}
