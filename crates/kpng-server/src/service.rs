//! The gRPC services `/localv1.Sets/Watch` and `/globalv1.Sets/Watch`, and the [`Hub`]
//! they share.
//!
//! They are written against tonic's server machinery directly (not generated) so that
//! answers are [`Frame`](crate::frame::Frame)s, encoded once for every client; the paths,
//! messages and framing are those of the generated services.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};

use kpng_api::{globalv1, localv1};
use kpng_store::StoreReader;
use tonic::body::Body;
use tonic::server::NamedService;
use tonic::{Request, Response, Status, Streaming};

use crate::answer::{Answers, Progress};
use crate::connection;
use crate::counters::{Connected, ServerStats};
use crate::feed::Feed;
use crate::frame::FrameCodec;
use crate::global::{GlobalContent, follow};
use crate::nodes::{NodeContent, NodeRegistry, fan_out};

/// What the services share: the store and the live feeds.
pub struct Hub {
    reader: StoreReader,
    nodes: Arc<NodeRegistry>,
    global: Mutex<Weak<Feed<GlobalContent>>>,
    stats: Arc<ServerStats>,
}

impl Hub {
    /// A hub serving from `reader`. Its node streams are kept current by
    /// [`serve`](crate::serve), which runs the fan-out while it serves.
    pub fn new(reader: StoreReader) -> Arc<Self> {
        Arc::new(Hub {
            reader,
            nodes: Arc::default(),
            global: Mutex::new(Weak::new()),
            stats: Arc::default(),
        })
    }

    /// The server's counters.
    pub fn stats(&self) -> Arc<ServerStats> {
        self.stats.clone()
    }

    /// Distinct nodes whose state is kept for connected clients.
    pub fn nodes(&self) -> usize {
        self.nodes.nodes()
    }

    /// Keeps every node stream current until the store closes.
    pub(crate) fn fan_out(&self) -> impl Future<Output = ()> + Send + 'static {
        fan_out(self.reader.clone(), self.nodes.clone())
    }

    fn global_feed(&self) -> Arc<Feed<GlobalContent>> {
        let mut global = self.global.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(feed) = global.upgrade() {
            return feed;
        }
        let feed = Feed::new(GlobalContent::default());
        // Follows the store while some client holds the feed.
        tokio::spawn(follow(Arc::downgrade(&feed), self.reader.clone()));
        *global = Arc::downgrade(&feed);
        feed
    }

    /// The `/localv1.Sets/Watch` service.
    pub fn local_service(self: &Arc<Self>) -> LocalSets {
        LocalSets(self.clone())
    }

    /// The `/globalv1.Sets/Watch` service.
    pub fn global_service(self: &Arc<Self>) -> GlobalSets {
        GlobalSets(self.clone())
    }

    async fn watch_node(
        self: Arc<Self>,
        request: Request<Streaming<localv1::WatchReq>>,
    ) -> Result<Response<Answers<NodeContent, localv1::WatchReq>>, Status> {
        let connection = connection::of_request(&request);
        let mut requests = request.into_inner();
        let first = requests
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("no WatchReq before the stream ended"))?;
        if first.node_name.is_empty() {
            return Err(Status::invalid_argument("WatchReq.node_name is empty"));
        }
        tracing::debug!(node = %first.node_name, "node stream opened");
        let progress = track(connection);
        let feed = self.nodes.feed(&first.node_name);
        let client = Connected::new(&self.stats);
        Ok(Response::new(Answers::new(feed, requests, first.with_node, progress, client)))
    }

    async fn watch_global(
        self: Arc<Self>,
        request: Request<Streaming<globalv1::GlobalWatchReq>>,
    ) -> Result<Response<Answers<GlobalContent, globalv1::GlobalWatchReq>>, Status> {
        let connection = connection::of_request(&request);
        let mut requests = request.into_inner();
        requests
            .message()
            .await?
            .ok_or_else(|| Status::invalid_argument("no GlobalWatchReq before the stream ended"))?;
        let progress = track(connection);
        let feed = self.global_feed();
        let client = Connected::new(&self.stats);
        Ok(Response::new(Answers::new(feed, requests, true, progress, client)))
    }
}

/// The progress of a new stream, followed by its connection's watchdog when it has one.
/// Until its first request, a stream does not count: a connection whose streams never ask
/// is idle.
fn track(connection: Option<connection::Connection>) -> Arc<Progress> {
    match connection {
        Some(connection) => connection.track(),
        None => Arc::default(),
    }
}

type BoxFuture = Pin<Box<dyn Future<Output = Result<http::Response<Body>, Infallible>> + Send>>;

/// The answer to a path this service does not have.
fn unimplemented() -> http::Response<Body> {
    let mut response = http::Response::new(Body::default());
    let headers = response.headers_mut();
    headers.insert(Status::GRPC_STATUS, (tonic::Code::Unimplemented as i32).into());
    headers.insert(http::header::CONTENT_TYPE, tonic::metadata::GRPC_CONTENT_TYPE);
    response
}

/// `/localv1.Sets/Watch`.
#[derive(Clone)]
pub struct LocalSets(Arc<Hub>);

impl NamedService for LocalSets {
    const NAME: &'static str = "localv1.Sets";
}

impl tower::Service<http::Request<Body>> for LocalSets {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> BoxFuture {
        let hub = self.0.clone();
        Box::pin(async move {
            if request.uri().path() != "/localv1.Sets/Watch" {
                return Ok(unimplemented());
            }
            let method = tower::service_fn(move |r| hub.clone().watch_node(r));
            let mut grpc = tonic::server::Grpc::new(FrameCodec::<localv1::WatchReq>::default());
            Ok(grpc.streaming(method, request).await)
        })
    }
}

/// `/globalv1.Sets/Watch`.
#[derive(Clone)]
pub struct GlobalSets(Arc<Hub>);

impl NamedService for GlobalSets {
    const NAME: &'static str = "globalv1.Sets";
}

impl tower::Service<http::Request<Body>> for GlobalSets {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<Body>) -> BoxFuture {
        let hub = self.0.clone();
        Box::pin(async move {
            if request.uri().path() != "/globalv1.Sets/Watch" {
                return Ok(unimplemented());
            }
            let method = tower::service_fn(move |r| hub.clone().watch_global(r));
            let codec = FrameCodec::<globalv1::GlobalWatchReq>::default();
            Ok(tonic::server::Grpc::new(codec).streaming(method, request).await)
        })
    }
}
