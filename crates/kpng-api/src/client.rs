//! The client end: connecting to a `to-api` server and pulling change sets. The node
//! follower ([`follow_node`]) reconnects with [`Backoff`]; under [`Retry::UntilPermanent`]
//! (`--once`) it gives up on an error that retrying cannot mend and returns it. (The
//! global stream's follower, which writes a store, is the api source in `kpng-sources`.)

use std::time::Duration;

use kpng_model::Op;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint, Uri};

use crate::addr::{Address, Security, SecurityError, tls_material};
use crate::localv1::{self, op_item};
use crate::peer::{Allowed, Credentials};
use crate::{WireError, globalv1, local};

/// Why a connection or a stream failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Refused before connecting (plaintext off the machine, unusable TLS files).
    #[error(transparent)]
    Security(#[from] SecurityError),
    /// The connection failed. The message carries the failure's causes (tonic's own says
    /// only "transport error").
    #[error("connecting to {address}: {}", chain(.error))]
    Connect {
        /// The server.
        address: Address,
        /// The failure.
        error: tonic::transport::Error,
    },
    /// The server refused or ended the stream with an error (its code and message; the
    /// transport error behind it, if any, is in the message).
    #[error("the server answered {:?}: {}", .0.code(), .0.message())]
    Status(tonic::Status),
    /// The server sent something that is not a valid object.
    #[error("server sent an invalid op: {0}")]
    Wire(#[from] WireError),
}

impl ClientError {
    /// Whether retrying cannot help: the security settings refuse the address, the socket
    /// or its directory may not be used (permission denied, not a directory), the TLS
    /// handshake refused a certificate, the server lacks the service or refused the
    /// request, or it sent something invalid. An unreachable or restarting server is not
    /// permanent.
    pub fn is_permanent(&self) -> bool {
        match self {
            ClientError::Security(_) | ClientError::Wire(_) => true,
            ClientError::Connect { error, .. } => io_kinds(error).any(|kind| {
                use std::io::ErrorKind::*;
                matches!(kind, PermissionDenied | NotADirectory | InvalidData | InvalidInput)
            }),
            ClientError::Status(status) => {
                use tonic::Code::*;
                let refused = matches!(
                    status.code(),
                    Unimplemented | PermissionDenied | Unauthenticated | InvalidArgument
                );
                refused || io_kinds(status).any(|kind| kind == std::io::ErrorKind::PermissionDenied)
            }
        }
    }
}

impl From<tonic::Status> for ClientError {
    fn from(status: tonic::Status) -> Self {
        ClientError::Status(status)
    }
}

/// The kinds of the I/O errors among `error`'s sources.
fn io_kinds<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> impl Iterator<Item = std::io::ErrorKind> + 'a {
    std::iter::successors(Some(error), |e| e.source())
        .filter_map(|e| e.downcast_ref::<std::io::Error>().map(std::io::Error::kind))
}

/// What a follower does when a stream fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retry {
    /// Retry every failure, with backoff (a long-running process).
    Always,
    /// Retry until a failure is permanent ([`ClientError::is_permanent`]), then return it
    /// (`--once`: an error that will not go away is an exit, not a wait).
    UntilPermanent,
}

