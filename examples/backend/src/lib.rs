//! A small dataplane built on kpng's backend template ([`kpng_backend::reconcile`]): it
//! keeps, in one text file, every service frontend of the node and the endpoints it picks
//! from, as a userspace balancer would read them:
//!
//! ```text
//! tcp 10.96.0.10:80 -> 10.244.0.10:80 10.244.1.10:80
//! udp [fd00::53]:53 -> [fd00:244::5]:53
//! tcp *:30080 -> 10.244.2.20:80
//! ```
//!
//! A line is an object: its key is the frontend (protocol, address and port; `*` for a
//! NodePort), its value the endpoints, sorted. The backend supplies only what is its own:
//! - [`Table`], the render: a service port becomes a line per cluster, external and
//!   load-balancer IP, and one per NodePort, each with the endpoints of the port's Cluster
//!   set (ready ones, as the node state lists them).
//! - [`FileKernel`], the kernel: [`read`](kpng_backend::reconcile::Kernel::read) parses the
//!   file back; [`commit`](kpng_backend::reconcile::Kernel::commit) applies a plan to what
//!   the file holds and replaces the file by renaming a new one over it, so a reader sees
//!   the whole plan or none of it ([`Unit::Plan`]). A frontend on port 0 is refused.
//!
//! The reconciler does the rest: the change loop, the plan, restarts that write nothing,
//! verification and repair (edit the file by hand: the next sync period puts it back).
//!
//! # Layout
//! - this file: [`Frontend`], [`Table`] (the render), [`FileKernel`] (the kernel), and
//!   [`backend`], which puts them together.
//! - `main.rs`: the binary, which follows a `kpng local` server's node-state stream.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

use kpng_backend::reconcile::{
    Filed, Kernel, Objects, Pack, Plan, Rank, Reconciler, Render, Unit, Wanted,
};
use kpng_model::global::{AnnotationKey, LoadBalancing};
use kpng_model::local::LocalServiceState;
use kpng_model::{NodeState, Protocol};

/// The backend's name.
pub const NAME: &str = "to-table-file";

/// A service frontend: where clients connect.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Frontend {
    /// The protocol.
    pub protocol: Protocol,
    /// The address, or `None` for a NodePort (any of the node's addresses).
    pub ip: Option<IpAddr>,
    /// The port.
    pub port: u16,
}

impl Rank for Frontend {}

/// Claims filed by the whole frontend: a service has a line or two.
impl Filed for Frontend {}

/// Kept whole by the template: a service has a line or two.
impl Pack for Frontend {}

/// The render: service ports to frontends and their endpoints.
#[derive(Debug, Default)]
pub struct Table;

impl Render for Table {
    type Key = Frontend;
    type Value = Vec<SocketAddr>;
    type Facts = ();
    type Error = std::convert::Infallible; // rendering never fails

    fn facts(&self, _state: &dyn NodeState) {}

    fn service(
        &mut self,
        _facts: &(),
        service: &LocalServiceState,
        _held: &dyn kpng_backend::reconcile::Lookup<Frontend, Vec<SocketAddr>>,
    ) -> Result<Wanted<Frontend, Vec<SocketAddr>>, std::convert::Infallible> {
        let mut wanted = Wanted::default();
        let s = &service.service;
        for port in &s.ports {
            let mut endpoints: Vec<SocketAddr> = service
                .endpoints
                .values()
                .filter_map(|e| {
                    let p = e.ports.iter().find(|p| p.name == port.name && p.cluster)?;
                    Some(SocketAddr::new(e.ip, p.port))
                })
                .collect();
            endpoints.sort();
            let addresses =
                s.cluster_ips.iter().chain(s.external_ips()).chain(s.load_balancer_ips());
            for ip in addresses.filter(|ip| !port.yielded.contains(ip)) {
                let frontend = Frontend { protocol: port.protocol, ip: Some(*ip), port: port.port };
                wanted.objects.insert(frontend, endpoints.clone());
            }
            if let Some(node_port) = port.node_port {
                let frontend = Frontend { protocol: port.protocol, ip: None, port: node_port };
                wanted.objects.insert(frontend, endpoints.clone());
                // An address frontend on the same port wins over the NodePort.
                wanted.yielding.insert(frontend);
            }
        }
        Ok(wanted)
    }

    fn unsupported(&self, lb: &LoadBalancing) -> Vec<(AnnotationKey, &'static str)> {
        kpng_backend::unsupported::all_settings(lb)
    }
}

