//! Who is at the other end of a Unix socket, who may be, and where a socket may live.
//!
//! kpng runs as root, and a Unix socket is a door into it. Both ends check the other:
//! - a server admits a client whose credentials ([`Credentials`], from `SO_PEERCRED` and
//!   `SO_PEERGROUPS`, taken by the kernel when the client connected) are root, the server's
//!   own user, or a user or group it was told to allow ([`Allowed`]); the socket's mode and
//!   group follow the same set ([`Allowed::socket_mode`]);
//! - a client trusts a server whose credentials (on its connected socket, those of whoever
//!   bound the listener) are root, its own user, or an allowed user, so a user who takes a
//!   socket's place while the server is down is never believed;
//! - a server listens only where nobody else can move its socket aside: every directory
//!   from the socket's up to `/` is owned by root or by the server's user and not writable
//!   by group or others, unless it is root's and sticky, as `/tmp` is
//!   ([`check_directories_above`]).
#![allow(unsafe_code)] // SO_PEERGROUPS has no safe wrapper: one getsockopt call, below.

use std::fmt;
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The credentials the kernel recorded for a peer when it connected (or, on a client's
/// socket, when the server's listener was bound).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The peer's process, when the kernel knows it.
    pub pid: Option<i32>,
    /// Its effective user.
    pub uid: u32,
    /// Its effective group.
    pub gid: u32,
    /// Its supplementary groups.
    pub groups: Vec<u32>,
}

impl Credentials {
    /// The credentials of `socket`'s peer.
    pub fn of(socket: &impl AsFd) -> io::Result<Credentials> {
        use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
        let cred = getsockopt(socket, PeerCredentials).map_err(io::Error::from)?;
        let pid = (cred.pid() > 0).then_some(cred.pid());
        let groups = peer_groups(socket)?;
        Ok(Credentials { pid, uid: cred.uid(), gid: cred.gid(), groups })
    }
}

impl fmt::Display for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "uid {} gid {}", self.uid, self.gid)?;
        if let Some(pid) = self.pid {
            write!(f, " (pid {pid})")?;
        }
        Ok(())
    }
}

/// How a service tells its server that a stream is in use. kpng's server cuts a connection
/// that has carried no stream for its client timeout (it holds a client slot for nothing);
/// it puts a `StreamWatch` in each request's extensions, and a service whose streams last
/// (the aggregator's producers, quiet between publications) opens it once the stream made
/// its first request, and holds what [`open`](Self::open) returns until the stream ends.
/// Absent under other servers (in-process tests).
#[derive(Clone)]
pub struct StreamWatch(std::sync::Arc<dyn Fn() -> StreamInUse + Send + Sync>);

impl StreamWatch {
    /// A watch whose `open` runs `open`.
    pub fn new(open: impl Fn() -> StreamInUse + Send + Sync + 'static) -> Self {
        StreamWatch(std::sync::Arc::new(open))
    }

    /// Counts the stream in use until the returned value is dropped.
    pub fn open(&self) -> StreamInUse {
        (self.0)()
    }
}

impl fmt::Debug for StreamWatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StreamWatch")
    }
}

/// A stream in use ([`StreamWatch::open`]), for as long as this is held.
pub struct StreamInUse {
    _held: Box<dyn std::any::Any + Send + Sync>,
}

impl StreamInUse {
    /// Holds `held` (what the server follows the stream by) until dropped.
    pub fn new(held: impl std::any::Any + Send + Sync) -> Self {
        StreamInUse { _held: Box::new(held) }
    }
}

impl fmt::Debug for StreamInUse {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StreamInUse")
    }
}

/// Who a server's client is, as its transport proved it: what a server binds names to
/// (the aggregator's producers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerIdentity {
    /// A process on this node, on a Unix socket.
    Local(Credentials),
    /// A mutual-TLS client, by the DNS and URI subject alternative names of its
    /// certificate, sorted (`DNS:name`, `URI:spiffe://...`).
    Certificate(Vec<String>),
    /// A plaintext TCP client (`--insecure`): anyone who can reach the port.
    Plaintext,
}

impl PeerIdentity {
    /// A stable text for this identity, the same across connections and restarts:
    /// `uid:0`, `cert:DNS:producer.example`, `plaintext`.
    pub fn key(&self) -> String {
        match self {
            PeerIdentity::Local(credentials) => format!("uid:{}", credentials.uid),
            PeerIdentity::Certificate(names) => format!("cert:{}", names.join(",")),
            PeerIdentity::Plaintext => "plaintext".to_string(),
        }
    }
}

