//! Listening on a Unix socket (clients admitted by their credentials, in a directory
//! nobody else can write) or TCP (mutual TLS, or plaintext when asked for), with a cap on
//! clients and a watchdog over them.

use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpng_api::addr::{Address, Security, SecurityError, tls_material};
use kpng_api::peer::{
    Allowed, Credentials, PeerIdentity, StreamInUse, StreamWatch, check_directories_above,
};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::Stream;
use tonic::service::Routes;
use tonic::transport::server::Router;
use tonic::transport::{Server, ServerTlsConfig};
use tower::layer::util::{Identity, Stack};
use tower::util::MapRequestLayer;

use crate::connection::{Admission, Connection, Guarded};
use crate::counters::ServerStats;
use crate::service::Hub;
use crate::throttle::Throttle;

/// Streams one connection may carry at once (a kpng client opens one).
const STREAMS_PER_CONNECTION: u32 = 16;

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Refused by the security rules or unusable TLS files.
    #[error(transparent)]
    Security(#[from] SecurityError),
    /// The address cannot be listened on.
    #[error("listening on {address}: {message}")]
    Listen {
        /// The address.
        address: Address,
        /// What failed.
        message: String,
    },
    /// The gRPC server failed.
    #[error("serving on {address}: {source}")]
    Serve {
        /// The address.
        address: Address,
        /// The failure.
        #[source]
        source: tonic::transport::Error,
    },
}

/// How the server bounds what its clients may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// Connections served at once; one more is closed as soon as it is accepted, and its
    /// client retries later.
    pub max_clients: usize,
    /// A connection whose client leaves an answer unread this long (it takes none of the
    /// answer's bytes), or that carries no stream this long, is closed; so is a TLS
    /// handshake that takes longer.
    pub client_timeout: Duration,
}

impl Default for ServeOptions {
    /// 1,024 clients, 30 s.
    fn default() -> Self {
        ServeOptions { max_clients: 1024, client_timeout: Duration::from_secs(30) }
    }
}

/// Serves `hub`'s streams on `address` until `shutdown` resolves, and keeps its node
/// streams current meanwhile. Logs the address it listens on (with the port chosen when 0
/// was given).
///
/// A Unix socket is refused in a directory others could write ([`check_directories_above`]);
/// it is created with the mode [`Allowed::socket_mode`] gives (0600 unless other users or
/// groups are allowed; its directory, if missing, 0755) and removed at the end; a stale
/// socket left by a previous run is replaced, one still in use is an error. A client whose
/// credentials [`Allowed::admits`] refuses is answered `PERMISSION_DENIED` to whatever it
/// asks, and logged.
pub async fn serve(
    hub: Arc<Hub>,
    address: &Address,
    security: &Security,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let routes = Routes::new(hub.local_service()).add_service(hub.global_service());
    // Once the store closes, the fan-out has told the node streams' clients so; the
    // server itself keeps running until shut down.
    let fan_out = hub.fan_out();
    let feeds = async move {
        fan_out.await;
        std::future::pending::<()>().await
    };
    let served = Served { routes, stats: hub.stats(), what: "the kpng API" };
    serve_routes(served, feeds, address, security, options, shutdown).await
}

/// gRPC services to serve, with the counters of their connections.
pub struct Served {
    /// The services.
    pub routes: Routes,
    /// Connection counters.
    pub stats: Arc<ServerStats>,
    /// What is served, for the log line (`the kpng API`).
    pub what: &'static str,
}

