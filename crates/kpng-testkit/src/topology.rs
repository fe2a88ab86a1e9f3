//! A small cluster in network namespaces, wired like real nodes.
//!
//! ```text
//!               lan (bridge)
//!   client ───────┼─────── node (runs kpng) ── local pods 10.244.0.x / fd00:244::x
//!  .100           │          .1
//!                 └─────── remote ──────────── remote pods 10.244.1.x / fd00:244:1::x
//!                            .2
//! LAN: 192.168.10.0/24, fd00:10::/64
//! ```
//!
//! Pods are attached Calico-style: a /32 (/128) address, a default route to a link-local
//! gateway, and a host route plus proxy ARP on the node side. The node has a default route
//! (to a LAN address nobody answers) like any real node. The client routes the service,
//! external and load-balancer ranges through the node.
//!
//! Servers in pods and probes from any namespace run in threads of the test process that
//! enter the namespace (`setns`), so no helper binary is needed.

use std::fs::File;
use std::net::{IpAddr, SocketAddr};
use std::thread;
use std::time::Duration;

use nix::sched::{CloneFlags, setns};

use crate::echo;
use crate::netns::Netns;
use crate::probe::{self, Outcome};

/// Ranges the client sends through the node: cluster IPs (the default service CIDR, which
/// holds the generated clusters' 100,000 services), external IPs, LB IPs.
const CLIENT_ROUTES_V4: [&str; 3] = ["10.96.0.0/12", "192.0.2.0/24", "203.0.113.0/24"];
const CLIENT_ROUTES_V6: [&str; 1] = ["fd00:96::/64"];

/// A pod: its namespace and addresses.
#[derive(Debug)]
pub struct Pod {
    /// The pod's name (what its servers answer).
    pub name: String,
    /// Its namespace.
    pub ns: Netns,
    /// Its IPv4 address.
    pub ipv4: IpAddr,
    /// Its IPv6 address.
    pub ipv6: IpAddr,
}

/// The namespaces of a test cluster.
#[derive(Debug)]
pub struct Cluster {
    /// The node kpng programs (`node-a` in manifests): 192.168.10.1, fd00:10::1.
    pub node: Netns,
    /// A second node hosting remote pods (`node-b`): 192.168.10.2, fd00:10::2.
    pub remote: Netns,
    /// An outside client: 192.168.10.100, fd00:10::100.
    pub client: Netns,
    /// The LAN bridge.
    pub lan: Netns,
    /// Pods, local and remote.
    pub pods: Vec<Pod>,
}

/// Runs `f` in a thread that has entered `ns`'s network namespace.
pub fn in_netns<T: Send + 'static>(ns: &Netns, f: impl FnOnce() -> T + Send + 'static) -> T {
    spawn_in_netns(ns, f).join().expect("thread in namespace panicked")
}

/// Starts `f` in a thread that has entered `ns`'s network namespace; the threads it starts
/// are in that namespace too (a server's connection threads, its outgoing connections).
pub fn spawn_in_netns<T: Send + 'static>(
    ns: &Netns,
    f: impl FnOnce() -> T + Send + 'static,
) -> thread::JoinHandle<T> {
    let path = format!("/var/run/netns/{}", ns.name());
    thread::spawn(move || {
        let file = File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
        setns(&file, CloneFlags::CLONE_NEWNET).unwrap_or_else(|e| panic!("setns {path}: {e}"));
        f()
    })
}

fn host(lan: &Netns, ns: &Netns, port: &str, v4: &str, v6: &str) {
    lan.veth(port, ns, "eth0");
    lan.ip(&["link", "set", port, "master", "br0"]);
    ns.ip(&["addr", "add", &format!("{v4}/24"), "dev", "eth0"]);
    ns.ip(&["addr", "add", &format!("{v6}/64"), "dev", "eth0", "nodad"]);
}

