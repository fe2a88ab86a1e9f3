//! The conformance suite over the nftables aggregator's appliers (libnftables in-process,
//! and the `nft` command), as root, in a network namespace of the test's own: the example's
//! frontends become chains of one nftables table, each plan one nft script committed as one
//! transaction ([`Unit::Plan`]). So the appliers' promise, a refused script changes nothing
//! and a script applies whole, is checked on the real kernel.

use std::collections::HashMap;
use std::net::SocketAddr;

use kpng_aggregator::diff::Script;
use kpng_aggregator::{Applier, LibNftApplier, NftApplier, NftError};
use kpng_backend::reconcile::{Held, Kernel, Objects, Plan, Unit};
use kpng_conformance::{Key, Subject, Value};
use kpng_example_backend::{Frontend, Table};
use kpng_model::Protocol;
use kpng_testkit::netns::Netns;

const TABLE: &str = "inet kpng_conformance";

/// A chain's name for a frontend: `tcp_10.96.0.10_80`, `udp_fd00--12_53`, `tcp_any_30080`.
fn chain(frontend: &Frontend) -> String {
    let protocol = match frontend.protocol {
        Protocol::Tcp => "tcp",
        Protocol::Udp => "udp",
        Protocol::Sctp => "sctp",
    };
    let ip = frontend.ip.map_or("any".to_string(), |ip| ip.to_string().replace(':', "-"));
    format!("{protocol}_{ip}_{}", frontend.port)
}

/// The frontend a chain stands for.
fn frontend(chain: &str) -> Option<Frontend> {
    let mut parts = chain.splitn(3, '_');
    let protocol = match parts.next()? {
        "tcp" => Protocol::Tcp,
        "udp" => Protocol::Udp,
        "sctp" => Protocol::Sctp,
        _ => return None,
    };
    let ip = match parts.next()? {
        "any" => None,
        ip => Some(ip.replace('-', ":").parse().ok()?),
    };
    Some(Frontend { protocol, ip, port: parts.next()?.parse().ok()? })
}

/// The example's objects as chains of one table: a rule per endpoint, naming it.
struct ApplierKernel {
    applier: Box<dyn Applier>,
}

impl Kernel for ApplierKernel {
    type Key = Frontend;
    type Value = Vec<SocketAddr>;
    type Error = NftError;

    const UNIT: Unit = Unit::Plan;

    fn read(&mut self) -> Result<Option<Held<Self>>, NftError> {
        let ruleset = self.applier.ruleset()?;
        let mut held = HashMap::new();
        let mut inside = false;
        let mut current: Option<Frontend> = None;
        for line in ruleset.lines().map(str::trim) {
            if line == format!("table {TABLE} {{") {
                inside = true;
            } else if inside && line.starts_with("table ") {
                inside = false;
            } else if let Some(name) =
                line.strip_prefix("chain ").and_then(|l| l.strip_suffix(" {"))
                && inside
            {
                current = frontend(name);
                if let Some(frontend) = current {
                    held.insert(frontend, Vec::new());
                }
            } else if let Some(endpoint) =
                line.strip_prefix("accept comment \"").and_then(|l| l.strip_suffix('"'))
                && let Some(frontend) = current.filter(|_| inside)
            {
                let endpoint = endpoint.parse().map_err(|e| NftError {
                    message: format!("chain {}: endpoint {endpoint:?}: {e}", chain(&frontend)),
                })?;
                held.entry(frontend).or_default().push(endpoint);
            } else if line == "}" {
                current = None;
            }
        }
        Ok((!held.is_empty() || ruleset.contains(&format!("table {TABLE} "))).then_some(held))
    }

    fn prepare(
        &mut self,
        _: &Plan<Frontend, Vec<SocketAddr>>,
        _: &Objects<Frontend, Vec<SocketAddr>>,
        _: bool,
    ) -> Result<(), NftError> {
        self.applier.commit(&Script { commands: vec![format!("add table {TABLE}")] })
    }

    /// One script, one transaction: chains flushed and filled, chains deleted. A frontend on
    /// port 0 jumps to a chain that does not exist, which nft refuses.
    fn commit(
        &mut self,
        plan: &Plan<Frontend, Vec<SocketAddr>>,
        _: &Objects<Frontend, Vec<SocketAddr>>,
    ) -> Result<(), NftError> {
        let mut commands = vec![format!("add table {TABLE}")];
        for (frontend, _, endpoints) in &plan.upserts {
            let name = chain(frontend);
            commands.push(format!("add chain {TABLE} {name}"));
            commands.push(format!("flush chain {TABLE} {name}"));
            if frontend.port == 0 {
                commands.push(format!("add rule {TABLE} {name} jump nowhere"));
            }
            for endpoint in endpoints {
                commands.push(format!("add rule {TABLE} {name} accept comment \"{endpoint}\""));
            }
        }
        for (frontend, _) in &plan.deletes {
            let name = chain(frontend);
            commands.push(format!("flush chain {TABLE} {name}"));
            commands.push(format!("delete chain {TABLE} {name}"));
        }
        self.applier.commit(&Script { commands })
    }
}

struct Aggregator {
    kind: &'static str,
    netns: Netns,
}

impl Aggregator {
    fn applier(&self) -> Box<dyn Applier> {
        match self.kind {
            "libnftables" => Box::new(LibNftApplier::open(Some(self.netns.name())).unwrap()),
            _ => Box::new(NftApplier::in_netns(self.netns.name())),
        }
    }
}

impl Subject for Aggregator {
    type Render = Table;
    type Kernel = ApplierKernel;

    fn name(&self) -> &'static str {
        self.kind
    }

    fn render(&self) -> Table {
        Table
    }

    fn open(&self) -> ApplierKernel {
        ApplierKernel { applier: self.applier() }
    }

    fn wipe(&self) {
        // Added first, so that deleting it cannot fail for its absence.
        let commands = vec![format!("add table {TABLE}"), format!("delete table {TABLE}")];
        self.applier().commit(&Script { commands }).expect("the table is removed");
    }

    fn poison(&self) -> (Key<Self>, Value<Self>) {
        (Frontend { protocol: Protocol::Udp, ip: None, port: 0 }, Vec::new())
    }

    fn foreign(&self) -> (Key<Self>, Value<Self>) {
        let frontend =
            Frontend { protocol: Protocol::Tcp, ip: Some("192.0.2.99".parse().unwrap()), port: 1 };
        (frontend, vec!["198.51.100.1:1".parse().unwrap()])
    }

    fn changed(&self, _: &Key<Self>, value: &Value<Self>) -> Option<Value<Self>> {
        let mut value = value.clone();
        value.push("198.51.100.2:2".parse().unwrap());
        Some(value)
    }
}

fn passes(test: &str, kind: &'static str) {
    if !kpng_testkit::privileged::require(test, &["nft", "ip"]) {
        return;
    }
    let subject = Aggregator { kind, netns: Netns::new("conformance") };
    kpng_conformance::run(&subject, 12);
}

#[test]
fn the_libnftables_applier_conforms() {
    passes("the_libnftables_applier_conforms", "libnftables");
}

#[test]
fn the_nft_command_applier_conforms() {
    passes("the_nft_command_applier_conforms", "nft");
}