/// Serves `served` on `address` as [`serve`] does (same socket rules, security, client cap
/// and watchdog) until `shutdown` resolves or `background` returns: what other gRPC
/// services of kpng (the nftables aggregator) listen with.
pub async fn serve_routes(
    served: Served,
    background: impl Future<Output = ()>,
    address: &Address,
    security: &Security,
    options: ServeOptions,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    security.check(address)?;
    let mut builder = Server::builder().max_concurrent_streams(STREAMS_PER_CONNECTION);
    if let Some(files) = &security.tls {
        let (identity, ca) = tls_material(files)?;
        let config = ServerTlsConfig::new()
            .identity(identity)
            .client_ca_root(ca)
            .timeout(options.client_timeout);
        builder = builder.tls_config(config).map_err(|e| SecurityError::File {
            what: "TLS certificate or key",
            path: files.cert.clone(),
            message: e.to_string(),
        })?;
    }
    let identified: IdentifyLayer = MapRequestLayer::new(identify);
    let router = builder.layer(identified).add_routes(served.routes);
    let stats = served.stats.clone();
    let admission =
        Admission::new(options.max_clients, options.client_timeout, served.stats, served.what);
    let listen_error = |message: String| ServeError::Listen { address: address.clone(), message };
    let serve_error = |source| ServeError::Serve { address: address.clone(), source };
    let log = |bound: &Address| {
        tracing::info!(
            address = %bound,
            tls = security.tls.is_some(),
            max_clients = options.max_clients,
            client_timeout = ?options.client_timeout,
            "serving {}", served.what
        )
    };
    match address {
        Address::Unix(path) => {
            let directory = |source| SecurityError::Directory { address: address.clone(), source };
            check_directories_above(path).map_err(directory)?;
            let listener = bind_unix(path, &security.allowed).await.map_err(listen_error)?;
            check_directories_above(path).map_err(directory)?;
            let _socket = SocketFile(path.to_path_buf());
            log(address);
            let clients = UnixClients {
                listener,
                allowed: security.allowed.clone(),
                what: served.what,
                refusals: Throttle::new(10_000),
                stats,
                telling: Arc::new(tokio::sync::Semaphore::new(REFUSALS_AT_ONCE)),
            };
            run(router, clients, admission, background, shutdown).await.map_err(serve_error)
        }
        Address::Tcp { host, port } => {
            let listener = tokio::net::TcpListener::bind((host.as_str(), *port))
                .await
                .map_err(|e| listen_error(e.to_string()))?;
            let local = listener.local_addr().map_err(|e| listen_error(e.to_string()))?;
            log(&Address::Tcp { host: local.ip().to_string(), port: local.port() });
            run(router, listener, admission, background, shutdown).await.map_err(serve_error)
        }
    }
}

/// Serves `listener`'s admitted connections, the `background` work (the node streams'
/// fan-out) and the watchdog, until `shutdown`.
async fn run<L: Listener>(
    router: Router<Stack<IdentifyLayer, Identity>>,
    listener: L,
    admission: Arc<Admission>,
    background: impl Future<Output = ()>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let watchdog = admission.watch();
    let incoming = incoming(listener, admission.clone());
    let (closing, closed) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        let _ = closing.send(());
    };
    // A graceful shutdown waits for every stream to end, and a client's stream (a node
    // watch, a producer) lasts as long as the client: past a short grace, every
    // connection is cut.
    let cut = async {
        if closed.await.is_ok() {
            tokio::time::sleep(SHUTDOWN_GRACE).await;
            admission.cut_all();
        }
        std::future::pending::<()>().await
    };
    tokio::select! {
        result = router.serve_with_incoming_shutdown(incoming, shutdown) => result,
        () = background => Ok(()),
        () = watchdog => Ok(()),
        () = cut => Ok(()),
    }
}

/// How long the streams under way may take to end once the server is told to stop.
const SHUTDOWN_GRACE: Duration = Duration::from_millis(500);

/// A listener of client connections.
trait Listener: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    /// The next admitted client, with its credentials on a Unix socket.
    fn next_client(
        &self,
    ) -> impl Future<Output = io::Result<(Self::Io, Option<Credentials>)>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn next_client(&self) -> io::Result<(tokio::net::TcpStream, Option<Credentials>)> {
        let (stream, _) = self.accept().await?;
        // Changes leave at once, not after the client acknowledges the previous frame.
        let _ = stream.set_nodelay(true);
        Ok((stream, None))
    }
}

/// A Unix socket's listener that admits only the clients `allowed` admits.
struct UnixClients {
    listener: tokio::net::UnixListener,
    allowed: Allowed,
    what: &'static str,
    /// Refusals, logged at most once every 10 s.
    refusals: Throttle,
    /// Where refusals are counted.
    stats: Arc<ServerStats>,
    /// Refused clients being told why, at most [`REFUSALS_AT_ONCE`].
    telling: Arc<tokio::sync::Semaphore>,
}

/// Refused clients told why at once; more are closed without a word.
const REFUSALS_AT_ONCE: usize = 16;

/// How long a refused client may take to hear why.
const REFUSAL_TIME: Duration = Duration::from_secs(5);

