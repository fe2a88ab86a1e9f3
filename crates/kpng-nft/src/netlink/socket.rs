//! A `NETLINK_NETFILTER` socket that commits batches and reports the first failure.

use std::io;
use std::time::Duration;

use netlink_sys::{Socket, SocketAddr};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

use super::wire::{Batch, NETLINK_NETFILTER};

const NLMSG_ERROR: u16 = 2;
const NLMSG_HDRLEN: usize = 16;

/// How long to wait for the kernel's answers before giving up on a batch.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// A batch the kernel did not apply.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    /// The socket failed.
    #[error("netlink {op}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The kernel rejected a message; the whole batch was aborted.
    #[error("the kernel rejected `{what}`")]
    Rejected {
        /// The rejected message, in nft syntax.
        what: String,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// The kernel did not answer every message.
    #[error("the kernel answered {answered} of {sent} messages")]
    Incomplete {
        /// Messages sent.
        sent: usize,
        /// Answers received.
        answered: usize,
    },
}

/// A connected netfilter netlink socket.
pub struct NetlinkSocket {
    socket: Socket,
    seq: u32,
    /// Bytes handed to the kernel so far.
    sent: u64,
}

fn io_error(op: &'static str) -> impl FnOnce(io::Error) -> CommitError {
    move |source| CommitError::Io { op, source }
}

impl NetlinkSocket {
    /// Opens and connects a socket to the kernel.
    pub fn open() -> Result<Self, CommitError> {
        let mut socket = Socket::new(NETLINK_NETFILTER).map_err(io_error("socket"))?;
        socket.bind_auto().map_err(io_error("bind"))?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(io_error("connect"))?;
        // Errors then carry only the header of the failed message, not its whole payload.
        let _ = socket.set_cap_ack(true);
        let _ = setsockopt(&socket, sockopt::RcvBufForce, &(8 << 20));
        let timeout = TimeVal::new(ANSWER_TIMEOUT.as_secs() as i64, 0);
        setsockopt(&socket, sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| CommitError::Io { op: "setsockopt", source: e.into() })?;
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() as u32);
        Ok(NetlinkSocket { socket, seq, sent: 0 })
    }

    /// Bytes sent to the kernel since the socket was opened (requests and transactions).
    pub fn bytes_sent(&self) -> u64 {
        self.sent
    }

    /// Receives one datagram. The buffer is larger than any datagram the kernel sends: the
    /// kernel sizes dump datagrams after the largest read so far (up to 32 KiB), and a set's
    /// dump restarts its walk from the first element for every datagram, so small reads make
    /// reading a large set back quadratic in the number of datagrams.
    fn receive(&mut self) -> Result<Vec<u8>, CommitError> {
        let mut buf = Vec::with_capacity(RECEIVE_BUFFER);
        let len = self.socket.recv(&mut buf, libc_msg_trunc()).map_err(io_error("receive"))?;
        if len > buf.len() {
            return Err(CommitError::Io {
                op: "receive",
                source: io::Error::other(format!("a {len}-byte datagram did not fit the buffer")),
            });
        }
        Ok(buf)
    }

    /// Sends one datagram, counting its bytes.
    fn send(&mut self, bytes: &[u8]) -> Result<usize, CommitError> {
        let sent = self.socket.send(bytes, 0).map_err(io_error("send"))?;
        self.sent += sent as u64;
        Ok(sent)
    }

    /// A new batch numbered after the previous one.
    pub fn batch(&self) -> Batch {
        Batch::new(self.seq)
    }

    /// Sends `batch` as one transaction and waits for the kernel's answer to every message.
    /// On error, nothing of the batch is in force.
    pub fn commit(&mut self, batch: Batch) -> Result<(), CommitError> {
        let (bytes, last_seq, messages) = batch.finish();
        self.seq = last_seq;
        if messages.is_empty() {
            return Ok(());
        }
        // A batch must fit in the socket's send buffer in one datagram.
        let _ = setsockopt(&self.socket, sockopt::SndBufForce, &(bytes.len() + (1 << 16)));
        let sent = self.send(&bytes)?;
        if sent != bytes.len() {
            return Err(CommitError::Io { op: "send", source: io::Error::other("short write") });
        }
        let first_seq = messages[0].0;
        let mut answered = 0usize;
        let mut failure: Option<(u32, i32)> = None;
        while answered < messages.len() {
            let datagram = self.receive()?;
            for (seq, code) in answers(&datagram) {
                if seq < first_seq || seq > last_seq {
                    continue;
                }
                answered += 1;
                if code != 0 && failure.is_none() {
                    failure = Some((seq, code));
                }
            }
        }
        if let Some((seq, code)) = failure {
            let what = messages
                .iter()
                .find(|(s, _)| *s == seq)
                .map_or_else(|| format!("message {seq}"), |(_, w)| w.clone());
            return Err(CommitError::Rejected {
                what,
                source: io::Error::from_raw_os_error(-code),
            });
        }
        if answered < messages.len() {
            return Err(CommitError::Incomplete { sent: messages.len(), answered });
        }
        Ok(())
    }
}

