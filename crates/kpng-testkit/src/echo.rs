//! A tiny server for dataplane tests: answers every TCP connection and UDP datagram with
//! `<name> <address of the peer it saw>`, so a test learns which endpoint answered and
//! whether the client's address was translated on the way.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::thread;
use std::time::Duration;

fn reply(name: &str, peer: SocketAddr) -> String {
    format!("{name} {}\n", peer.ip().to_canonical())
}

fn serve_tcp(name: String, listener: TcpListener) {
    for mut stream in listener.incoming().map_while(Result::ok) {
        let name = name.clone();
        thread::spawn(move || answer_tcp(&name, &mut stream));
    }
}

fn answer_tcp(name: &str, stream: &mut TcpStream) {
    let Ok(peer) = stream.peer_addr() else { return };
    let _ = stream.write_all(reply(name, peer).as_bytes());
    // Keep the connection while the client keeps it (lets tests hold a connection open),
    // answering each line with the same reply.
    let _ = stream.set_read_timeout(Some(Duration::from_secs(600)));
    let mut buf = [0u8; 256];
    while let Ok(n) = stream.read(&mut buf) {
        if n == 0 || stream.write_all(reply(name, peer).as_bytes()).is_err() {
            break;
        }
    }
}

fn serve_udp(name: String, socket: UdpSocket) {
    let mut buf = [0u8; 1500];
    while let Ok((_, peer)) = socket.recv_from(&mut buf) {
        let _ = socket.send_to(reply(&name, peer).as_bytes(), peer);
    }
}

/// Bound sockets, ready to serve.
pub struct Servers {
    tcp: Vec<TcpListener>,
    udp: Vec<UdpSocket>,
}

/// Binds TCP and UDP on the given ports, on every address of both families.
pub fn bind(tcp: &[u16], udp: &[u16]) -> std::io::Result<Servers> {
    Ok(Servers {
        tcp: tcp.iter().map(|p| TcpListener::bind(("::", *p))).collect::<Result<_, _>>()?,
        udp: udp.iter().map(|p| UdpSocket::bind(("::", *p))).collect::<Result<_, _>>()?,
    })
}

impl Servers {
    /// Answers as `name`, forever.
    pub fn run(self, name: &str) {
        let mut handles = Vec::new();
        for listener in self.tcp {
            let name = name.to_string();
            handles.push(thread::spawn(move || serve_tcp(name, listener)));
        }
        for socket in self.udp {
            let name = name.to_string();
            handles.push(thread::spawn(move || serve_udp(name, socket)));
        }
        for handle in handles {
            let _ = handle.join();
        }
    }
}