/// Serves TCP, UDP and SCTP on `ports` in `pod`'s namespace, answering with its name;
/// returns once every socket is bound.
fn serve(pod: &Pod, ports: &[u16]) {
    let (server_name, tcp, udp) = (pod.name.clone(), ports.to_vec(), ports.to_vec());
    let (ready_tx, ready) = std::sync::mpsc::channel();
    spawn_in_netns(&pod.ns, move || {
        let sctp: Result<Vec<_>, _> =
            tcp.iter().map(|p| crate::sctp::serve(&server_name, *p)).collect();
        match (echo::bind(&tcp, &udp), sctp) {
            (Ok(servers), Ok(sctp)) => {
                for responder in sctp {
                    thread::spawn(responder);
                }
                let _ = ready_tx.send(Ok(()));
                servers.run(&server_name);
            }
            (Err(e), _) | (_, Err(e)) => {
                let _ = ready_tx.send(Err(e.to_string()));
            }
        }
    });
    if let Err(e) = ready.recv().expect("server thread") {
        panic!("servers of {} cannot bind: {e}", pod.name);
    }
}

fn router(ns: &Netns) {
    ns.sysctl("net.ipv4.ip_forward", "1");
    ns.sysctl("net.ipv6.conf.all.forwarding", "1");
    ns.sysctl("net.ipv4.conf.all.rp_filter", "0");
    ns.sysctl("net.ipv4.conf.default.rp_filter", "0");
    // A redirect for traffic routed back out of its LAN interface would use up the ICMP
    // rate-limit tokens of the client and swallow the port-unreachable of a REJECT.
    ns.sysctl("net.ipv4.conf.all.send_redirects", "0");
    ns.sysctl("net.ipv4.conf.default.send_redirects", "0");
}

impl Cluster {
    /// The LAN, the node, the remote node and the client, without pods.
    pub fn new() -> Cluster {
        let lan = Netns::new("lan");
        lan.ip(&["link", "add", "br0", "type", "bridge"]);
        lan.ip(&["link", "set", "br0", "up"]);
        let node = Netns::new("node");
        let remote = Netns::new("remote");
        let client = Netns::new("client");
        host(&lan, &node, "p-node", "192.168.10.1", "fd00:10::1");
        host(&lan, &remote, "p-remote", "192.168.10.2", "fd00:10::2");
        host(&lan, &client, "p-client", "192.168.10.100", "fd00:10::100");
        router(&node);
        router(&remote);
        node.sysctl("net.ipv4.conf.eth0.send_redirects", "0");
        remote.sysctl("net.ipv4.conf.eth0.send_redirects", "0");
        // Real nodes have a default route; the gateway need not answer.
        node.ip(&["route", "add", "default", "via", "192.168.10.254"]);
        node.ip(&["-6", "route", "add", "default", "via", "fd00:10::fe"]);
        node.ip(&["route", "add", "10.244.1.0/24", "via", "192.168.10.2"]);
        node.ip(&["-6", "route", "add", "fd00:244:1::/64", "via", "fd00:10::2"]);
        remote.ip(&["route", "add", "default", "via", "192.168.10.1"]);
        remote.ip(&["-6", "route", "add", "default", "via", "fd00:10::1"]);
        for range in CLIENT_ROUTES_V4 {
            client.ip(&["route", "add", range, "via", "192.168.10.1"]);
        }
        for range in CLIENT_ROUTES_V6 {
            client.ip(&["-6", "route", "add", range, "via", "fd00:10::1"]);
        }
        Cluster { node, remote, client, lan, pods: Vec::new() }
    }

