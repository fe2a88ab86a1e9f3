//! The gRPC services.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};

use kpng_api::{globalv1, localv1};
use kpng_local::NodeProjector;
use kpng_store::StoreReader;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use crate::feed::{Content, Feed, GlobalContent, NodeContent};

/// Counters of a server.
#[derive(Debug, Default)]
pub struct ServerStats {
    connected: AtomicU64,
    streams: AtomicU64,
}

impl ServerStats {
    /// Clients connected now.
    pub fn connected(&self) -> u64 {
        self.connected.load(Ordering::Relaxed)
    }

    /// Streams served since start.
    pub fn streams(&self) -> u64 {
        self.streams.load(Ordering::Relaxed)
    }
}

/// What the services share: the store and the live feeds.
pub struct Hub {
    reader: StoreReader,
    nodes: Mutex<HashMap<String, Weak<Feed<NodeContent>>>>,
    global: Mutex<Weak<Feed<GlobalContent>>>,
    stats: Arc<ServerStats>,
}

impl Hub {
    /// A hub serving from `reader`.
    pub fn new(reader: StoreReader) -> Arc<Self> {
        Arc::new(Hub {
            reader,
            nodes: Mutex::new(HashMap::new()),
            global: Mutex::new(Weak::new()),
            stats: Arc::default(),
        })
    }

    /// The server's counters.
    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }

    fn node_feed(&self, node: &str) -> Arc<Feed<NodeContent>> {
        let mut nodes = self.nodes.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(feed) = nodes.get(node).and_then(Weak::upgrade) {
            return feed;
        }
        nodes.retain(|_, feed| feed.strong_count() > 0);
        let content = NodeContent(NodeProjector::new(node));
        let feed = Feed::start(content, self.reader.clone());
        nodes.insert(node.to_string(), Arc::downgrade(&feed));
        feed
    }

    fn global_feed(&self) -> Arc<Feed<GlobalContent>> {
        let mut global = self.global.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(feed) = global.upgrade() {
            return feed;
        }
        let feed = Feed::start(GlobalContent::default(), self.reader.clone());
        *global = Arc::downgrade(&feed);
        feed
    }

    /// The `/localv1.Sets/Watch` service.
    pub fn local_service(self: &Arc<Self>) -> localv1::sets_server::SetsServer<LocalSets> {
        localv1::sets_server::SetsServer::new(LocalSets(self.clone()))
            .max_encoding_message_size(usize::MAX)
    }

    /// The `/globalv1.Sets/Watch` service.
    pub fn global_service(self: &Arc<Self>) -> globalv1::sets_server::SetsServer<GlobalSets> {
        globalv1::sets_server::SetsServer::new(GlobalSets(self.clone()))
            .max_encoding_message_size(usize::MAX)
    }
}

type Items = ReceiverStream<Result<localv1::OpItem, Status>>;

/// Counts a connected client while alive.
struct Connected(Arc<ServerStats>);

impl Connected {
    fn new(stats: &Arc<ServerStats>) -> Self {
        stats.connected.fetch_add(1, Ordering::Relaxed);
        stats.streams.fetch_add(1, Ordering::Relaxed);
        Connected(stats.clone())
    }
}

impl Drop for Connected {
    fn drop(&mut self) {
        self.0.connected.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Serves one pull-based stream of `feed` until the client goes or the store closes.
async fn pull<C: Content, R>(
    feed: Arc<Feed<C>>,
    mut requests: Streaming<R>,
    out: mpsc::Sender<Result<localv1::OpItem, Status>>,
    keep: impl Fn(&localv1::OpItem) -> bool,
) {
    let mut versions = feed.subscribe();
    let mut sent: Option<u64> = None;
    loop {
        // Wait until there is something new for this client (or, first, anything at all).
        let closed = tokio::select! {
            ready = versions.wait_for(|v| v.closed || (v.number > 0 && Some(v.number) != sent)) => {
                ready.map(|v| v.closed).unwrap_or(true)
            }
            request = requests.message() => match request {
                // An early request: the client is waiting already.
                Ok(Some(_)) => continue,
                _ => return,
            },
        };
        if closed {
            let _ = out.send(Err(Status::unavailable("the server's store closed"))).await;
            return;
        }
        let (version, items) = feed.lock().since(sent);
        for item in items.into_iter().filter(|i| keep(i)) {
            if out.send(Ok(item)).await.is_err() {
                return;
            }
        }
        let sync = localv1::OpItem { op: Some(localv1::op_item::Op::Sync(localv1::EmptyOp {})) };
        if out.send(Ok(sync)).await.is_err() {
            return;
        }
        sent = Some(version);
        match requests.message().await {
            Ok(Some(_)) => {}
            _ => return,
        }
    }
}

/// `/localv1.Sets/Watch`.
pub struct LocalSets(Arc<Hub>);

#[tonic::async_trait]
impl localv1::sets_server::Sets for LocalSets {
    type WatchStream = Items;

    async fn watch(
        &self,
        request: Request<Streaming<localv1::WatchReq>>,
    ) -> Result<Response<Items>, Status> {
        let mut requests = request.into_inner();
        let first = requests
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("no WatchReq before the stream ended"))?;
        if first.node_name.is_empty() {
            return Err(Status::invalid_argument("WatchReq.node_name is empty"));
        }
        let hub = self.0.clone();
        let (out, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let _connected = Connected::new(&hub.stats);
            tracing::debug!(node = %first.node_name, "node stream opened");
            let feed = hub.node_feed(&first.node_name);
            let with_node = first.with_node;
            let keep = move |item: &localv1::OpItem| with_node || !is_node_item(item);
            pull(feed, requests, out, keep).await;
            tracing::debug!(node = %first.node_name, "node stream closed");
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

fn is_node_item(item: &localv1::OpItem) -> bool {
    use localv1::op_item::Op;
    let set = match &item.op {
        Some(Op::Set(value)) => value.r#ref.as_ref().map(|r| r.set),
        Some(Op::Delete(reference)) => Some(reference.set),
        _ => None,
    };
    set == Some(localv1::Set::NodeSet as i32)
}

/// `/globalv1.Sets/Watch`.
pub struct GlobalSets(Arc<Hub>);

#[tonic::async_trait]
impl globalv1::sets_server::Sets for GlobalSets {
    type WatchStream = Items;

    async fn watch(
        &self,
        request: Request<Streaming<globalv1::GlobalWatchReq>>,
    ) -> Result<Response<Items>, Status> {
        let mut requests = request.into_inner();
        requests
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("no GlobalWatchReq before the stream ended"))?;
        let hub = self.0.clone();
        let (out, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            let _connected = Connected::new(&hub.stats);
            let feed = hub.global_feed();
            pull(feed, requests, out, |_| true).await;
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}