/// A channel to the `to-api` server at `address`. Certificate and key problems are reported
/// here, before any connection is tried.
pub async fn connect(address: &Address, security: &Security) -> Result<Channel, ClientError> {
    security.check(address)?;
    let failed = |error| ClientError::Connect { address: address.clone(), error };
    match address {
        Address::Unix(path) => {
            let path = path.clone();
            let allowed = security.allowed.clone();
            let connector = tower::service_fn(move |_: Uri| {
                let (path, allowed) = (path.clone(), allowed.clone());
                async move {
                    let stream = tokio::net::UnixStream::connect(&path).await?;
                    trust_server(&stream, &path, &allowed)?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            });
            // The URI is not used by the connector; it only has to be valid.
            Endpoint::from_static("http://kpng.local")
                .connect_with_connector(connector)
                .await
                .map_err(failed)
        }
        Address::Tcp { host, port } => {
            let authority = if host.contains(':') {
                format!("[{host}]:{port}")
            } else {
                format!("{host}:{port}")
            };
            let scheme = if security.tls.is_some() { "https" } else { "http" };
            let mut endpoint = Endpoint::from_shared(format!("{scheme}://{authority}"))
                .map_err(failed)?
                .connect_timeout(Duration::from_secs(5));
            if let Some(files) = &security.tls {
                let (identity, ca) = tls_material(files)?;
                let config = ClientTlsConfig::new()
                    .ca_certificate(ca)
                    .identity(identity)
                    .domain_name(host.clone());
                endpoint = endpoint.tls_config(config).map_err(|e| SecurityError::File {
                    what: "TLS configuration",
                    path: files.cert.clone(),
                    message: e.to_string(),
                })?;
            }
            endpoint.connect().await.map_err(failed)
        }
    }
}

/// Checks who listens at `path` before anything it says is used: the kernel gives, on our
/// connected socket, the credentials of whoever bound the listener, which must be root,
/// this process's user or an allowed user. Anyone else (a user who bound the path while
/// the real server was down) is refused with `PermissionDenied`, which retrying cannot
/// mend.
fn trust_server(
    stream: &tokio::net::UnixStream,
    path: &std::path::Path,
    allowed: &Allowed,
) -> std::io::Result<()> {
    let server = Credentials::of(stream)?;
    if allowed.trusts_uid(server.uid) {
        return Ok(());
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        format!(
            "refusing the server at {}: it runs as {server}, and only {} are trusted \
             (--allow-uid adds a user)",
            path.display(),
            Allowed { gids: Vec::new(), ..allowed.clone() }.describe()
        ),
    ))
}

/// A pull-based watch stream: each call to [`next_items`](Self::next_items) asks for the
/// next change set and returns its items.
struct Pull<R> {
    requests: mpsc::Sender<R>,
    request: R,
    responses: tonic::Streaming<localv1::OpItem>,
    pending: bool,
}

impl<R: Clone> Pull<R> {
    /// Hands each item of the next change set (without the closing `Sync`) to `each` as it
    /// arrives; `false` when the server ended the stream.
    async fn next_each(
        &mut self,
        mut each: impl FnMut(localv1::OpItem) -> Result<(), ClientError>,
    ) -> Result<bool, ClientError> {
        if !self.pending && self.requests.send(self.request.clone()).await.is_err() {
            return Ok(false);
        }
        self.pending = true;
        while let Some(item) = self.responses.message().await? {
            if matches!(item.op, Some(op_item::Op::Sync(_))) {
                self.pending = false;
                return Ok(true);
            }
            each(item)?;
        }
        Ok(false)
    }

    /// The items of the next change set, without the closing `Sync`; `None` when the server
    /// ended the stream.
    async fn next_items(&mut self) -> Result<Option<Vec<localv1::OpItem>>, ClientError> {
        let mut items = Vec::new();
        let more = self
            .next_each(|item| {
                items.push(item);
                Ok(())
            })
            .await?;
        Ok(more.then_some(items))
    }
}

/// A node's ENLS stream (`/localv1.Sets/Watch`).
pub struct LocalWatch(Pull<localv1::WatchReq>);

impl LocalWatch {
    /// Opens the stream of node `node`; with `with_node`, the node's own item is included.
    pub async fn start(channel: Channel, node: &str, with_node: bool) -> Result<Self, ClientError> {
        let request = localv1::WatchReq { node_name: node.to_string(), with_node };
        let (requests, rx) = mpsc::channel(1);
        requests.send(request.clone()).await.ok();
        let mut client =
            localv1::sets_client::SetsClient::new(channel).max_decoding_message_size(usize::MAX);
        let responses = client.watch(ReceiverStream::new(rx)).await?.into_inner();
        Ok(LocalWatch(Pull { requests, request, responses, pending: true }))
    }

    /// The ops of the next change set (without `Sync`; the first starts with `Reset`), or
    /// `None` when the server ended the stream.
    pub async fn next(&mut self) -> Result<Option<Vec<Op>>, ClientError> {
        // Each item is decoded as it arrives: a whole state is never held twice.
        let mut ops = Vec::new();
        let more = self
            .0
            .next_each(|item| {
                let mut op = local::decode_op(&item)?;
                local::share_with_previous(ops.last(), &mut op);
                ops.push(op);
                Ok(())
            })
            .await?;
        Ok(more.then_some(ops))
    }
}

/// The global model's stream (`/globalv1.Sets/Watch`).
pub struct GlobalWatch(Pull<globalv1::GlobalWatchReq>);