/// Why the file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be read or replaced.
    #[error("{path}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A line is not `<protocol> <address>:<port> -> <endpoint>...`.
    #[error("{path}:{line}: {why}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// What is wrong.
        why: String,
    },
    /// A frontend on port 0 cannot be served.
    #[error("frontend {0} has port 0, which cannot be served")]
    PortZero(String),
}

/// The kernel: one text file, replaced whole at each commit.
#[derive(Debug, Clone)]
pub struct FileKernel {
    path: PathBuf,
}

impl FileKernel {
    /// The table kept at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        FileKernel { path: path.into() }
    }

    /// Where the table is.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn io(&self, source: std::io::Error) -> FileError {
        FileError::Io { path: self.path.clone(), source }
    }

    fn write(&self, objects: &HashMap<Frontend, Vec<SocketAddr>>) -> Result<(), FileError> {
        let mut lines: Vec<String> = objects.iter().map(|(f, e)| line(f, e)).collect();
        lines.sort();
        let mut text = lines.join("\n");
        text.push('\n');
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(".new");
        let new = self.path.with_file_name(name);
        std::fs::write(&new, text).map_err(|e| self.io(e))?;
        std::fs::rename(&new, &self.path).map_err(|e| self.io(e))
    }
}

/// A frontend as the file writes it.
pub fn frontend_text(frontend: &Frontend) -> String {
    let protocol = frontend.protocol.as_str().to_ascii_lowercase();
    match frontend.ip {
        Some(ip) => format!("{protocol} {}", SocketAddr::new(ip, frontend.port)),
        None => format!("{protocol} *:{}", frontend.port),
    }
}

fn line(frontend: &Frontend, endpoints: &[SocketAddr]) -> String {
    let endpoints: Vec<String> = endpoints.iter().map(ToString::to_string).collect();
    format!("{} -> {}", frontend_text(frontend), endpoints.join(" ")).trim_end().to_string()
}

fn parse_line(text: &str) -> Result<(Frontend, Vec<SocketAddr>), String> {
    let (front, back) = text.split_once("->").ok_or("no `->`")?;
    let (protocol, address) = front.trim().split_once(' ').ok_or("no protocol")?;
    let protocol = match protocol {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        other => return Err(format!("unknown protocol {other:?}")),
    };
    let frontend = match address.strip_prefix("*:") {
        Some(port) => {
            let port = port.parse().map_err(|_| format!("invalid port {port:?}"))?;
            Frontend { protocol, ip: None, port }
        }
        None => {
            let at: SocketAddr =
                address.parse().map_err(|_| format!("invalid address {address:?}"))?;
            Frontend { protocol, ip: Some(at.ip()), port: at.port() }
        }
    };
    let endpoints = back
        .split_whitespace()
        .map(|e| e.parse().map_err(|_| format!("invalid endpoint {e:?}")))
        .collect::<Result<_, String>>()?;
    Ok((frontend, endpoints))
}

impl Kernel for FileKernel {
    type Key = Frontend;
    type Value = Vec<SocketAddr>;
    type Error = FileError;

    const UNIT: Unit = Unit::Plan;
    const WHAT: &'static str = "frontend table";
    const APPLIED: &'static str = "written";

    fn read(&mut self) -> Result<Option<HashMap<Frontend, Vec<SocketAddr>>>, FileError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(self.io(e)),
        };
        let mut objects = HashMap::new();
        for (at, text) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
            let parsed = parse_line(text);
            let (frontend, endpoints) = parsed.map_err(|why| FileError::Parse {
                path: self.path.clone(),
                line: at + 1,
                why,
            })?;
            objects.insert(frontend, endpoints);
        }
        Ok(Some(objects))
    }

    fn prepare(
        &mut self,
        _plan: &Plan<Frontend, Vec<SocketAddr>>,
        _after: &Objects<Frontend, Vec<SocketAddr>>,
        installed: bool,
    ) -> Result<(), FileError> {
        match installed {
            true => Ok(()),
            false => self.write(&HashMap::new()),
        }
    }

    fn commit(
        &mut self,
        plan: &Plan<Frontend, Vec<SocketAddr>>,
        _after: &Objects<Frontend, Vec<SocketAddr>>,
    ) -> Result<(), FileError> {
        if let Some((frontend, _, _)) = plan.upserts.iter().find(|(f, _, _)| f.port == 0) {
            return Err(FileError::PortZero(frontend_text(frontend)));
        }
        let mut objects = self.read()?.unwrap_or_default();
        plan.apply_to(&mut objects, None);
        self.write(&objects)
    }
}

/// The backend: [`Table`] rendered into the file at `path`.
pub fn backend(path: impl Into<PathBuf>) -> Reconciler<Table, FileKernel> {
    Reconciler::new(NAME, Table, FileKernel::new(path))
}
