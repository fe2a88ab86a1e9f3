//! One kpng per node and dataplane: a lock that is an abstract Unix socket named after
//! the dataplane. Abstract sockets belong to a network namespace, so the lock is per node
//! (per namespace), and the kernel releases it when the process dies, however it dies. A
//! second kpng that wants the same dataplane is told who holds it.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

/// The lock on one dataplane of this network namespace, held while it lives.
#[derive(Debug)]
pub struct InstanceLock {
    _listener: UnixListener,
}

/// Another process holds the lock.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another kpng programs this dataplane here.
    #[error(
        "another kpng already programs {dataplane} in this network namespace ({holder}); run one kpng per node, or stop that one first"
    )]
    Held {
        /// The dataplane.
        dataplane: String,
        /// Who holds it: pid and command line, as far as they can be known.
        holder: String,
    },
    /// The lock cannot be taken for another reason.
    #[error("cannot take the instance lock for {dataplane}")]
    Io {
        /// The dataplane.
        dataplane: String,
        /// What failed.
        #[source]
        source: std::io::Error,
    },
}

impl InstanceLock {
    /// Takes the lock for `dataplane` (`nftables`, `iptables`, ...).
    pub fn take(dataplane: &str) -> Result<InstanceLock, LockError> {
        let name = format!("kpng/{dataplane}");
        let address = SocketAddr::from_abstract_name(name.as_bytes())
            .map_err(|source| LockError::Io { dataplane: dataplane.into(), source })?;
        match UnixListener::bind_addr(&address) {
            Ok(listener) => Ok(InstanceLock { _listener: listener }),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                Err(LockError::Held { dataplane: dataplane.into(), holder: holder(&address) })
            }
            Err(source) => Err(LockError::Io { dataplane: dataplane.into(), source }),
        }
    }
}

/// The pid and command line of the process listening on `address`.
fn holder(address: &SocketAddr) -> String {
    let Ok(stream) = UnixStream::connect_addr(address) else {
        return "its process is unknown".into();
    };
    let Ok(credentials) =
        nix::sys::socket::getsockopt(&stream, nix::sys::socket::sockopt::PeerCredentials)
    else {
        return "its process is unknown".into();
    };
    let pid = credentials.pid();
    let command = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|bytes| {
            bytes
                .split(|b| *b == 0)
                .filter(|part| !part.is_empty())
                .map(String::from_utf8_lossy)
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_default();
    match command.is_empty() {
        true => format!("pid {pid}"),
        false => format!("pid {pid}: {command}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_with_the_first_named() {
        let name = format!("test-{}", std::process::id());
        let first = InstanceLock::take(&name).unwrap();
        let error = InstanceLock::take(&name).unwrap_err().to_string();
        assert!(error.contains(&format!("pid {}", std::process::id())), "{error}");
        assert!(error.contains("run one kpng per node"), "{error}");
        drop(first);
        InstanceLock::take(&name).expect("released with its holder");
    }
}
