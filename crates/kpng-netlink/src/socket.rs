//! [`NetlinkSocket`]: one connected netlink socket. It commits nf_tables batches (reporting
//! the first message the kernel rejected), runs dumps, sends acknowledged requests, and
//! receives notifications.

use std::io;
use std::time::Duration;

use netlink_sys::{Socket, SocketAddr};
use nix::sys::socket::{setsockopt, sockopt};
use nix::sys::time::TimeVal;

use crate::message::{FinishedBatch, NLMSG_DONE, NLMSG_ERROR, messages};

/// How long to wait for the kernel's answers before giving up.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);

/// Bytes read at once: above the kernel's largest datagram. The kernel sizes dump
/// datagrams after the largest read so far (up to 32 KiB), and a set's dump restarts its
/// walk from the first element for every datagram, so small reads make reading a large set
/// back quadratic in the number of datagrams.
const RECEIVE_BUFFER: usize = 64 * 1024;

/// A netlink exchange that failed.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The socket failed.
    #[error("netlink {op}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The error.
        #[source]
        source: io::Error,
    },
    /// The kernel rejected a message of a batch; the whole batch was aborted.
    #[error("the kernel rejected `{what}`")]
    Rejected {
        /// The rejected message, described in nft syntax.
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

impl NetlinkError {
    /// The kernel's error number, when the kernel answered with one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Io { source, .. } | NetlinkError::Rejected { source, .. } => {
                source.raw_os_error()
            }
            NetlinkError::Incomplete { .. } => None,
        }
    }
}

fn io_error(op: &'static str) -> impl FnOnce(io::Error) -> NetlinkError {
    move |source| NetlinkError::Io { op, source }
}

/// A connected netlink socket of one protocol.
pub struct NetlinkSocket {
    socket: Socket,
    seq: u32,
    /// Bytes handed to the kernel so far.
    sent: u64,
}

impl std::fmt::Debug for NetlinkSocket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NetlinkSocket").field("seq", &self.seq).finish_non_exhaustive()
    }
}