impl fmt::Display for PeerIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PeerIdentity::Local(credentials) => write!(f, "{credentials}"),
            PeerIdentity::Certificate(names) => write!(f, "certificate {}", names.join(",")),
            PeerIdentity::Plaintext => f.write_str("a plaintext TCP client"),
        }
    }
}

/// `SO_PEERGROUPS`: the peer's supplementary groups.
fn peer_groups(socket: &impl AsFd) -> io::Result<Vec<u32>> {
    let fd = socket.as_fd().as_raw_fd();
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let mut len = (groups.len() * std::mem::size_of::<libc::gid_t>()) as libc::socklen_t;
        // SAFETY: `groups` is a live buffer of `len` bytes, and the kernel writes at most
        // `len` bytes into it (or sets `len` to what it needs and fails with ERANGE).
        let result = unsafe {
            libc::getsockopt(
                fd,
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let count = len as usize / std::mem::size_of::<libc::gid_t>();
        if result == 0 {
            groups.truncate(count);
            return Ok(groups);
        }
        let error = io::Error::last_os_error();
        if error.raw_os_error() == Some(libc::ERANGE) && count > groups.len() {
            groups.resize(count, 0);
            continue;
        }
        return Err(error);
    }
}

/// This process's effective user.
pub fn own_uid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// Users and groups allowed on a Unix socket besides root and the process's own user
/// (`--allow-uid`, `--allow-gid`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allowed {
    /// Users allowed.
    pub uids: Vec<u32>,
    /// Groups allowed (a client's primary group or one of its supplementary groups).
    pub gids: Vec<u32>,
}

impl Allowed {
    /// Whether a peer running as `uid` is trusted: root, this process's user, or an
    /// allowed user. What a client asks of a server.
    pub fn trusts_uid(&self, uid: u32) -> bool {
        uid == 0 || uid == own_uid() || self.uids.contains(&uid)
    }

    /// Whether a client with these credentials may connect: a trusted user, or a member of
    /// an allowed group.
    pub fn admits(&self, peer: &Credentials) -> bool {
        self.trusts_uid(peer.uid)
            || self.gids.iter().any(|gid| *gid == peer.gid || peer.groups.contains(gid))
    }

    /// The socket's permissions for this set: `(mode, group)`. Only the owner (0600) when
    /// nobody else is allowed; owner and group (0660, the socket's group set to it) for one
    /// allowed group; everyone (0666) when users or several groups are allowed, whom the
    /// credentials check then sorts out.
    pub fn socket_mode(&self) -> (u32, Option<u32>) {
        match (self.uids.is_empty(), self.gids.as_slice()) {
            (true, []) => (0o600, None),
            (true, [gid]) => (0o660, Some(*gid)),
            _ => (0o666, None),
        }
    }

    /// Who is admitted, for messages: `root, uid 1000 (kpng's), uid 1001, gid 50`.
    pub fn describe(&self) -> String {
        let mut who = vec!["root".to_string()];
        let own = own_uid();
        if own != 0 {
            who.push(format!("uid {own} (kpng's own)"));
        }
        who.extend(self.uids.iter().map(|uid| format!("uid {uid}")));
        who.extend(self.gids.iter().map(|gid| format!("gid {gid}")));
        who.join(", ")
    }
}

/// A directory in which another user could replace a socket.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "directory {} is owned by uid {owner} with mode {mode:04o}: every directory on the way up \
     to / must be owned by root (or by kpng's uid {own}) and not writable by group or others, \
     unless it is root's with the sticky bit (as /tmp)",
    dir.display()
)]
pub struct UnsafeDirectory {
    /// The directory.
    pub dir: PathBuf,
    /// Its owner.
    pub owner: u32,
    /// Its permission bits (with set-id and sticky bits).
    pub mode: u32,
    /// This process's user.
    pub own: u32,
}

