//! [`Client`]: nftlb's REST API over plain HTTP/1.1, one connection per call, as nftlb
//! serves it (it reads a request's head and body together and closes after answering).
//!
//! Every call carries nftlb's key, in plaintext: a local user who binds nftlb's port while
//! nftlb restarts would receive it. So before a request is written, the connection's other
//! end is looked up in the kernel's socket table (`/proc/net/tcp`, `/proc/net/tcp6`): the
//! socket it reached belongs to the user who opened the listening socket, and the key is
//! sent only when that is root (or kpng's own user).

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpStream};
use std::time::Duration;

use crate::error::NftlbError;

/// How long one call may take: nftlb answers once the kernel holds the change.
const CALL_TIMEOUT: Duration = Duration::from_secs(30);

/// A client of one nftlb daemon.
#[derive(Debug, Clone)]
pub struct Client {
    addr: String,
    key: String,
}

impl Client {
    /// A client of the daemon at `url` (`http://HOST:PORT`) authenticating with `key`.
    pub fn new(url: &str, key: &str) -> Result<Client, NftlbError> {
        let addr = url
            .strip_prefix("http://")
            .map(|rest| rest.trim_end_matches('/'))
            .filter(|addr| !addr.is_empty() && !addr.contains('/') && addr.contains(':'))
            .ok_or_else(|| NftlbError::Url(url.to_string()))?;
        Ok(Client { addr: addr.to_string(), key: key.to_string() })
    }

    /// A client whose key is the first line of `path` (nftlb's `NFTLB_SERVER_KEY`).
    pub fn with_key_file(url: &str, path: &str) -> Result<Client, NftlbError> {
        let key_error = |why: String| NftlbError::Key { path: path.to_string(), why };
        let text = std::fs::read_to_string(path).map_err(|e| key_error(e.to_string()))?;
        let key = text.lines().next().unwrap_or_default().trim();
        if key.is_empty() {
            return Err(key_error("the file is empty".into()));
        }
        Client::new(url, key)
    }

    /// One call; nftlb's answer when it is `200`.
    pub fn call(&self, method: &str, path: &str, body: &str) -> Result<String, NftlbError> {
        let io = |source| NftlbError::Io {
            method: method.to_string(),
            path: path.to_string(),
            addr: self.addr.clone(),
            source,
        };
        let mut stream = TcpStream::connect(&self.addr).map_err(io)?;
        stream.set_read_timeout(Some(CALL_TIMEOUT)).map_err(io)?;
        let owner = listener_owner(&stream).map_err(io)?;
        let own = nix::unistd::geteuid().as_raw();
        if owner != 0 && owner != own {
            return Err(NftlbError::Untrusted { addr: self.addr.clone(), owner });
        }
        // One write: nftlb reads a request's head and body together.
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {}\r\nKey: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            self.addr,
            self.key,
            body.len()
        );
        stream.write_all(request.as_bytes()).map_err(io)?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).map_err(io)?;
        let text = String::from_utf8_lossy(&response);
        let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
        let status = head.lines().next().unwrap_or_default();
        if status.split_whitespace().nth(1) != Some("200") {
            return Err(NftlbError::Refused {
                method: method.to_string(),
                path: path.to_string(),
                status: status.to_string(),
                body: body.trim().to_string(),
            });
        }
        Ok(body.to_string())
    }
}

/// The user who owns the socket `stream` is connected to: the listener's owner, from the
/// kernel's socket table. Not found (a remote address) is an error: the key is sent only to
/// a listener of this node.
fn listener_owner(stream: &TcpStream) -> std::io::Result<u32> {
    let (ours, theirs) = (stream.local_addr()?, stream.peer_addr()?);
    let table = match theirs {
        std::net::SocketAddr::V4(_) => "/proc/net/tcp",
        std::net::SocketAddr::V6(_) => "/proc/net/tcp6",
    };
    let text = std::fs::read_to_string(table)?;
    owner_in_table(&text, theirs, ours).ok_or_else(|| {
        std::io::Error::other(format!(
            "the socket {theirs} answering {ours} is not in {table}: nftlb must listen on this \
             node, in this network namespace"
        ))
    })
}

/// In a socket table's text, the uid of the socket whose local address is `local` and
/// remote address `remote`.
fn owner_in_table(text: &str, local: SocketAddr, remote: SocketAddr) -> Option<u32> {
    text.lines().skip(1).find_map(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (own, other) = (parse_address(fields.get(1)?)?, parse_address(fields.get(2)?)?);
        (same(own, local) && same(other, remote)).then(|| fields.get(7)?.parse().ok())?
    })
}

