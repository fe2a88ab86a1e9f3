//! Raw API requests over a `kube::Client`: a list page as bytes, a watch as a stream of
//! lines, and failures classified by what the loop must do about them. Nothing here logs
//! a response body: an error carries the server's status message, shortened.

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;
use serde::Deserialize;

/// How long a list page may take before the request is abandoned.
pub const PAGE_TIMEOUT: Duration = Duration::from_secs(60);

/// At most this much of an error body is read, and this much of its message kept.
const ERROR_BODY_LIMIT: usize = 64 * 1024;
const MESSAGE_LIMIT: usize = 300;

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// The server answered with an error status (or a watch `ERROR` event).
    #[error("{code} {reason}: {message}")]
    Status {
        /// The HTTP status code (or the Status object's code).
        code: u16,
        /// The Status object's reason (`Expired`, `NotFound`...), or the HTTP reason.
        reason: String,
        /// The Status object's message, shortened.
        message: String,
    },
    /// The request could not be sent or its answer not read: the URL, and the error with
    /// its causes (`client error (Connect): tcp connect error: Connection refused`).
    #[error("GET {url}: {cause}")]
    Transport {
        /// The URL requested.
        url: String,
        /// What failed, with its causes.
        cause: String,
    },
    /// The request did not complete in time.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The answer is not what the API sends.
    #[error("invalid answer: {0}")]
    Invalid(String),
}

impl ApiError {
    /// A request to `url` that failed in transport.
    fn transport(url: &str, error: kube::Error) -> ApiError {
        ApiError::Transport { url: url.to_string(), cause: kpng_api::client::chain(&error) }
    }

    /// The status code, for a status error.
    pub fn code(&self) -> Option<u16> {
        match self {
            ApiError::Status { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// A status error from a `Status` object's JSON (a watch `ERROR` event's object, or an
    /// error response's body), with `fallback` as the code when the object has none.
    pub fn from_status(json: &[u8], fallback: u16) -> ApiError {
        #[derive(Deserialize, Default)]
        struct Status {
            code: Option<u16>,
            reason: Option<String>,
            message: Option<String>,
        }
        let status: Status = serde_json::from_slice(json).unwrap_or_default();
        let mut message = status.message.unwrap_or_default();
        if message.len() > MESSAGE_LIMIT {
            let cut = (0..=MESSAGE_LIMIT).rev().find(|i| message.is_char_boundary(*i));
            message.truncate(cut.unwrap_or(0));
            message.push_str("...");
        }
        ApiError::Status {
            code: status.code.unwrap_or(fallback),
            reason: status.reason.unwrap_or_default(),
            message: crate::convert::printable(&message).into_owned(),
        }
    }
}

/// Sends `GET url` and returns the response body if the status is a success.
async fn send(client: &kube::Client, url: &str) -> Result<kube::client::Body, ApiError> {
    let request = http::Request::get(url)
        .header(http::header::ACCEPT, "application/json")
        .body(kube::client::Body::empty())
        .map_err(|e| ApiError::Invalid(format!("request {url:?}: {e}")))?;
    let response = client.send(request).await.map_err(|e| ApiError::transport(url, e))?;
    let status = response.status();
    let body = response.into_body();
    if status.is_success() {
        return Ok(body);
    }
    let bytes = read_limited(body, ERROR_BODY_LIMIT).await.unwrap_or_default();
    let mut error = ApiError::from_status(&bytes, status.as_u16());
    if let ApiError::Status { reason, .. } = &mut error
        && reason.is_empty()
    {
        *reason = status.canonical_reason().unwrap_or_default().to_string();
    }
    Err(error)
}

/// At most `limit` bytes of a body.
async fn read_limited(mut body: kube::client::Body, limit: usize) -> Option<Bytes> {
    let mut out = BytesMut::new();
    while out.len() < limit {
        match body.frame().await {
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    out.extend_from_slice(&data);
                }
            }
            _ => break,
        }
    }
    out.truncate(limit);
    Some(out.freeze())
}

/// One list page: the whole body.
pub async fn get(client: &kube::Client, url: &str) -> Result<Bytes, ApiError> {
    let fetch = async {
        let body = send(client, url).await?;
        let collected = body.collect().await.map_err(|e| ApiError::transport(url, e))?;
        Ok(collected.to_bytes())
    };
    tokio::time::timeout(PAGE_TIMEOUT, fetch).await.map_err(|_| ApiError::Timeout(PAGE_TIMEOUT))?
}

/// A watch response: newline-separated JSON events.
pub struct WatchLines {
    url: String,
    body: kube::client::Body,
    buffer: BytesMut,
    idle: Duration,
}

/// Opens a watch; the stream fails if nothing arrives for `idle`.
pub async fn watch(
    client: &kube::Client,
    url: &str,
    idle: Duration,
) -> Result<WatchLines, ApiError> {
    let opened = tokio::time::timeout(PAGE_TIMEOUT, send(client, url));
    let body = opened.await.map_err(|_| ApiError::Timeout(PAGE_TIMEOUT))??;
    Ok(WatchLines { url: url.to_string(), body, buffer: BytesMut::new(), idle })
}

impl WatchLines {
    /// The next line (without its newline), or `None` when the server ended the watch.
    pub async fn next_line(&mut self) -> Result<Option<Bytes>, ApiError> {
        loop {
            if let Some(at) = self.buffer.iter().position(|b| *b == b'\n') {
                let line = self.buffer.split_to(at + 1).freeze();
                let line = line.slice(..at);
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                return Ok(Some(line));
            }
            let frame = tokio::time::timeout(self.idle, self.body.frame())
                .await
                .map_err(|_| ApiError::Timeout(self.idle))?;
            match frame {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buffer.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => return Err(ApiError::transport(&self.url, e)),
                // A last line without a newline still counts.
                None if !self.buffer.iter().all(u8::is_ascii_whitespace) => {
                    return Ok(Some(std::mem::take(&mut self.buffer).freeze()));
                }
                None => return Ok(None),
            }
        }
    }
}