impl UnixClients {
    /// Logs a refusal: the first at once, then at most one line every 10 s with the count
    /// since, so a user who keeps trying cannot fill the log.
    fn refuse(&self, peer: &Credentials) {
        self.stats.unauthorized.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if let Some(count) = self.refusals.occur() {
            tracing::warn!(
                client = %peer,
                refused = count,
                admitted = %self.allowed.describe(),
                "{}: client refused: its user and groups are not allowed (--allow-uid, --allow-gid)",
                self.what
            );
        }
    }
}

impl Listener for UnixClients {
    type Io = tokio::net::UnixStream;

    async fn next_client(&self) -> io::Result<(tokio::net::UnixStream, Option<Credentials>)> {
        loop {
            let (stream, _) = self.listener.accept().await?;
            match Credentials::of(&stream) {
                Ok(peer) if self.allowed.admits(&peer) => return Ok((stream, Some(peer))),
                Ok(peer) => {
                    self.refuse(&peer);
                    let message = format!(
                        "{} refused {peer}: it admits {} (--allow-uid, --allow-gid)",
                        self.what,
                        self.allowed.describe()
                    );
                    if let Ok(slot) = self.telling.clone().try_acquire_owned() {
                        tokio::spawn(async move {
                            let told = tell_refused(stream, message);
                            let _ = tokio::time::timeout(REFUSAL_TIME, told).await;
                            drop(slot);
                        });
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "{}: a client's credentials cannot be read: refused", self.what)
                }
            }
        }
    }
}

/// Answers every request of a refused client with `PERMISSION_DENIED` and `message`, so
/// that it learns why instead of seeing its connection drop (and stops retrying). None of
/// kpng's services is reachable on this connection.
async fn tell_refused(stream: tokio::net::UnixStream, message: String) {
    use http_body_util::Empty;
    let service = hyper::service::service_fn(move |_request| {
        let response = http::Response::builder()
            .header("content-type", "application/grpc")
            .header("grpc-status", (tonic::Code::PermissionDenied as i32).to_string())
            .header("grpc-message", grpc_message(&message))
            .body(Empty::<bytes::Bytes>::new());
        async move { response }
    });
    let executor = hyper_util::rt::TokioExecutor::new();
    let connection = hyper::server::conn::http2::Builder::new(executor)
        .max_concurrent_streams(1)
        .serve_connection(hyper_util::rt::TokioIo::new(stream), service);
    let _ = connection.await;
}

/// `text` as a `grpc-message` header: percent-encoded outside printable ASCII.
fn grpc_message(text: &str) -> String {
    let mut encoded = String::with_capacity(text.len());
    for byte in text.bytes() {
        if (0x20..0x7f).contains(&byte) && byte != b'%' {
            encoded.push(byte as char);
        } else {
            encoded.push_str(&format!("%{byte:02X}"));
        }
    }
    encoded
}

type IdentifyLayer = MapRequestLayer<fn(GrpcRequest) -> GrpcRequest>;
type GrpcRequest = http::Request<tonic::body::Body>;

/// Tells the services who sent a request: a [`PeerIdentity`] in its extensions, from the
/// client's Unix credentials or its TLS certificate; and a [`StreamWatch`] through which
/// a long stream keeps its connection from being taken for idle by the watchdog.
fn identify(mut request: GrpcRequest) -> GrpcRequest {
    use tonic::transport::server::TlsConnectInfo;
    let extensions = request.extensions();
    let connection = crate::connection::of_extensions(extensions);
    let identity = if let Some(tls) = extensions.get::<TlsConnectInfo<Connection>>() {
        let names = tls.peer_certs().and_then(|certs| certs.first().map(certificate_names));
        PeerIdentity::Certificate(names.unwrap_or_default())
    } else {
        match extensions.get::<Connection>().and_then(Connection::credentials) {
            Some(credentials) => PeerIdentity::Local(credentials.clone()),
            None => PeerIdentity::Plaintext,
        }
    };
    request.extensions_mut().insert(identity);
    if let Some(connection) = connection {
        let watch = StreamWatch::new(move || StreamInUse::new(connection.track()));
        request.extensions_mut().insert(watch);
    }
    request
}

/// The DNS and URI subject alternative names of a certificate, sorted; none when it cannot
/// be parsed (the TLS handshake already accepted it).
fn certificate_names(der: &tonic::transport::CertificateDer<'static>) -> Vec<String> {
    let Ok(cert) = webpki::EndEntityCert::try_from(der) else { return Vec::new() };
    let dns = cert.valid_dns_names().map(|name| format!("DNS:{name}"));
    let mut names: Vec<String> =
        dns.chain(cert.valid_uri_names().map(|uri| format!("URI:{uri}"))).collect();
    names.sort();
    names.dedup();
    names
}

