//! Where a `to-api` server (or the aggregator) listens and its clients connect:
//! `unix:///path`, where both ends check the other's credentials ([`crate::peer`]), or
//! `tcp://host:port` with mutual TLS; plaintext TCP only when asked for (`--insecure`).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::peer::{Allowed, UnsafeDirectory};

/// The default address of `to-api` and its clients.
pub const DEFAULT_ADDRESS: &str = "unix:///run/kpng/kpng.sock";

/// A server address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Address {
    /// A Unix socket (only local processes; its file mode decides who may connect).
    Unix(PathBuf),
    /// A TCP host (name or IP) and port.
    Tcp {
        /// Host name or IP address.
        host: String,
        /// Port.
        port: u16,
    },
}

/// An address that is neither `unix:///path` nor `tcp://host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid address {text:?}: {reason} (expected unix:///path or tcp://host:port)")]
pub struct AddressError {
    text: String,
    reason: &'static str,
}

impl FromStr for Address {
    type Err = AddressError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let error = |reason| AddressError { text: text.to_string(), reason };
        if let Some(path) = text.strip_prefix("unix://") {
            if !path.starts_with('/') {
                return Err(error("the socket path must be absolute"));
            }
            return Ok(Address::Unix(PathBuf::from(path)));
        }
        let Some(rest) = text.strip_prefix("tcp://") else { return Err(error("unknown scheme")) };
        let (host, port) = rest.rsplit_once(':').ok_or_else(|| error("no port"))?;
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(error("no host"));
        }
        let port = port.parse().map_err(|_| error("the port is not a number from 0 to 65535"))?;
        Ok(Address::Tcp { host: host.to_string(), port })
    }
}

impl fmt::Display for Address {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Address::Unix(path) => write!(f, "unix://{}", path.display()),
            Address::Tcp { host, port } if host.contains(':') => write!(f, "tcp://[{host}]:{port}"),
            Address::Tcp { host, port } => write!(f, "tcp://{host}:{port}"),
        }
    }
}

/// PEM files for mutual TLS: our certificate and key, and the CA that signs the peer's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Our certificate chain.
    pub cert: PathBuf,
    /// Our private key.
    pub key: PathBuf,
    /// The CA the peer's certificate must chain to.
    pub ca: PathBuf,
}

/// How a connection is protected.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Security {
    /// Mutual TLS, if configured.
    pub tls: Option<TlsFiles>,
    /// Plaintext TCP was explicitly allowed: anyone who can reach the port may connect, and
    /// whoever listens on it is believed.
    pub insecure: bool,
    /// On a Unix socket, who is admitted (a server) or trusted (a client) besides root and
    /// the process's own user.
    pub allowed: Allowed,
}

