//! Sockets over netlink (`sock_diag`): dump a namespace's connected UDP sockets, and destroy
//! one by its addresses and cookie, as `ss -K` does. Bytes only; the socket carries them.
//!
//! Destroying needs `CONFIG_INET_DIAG_DESTROY`; without it the kernel answers
//! `EOPNOTSUPP`. The socket's owner sees `ECONNABORTED`, and the socket is disconnected.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::message::{NLM_F_ACK, NLM_F_DUMP, NLM_F_REQUEST, NLMSG_HDRLEN};

/// The netlink protocol of socket diagnostics.
pub const NETLINK_SOCK_DIAG: isize = 4;

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const SOCK_DESTROY: u16 = 21;
const AF_INET: u8 = 2;
const AF_INET6: u8 = 10;
const IPPROTO_UDP: u8 = 17;
/// A connected UDP socket is in `TCP_ESTABLISHED` as far as the kernel's states go.
const TCP_ESTABLISHED: u32 = 1;

/// `struct inet_diag_sockid`.
const SOCKID_LEN: usize = 48;
/// `struct inet_diag_req_v2`.
const REQUEST_LEN: usize = 8 + SOCKID_LEN;
/// `struct inet_diag_msg` up to the end of its socket id.
const MESSAGE_ID_END: usize = 4 + SOCKID_LEN;

/// One UDP socket, as the kernel names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UdpSocket {
    /// Whether it is an IPv6 socket (its addresses may be IPv4-mapped).
    pub v6: bool,
    /// Its own address.
    pub local: SocketAddr,
    /// The address it is connected to.
    pub remote: SocketAddr,
    /// The interface it is bound to (0: none).
    pub interface: u32,
    /// Its cookie: the number BPF programs know it by (`bpf_get_socket_cookie`).
    pub cookie: u64,
}

/// A dump request for the connected UDP sockets of one family (`v6`: the IPv6 sockets).
pub fn dump_connected_udp(v6: bool) -> Vec<u8> {
    let family = if v6 { AF_INET6 } else { AF_INET };
    message(SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, |b| {
        b.extend_from_slice(&[family, IPPROTO_UDP, 0, 0]);
        b.extend_from_slice(&(1u32 << TCP_ESTABLISHED).to_ne_bytes());
        b.extend_from_slice(&[0u8; SOCKID_LEN]);
    })
}

/// A request (acknowledged) that destroys `socket`. The kernel finds it by its addresses
/// and checks its cookie, so a socket closed meanwhile is never mistaken for another.
pub fn destroy(socket: &UdpSocket) -> Vec<u8> {
    let family = if socket.v6 { AF_INET6 } else { AF_INET };
    message(SOCK_DESTROY, NLM_F_REQUEST | NLM_F_ACK, |b| {
        b.extend_from_slice(&[family, IPPROTO_UDP, 0, 0]);
        b.extend_from_slice(&(1u32 << TCP_ESTABLISHED).to_ne_bytes());
        b.extend_from_slice(&socket.local.port().to_be_bytes());
        b.extend_from_slice(&socket.remote.port().to_be_bytes());
        put_address(b, socket.local.ip());
        put_address(b, socket.remote.ip());
        b.extend_from_slice(&socket.interface.to_ne_bytes());
        b.extend_from_slice(&(socket.cookie as u32).to_ne_bytes());
        b.extend_from_slice(&((socket.cookie >> 32) as u32).to_ne_bytes());
    })
}

/// The socket in a dumped message body (`struct inet_diag_msg`).
pub fn udp_socket(body: &[u8]) -> Option<UdpSocket> {
    let id = body.get(4..MESSAGE_ID_END)?;
    let v6 = match body[0] {
        AF_INET => false,
        AF_INET6 => true,
        _ => return None,
    };
    let word = |at: usize| u32::from_ne_bytes([id[at], id[at + 1], id[at + 2], id[at + 3]]);
    let address = |at: usize| -> Option<IpAddr> {
        let bytes: [u8; 16] = id.get(at..at + 16)?.try_into().ok()?;
        Some(match v6 {
            false => Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]).into(),
            true => Ipv6Addr::from(bytes).into(),
        })
    };
    let local = SocketAddr::new(address(4)?, u16::from_be_bytes([id[0], id[1]]));
    let remote = SocketAddr::new(address(20)?, u16::from_be_bytes([id[2], id[3]]));
    let cookie = u64::from(word(40)) | (u64::from(word(44)) << 32);
    Some(UdpSocket { v6, local, remote, interface: word(36), cookie })
}

fn put_address(b: &mut Vec<u8>, ip: IpAddr) {
    let mut bytes = [0u8; 16];
    match ip {
        IpAddr::V4(v4) => bytes[..4].copy_from_slice(&v4.octets()),
        IpAddr::V6(v6) => bytes = v6.octets(),
    }
    b.extend_from_slice(&bytes);
}

/// A `sock_diag` message: its header (the socket fills the sequence number), then `body`.
fn message(kind: u16, flags: u16, body: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
    let mut b = Vec::with_capacity(NLMSG_HDRLEN + REQUEST_LEN);
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&kind.to_ne_bytes());
    b.extend_from_slice(&flags.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    b.extend_from_slice(&0u32.to_ne_bytes());
    body(&mut b);
    let len = b.len() as u32;
    b[..4].copy_from_slice(&len.to_ne_bytes());
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_destroy_request_names_the_socket_as_the_dump_did() {
        let socket = UdpSocket {
            v6: false,
            local: "10.244.0.50:40000".parse().unwrap(),
            remote: "10.244.0.10:8080".parse().unwrap(),
            interface: 0,
            cookie: 0x1_0000_0002,
        };
        let request = destroy(&socket);
        assert_eq!(request.len(), NLMSG_HDRLEN + REQUEST_LEN);
        assert_eq!(u16::from_ne_bytes([request[4], request[5]]), SOCK_DESTROY);
        // A dumped message carries the same id after a 4-byte prefix where the request has 8.
        let body = &request[NLMSG_HDRLEN..];
        let mut dumped = vec![AF_INET, TCP_ESTABLISHED as u8, 0, 0];
        dumped.extend_from_slice(&body[8..]);
        dumped.extend_from_slice(&[0u8; 20]);
        assert_eq!(udp_socket(&dumped), Some(socket));
    }

    #[test]
    fn ipv6_sockets_keep_their_mapped_addresses() {
        let socket = UdpSocket {
            v6: true,
            local: "[::ffff:10.244.0.50]:40000".parse().unwrap(),
            remote: "[fd00::10]:53".parse().unwrap(),
            interface: 3,
            cookie: 77,
        };
        let body = &destroy(&socket)[NLMSG_HDRLEN..];
        let mut dumped = vec![AF_INET6, 1, 0, 0];
        dumped.extend_from_slice(&body[8..]);
        assert_eq!(udp_socket(&dumped), Some(socket));
        assert_eq!(udp_socket(&dumped[..30]), None, "a short message is no socket");
    }
}