/// Two addresses alike, an IPv4 address and its IPv4-mapped IPv6 form included.
fn same(a: SocketAddr, b: SocketAddr) -> bool {
    let canonical = |ip: IpAddr| match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    };
    a.port() == b.port() && canonical(a.ip()) == canonical(b.ip())
}

/// A socket table's `ADDRESS:PORT`: the address as 32-bit words in the kernel's byte order
/// (the machine's), each printed in hexadecimal.
fn parse_address(text: &str) -> Option<SocketAddr> {
    let (address, port) = text.split_once(':')?;
    let port = u16::from_str_radix(port, 16).ok()?;
    let mut bytes = Vec::with_capacity(16);
    for at in (0..address.len()).step_by(8) {
        let word = u32::from_str_radix(address.get(at..at + 8)?, 16).ok()?;
        bytes.extend_from_slice(&word.to_ne_bytes());
    }
    let ip = match bytes.len() {
        4 => IpAddr::from(<[u8; 4]>::try_from(bytes).ok()?),
        16 => IpAddr::from(<[u8; 16]>::try_from(bytes).ok()?),
        _ => return None,
    };
    Some(SocketAddr::new(ip, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_plain_http_host_and_port() {
        assert!(Client::new("http://127.0.0.1:5555", "k").is_ok());
        assert!(Client::new("http://[::1]:5555/", "k").is_ok());
        for bad in ["https://127.0.0.1:5555", "127.0.0.1:5555", "http://host", "http://h:1/farms"] {
            let error = Client::new(bad, "k").unwrap_err().to_string();
            assert!(error.contains(bad), "{error}");
        }
    }

    #[test]
    fn an_answer_other_than_200_is_a_refusal_naming_the_call() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let n = stream.read(&mut buf).unwrap();
            let request = String::from_utf8_lossy(&buf[..n]).into_owned();
            stream
                .write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 24\r\n\r\n{\"response\": \"error\"}  ")
                .unwrap();
            request
        });
        // The listener is this process's: its user is trusted.
        let error =
            Client::new(&url, "secret").unwrap().call("DELETE", "/farms/x", "").unwrap_err();
        let request = server.join().unwrap();
        assert!(request.starts_with("DELETE /farms/x HTTP/1.1\r\n"), "{request}");
        assert!(request.contains("\r\nKey: secret\r\n"), "{request}");
        let text = error.to_string();
        assert!(text.contains("DELETE /farms/x") && text.contains("400"), "{text}");
    }

    #[test]
    fn the_socket_table_names_each_connections_owner() {
        // Both ends of a loopback connection of this process, as the kernel lists them.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let own = nix::unistd::geteuid().as_raw();
        assert_eq!(listener_owner(&stream).unwrap(), own);
        // A table's lines, byte order as this machine's kernel prints them.
        let word = |octets: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(octets));
        let v4 = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n   0: {}:15B3 {}:9C40 01 00000000:00000000 00:00000000 00000000 65534        0 1 1\n",
            word([127, 0, 0, 1]),
            word([127, 0, 0, 1]),
        );
        let nftlb: SocketAddr = "127.0.0.1:5555".parse().unwrap();
        let client: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        assert_eq!(owner_in_table(&v4, nftlb, client), Some(65534));
        assert_eq!(owner_in_table(&v4, client, nftlb), None, "the other end");
        let mapped: SocketAddr = "[::ffff:127.0.0.1]:5555".parse().unwrap();
        assert_eq!(owner_in_table(&v4, mapped, client), Some(65534));
        let v6 = format!(
            "header\n   0: {}{}{}{}:15B3 {}{}{}{}:9C40 01 0:0 0:0 0 0 0 1\n",
            word([0, 0, 0, 0]),
            word([0, 0, 0, 0]),
            word([0, 0, 0, 0]),
            word([0, 0, 0, 1]),
            word([0, 0, 0, 0]),
            word([0, 0, 0, 0]),
            word([0, 0, 0, 0]),
            word([0, 0, 0, 1]),
        );
        let (nftlb6, client6) = ("[::1]:5555".parse().unwrap(), "[::1]:40000".parse().unwrap());
        assert_eq!(owner_in_table(&v6, nftlb6, client6), Some(0));
    }
}