/// The admitted connections of `listener`. An accept that fails (no descriptor left, for
/// instance) is logged and retried after a pause, never in a tight loop.
fn incoming<L: Listener>(
    listener: L,
    admission: Arc<Admission>,
) -> impl Stream<Item = Result<Guarded<L::Io>, io::Error>> + Send {
    futures::stream::unfold((listener, admission), |(listener, admission)| async move {
        loop {
            match listener.next_client().await {
                Ok((io, credentials)) => {
                    if let Some(guarded) = admission.admit(io, credentials) {
                        return Some((Ok(guarded), (listener, admission)));
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "accepting a to-api client failed; retrying in 100 ms");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    })
}

/// Removes the socket file when the server stops, however it stops (nothing for TCP).
struct SocketFile(std::path::PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        if !self.0.as_os_str().is_empty() {
            let _ = std::fs::remove_file(&self.0);
        }
    }
}

async fn bind_unix(path: &Path, allowed: &Allowed) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::DirBuilderExt;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    }
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            return Err(format!("{} exists and is not a socket", path.display()));
        }
        if tokio::net::UnixStream::connect(path).await.is_ok() {
            return Err(format!("{} is in use by another server", path.display()));
        }
        std::fs::remove_file(path)
            .map_err(|e| format!("removing stale {}: {e}", path.display()))?;
    }
    bind_private(path, allowed)
}

/// Binds a socket that has its final mode and group (0600 unless others are allowed) from
/// the moment others can reach it: it is bound in a new directory of mode 0700 beside
/// `path`, given its mode and group there, then linked into place (a chmod after binding at
/// `path` would leave a moment when others may connect; a link, unlike a rename, never
/// replaces a socket another server bound meanwhile). The umask is left alone: it is
/// process-wide, and two binds at once that set and restored it would each restore what the
/// other set.
fn bind_private(path: &Path, allowed: &Allowed) -> Result<tokio::net::UnixListener, String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Short names: a socket's path is limited to 107 bytes, and the one inside the
    // directory is at most a few bytes longer than `path`.
    let hidden = format!(".k{:x}.{:x}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed));
    let dir = path.with_file_name(hidden);
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| format!("creating {}: {e}", dir.display()))?;
    let inside = dir.join("s");
    let (mode, group) = allowed.socket_mode();
    let bind = || {
        let listener = tokio::net::UnixListener::bind(&inside)?;
        if group.is_some() {
            std::os::unix::fs::chown(&inside, None, group)?;
        }
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(mode))?;
        std::fs::hard_link(&inside, path)?;
        Ok::<_, std::io::Error>(listener)
    };
    let bound = bind().map_err(|e| format!("binding {}: {e}", path.display()));
    let _ = std::fs::remove_file(&inside);
    let _ = std::fs::remove_dir(&dir);
    bound
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[tokio::test]
    async fn the_socket_is_private_from_the_start() {
        use nix::sys::stat::{Mode, umask};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kpng.sock");
        // Even when the process would create files open to everyone.
        let previous = umask(Mode::empty());
        let listener = bind_private(&path, &Allowed::default());
        let during = umask(previous);
        assert_eq!(during, Mode::empty(), "the bind leaves the process's umask alone");
        let _listener = listener.unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o} at bind time");
        // Nothing is left beside it, and the process's umask is its own.
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["kpng.sock"]);
        let now = umask(previous);
        assert_eq!(umask(now), previous);
    }

    #[tokio::test]
    async fn a_bound_socket_answers_at_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kpng.sock");
        let listener = bind_private(&path, &Allowed::default()).unwrap();
        let (client, accepted) =
            tokio::join!(tokio::net::UnixStream::connect(&path), listener.accept());
        client.unwrap();
        accepted.unwrap();
        // A path in a directory that does not exist is an error naming it, and a path
        // taken meanwhile is never replaced.
        let error =
            bind_private(&dir.path().join("missing/kpng.sock"), &Allowed::default()).unwrap_err();
        assert!(error.contains("missing"), "{error}");
        let error = bind_private(&path, &Allowed::default()).unwrap_err();
        assert!(error.contains("kpng.sock") && error.contains("exists"), "{error}");
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["kpng.sock"]);
        let (client, accepted) =
            tokio::join!(tokio::net::UnixStream::connect(&path), listener.accept());
        client.unwrap();
        accepted.unwrap();
    }
}
