//! Active-mode FTP for dataplane tests, the smallest part of it that exercises a conntrack
//! helper: a server that answers `RETR` by opening the data connection to the address the
//! client gave with `PORT`, and a client that logs in, listens, sends `PORT` and `RETR`,
//! and reads the file. The file is `<server name> <control peer address> <PORT address>`:
//! behind a masquerading NAT, the two addresses agree only if a NAT helper rewrote `PORT`.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::Duration;

use crate::netns::Netns;
use crate::topology::{in_netns, spawn_in_netns};

const TIMEOUT: Duration = Duration::from_secs(5);

/// Serves FTP on `port` in `ns` for the rest of the process, answering as `name`. The
/// server's threads live in `ns`: the data connections they open start there.
pub fn serve(ns: &Netns, name: &str, port: u16) {
    let name = name.to_string();
    let (ready_tx, ready) = std::sync::mpsc::channel();
    spawn_in_netns(ns, move || {
        let listener = match TcpListener::bind(("0.0.0.0", port)) {
            Ok(listener) => {
                let _ = ready_tx.send(Ok(()));
                listener
            }
            Err(e) => {
                let _ = ready_tx.send(Err(format!("binding port {port}: {e}")));
                return;
            }
        };
        for stream in listener.incoming().map_while(Result::ok) {
            let name = name.clone();
            thread::spawn(move || {
                let _ = session(&name, stream);
            });
        }
    });
    if let Err(e) = ready.recv().unwrap_or_else(|_| Err("the server thread ended".into())) {
        panic!("the FTP server in {}: {e}", ns.name());
    }
}

/// `h1,h2,h3,h4,p1,p2` → the address.
fn parse_port(arg: &str) -> Option<SocketAddr> {
    let n: Vec<u8> = arg.split(',').map(|p| p.trim().parse().ok()).collect::<Option<_>>()?;
    let [a, b, c, d, p1, p2] = n[..] else { return None };
    let ip = Ipv4Addr::new(a, b, c, d);
    Some(SocketAddr::new(IpAddr::V4(ip), u16::from(p1) << 8 | u16::from(p2)))
}

fn session(name: &str, mut control: TcpStream) -> std::io::Result<()> {
    control.set_read_timeout(Some(TIMEOUT))?;
    let peer = control.peer_addr()?;
    let mut lines = BufReader::new(control.try_clone()?);
    control.write_all(b"220 kpng test FTP\r\n")?;
    let mut data_to = None;
    loop {
        let mut line = String::new();
        if lines.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let (verb, arg) = line.trim_end().split_once(' ').unwrap_or((line.trim_end(), ""));
        let failed;
        let reply: &[u8] = match verb.to_ascii_uppercase().as_str() {
            "USER" => b"331 any password\r\n",
            "PASS" => b"230 logged in\r\n",
            "TYPE" => b"200 ok\r\n",
            "PORT" => match parse_port(arg) {
                Some(addr) => {
                    data_to = Some(addr);
                    b"200 PORT ok\r\n"
                }
                None => b"501 bad PORT\r\n",
            },
            "RETR" => {
                let Some(addr) = data_to.take() else {
                    control.write_all(b"425 PORT first\r\n")?;
                    continue;
                };
                control.write_all(b"150 opening data connection\r\n")?;
                match TcpStream::connect_timeout(&addr, TIMEOUT) {
                    Ok(mut data) => {
                        let file = format!("{name} {} {}\n", peer.ip(), addr.ip());
                        data.write_all(file.as_bytes())?;
                        drop(data);
                        b"226 transfer complete\r\n"
                    }
                    Err(e) => {
                        failed = format!("425 cannot open a data connection to {addr}: {e}\r\n");
                        failed.as_bytes()
                    }
                }
            }
            "QUIT" => {
                control.write_all(b"221 bye\r\n")?;
                return Ok(());
            }
            _ => b"502 not implemented\r\n",
        };
        control.write_all(reply)?;
    }
}

/// What one retrieval saw.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retrieved {
    /// The file: `<server name> <the address the server saw on the control connection>
    /// <the address PORT gave it>`.
    pub content: String,
    /// Where the data connection came from, as the client saw it.
    pub data_peer: SocketAddr,
}

/// From `ns`, retrieves a file from the FTP server at `server` in active mode.
pub fn retrieve(ns: &Netns, server: SocketAddr) -> Result<Retrieved, String> {
    in_netns(ns, move || client(server).map_err(|e| e.to_string()))
}

fn expect(lines: &mut BufReader<TcpStream>, code: &str) -> std::io::Result<()> {
    let mut line = String::new();
    lines.read_line(&mut line)?;
    if line.starts_with(code) {
        Ok(())
    } else {
        Err(std::io::Error::other(format!("expected {code}, the server said {line:?}")))
    }
}

fn client(server: SocketAddr) -> std::io::Result<Retrieved> {
    let mut control = TcpStream::connect_timeout(&server, TIMEOUT)?;
    control.set_read_timeout(Some(TIMEOUT))?;
    let mut lines = BufReader::new(control.try_clone()?);
    expect(&mut lines, "220")?;
    control.write_all(b"USER test\r\n")?;
    expect(&mut lines, "331")?;
    control.write_all(b"PASS test\r\n")?;
    expect(&mut lines, "230")?;
    let local = control.local_addr()?;
    let listener = TcpListener::bind((local.ip(), 0))?;
    let IpAddr::V4(ip) = local.ip() else {
        return Err(std::io::Error::other("active-mode PORT is IPv4 only"));
    };
    let local = listener.local_addr()?;
    let port = local.port();
    let [a, b, c, d] = ip.octets();
    let command = format!("PORT {a},{b},{c},{d},{},{}\r\n", port >> 8, port & 0xff);
    control.write_all(command.as_bytes())?;
    expect(&mut lines, "200")?;
    control.write_all(b"RETR file\r\n")?;
    expect(&mut lines, "150")?;
    listener.set_nonblocking(true)?;
    let deadline = std::time::Instant::now() + TIMEOUT;
    let (mut data, data_peer) = loop {
        match listener.accept() {
            Ok(accepted) => break accepted,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if std::time::Instant::now() > deadline {
                    let mut said = String::new();
                    let _ = lines.read_line(&mut said);
                    let why =
                        format!("no data connection came to {local}; the server said {said:?}");
                    return Err(std::io::Error::other(why));
                }
                thread::sleep(Duration::from_millis(10));
            }
            Err(e) => return Err(e),
        }
    };
    data.set_nonblocking(false)?;
    data.set_read_timeout(Some(TIMEOUT))?;
    let mut content = String::new();
    data.read_to_string(&mut content)?;
    expect(&mut lines, "226")?;
    let _ = control.write_all(b"QUIT\r\n");
    Ok(Retrieved { content: content.trim_end().to_string(), data_peer })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_arguments_read_as_addresses() {
        assert_eq!(parse_port("192,168,10,100,4,1"), Some("192.168.10.100:1025".parse().unwrap()));
        assert_eq!(parse_port("1,2,3"), None);
        assert_eq!(parse_port("1,2,3,4,5,300"), None);
    }
}