impl NetlinkSocket {
    /// Opens and connects a socket of `protocol` (see [`crate::message::NETLINK_NETFILTER`]).
    pub fn open(protocol: isize) -> Result<Self, NetlinkError> {
        let mut socket = Socket::new(protocol).map_err(io_error("socket"))?;
        socket.bind_auto().map_err(io_error("bind"))?;
        socket.connect(&SocketAddr::new(0, 0)).map_err(io_error("connect"))?;
        // Errors then carry only the header of the failed message, not its whole payload.
        let _ = socket.set_cap_ack(true);
        let _ = setsockopt(&socket, sockopt::RcvBufForce, &(8 << 20));
        let timeout = TimeVal::new(ANSWER_TIMEOUT.as_secs() as i64, 0);
        setsockopt(&socket, sockopt::ReceiveTimeout, &timeout)
            .map_err(|e| NetlinkError::Io { op: "setsockopt", source: e.into() })?;
        let seq = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_secs() as u32);
        Ok(NetlinkSocket { socket, seq, sent: 0 })
    }

    /// Opens a socket of `protocol` in the network namespace `netns` (an open
    /// `/proc/<pid>/ns/net`, or a bind mount of one). A socket stays in the namespace it
    /// was created in: a short-lived thread enters `netns`, opens it, and ends, so this
    /// thread's namespace never changes.
    pub fn open_in(protocol: isize, netns: &std::fs::File) -> Result<Self, NetlinkError> {
        std::thread::scope(|scope| {
            let opened = std::thread::Builder::new()
                .name("kpng-netns".into())
                .spawn_scoped(scope, || {
                    nix::sched::setns(netns, nix::sched::CloneFlags::CLONE_NEWNET)
                        .map_err(|e| NetlinkError::Io { op: "setns", source: e.into() })?;
                    NetlinkSocket::open(protocol)
                })
                .map_err(io_error("spawn"))?;
            opened.join().unwrap_or_else(|_| {
                Err(NetlinkError::Io { op: "setns", source: io::Error::other("thread panicked") })
            })
        })
    }

    /// Subscribes to multicast `group` (a notification group of the protocol).
    pub fn subscribe(&mut self, group: u32) -> Result<(), NetlinkError> {
        self.socket.add_membership(group).map_err(io_error("subscribe"))
    }

    /// Stops receiving multicast `group`; what was queued before stays to be received.
    pub fn unsubscribe(&mut self, group: u32) -> Result<(), NetlinkError> {
        self.socket.drop_membership(group).map_err(io_error("unsubscribe"))
    }

    /// Receives one datagram from the kernel if one is queued, without waiting: `None` when
    /// none is. Notifications lost because the socket's buffer was full fail with `ENOBUFS`
    /// once ([`NetlinkError::errno`]); receiving goes on after it.
    ///
    /// A datagram another socket sent to a group this one joined is dropped (the kernel's
    /// port id is 0): a process allowed to send to the group could otherwise announce a
    /// commit that touched nothing and hide a change behind it.
    pub fn try_receive(&mut self) -> Result<Option<Vec<u8>>, NetlinkError> {
        let flags = (nix::sys::socket::MsgFlags::MSG_TRUNC
            | nix::sys::socket::MsgFlags::MSG_DONTWAIT)
            .bits();
        loop {
            let mut buf = Vec::with_capacity(RECEIVE_BUFFER);
            let (len, from) = match self.socket.recv_from(&mut buf, flags) {
                Ok(received) => received,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(None),
                Err(source) => return Err(NetlinkError::Io { op: "receive", source }),
            };
            if from.port_number() != 0 {
                tracing::warn!(
                    port = from.port_number(),
                    "dropped a netlink datagram another process sent to a notification group"
                );
                continue;
            }
            if len > buf.len() {
                let error =
                    io::Error::other(format!("a {len}-byte datagram did not fit the buffer"));
                return Err(NetlinkError::Io { op: "receive", source: error });
            }
            return Ok(Some(buf));
        }
    }

    /// Waits without a deadline for notifications (after [`NetlinkSocket::subscribe`]).
    pub fn clear_timeout(&mut self) -> Result<(), NetlinkError> {
        let none = TimeVal::new(0, 0);
        setsockopt(&self.socket, sockopt::ReceiveTimeout, &none)
            .map_err(|e| NetlinkError::Io { op: "setsockopt", source: e.into() })
    }

    /// Bytes sent to the kernel since the socket was opened.
    pub fn bytes_sent(&self) -> u64 {
        self.sent
    }

    /// The sequence number the next batch starts after.
    pub fn seq(&self) -> u32 {
        self.seq
    }

    /// Receives one datagram.
    pub fn receive(&mut self) -> Result<Vec<u8>, NetlinkError> {
        let mut buf = Vec::with_capacity(RECEIVE_BUFFER);
        let flags = nix::sys::socket::MsgFlags::MSG_TRUNC.bits();
        let len = self.socket.recv(&mut buf, flags).map_err(io_error("receive"))?;
        if len > buf.len() {
            let error = io::Error::other(format!("a {len}-byte datagram did not fit the buffer"));
            return Err(NetlinkError::Io { op: "receive", source: error });
        }
        Ok(buf)
    }

    fn send(&mut self, bytes: &[u8]) -> Result<(), NetlinkError> {
        let sent = self.socket.send(bytes, 0).map_err(io_error("send"))?;
        self.sent += sent as u64;
        if sent != bytes.len() {
            return Err(NetlinkError::Io { op: "send", source: io::Error::other("short write") });
        }
        Ok(())
    }

    /// Sends `batch` as one transaction and waits for the kernel's answer to every message.
    /// On error, nothing of the batch is in force.
    pub fn commit(&mut self, batch: FinishedBatch) -> Result<(), NetlinkError> {
        let FinishedBatch { bytes, last_seq, descriptions } = batch;
        self.seq = last_seq;
        let Some(first_seq) = descriptions.first().map(|(seq, _)| *seq) else { return Ok(()) };
        // A batch must fit in the socket's send buffer in one datagram.
        let _ = setsockopt(&self.socket, sockopt::SndBufForce, &(bytes.len() + (1 << 16)));
        self.send(&bytes)?;
        let mut answered = 0usize;
        let mut failure: Option<(u32, i32)> = None;
        while answered < descriptions.len() {
            let datagram = self.receive()?;
            for message in messages(&datagram) {
                let Some(code) = message.error_code() else { continue };
                if message.seq < first_seq || message.seq > last_seq {
                    continue;
                }
                answered += 1;
                if code != 0 && failure.is_none() {
                    failure = Some((message.seq, code));
                }
            }
        }
        match failure {
            None => Ok(()),
            Some((seq, code)) => {
                let what = descriptions
                    .iter()
                    .find(|(s, _)| *s == seq)
                    .map_or_else(|| format!("message {seq}"), |(_, w)| w.clone());
                Err(NetlinkError::Rejected { what, source: io::Error::from_raw_os_error(-code) })
            }
        }
    }

    /// Sends a dump request (made with [`crate::message::request`]) and returns the body
    /// (after the `nlmsghdr`) of every message of the answer. A missing object (ENOENT) is
    /// an empty answer.
    pub fn dump(&mut self, request: &[u8]) -> Result<Vec<Vec<u8>>, NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        let mut request = request.to_vec();
        request[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        self.send(&request)?;
        let mut bodies = Vec::new();
        loop {
            let datagram = self.receive()?;
            for message in messages(&datagram) {
                if message.seq != self.seq {
                    continue;
                }
                match message.kind {
                    NLMSG_DONE => return Ok(bodies),
                    NLMSG_ERROR => {
                        let code = message.error_code().unwrap_or(0);
                        if code == 0 || code == -(nix::errno::Errno::ENOENT as i32) {
                            return Ok(bodies);
                        }
                        let source = io::Error::from_raw_os_error(-code);
                        return Err(NetlinkError::Io { op: "dump", source });
                    }
                    _ => bodies.push(message.body.to_vec()),
                }
            }
        }
    }

    /// Sends one request that expects an answer and an acknowledgement (made with
    /// [`crate::message::request`], `NLM_F_ACK` set) and returns the answer's body (after
    /// the `nlmsghdr`).
    pub fn get(&mut self, request: &[u8]) -> Result<Vec<u8>, NetlinkError> {
        self.seq = self.seq.wrapping_add(1);
        let mut request = request.to_vec();
        request[8..12].copy_from_slice(&self.seq.to_ne_bytes());
        self.send(&request)?;
        let mut answer = None;
        loop {
            let datagram = self.receive()?;
            for message in messages(&datagram) {
                if message.seq != self.seq {
                    continue;
                }
                match message.error_code() {
                    Some(0) => {
                        return answer.ok_or_else(|| NetlinkError::Io {
                            op: "get",
                            source: io::Error::other("acknowledged without an answer"),
                        });
                    }
                    Some(code) => {
                        let source = io::Error::from_raw_os_error(-code);
                        return Err(NetlinkError::Io { op: "get", source });
                    }
                    None => answer = Some(message.body.to_vec()),
                }
            }
        }
    }

    /// Sends requests that each expect an acknowledgement (several per datagram) and
    /// returns the error code of each, in order (0: done).
    pub fn requests(&mut self, requests: &[Vec<u8>]) -> Result<Vec<i32>, NetlinkError> {
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
            let mut answers = vec![None; chunk.len()];
            let mut pending = chunk.len();
            while pending > 0 {
                let reply = self.receive()?;
                for message in messages(&reply) {
                    let Some(code) = message.error_code() else { continue };
                    let index = message.seq.wrapping_sub(first) as usize;
                    if index < chunk.len() && answers[index].is_none() {
                        answers[index] = Some(code);
                        pending -= 1;
                    }
                }
            }
            codes.extend(answers.into_iter().map(|c| c.unwrap_or(0)));
        }
        Ok(codes)
    }
}