/// Checks every directory from `path`'s (a socket, or a file kpng trusts) up to `/`, as
/// written and with symlinks resolved: each must be owned by root or this process's user
/// and not writable by group or others, except a root-owned directory with the sticky bit
/// (nobody can move another's entry there). Directories that do not exist yet are skipped
/// (the caller creates them and checks again).
pub fn check_directories_above(path: &Path) -> Result<(), UnsafeDirectory> {
    let Some(parent) = path.parent() else { return Ok(()) };
    let own = own_uid();
    let mut dirs: Vec<PathBuf> = parent.ancestors().map(Path::to_path_buf).collect();
    if let Some(resolved) = parent.ancestors().find_map(|dir| std::fs::canonicalize(dir).ok()) {
        dirs.extend(resolved.ancestors().map(Path::to_path_buf));
    }
    dirs.dedup();
    for dir in dirs.into_iter().filter(|d| !d.as_os_str().is_empty()) {
        let Ok(meta) = std::fs::metadata(&dir) else { continue };
        let (owner, mode) = (meta.uid(), meta.mode() & 0o7777);
        let owned = owner == 0 || owner == own;
        let shared = mode & 0o022 != 0;
        let sticky_root = owner == 0 && mode & 0o1000 != 0;
        if !owned || (shared && !sticky_root) {
            return Err(UnsafeDirectory { dir, owner, mode, own });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn a_socket_pair_shows_this_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let peer = Credentials::of(&a).unwrap();
        assert_eq!(peer.uid, own_uid());
        assert_eq!(peer.gid, nix::unistd::getegid().as_raw());
        assert_eq!(peer.pid, Some(std::process::id() as i32));
        let mut groups: Vec<u32> =
            nix::unistd::getgroups().unwrap().iter().map(|g| g.as_raw()).collect();
        let mut seen = peer.groups.clone();
        groups.sort();
        seen.sort();
        assert_eq!(seen, groups);
    }

    #[test]
    fn who_is_admitted() {
        let stranger = Credentials { pid: None, uid: 64_000, gid: 64_000, groups: vec![64_001] };
        let root = Credentials { uid: 0, gid: 0, ..stranger.clone() };
        let none = Allowed::default();
        assert!(none.admits(&root) && !none.admits(&stranger));
        assert!(!none.trusts_uid(64_000));
        assert!(Allowed { uids: vec![64_000], gids: vec![] }.admits(&stranger));
        assert!(Allowed { uids: vec![], gids: vec![64_000] }.admits(&stranger), "primary group");
        assert!(Allowed { uids: vec![], gids: vec![64_001] }.admits(&stranger), "supplementary");
        assert!(!Allowed { uids: vec![1], gids: vec![2] }.admits(&stranger));
        // A group allowed does not make a server trusted.
        assert!(!Allowed { uids: vec![], gids: vec![64_000] }.trusts_uid(64_000));

        assert_eq!(none.socket_mode(), (0o600, None));
        assert_eq!(Allowed { uids: vec![], gids: vec![5] }.socket_mode(), (0o660, Some(5)));
        assert_eq!(Allowed { uids: vec![], gids: vec![5, 6] }.socket_mode(), (0o666, None));
        assert_eq!(Allowed { uids: vec![7], gids: vec![] }.socket_mode(), (0o666, None));
        let described = Allowed { uids: vec![7], gids: vec![5] }.describe();
        assert!(
            described.starts_with("root") && described.ends_with("uid 7, gid 5"),
            "{described}"
        );
    }

    #[test]
    fn directories_others_can_write_are_refused() {
        let base = tempfile::tempdir().unwrap();
        let private = base.path().join("private");
        std::fs::create_dir(&private).unwrap();
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o755)).unwrap();
        check_directories_above(&private.join("s.sock")).unwrap();
        // Not yet created below it: what exists is checked.
        check_directories_above(&private.join("later/s.sock")).unwrap();

        let open = base.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let error = check_directories_above(&open.join("s.sock")).unwrap_err();
        assert_eq!(error.dir, open);
        assert_eq!(error.mode, 0o777);
        let text = error.to_string();
        assert!(text.contains(&open.display().to_string()) && text.contains("0777"), "{text}");
        // Deeper down, the open directory is still on the way up.
        std::fs::create_dir(open.join("inner")).unwrap();
        let error = check_directories_above(&open.join("inner/s.sock")).unwrap_err();
        assert_eq!(error.dir, open);
        // Through a symlink from a private directory, the target's ancestors count.
        let link = private.join("link");
        std::os::unix::fs::symlink(open.join("inner"), &link).unwrap();
        let error = check_directories_above(&link.join("s.sock")).unwrap_err();
        assert_eq!(error.dir, open);

        // Writable by the group only is refused too; a sticky directory is allowed only when
        // root owns it.
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o770)).unwrap();
        assert!(check_directories_above(&open.join("s.sock")).is_err());
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).unwrap();
        let sticky = check_directories_above(&open.join("s.sock"));
        assert_eq!(sticky.is_ok(), own_uid() == 0, "{sticky:?}");
    }

    #[test]
    fn a_directory_of_another_user_is_refused() {
        if own_uid() != 0 {
            // Giving a directory away takes root; the rule is the same as above.
            assert!(
                std::env::var_os("CI").is_none(),
                "CI runs as root: this test must not be skipped"
            );
            return;
        }
        let base = tempfile::tempdir().unwrap();
        let theirs = base.path().join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let error = check_directories_above(&theirs.join("s.sock")).unwrap_err();
        assert_eq!((error.owner, error.mode), (65534, 0o755));
    }
}
