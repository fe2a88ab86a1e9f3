//! SCTP for dataplane tests, with raw sockets (the test kernel needs no SCTP stack).
//!
//! A probe sends one SCTP INIT to the target; the responder in a pod answers every INIT to
//! its port with an ABORT whose "user-initiated abort" cause carries
//! `<name> <address of the peer it saw>`. Conntrack and NAT treat these as a real
//! association being set up and torn down, so the probe learns which endpoint answered and
//! whether the client's address was translated, exactly as for TCP and UDP.

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, Socket, Type};

use crate::probe::Outcome;

const IPPROTO_SCTP: i32 = 132;
const CHUNK_INIT: u8 = 1;
const CHUNK_ABORT: u8 = 6;
const CAUSE_USER_ABORT: u16 = 12;

/// CRC32c (Castagnoli), as SCTP uses it.
pub fn crc32c(data: &[u8]) -> u32 {
    let mut crc = !0u32;
    for byte in data {
        crc ^= u32::from(*byte);
        for _ in 0..8 {
            crc = if crc & 1 != 0 { (crc >> 1) ^ 0x82f6_3b78 } else { crc >> 1 };
        }
    }
    !crc
}

/// An SCTP packet (common header and one chunk) with its checksum filled in.
fn packet(src_port: u16, dst_port: u16, vtag: u32, chunk: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(12 + chunk.len());
    p.extend_from_slice(&src_port.to_be_bytes());
    p.extend_from_slice(&dst_port.to_be_bytes());
    p.extend_from_slice(&vtag.to_be_bytes());
    p.extend_from_slice(&[0; 4]);
    p.extend_from_slice(chunk);
    let sum = crc32c(&p);
    p[8..12].copy_from_slice(&sum.to_le_bytes());
    p
}

fn init_chunk(tag: u32) -> Vec<u8> {
    let mut c = vec![CHUNK_INIT, 0, 0, 20];
    c.extend_from_slice(&tag.to_be_bytes());
    c.extend_from_slice(&65535u32.to_be_bytes());
    c.extend_from_slice(&1u16.to_be_bytes());
    c.extend_from_slice(&1u16.to_be_bytes());
    c.extend_from_slice(&1u32.to_be_bytes());
    c
}

fn abort_chunk(text: &str) -> Vec<u8> {
    let cause_len = 4 + text.len();
    let mut c = vec![CHUNK_ABORT, 0];
    c.extend_from_slice(&((4 + cause_len) as u16).to_be_bytes());
    c.extend_from_slice(&CAUSE_USER_ABORT.to_be_bytes());
    c.extend_from_slice(&(cause_len as u16).to_be_bytes());
    c.extend_from_slice(text.as_bytes());
    while c.len() % 4 != 0 {
        c.push(0);
    }
    c
}

/// A received SCTP packet: source address, ports, verification tag, first chunk.
struct Received {
    src: Ipv4Addr,
    src_port: u16,
    dst_port: u16,
    chunk_type: u8,
    chunk: Vec<u8>,
}

fn receive(socket: &Socket) -> std::io::Result<Received> {
    let mut buf = [0u8; 2048];
    let n = std::io::Read::read(&mut &*socket, &mut buf)?;
    parse(&buf[..n]).ok_or_else(|| std::io::Error::other("not an SCTP packet"))
}

fn parse(bytes: &[u8]) -> Option<Received> {
    let ihl = usize::from(bytes.first()? & 0x0f) * 4;
    if bytes.get(9) != Some(&(IPPROTO_SCTP as u8)) {
        return None;
    }
    let src = Ipv4Addr::new(bytes[12], bytes[13], bytes[14], bytes[15]);
    let sctp = bytes.get(ihl..)?;
    let chunk = sctp.get(12..)?;
    Some(Received {
        src,
        src_port: u16::from_be_bytes([sctp[0], sctp[1]]),
        dst_port: u16::from_be_bytes([sctp[2], sctp[3]]),
        chunk_type: *chunk.first()?,
        chunk: chunk.to_vec(),
    })
}

