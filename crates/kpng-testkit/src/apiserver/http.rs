//! The HTTP side of the fake API server: lists (with pages and selectors) and watch
//! streams.

use std::convert::Infallible;
use std::ops::Bound;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use super::{Event, ObjectKey, Resource, Shared, Stored};

/// The query of a list or watch request.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct Params {
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

pub(super) async fn services(
    State(shared): State<Arc<Shared>>,
    Query(params): Query<Params>,
) -> Response {
    serve(shared, Resource::Services, params)
}

pub(super) async fn slices(
    State(shared): State<Arc<Shared>>,
    Query(params): Query<Params>,
) -> Response {
    serve(shared, Resource::EndpointSlices, params)
}

pub(super) async fn nodes(
    State(shared): State<Arc<Shared>>,
    Query(params): Query<Params>,
) -> Response {
    serve(shared, Resource::Nodes, params)
}

pub(super) async fn service_cidrs(
    State(shared): State<Arc<Shared>>,
    Query(params): Query<Params>,
) -> Response {
    serve(shared, Resource::ServiceCidrs, params)
}

/// ServiceCIDRs as networking.k8s.io/v1beta1: the same objects, when served.
pub(super) async fn service_cidrs_v1beta1(
    State(shared): State<Arc<Shared>>,
    Query(params): Query<Params>,
) -> Response {
    if !shared.lock().beta_service_cidrs {
        let message = "the server could not find the requested resource".to_string();
        return status(StatusCode::NOT_FOUND, "NotFound", message);
    }
    respond(shared, Resource::ServiceCidrs, params)
}

/// A `Status` error answer.
fn status(code: StatusCode, reason: &str, message: String) -> Response {
    let status = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16(),
    });
    (code, [(header::CONTENT_TYPE, "application/json")], status.to_string()).into_response()
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
    let (_, kind) = resource.list_kind();
    if shared.lock().forbidden.contains(&resource) {
        let message = format!("{kind} is forbidden: the fake server refuses it");
        return status(StatusCode::FORBIDDEN, "Forbidden", message);
    }
    if shared.lock().hidden.contains(&resource) {
        let message = "the server could not find the requested resource".to_string();
        return status(StatusCode::NOT_FOUND, "NotFound", message);
    }
    respond(shared, resource, params)
}

/// A list or a watch stream.
fn respond(shared: Arc<Shared>, resource: Resource, params: Params) -> Response {
    if params.watch.as_deref().is_some_and(|w| w == "true" || w == "1") {
        return watch_stream(shared, resource, params);
    }
    list(&shared, resource, &params)
}

/// A list page.
fn list(shared: &Shared, resource: Resource, params: &Params) -> Response {
    let mut inner = shared.lock();
    *inner.lists.entry(resource).or_default() += 1;
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
        // As after an etcd compaction, a token older than the history expires.
        Some(Some((rv, _))) if rv < inner.oldest => {
            let message = "The provided continue parameter is too old".to_string();
            return status(StatusCode::GONE, "Expired", message);
        }
        Some(Some((rv, last))) => (rv, Bound::Excluded(last)),
        Some(None) => return (StatusCode::BAD_REQUEST, "malformed continue token").into_response(),
    };
    let limit = params.limit.filter(|l| *l > 0).unwrap_or(usize::MAX);
    let mut matching = inner
        .objects
        .range((from, Bound::Unbounded))
        .take_while(|((r, _, _), _)| *r == resource)
        .filter(|(_, object)| selected(&object.value, params));
    let page: Vec<(&ObjectKey, &Arc<Stored>)> = matching.by_ref().take(limit).collect();
    let more = matching.next().is_some();
    let last = page.last().map(|((_, namespace, name), _)| format!("{namespace}/{name}"));
    let items: Vec<Arc<Stored>> = page.into_iter().map(|(_, o)| o.clone()).collect();
    drop(inner);
    let (api_version, kind) = resource.list_kind();
    let mut metadata = json!({ "resourceVersion": revision.to_string() });
    if let Some(last) = last.filter(|_| more) {
        metadata["continue"] = json!(format!("{revision}:{last}"));
    }
    // The stored texts, joined: a page costs a copy, not an encoding.
    let mut body = format!(
        "{{\"apiVersion\":\"{api_version}\",\"kind\":\"{kind}\",\"metadata\":{metadata},\"items\":["
    );
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            body.push(',');
        }
        body.push_str(&item.text);
    }
    body.push_str("]}");
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

fn line(kind: &str, object: &Stored) -> Bytes {
    Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":{}}}\n", object.text))
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
    let open = OpenWatch::new(&shared, resource);
    let bookmarks = params.allow_watch_bookmarks.unwrap_or(false);
    let timeout = Duration::from_secs(params.timeout_seconds.unwrap_or(3600));
    let (api_version, _) = resource.list_kind();
    tokio::spawn(async move {
        let _open = open;
        if gone {
            let status = json!({ "kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "Expired", "code": 410,
                "message": format!("too old resource version: {since}") });
            let _ = tx.send(line("ERROR", &Stored::new(status))).await;
            return;
        }
        let mut last = since;
        for event in
            replay.iter().filter(|e| e.resource == resource && selected(&e.object.value, &params))
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
                // A disconnection ends the stream before any event that came after it.
                biased;
                _ = disconnects.changed() => return,
                event = events.recv() => match event {
                    Ok(event) if event.resource == resource && event.raw.is_some() => {
                        let raw = format!("{}\n", event.raw.as_deref().unwrap_or_default());
                        if tx.send(Bytes::from(raw)).await.is_err() { return; }
                    }
                    Ok(event) if event.revision > last && event.resource == resource && selected(&event.object.value, &params) => {
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
                    if tx.send(line("BOOKMARK", &Stored::new(mark))).await.is_err() { return; }
                }
                () = &mut deadline => return,
            }
        }
    });
    let stream =
        futures::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|b| b.map(Ok::<_, Infallible>)));
    (StatusCode::OK, [(header::CONTENT_TYPE, "application/json")], Body::from_stream(stream))
        .into_response()
}

/// Counts a watch stream as open while it lives.
struct OpenWatch {
    shared: Arc<Shared>,
    resource: Resource,
}

impl OpenWatch {
    fn new(shared: &Arc<Shared>, resource: Resource) -> OpenWatch {
        *shared.lock().watches.entry(resource).or_default() += 1;
        OpenWatch { shared: shared.clone(), resource }
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        if let Some(n) = self.shared.lock().watches.get_mut(&self.resource) {
            *n = n.saturating_sub(1);
        }
    }
}
