//! The client side of dataplane tests: one TCP connection or UDP exchange, reported as the
//! server's answer, `refused`, `timeout`, or `error: ...`.

use std::io::{ErrorKind, Read};
use std::net::{IpAddr, SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

/// The outcome of one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The server answered: its name and the client address it saw.
    Answer {
        /// The endpoint's name.
        name: String,
        /// The source address the endpoint saw.
        peer: IpAddr,
    },
    /// Connection refused or ICMP port unreachable.
    Refused,
    /// No answer in time (dropped).
    Timeout,
    /// Anything else.
    Error(String),
}

impl std::fmt::Display for Outcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Outcome::Answer { name, peer } => write!(f, "{name} {peer}"),
            Outcome::Refused => f.write_str("refused"),
            Outcome::Timeout => f.write_str("timeout"),
            Outcome::Error(e) => write!(f, "error: {e}"),
        }
    }
}

impl std::str::FromStr for Outcome {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim() {
            "refused" => Ok(Outcome::Refused),
            "timeout" => Ok(Outcome::Timeout),
            other if other.starts_with("error: ") => Ok(Outcome::Error(other[7..].to_string())),
            other => {
                let (name, peer) =
                    other.split_once(' ').ok_or_else(|| format!("bad probe line {other:?}"))?;
                let peer = peer.parse().map_err(|e| format!("bad peer in {other:?}: {e}"))?;
                Ok(Outcome::Answer { name: name.to_string(), peer })
            }
        }
    }
}

fn classify(e: std::io::Error) -> Outcome {
    match e.kind() {
        ErrorKind::ConnectionRefused => Outcome::Refused,
        ErrorKind::TimedOut | ErrorKind::WouldBlock => Outcome::Timeout,
        _ => Outcome::Error(e.to_string()),
    }
}

fn parse_answer(text: &str) -> Outcome {
    text.lines().next().unwrap_or_default().parse().unwrap_or_else(Outcome::Error)
}

/// One TCP connection to `target`: the first line the server sends.
pub fn tcp(target: SocketAddr, timeout: Duration) -> Outcome {
    let mut stream = match TcpStream::connect_timeout(&target, timeout) {
        Ok(s) => s,
        Err(e) => return classify(e),
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let mut buf = [0u8; 256];
    match stream.read(&mut buf) {
        Ok(n) => parse_answer(&String::from_utf8_lossy(&buf[..n])),
        Err(e) => classify(e),
    }
}

/// One TCP connection to `target` from the local address `source`.
pub fn tcp_from(source: IpAddr, target: SocketAddr, timeout: Duration) -> Outcome {
    use socket2::{Domain, Socket, Type};
    let domain = if target.is_ipv4() { Domain::IPV4 } else { Domain::IPV6 };
    let connected = Socket::new(domain, Type::STREAM, None)
        .and_then(|s| s.bind(&SocketAddr::new(source, 0).into()).map(|()| s))
        .and_then(|s| s.connect_timeout(&target.into(), timeout).map(|()| s));
    let mut stream: TcpStream = match connected {
        Ok(socket) => socket.into(),
        Err(e) => return classify(e),
    };
    let _ = stream.set_read_timeout(Some(timeout));
    let mut buf = [0u8; 256];
    match stream.read(&mut buf) {
        Ok(n) => parse_answer(&String::from_utf8_lossy(&buf[..n])),
        Err(e) => classify(e),
    }
}

/// One UDP exchange with `target`, from `source_port` (0: any).
pub fn udp(target: SocketAddr, source_port: u16, timeout: Duration) -> Outcome {
    let bind: SocketAddr = if target.is_ipv4() {
        ([0, 0, 0, 0], source_port).into()
    } else {
        ([0u16; 8], source_port).into()
    };
    let socket = match UdpSocket::bind(bind) {
        Ok(s) => s,
        Err(e) => return Outcome::Error(e.to_string()),
    };
    if let Err(e) = socket.connect(target) {
        return classify(e);
    }
    let _ = socket.set_read_timeout(Some(timeout));
    if let Err(e) = socket.send(b"hello") {
        return classify(e);
    }
    let mut buf = [0u8; 256];
    match socket.recv(&mut buf) {
        Ok(n) => parse_answer(&String::from_utf8_lossy(&buf[..n])),
        Err(e) => classify(e),
    }
}