/// Why a connection or listener was refused before it started.
#[derive(Debug, thiserror::Error)]
pub enum SecurityError {
    /// Plaintext TCP without `--insecure`.
    #[error(
        "{0}: plaintext TCP authenticates nobody (on loopback too, any local user may connect \
         or listen in the server's place): use mutual TLS (--tls-cert, --tls-key, --tls-ca) or \
         a unix:// socket, or accept plaintext with --insecure"
    )]
    Plaintext(Address),
    /// `--allow-uid` or `--allow-gid` with a TCP address.
    #[error(
        "{0}: --allow-uid and --allow-gid apply to unix:// addresses only (TCP peers are \
             identified by their certificates)"
    )]
    AllowedOnTcp(Address),
    /// A Unix socket in a directory where another user could replace it.
    #[error("refusing {address}: {source}")]
    Directory {
        /// The socket's address.
        address: Address,
        /// The directory and what is wrong with it.
        #[source]
        source: UnsafeDirectory,
    },
    /// TLS on a Unix socket.
    #[error("{0}: TLS applies to tcp:// addresses only")]
    TlsOnUnix(Address),
    /// A certificate, key or CA file that cannot be used.
    #[error("{what} {path}: {message}")]
    File {
        /// Which file.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

impl Security {
    /// Checks that `address` may be used with these settings and that the TLS files (if
    /// any) can be read: what a command does before it starts, so that a mistake is fatal
    /// at once instead of a retry loop.
    pub fn validate(&self, address: &Address) -> Result<(), SecurityError> {
        self.check(address)?;
        if let Some(files) = &self.tls {
            tls_material(files)?;
        }
        Ok(())
    }

    /// Whether connections to or on `address` are plaintext TCP (`--insecure`): what a
    /// command warns about when it starts.
    pub fn is_plaintext_tcp(&self, address: &Address) -> bool {
        matches!(address, Address::Tcp { .. }) && self.tls.is_none()
    }

    /// Checks that `address` may be used with these settings.
    pub fn check(&self, address: &Address) -> Result<(), SecurityError> {
        match (address, &self.tls) {
            (Address::Unix(_), Some(_)) => Err(SecurityError::TlsOnUnix(address.clone())),
            (Address::Tcp { .. }, None) if !self.insecure => {
                Err(SecurityError::Plaintext(address.clone()))
            }
            (Address::Tcp { .. }, _) if self.allowed != Allowed::default() => {
                Err(SecurityError::AllowedOnTcp(address.clone()))
            }
            _ => Ok(()),
        }
    }
}

/// Reads a PEM file, checking that it holds what it should.
pub fn read_pem(what: &'static str, path: &Path, marker: &str) -> Result<Vec<u8>, SecurityError> {
    let error = |message: String| SecurityError::File { what, path: path.to_path_buf(), message };
    let bytes = std::fs::read(path).map_err(|e| error(e.to_string()))?;
    let text = String::from_utf8_lossy(&bytes);
    if !text.contains("-----BEGIN") || !text.contains(marker) {
        return Err(error(format!("no PEM {marker} block")));
    }
    Ok(bytes)
}

/// Our identity and the peer CA, read and checked.
pub fn tls_material(
    files: &TlsFiles,
) -> Result<(tonic::transport::Identity, tonic::transport::Certificate), SecurityError> {
    let cert = read_pem("certificate", &files.cert, "CERTIFICATE")?;
    let key = read_pem("key", &files.key, "PRIVATE KEY")?;
    let ca = read_pem("CA", &files.ca, "CERTIFICATE")?;
    Ok((
        tonic::transport::Identity::from_pem(cert, key),
        tonic::transport::Certificate::from_pem(ca),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_parse_and_print() {
        for text in ["unix:///run/kpng/kpng.sock", "tcp://127.0.0.1:4000", "tcp://[::1]:80"] {
            assert_eq!(text.parse::<Address>().unwrap().to_string(), text);
        }
        let error = "unix://relative".parse::<Address>().unwrap_err().to_string();
        assert!(error.contains("must be absolute"), "{error}");
        assert!("http://x:1".parse::<Address>().is_err());
        assert!("tcp://host".parse::<Address>().is_err());
        assert!("tcp://host:99999".parse::<Address>().is_err());
    }

    #[test]
    fn plaintext_needs_insecure_on_loopback_too() {
        let local: Address = "tcp://127.0.0.1:1".parse().unwrap();
        let remote: Address = "tcp://10.0.0.1:1".parse().unwrap();
        let plain = Security::default();
        for address in [&local, &remote] {
            let error = plain.check(address).unwrap_err();
            assert!(matches!(error, SecurityError::Plaintext(_)), "{error}");
            assert!(error.to_string().contains("--insecure"), "{error}");
            let insecure = Security { insecure: true, ..plain.clone() };
            assert!(insecure.check(address).is_ok() && insecure.is_plaintext_tcp(address));
        }
        let unix: Address = "unix:///run/kpng/kpng.sock".parse().unwrap();
        assert!(plain.check(&unix).is_ok() && !plain.is_plaintext_tcp(&unix));
        // Users and groups are a Unix socket's business.
        let allowed =
            Security { allowed: Allowed { uids: vec![1000], gids: vec![] }, ..plain.clone() };
        assert!(allowed.check(&unix).is_ok());
        let insecure = Security { insecure: true, ..allowed };
        assert!(matches!(insecure.check(&local), Err(SecurityError::AllowedOnTcp(_))));
    }
}