fn raw() -> std::io::Result<Socket> {
    Socket::new(Domain::IPV4, Type::RAW, Some(Protocol::from(IPPROTO_SCTP)))
}

/// Answers every SCTP INIT to `port` with an ABORT naming `name` and the peer, forever.
/// Binding happens before this returns, so a probe right after cannot be missed.
pub fn serve(name: &str, port: u16) -> std::io::Result<impl FnOnce() + Send + 'static> {
    let socket = raw()?;
    let name = name.to_string();
    Ok(move || {
        loop {
            let Ok(packet) = receive(&socket) else { continue };
            if packet.dst_port != port || packet.chunk_type != CHUNK_INIT || packet.chunk.len() < 8
            {
                continue;
            }
            let tag = u32::from_be_bytes([
                packet.chunk[4],
                packet.chunk[5],
                packet.chunk[6],
                packet.chunk[7],
            ]);
            let text = format!("{name} {}", packet.src);
            let reply = packet_bytes(port, packet.src_port, tag, &abort_chunk(&text));
            let to = SocketAddr::V4(SocketAddrV4::new(packet.src, 0));
            let _ = socket.send_to(&reply, &to.into());
        }
    })
}

fn packet_bytes(src_port: u16, dst_port: u16, vtag: u32, chunk: &[u8]) -> Vec<u8> {
    packet(src_port, dst_port, vtag, chunk)
}

/// Sends one INIT from `source_port` to `target` and waits for the answer.
pub fn probe(target: SocketAddr, source_port: u16, timeout: Duration) -> Outcome {
    let SocketAddr::V4(target) = target else {
        return Outcome::Error("SCTP probes are IPv4 only".into());
    };
    let socket = match raw() {
        Ok(s) => s,
        Err(e) => return Outcome::Error(e.to_string()),
    };
    let tag = 0x4b50_4e47 ^ u32::from(source_port);
    let init = packet(source_port, target.port(), 0, &init_chunk(tag));
    if let Err(e) =
        socket.send_to(&init, &SocketAddr::V4(SocketAddrV4::new(*target.ip(), 0)).into())
    {
        return Outcome::Error(e.to_string());
    }
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Outcome::Timeout;
        }
        let _ = socket.set_read_timeout(Some(left));
        let Ok(packet) = receive(&socket) else { return Outcome::Timeout };
        if packet.src != *target.ip()
            || packet.src_port != target.port()
            || packet.dst_port != source_port
        {
            continue;
        }
        if packet.chunk_type != CHUNK_ABORT || packet.chunk.len() < 8 {
            return Outcome::Error(format!("unexpected SCTP chunk {}", packet.chunk_type));
        }
        let cause_len = usize::from(u16::from_be_bytes([packet.chunk[6], packet.chunk[7]]));
        let text = packet.chunk.get(8..4 + cause_len).unwrap_or_default();
        return String::from_utf8_lossy(text).parse().unwrap_or_else(Outcome::Error);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc32c_matches_the_published_check_value() {
        assert_eq!(crc32c(b"123456789"), 0xe306_9283);
    }

    #[test]
    fn abort_chunks_are_padded_and_parse_back() {
        let chunk = abort_chunk("web-a 10.0.0.1");
        assert_eq!(chunk.len() % 4, 0);
        assert_eq!(chunk[0], CHUNK_ABORT);
        let mut ip =
            vec![0x45, 0, 0, 0, 0, 0, 0, 0, 64, IPPROTO_SCTP as u8, 0, 0, 10, 0, 0, 9, 10, 0, 0, 1];
        ip.extend(packet(80, 4000, 7, &chunk));
        let parsed = parse(&ip).unwrap();
        assert_eq!(
            (parsed.src, parsed.src_port, parsed.dst_port, parsed.chunk_type),
            (Ipv4Addr::new(10, 0, 0, 9), 80, 4000, CHUNK_ABORT)
        );
    }
}
