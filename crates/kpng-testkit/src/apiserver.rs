//! A fake Kubernetes API server: real HTTP list and watch for Services, EndpointSlices and
//! Nodes, driven by a scenario API, for tests and benchmarks of the kube source.
//!
//! What it serves, as the real API server does:
//! - `GET /api/v1/services`, `/apis/discovery.k8s.io/v1/endpointslices`, `/api/v1/nodes`:
//!   a list (`kind: ServiceList`...) with the current `resourceVersion`;
//! - the same with `watch=true`: a chunked stream of newline-separated events (`ADDED`,
//!   `MODIFIED`, `DELETED`, and `BOOKMARK` when `allowWatchBookmarks=true`) after the given
//!   `resourceVersion`; a version older than the retained history gets a `410 Gone` `ERROR`
//!   event, as after an etcd compaction;
//! - `limit` and `continue` for lists in pages (later pages show the objects as they are
//!   then, where the real server keeps the first page's snapshot);
//! - `labelSelector` (`key`, `!key`, `key=value`, `key!=value`) and `fieldSelector`
//!   (`metadata.name=...`).
//!
//! The scenario API changes objects ([`FakeApiServer::apply`], [`FakeApiServer::delete`]),
//! makes no-op updates that only bump `resourceVersion` ([`FakeApiServer::touch`]), drops
//! every open watch ([`FakeApiServer::disconnect`]), forgets history
//! ([`FakeApiServer::compact`]) and refuses a kind with 403 ([`FakeApiServer::forbid`]).
//! Objects are stored as given, so a test can serve a malformed one.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::convert::Infallible;
use std::net::SocketAddr;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::{broadcast, mpsc, watch};

/// The kinds the server serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Resource {
    /// v1 Service.
    Services,
    /// discovery.k8s.io/v1 EndpointSlice.
    EndpointSlices,
    /// v1 Node.
    Nodes,
}

impl Resource {
    /// The resource of an object, from its `kind`.
    pub fn of(object: &Value) -> Option<Resource> {
        match object.get("kind")?.as_str()? {
            "Service" => Some(Resource::Services),
            "EndpointSlice" => Some(Resource::EndpointSlices),
            "Node" => Some(Resource::Nodes),
            _ => None,
        }
    }

    fn list_kind(self) -> (&'static str, &'static str) {
        match self {
            Resource::Services => ("v1", "ServiceList"),
            Resource::EndpointSlices => ("discovery.k8s.io/v1", "EndpointSliceList"),
            Resource::Nodes => ("v1", "NodeList"),
        }
    }
}

type ObjectKey = (Resource, String, String);

#[derive(Debug)]
struct Event {
    revision: u64,
    resource: Resource,
    kind: &'static str,
    object: Value,
}

#[derive(Debug, Default)]
struct Inner {
    revision: u64,
    objects: BTreeMap<ObjectKey, Value>,
    history: VecDeque<Arc<Event>>,
    /// Watches from a version older than this get 410 Gone.
    oldest: u64,
    /// Kinds whose lists and watches are answered 403 Forbidden, as without RBAC.
    forbidden: BTreeSet<Resource>,
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
            .route("/api/v1/services", get(services))
            .route("/apis/discovery.k8s.io/v1/endpointslices", get(slices))
            .route("/api/v1/nodes", get(nodes))
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
        if let Some(key) = key_of(&object) {
            match kind {
                "DELETED" => inner.objects.remove(&key),
                _ => inner.objects.insert(key, object.clone()),
            };
        }
        let event = Arc::new(Event { revision, resource, kind, object });
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
            .cloned()
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

