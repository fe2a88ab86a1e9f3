//! [`Client`]: nftlb's REST API over plain HTTP/1.1, one connection per call, as nftlb
//! serves it (it reads a request's head and body together and closes after answering).

use std::io::{Read, Write};
use std::net::TcpStream;
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
        let error =
            Client::new(&url, "secret").unwrap().call("DELETE", "/farms/x", "").unwrap_err();
        let request = server.join().unwrap();
        assert!(request.starts_with("DELETE /farms/x HTTP/1.1\r\n"), "{request}");
        assert!(request.contains("\r\nKey: secret\r\n"), "{request}");
        let text = error.to_string();
        assert!(text.contains("DELETE /farms/x") && text.contains("400"), "{text}");
    }
}
