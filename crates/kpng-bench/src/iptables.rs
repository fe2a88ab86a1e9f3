//! The kube-proxy iptables approach, for comparison: the node's whole nat table in
//! kube-proxy's layout (a KUBE-SVC chain per service port, a KUBE-SEP chain per endpoint,
//! probability rules between them), loaded with one `iptables-restore`, as that mode does
//! on every sync.

use std::fmt::Write as _;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Instant;

use kpng_model::{Family, LocalState};

use crate::table::percentiles;

/// A chain name from a hash of `text`: `PREFIX` and 16 hex digits (kube-proxy's names
/// are as long).
fn chain(prefix: &str, text: &str) -> String {
    let hash = kpng_model::hash::fnv1a64(text.as_bytes());
    format!("{prefix}{hash:016X}")
}

/// The IPv4 nat table for `state`, as `iptables-restore` input.
pub fn ruleset(state: &LocalState) -> String {
    let (mut chains, mut rules) = (String::new(), String::new());
    for name in ["KUBE-SERVICES", "KUBE-MARK-MASQ", "KUBE-POSTROUTING"] {
        let _ = writeln!(chains, ":{name} - [0:0]");
    }
    rules.push_str(
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
    );
    rules.push_str(
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES\n",
    );
    rules.push_str("-A POSTROUTING -j KUBE-POSTROUTING\n");
    rules.push_str("-A KUBE-MARK-MASQ -j MARK --or-mark 0x4000\n");
    rules.push_str("-A KUBE-POSTROUTING -m mark --mark 0x4000/0x4000 -j MASQUERADE\n");
    for (key, service) in &state.services {
        let Some(vip) = service.service.cluster_ip(Family::V4) else { continue };
        for port in &service.service.ports {
            let proto = port.protocol.as_str().to_lowercase();
            let svc = chain("KUBE-SVC-", &format!("{key}:{}:{proto}", port.name));
            let _ = writeln!(chains, ":{svc} - [0:0]");
            let _ = writeln!(
                rules,
                "-A KUBE-SERVICES -d {vip}/32 -p {proto} -m {proto} --dport {} -m comment --comment \"{key}:{} cluster IP\" -j {svc}",
                port.port, port.name
            );
            let endpoints: Vec<(std::net::IpAddr, u16)> = service
                .endpoints
                .values()
                .filter(|e| Family::of(&e.ip) == Family::V4)
                .filter_map(|e| {
                    e.ports
                        .iter()
                        .find(|p| *p.name == *port.name && p.protocol == port.protocol && p.cluster)
                        .map(|p| (e.ip, p.port))
                })
                .collect();
            for (i, (ip, target)) in endpoints.iter().enumerate() {
                let sep = chain("KUBE-SEP-", &format!("{svc}{ip}:{target}"));
                let _ = writeln!(chains, ":{sep} - [0:0]");
                let remaining = endpoints.len() - i;
                if remaining > 1 {
                    let _ = writeln!(
                        rules,
                        "-A {svc} -m statistic --mode random --probability {:.11} -j {sep}",
                        1.0 / remaining as f64
                    );
                } else {
                    let _ = writeln!(rules, "-A {svc} -j {sep}");
                }
                let _ = writeln!(rules, "-A {sep} -s {ip}/32 -j KUBE-MARK-MASQ");
                let _ = writeln!(
                    rules,
                    "-A {sep} -p {proto} -m {proto} -j DNAT --to-destination {ip}:{target}"
                );
            }
        }
    }
    format!("*nat\n{chains}{rules}COMMIT\n")
}

/// Median time (ms) of `times` loads of `text` with `iptables-restore` (the whole nat
/// table replaced), or `None` when `times` is 0 or `iptables-restore` is not installed.
pub fn restore(text: &str, times: usize) -> anyhow::Result<Option<f64>> {
    if times == 0 || Command::new("iptables-restore").arg("--version").output().is_err() {
        return Ok(None);
    }
    let mut samples = Vec::new();
    for _ in 0..times {
        let start = Instant::now();
        crate::feed("iptables-restore", &[], text)?;
        samples.push(start.elapsed());
    }
    // Leave the namespace's nat table empty again.
    let _ = Command::new("iptables-restore").stdin(Stdio::piped()).spawn().and_then(|mut c| {
        c.stdin.take().map(|mut s| s.write_all(b"*nat\nCOMMIT\n"));
        c.wait()
    });
    Ok(Some(percentiles(&mut samples).0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kpng_local::project_node_state;
    use kpng_model::{GlobalModel, Object, Protocol};
    use kpng_testkit::builders::{endpoint, service, slice};

    #[test]
    fn one_chain_per_service_port_and_per_endpoint() {
        let mut model = GlobalModel::new();
        model.apply(Object::Service(service(
            "ns",
            "web",
            &["10.96.0.1"],
            &[("http", Protocol::Tcp, 80)],
        )));
        let eps = vec![endpoint("10.1.0.1", "n1"), endpoint("10.1.0.2", "n2")];
        model.apply(Object::EndpointSlice(slice(
            "ns",
            "web-1",
            "web",
            &[("http", Protocol::Tcp, 8080)],
            eps,
        )));
        let text = ruleset(&project_node_state(&model, "n1"));
        assert_eq!(text.matches(":KUBE-SVC-").count(), 1, "{text}");
        assert_eq!(text.matches(":KUBE-SEP-").count(), 2, "{text}");
        assert!(text.contains("-d 10.96.0.1/32 -p tcp -m tcp --dport 80"), "{text}");
        assert!(text.contains("--probability 0.50000000000"), "{text}");
        assert!(text.contains("--to-destination 10.1.0.2:8080"), "{text}");
        assert!(text.ends_with("COMMIT\n"));
    }
}
