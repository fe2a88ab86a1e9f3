//! Listening on a Unix socket or TCP, with optional mutual TLS.

use std::future::Future;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use kpng_api::addr::{Address, Security, SecurityError, tls_material};
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tonic::transport::{Server, ServerTlsConfig};

use crate::service::Hub;

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

/// Serves `hub`'s streams on `address` until `shutdown` resolves. Logs the address it
/// listens on (with the port chosen when 0 was given). A Unix socket is created with mode
/// 0600 (its directory too if missing) and removed at the end; a stale socket left by a
/// previous run is replaced, one still in use is an error.
pub async fn serve(
    hub: Arc<Hub>,
    address: &Address,
    security: &Security,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    security.check(address)?;
    let mut builder = Server::builder();
    if let Some(files) = &security.tls {
        let (identity, ca) = tls_material(files)?;
        let config = ServerTlsConfig::new().identity(identity).client_ca_root(ca);
        builder = builder.tls_config(config).map_err(|e| SecurityError::File {
            what: "TLS certificate or key",
            path: files.cert.clone(),
            message: e.to_string(),
        })?;
    }
    let router = builder.add_service(hub.local_service()).add_service(hub.global_service());
    let listen_error = |message: String| ServeError::Listen { address: address.clone(), message };
    let serve_error = |source| ServeError::Serve { address: address.clone(), source };
    match address {
        Address::Unix(path) => {
            let listener = bind_unix(path).await.map_err(listen_error)?;
            let _socket = SocketFile(path.to_path_buf());
            tracing::info!(address = %address, "serving the kpng API");
            router
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
                .await
                .map_err(serve_error)
        }
        Address::Tcp { host, port } => {
            let listener = tokio::net::TcpListener::bind((host.as_str(), *port))
                .await
                .map_err(|e| listen_error(e.to_string()))?;
            let local = listener.local_addr().map_err(|e| listen_error(e.to_string()))?;
            let bound = Address::Tcp { host: local.ip().to_string(), port: local.port() };
            tracing::info!(address = %bound, tls = security.tls.is_some(), "serving the kpng API");
            // Changes leave at once, not after the client acknowledges the previous frame.
            let incoming = tokio_stream::StreamExt::map(TcpListenerStream::new(listener), |conn| {
                conn.inspect(|tcp| {
                    let _ = tcp.set_nodelay(true);
                })
            });
            router.serve_with_incoming_shutdown(incoming, shutdown).await.map_err(serve_error)
        }
    }
}

/// Removes the socket file when the server stops, however it stops.
struct SocketFile(std::path::PathBuf);

impl Drop for SocketFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
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
    let listener = tokio::net::UnixListener::bind(path).map_err(|e| e.to_string())?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("setting the mode of {}: {e}", path.display()))?;
    Ok(listener)
}
