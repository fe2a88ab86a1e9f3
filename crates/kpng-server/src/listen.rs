//! Listening on a Unix socket or TCP, with optional mutual TLS, a cap on clients and a
//! watchdog over them.

use std::future::Future;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kpng_api::addr::{Address, Security, SecurityError, tls_material};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_stream::Stream;
use tonic::service::Routes;
use tonic::transport::server::Router;
use tonic::transport::{Server, ServerTlsConfig};

use crate::connection::{Admission, Guarded};
use crate::counters::ServerStats;
use crate::service::Hub;

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
/// was given). A Unix socket is created with mode 0600 (its directory too if missing) and
/// removed at the end; a stale socket left by a previous run is replaced, one still in use
/// is an error.
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
    let router = builder.add_routes(served.routes);
    let admission = Admission::new(options.max_clients, options.client_timeout, served.stats);
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
            let listener = bind_unix(path).await.map_err(listen_error)?;
            let _socket = SocketFile(path.to_path_buf());
            log(address);
            run(router, listener, admission, background, shutdown).await.map_err(serve_error)
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
    router: Router,
    listener: L,
    admission: Arc<Admission>,
    background: impl Future<Output = ()>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), tonic::transport::Error> {
    let watchdog = admission.watch();
    let incoming = incoming(listener, admission.clone());
    tokio::select! {
        result = router.serve_with_incoming_shutdown(incoming, shutdown) => result,
        () = background => Ok(()),
        () = watchdog => Ok(()),
    }
}

/// A listener of client connections.
trait Listener: Send + 'static {
    type Io: AsyncRead + AsyncWrite + Unpin + Send + 'static;
    fn next_client(&self) -> impl Future<Output = io::Result<Self::Io>> + Send;
}

impl Listener for tokio::net::TcpListener {
    type Io = tokio::net::TcpStream;

    async fn next_client(&self) -> io::Result<tokio::net::TcpStream> {
        let (stream, _) = self.accept().await?;
        // Changes leave at once, not after the client acknowledges the previous frame.
        let _ = stream.set_nodelay(true);
        Ok(stream)
    }
}

impl Listener for tokio::net::UnixListener {
    type Io = tokio::net::UnixStream;

    async fn next_client(&self) -> io::Result<tokio::net::UnixStream> {
        Ok(self.accept().await?.0)
    }
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
                Ok(io) => {
                    if let Some(guarded) = admission.admit(io) {
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

async fn bind_unix(path: &Path) -> Result<tokio::net::UnixListener, String> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
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
    bind_private(path)
}

/// Binds a socket that is mode 0600 from the moment others can reach it: it is bound in a
/// new directory of mode 0700 beside `path`, made 0600 there, then linked into place (a
/// chmod after binding at `path` would leave a moment when others may connect; a link,
/// unlike a rename, never replaces a socket another server bound meanwhile). The umask is
/// left alone: it is process-wide, and two binds at once that set and restored it would
/// each restore what the other set.
fn bind_private(path: &Path) -> Result<tokio::net::UnixListener, String> {
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
    let bind = || {
        let listener = tokio::net::UnixListener::bind(&inside)?;
        std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o600))?;
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
        let listener = bind_private(&path);
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
        let listener = bind_private(&path).unwrap();
        let (client, accepted) =
            tokio::join!(tokio::net::UnixStream::connect(&path), listener.accept());
        client.unwrap();
        accepted.unwrap();
        // A path in a directory that does not exist is an error naming it, and a path
        // taken meanwhile is never replaced.
        let error = bind_private(&dir.path().join("missing/kpng.sock")).unwrap_err();
        assert!(error.contains("missing"), "{error}");
        let error = bind_private(&path).unwrap_err();
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