    /// Forgets the event history: watches from any older version get 410 Gone.
    pub fn compact(&self) {
        let mut inner = self.shared.lock();
        inner.history.clear();
        inner.oldest = inner.revision;
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Params {
    watch: Option<String>,
    resource_version: Option<String>,
    label_selector: Option<String>,
    field_selector: Option<String>,
    allow_watch_bookmarks: Option<bool>,
    timeout_seconds: Option<u64>,
    limit: Option<usize>,
    #[serde(rename = "continue")]
    continue_token: Option<String>,
}

async fn services(State(shared): State<Arc<Shared>>, Query(params): Query<Params>) -> Response {
    serve(shared, Resource::Services, params)
}

async fn slices(State(shared): State<Arc<Shared>>, Query(params): Query<Params>) -> Response {
    serve(shared, Resource::EndpointSlices, params)
}

async fn nodes(State(shared): State<Arc<Shared>>, Query(params): Query<Params>) -> Response {
    serve(shared, Resource::Nodes, params)
}

/// Whether `object` satisfies the label and field selectors.
fn selected(object: &Value, params: &Params) -> bool {
    let labels = object.pointer("/metadata/labels").and_then(Value::as_object);
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    let labels_ok = params
        .label_selector
        .iter()
        .flat_map(|s| s.split(','))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .all(|term| {
            if let Some(key) = term.strip_prefix('!') {
                label(key).is_none()
            } else if let Some((k, v)) = term.split_once("!=") {
                label(k) != Some(v)
            } else if let Some((k, v)) = term.split_once("==").or_else(|| term.split_once('=')) {
                label(k) == Some(v)
            } else {
                label(term).is_some()
            }
        });
    let name = object.pointer("/metadata/name").and_then(Value::as_str);
    let fields_ok = params.field_selector.iter().flat_map(|s| s.split(',')).all(|term| match term
        .split_once('=')
    {
        Some(("metadata.name", v)) => name == Some(v.trim_start_matches('=')),
        _ => true,
    });
    labels_ok && fields_ok
}

fn serve(shared: Arc<Shared>, resource: Resource, params: Params) -> Response {
    if shared.lock().forbidden.contains(&resource) {
        let (_, kind) = resource.list_kind();
        let status = json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": format!("{kind} is forbidden: the fake server refuses it"),
            "reason": "Forbidden", "code": 403,
        });
        return (
            StatusCode::FORBIDDEN,
            [(header::CONTENT_TYPE, "application/json")],
            status.to_string(),
        )
            .into_response();
    }
    if params.watch.as_deref().is_some_and(|w| w == "true" || w == "1") {
        return watch_stream(shared, resource, params);
    }
    let inner = shared.lock();
    // A continue token is "<list resourceVersion>:<namespace>/<name>" of the last object
    // sent; later pages show the objects after it as they are now, not as they were at the
    // first page. Each page starts where the last ended: listing is linear in its size.
    let token = params.continue_token.as_deref().map(|t| {
        let (rv, last) = t.split_once(':')?;
        let (namespace, name) = last.split_once('/')?;
        Some((rv.parse::<u64>().ok()?, (resource, namespace.to_string(), name.to_string())))
    });
    let (revision, from) = match token {
        None => (inner.revision, Bound::Included((resource, String::new(), String::new()))),
        Some(Some((rv, last))) => (rv, Bound::Excluded(last)),
        Some(None) => return (StatusCode::BAD_REQUEST, "malformed continue token").into_response(),
    };
    let limit = params.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
    let mut matching = inner
        .objects
        .range((from, Bound::Unbounded))
        .take_while(|((r, _, _), _)| *r == resource)
        .filter(|(_, object)| selected(object, &params));
    let page: Vec<(&ObjectKey, &Value)> = matching.by_ref().take(limit).collect();
    let more = matching.next().is_some();
    let last = page.last().map(|((_, namespace, name), _)| format!("{namespace}/{name}"));
    let items: Vec<Value> = page.into_iter().map(|(_, o)| o.clone()).collect();
    let (api_version, kind) = resource.list_kind();
    let mut metadata = json!({ "resourceVersion": revision.to_string() });
    if let Some(last) = last.filter(|_| more) {
        metadata["continue"] = json!(format!("{revision}:{last}"));
    }
    let body = json!({
        "apiVersion": api_version,
        "kind": kind,
        "metadata": metadata,
        "items": items,
    });
    ([(header::CONTENT_TYPE, "application/json")], body.to_string()).into_response()
}

fn line(kind: &str, object: &Value) -> Bytes {
    Bytes::from(format!("{}\n", json!({ "type": kind, "object": object })))
}

fn watch_stream(shared: Arc<Shared>, resource: Resource, params: Params) -> Response {
    let since: u64 = params.resource_version.as_deref().and_then(|v| v.parse().ok()).unwrap_or(0);
    let mut events = shared.events.subscribe();
    let mut disconnects = shared.disconnects.subscribe();
    let (replay, gone) = {
        let inner = shared.lock();
        let replay: Vec<Arc<Event>> =
            inner.history.iter().filter(|e| e.revision > since).cloned().collect();
        (replay, since < inner.oldest)
    };
    let (tx, mut rx) = mpsc::channel::<Bytes>(64);
    let bookmarks = params.allow_watch_bookmarks.unwrap_or(false);
    let timeout = Duration::from_secs(params.timeout_seconds.unwrap_or(3600));
    let (api_version, _) = resource.list_kind();
    tokio::spawn(async move {
        if gone {
            let status = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
                "message": format!("too old resource version: {since}") });
            let _ = tx.send(line("ERROR", &status)).await;
            return;
        }
        let mut last = since;
        for event in
            replay.iter().filter(|e| e.resource == resource && selected(&e.object, &params))
        {
            last = event.revision;
            if tx.send(line(event.kind, &event.object)).await.is_err() {
                return;
            }
        }
        let deadline = tokio::time::sleep(timeout);
        tokio::pin!(deadline);
        let mut ticks = tokio::time::interval(shared.bookmark_every);
        loop {
            tokio::select! {
                event = events.recv() => match event {
                    Ok(event) if event.revision > last && event.resource == resource && selected(&event.object, &params) => {
                        last = event.revision;
                        if tx.send(line(event.kind, &event.object)).await.is_err() { return; }
                    }
                    Ok(_) => {}
                    Err(_) => return,
                },
                _ = ticks.tick(), if bookmarks => {
                    let revision = shared.lock().revision;
                    let kind = resource.list_kind().1.trim_end_matches("List");
                    let mark = json!({ "kind": kind, "apiVersion": api_version, "metadata": { "resourceVersion": revision.to_string() } });
                    if tx.send(line("BOOKMARK", &mark)).await.is_err() { return; }
                }
                _ = disconnects.changed() => return,
                () = &mut deadline => return,
            }
        }
    });
    let stream =
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(Ok::<_, Infallible>)));
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], Body::from_stream(stream))
        .into_response()
}