    /// Adds pod `name` on the node (`local`) or on the remote node, with host number `n`
    /// (10.244.0.n or 10.244.1.n), and serves TCP and UDP on `ports` in it.
    pub fn add_pod(&mut self, name: &str, local: bool, n: u8, ports: &[u16]) -> &Pod {
        let (host_ns, subnet) = if local { (&self.node, 0) } else { (&self.remote, 1) };
        let ipv4 = format!("10.244.{subnet}.{n}");
        let ipv6 = if local { format!("fd00:244::{n:x}") } else { format!("fd00:244:1::{n:x}") };
        let ns = Netns::new("pod");
        let link = format!("v{n}");
        host_ns.veth(&link, &ns, "eth0");
        ns.ip(&["addr", "add", &format!("{ipv4}/32"), "dev", "eth0"]);
        ns.ip(&["addr", "add", &format!("{ipv6}/128"), "dev", "eth0", "nodad"]);
        ns.ip(&["route", "add", "169.254.1.1", "dev", "eth0"]);
        ns.ip(&["route", "add", "default", "via", "169.254.1.1"]);
        ns.ip(&["-6", "route", "add", "default", "via", "fe80::1", "dev", "eth0"]);
        host_ns.sysctl(&format!("net.ipv4.conf.{link}.proxy_arp"), "1");
        host_ns.ip(&["-6", "addr", "add", "fe80::1/64", "dev", &link, "nodad"]);
        host_ns.ip(&["route", "add", &format!("{ipv4}/32"), "dev", &link]);
        host_ns.ip(&["-6", "route", "add", &format!("{ipv6}/128"), "dev", &link]);
        let pod = Pod {
            name: name.to_string(),
            ns,
            ipv4: ipv4.parse().unwrap(),
            ipv6: ipv6.parse().unwrap(),
        };
        serve(&pod, ports);
        self.pods.push(pod);
        self.pods.last().expect("just pushed")
    }

    /// Adds a host `name` on the LAN, 192.168.10.`n` and fd00:10::`n` (routed through the
    /// node by default), serving TCP and UDP on `ports` like a pod: a neighbour of the node,
    /// as endpoints of direct server return must be. Found with [`Cluster::pod`].
    pub fn add_lan_host(&mut self, name: &str, n: u8, ports: &[u16]) -> &Pod {
        let ns = Netns::new("host");
        let (ipv4, ipv6) = (format!("192.168.10.{n}"), format!("fd00:10::{n:x}"));
        host(&self.lan, &ns, &format!("p-h{n}"), &ipv4, &ipv6);
        ns.ip(&["route", "add", "default", "via", "192.168.10.1"]);
        ns.ip(&["-6", "route", "add", "default", "via", "fd00:10::1"]);
        let pod = Pod {
            name: name.to_string(),
            ns,
            ipv4: ipv4.parse().expect("an address"),
            ipv6: ipv6.parse().expect("an address"),
        };
        serve(&pod, ports);
        self.pods.push(pod);
        self.pods.last().expect("just pushed")
    }

    /// The pod named `name`.
    pub fn pod(&self, name: &str) -> &Pod {
        self.pods.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("no pod {name}"))
    }

    /// One TCP probe from `from` to `target`.
    pub fn tcp(from: &Netns, target: &str) -> Outcome {
        let target: SocketAddr = target.parse().expect("target address");
        in_netns(from, move || probe::tcp(target, Duration::from_millis(1500)))
    }

    /// One TCP probe from `from` to `target`, from its local address `source`.
    pub fn tcp_from(from: &Netns, source: &str, target: &str) -> Outcome {
        let target: SocketAddr = target.parse().expect("target address");
        let source: IpAddr = source.parse().expect("source address");
        in_netns(from, move || probe::tcp_from(source, target, Duration::from_millis(1500)))
    }

    /// One SCTP probe (IPv4) from `from` to `target`, from source port `source_port`.
    pub fn sctp(from: &Netns, target: &str, source_port: u16) -> Outcome {
        let target: SocketAddr = target.parse().expect("target address");
        in_netns(from, move || crate::sctp::probe(target, source_port, Duration::from_millis(1500)))
    }

    /// One UDP probe from `from` to `target`, from source port `source_port` (0: any).
    pub fn udp(from: &Netns, target: &str, source_port: u16) -> Outcome {
        let target: SocketAddr = target.parse().expect("target address");
        in_netns(from, move || probe::udp(target, source_port, Duration::from_millis(1500)))
    }
}

impl Default for Cluster {
    fn default() -> Self {
        Self::new()
    }
}