impl GlobalWatch {
    /// Opens the stream.
    pub async fn start(channel: Channel) -> Result<Self, ClientError> {
        let request = globalv1::GlobalWatchReq {};
        let (requests, rx) = mpsc::channel(1);
        requests.send(request).await.ok();
        let mut client =
            globalv1::sets_client::SetsClient::new(channel).max_decoding_message_size(usize::MAX);
        let responses = client.watch(ReceiverStream::new(rx)).await?.into_inner();
        Ok(GlobalWatch(Pull { requests, request, responses, pending: true }))
    }

    /// The items of the next change set (without `Sync`), or `None` when the stream ended.
    pub async fn next_items(&mut self) -> Result<Option<Vec<localv1::OpItem>>, ClientError> {
        self.0.next_items().await
    }
}

/// Delays between reconnections: 0.5 s doubling to 30 s, back to the start after a
/// stream that delivered something.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff(Duration);

impl Default for Backoff {
    fn default() -> Self {
        Backoff(Self::MIN)
    }
}

impl Backoff {
    const MIN: Duration = Duration::from_millis(500);
    const MAX: Duration = Duration::from_secs(30);

    /// The delay before the next attempt.
    pub fn delay(&self) -> Duration {
        self.0
    }

    /// Back to the shortest delay: the last stream delivered something.
    pub fn reset(&mut self) {
        self.0 = Self::MIN;
    }

    /// Waits the current delay, then doubles it (up to 30 s).
    pub async fn wait(&mut self) {
        tokio::time::sleep(self.0).await;
        self.0 = (self.0 * 2).min(Self::MAX);
    }
}

/// What a follower says of a failure: the first time at warning level, and again only
/// when the failure changes; while it repeats (a server refused, retried every 30 s) it is
/// logged at debug level, so a refusal is said once, clearly, instead of filling the log.
#[derive(Debug, Default)]
pub struct FailureLog {
    last: Option<String>,
}

impl FailureLog {
    /// Whether `text` should be logged as a warning: it differs from the last failure.
    pub fn is_new(&mut self, text: &str) -> bool {
        if self.last.as_deref() == Some(text) {
            return false;
        }
        self.last = Some(text.to_string());
        true
    }

    /// A stream delivered something: the next failure is news again.
    pub fn recovered(&mut self) {
        self.last = None;
    }
}

/// Follows node `node`'s stream from the server at `address`: each change set (ops without
/// `Sync`; after each (re)connection one starting with `Reset`) goes to `changes`. Returns
/// `Ok` when `changes` is closed. Failures are logged and retried with backoff, except a
/// permanent one under [`Retry::UntilPermanent`], which is returned.
pub async fn follow_node(
    address: Address,
    security: Security,
    node: String,
    changes: mpsc::Sender<Vec<Op>>,
    retry: Retry,
) -> Result<(), ClientError> {
    let mut backoff = Backoff::default();
    let mut failures = FailureLog::default();
    loop {
        let stream = async {
            let channel = connect(&address, &security).await?;
            let mut watch = LocalWatch::start(channel, &node, true).await?;
            while let Some(ops) = watch.next().await? {
                backoff.reset();
                failures.recovered();
                if changes.send(ops).await.is_err() {
                    return Ok(true);
                }
            }
            Ok::<_, ClientError>(false)
        };
        match stream.await {
            Ok(true) => return Ok(()),
            Ok(false) => {
                tracing::warn!(server = %address, retry_in = ?backoff.delay(), "the server ended the stream")
            }
            Err(error) if retry == Retry::UntilPermanent && error.is_permanent() => {
                return Err(error);
            }
            Err(error) => {
                let error = chain(&error);
                if failures.is_new(&error) {
                    tracing::warn!(server = %address, %error, retry_in = ?backoff.delay(), "node stream failed (said once while it repeats)")
                } else {
                    tracing::debug!(server = %address, %error, retry_in = ?backoff.delay(), "node stream failed again")
                }
            }
        }
        if changes.is_closed() {
            return Ok(());
        }
        backoff.wait().await;
    }
}

/// An error and its sources, joined by `: ` (a transport error alone says little; its
/// sources say which certificate was refused or which connection failed).
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        let next = e.to_string();
        if !text.ends_with(&next) {
            text.push_str(": ");
            text.push_str(&next);
        }
        source = e.source();
    }
    text
}