impl NetlinkSocket {
    /// Sends a dump request and returns the payload (after the `nfgenmsg`) of every message
    /// of the answer. A missing table or set is an empty answer.
    pub fn dump(&mut self, request: &[u8]) -> Result<Vec<Vec<u8>>, CommitError> {
        self.seq = self.seq.wrapping_add(1);
        let mut request = request.to_vec();
        request[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        self.send(&request)?;
        let mut payloads = Vec::new();
        loop {
            let datagram = self.receive()?;
            let mut at = 0;
            while at + NLMSG_HDRLEN <= datagram.len() {
                let word = |i: usize| {
                    u32::from_ne_bytes(datagram[i..i + 4].try_into().unwrap_or_default())
                };
                let len = word(at) as usize;
                let kind = u16::from_ne_bytes([datagram[at + 4], datagram[at + 5]]);
                if len < NLMSG_HDRLEN || at + len > datagram.len() {
                    break;
                }
                if word(at + 8) == self.seq {
                    match kind {
                        NLMSG_DONE => return Ok(payloads),
                        NLMSG_ERROR => {
                            let code = word(at + NLMSG_HDRLEN) as i32;
                            if code == 0 || code == -libc_enoent() {
                                return Ok(payloads);
                            }
                            return Err(CommitError::Io {
                                op: "dump",
                                source: io::Error::from_raw_os_error(-code),
                            });
                        }
                        _ if len >= NLMSG_HDRLEN + 4 => {
                            payloads.push(datagram[at + NLMSG_HDRLEN + 4..at + len].to_vec())
                        }
                        _ => {}
                    }
                }
                at += (len + 3) & !3;
            }
        }
    }
}

impl NetlinkSocket {
    /// Sends requests that each expect an acknowledgement (several per datagram) and
    /// returns the error code of each, in order (0: done).
    pub fn requests(&mut self, requests: &[Vec<u8>]) -> Result<Vec<i32>, CommitError> {
        let mut codes = Vec::with_capacity(requests.len());
        for chunk in requests.chunks(64) {
            let first = self.seq.wrapping_add(1);
            let mut datagram = Vec::new();
            for request in chunk {
                self.seq = self.seq.wrapping_add(1);
                let mut request = request.clone();
                request[8..12].copy_from_slice(&self.seq.to_ne_bytes());
                datagram.extend_from_slice(&request);
            }
            self.send(&datagram)?;
            let mut answers_by_seq = vec![None; chunk.len()];
            let mut pending = chunk.len();
            while pending > 0 {
                let reply = self.receive()?;
                for (seq, code) in answers(&reply) {
                    let index = seq.wrapping_sub(first) as usize;
                    if index < chunk.len() && answers_by_seq[index].is_none() {
                        answers_by_seq[index] = Some(code);
                        pending -= 1;
                    }
                }
            }
            codes.extend(answers_by_seq.into_iter().map(|c| c.unwrap_or(0)));
        }
        Ok(codes)
    }
}

const NLMSG_DONE: u16 = 3;

/// Bytes read at once: above the kernel's largest datagram.
const RECEIVE_BUFFER: usize = 64 * 1024;

/// `MSG_TRUNC`: `recv` returns a datagram's whole length even when it did not fit.
fn libc_msg_trunc() -> i32 {
    nix::sys::socket::MsgFlags::MSG_TRUNC.bits()
}

fn libc_enoent() -> i32 {
    nix::errno::Errno::ENOENT as i32
}

/// `(sequence number, error code)` of every `NLMSG_ERROR` in a datagram (code 0 is an ack).
fn answers(datagram: &[u8]) -> Vec<(u32, i32)> {
    let mut out = Vec::new();
    let mut at = 0;
    while at + NLMSG_HDRLEN <= datagram.len() {
        let word = |i: usize| u32::from_ne_bytes(datagram[i..i + 4].try_into().unwrap_or_default());
        let len = word(at) as usize;
        let kind = u16::from_ne_bytes([datagram[at + 4], datagram[at + 5]]);
        let seq = word(at + 8);
        if len < NLMSG_HDRLEN || at + len > datagram.len() {
            break;
        }
        if kind == NLMSG_ERROR && len >= NLMSG_HDRLEN + 4 {
            out.push((seq, word(at + NLMSG_HDRLEN) as i32));
        }
        at += (len + 3) & !3;
    }
    out
}
