//! Endpoint selection for one service port in one family, as upstream kube-proxy does it.
//!
//! - Cluster set: Ready endpoints allowed by topology; if none, every Serving+Terminating
//!   endpoint (topology ignored).
//! - Local set: local Ready endpoints; if none, local Serving+Terminating endpoints.
//! - The port has endpoints if any endpoint anywhere is Ready or Serving+Terminating.
//!
//! A set a service does not use is not computed (left empty), so endpoints that only it
//! would contain do not reach the node's state.

use kpng_model::global::Endpoint;

/// The node a selection is made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeView<'a> {
    /// The node name: endpoints whose `nodeName` equals it are local.
    pub name: &'a str,
    /// The node's zone label.
    pub zone: Option<&'a str>,
}

impl NodeView<'_> {
    /// Whether `endpoint` runs on this node.
    pub fn is_local(&self, endpoint: &Endpoint) -> bool {
        endpoint.node_name() == Some(self.name)
    }
}

/// Which sets a service port uses (kube-proxy's `UsesClusterEndpoints` and
/// `UsesLocalEndpoints`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetsUsed {
    /// Cluster set: internal policy Cluster, or externally reachable at all (external
    /// policy Cluster, or the short-circuit of pod and node traffic under policy Local).
    pub cluster: bool,
    /// Local set: internal policy Local, or external policy Local on an externally
    /// reachable port.
    pub local: bool,
}

/// The outcome for a list of candidate endpoints, by index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    /// `cluster[i]`: candidate `i` is in the Cluster set.
    pub cluster: Vec<bool>,
    /// `local[i]`: candidate `i` is in the Local set.
    pub local: Vec<bool>,
    /// Some candidate is Ready, or Serving and Terminating.
    pub has_endpoints: bool,
}

/// The topology filter that applies to a port's Cluster set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Topology<'a> {
    /// Every Ready endpoint has node hints and one names this node.
    Node(&'a str),
    /// Every Ready endpoint has zone hints and one names this node's zone.
    Zone(&'a str),
}

impl Topology<'_> {
    fn admits(&self, endpoint: &Endpoint) -> bool {
        match self {
            Topology::Node(name) => endpoint.node_hints().iter().any(|n| n == name),
            Topology::Zone(zone) => endpoint.zone_hints().iter().any(|z| z == zone),
        }
    }
}

/// Chooses the topology filter from the Ready endpoints only.
fn topology<'a>(endpoints: &[&Endpoint], node: &NodeView<'a>) -> Option<Topology<'a>> {
    let ready: Vec<&Endpoint> = endpoints.iter().copied().filter(|e| e.is_ready()).collect();
    if ready.is_empty() {
        return None;
    }
    let all_node_hinted = ready.iter().all(|e| !e.node_hints().is_empty());
    if all_node_hinted && ready.iter().any(|e| e.node_hints().iter().any(|n| n == node.name)) {
        return Some(Topology::Node(node.name));
    }
    let zone = node.zone.filter(|z| !z.is_empty())?;
    let all_zone_hinted = ready.iter().all(|e| !e.zone_hints().is_empty());
    if all_zone_hinted && ready.iter().any(|e| e.zone_hints().iter().any(|z| z == zone)) {
        return Some(Topology::Zone(zone));
    }
    None
}

/// Selects the Cluster and Local sets among `endpoints` (already one per IP and port).
pub fn select_endpoints(endpoints: &[&Endpoint], node: &NodeView<'_>, used: SetsUsed) -> Selection {
    let n = endpoints.len();
    let has_endpoints = endpoints.iter().any(|e| e.is_ready() || e.is_serving_terminating());
    let mut selection = Selection { cluster: vec![false; n], local: vec![false; n], has_endpoints };

    if used.cluster {
        let filter = topology(endpoints, node);
        let mut any = false;
        for (i, e) in endpoints.iter().enumerate() {
            let chosen = e.is_ready() && filter.is_none_or(|t| t.admits(e));
            selection.cluster[i] = chosen;
            any |= chosen;
        }
        if !any {
            for (i, e) in endpoints.iter().enumerate() {
                selection.cluster[i] = e.is_serving_terminating();
            }
        }
    }

    if used.local {
        let is_local_ready = |e: &Endpoint| node.is_local(e) && e.is_ready();
        let any_local_ready = endpoints.iter().any(|e| is_local_ready(e));
        for (i, e) in endpoints.iter().enumerate() {
            selection.local[i] = if any_local_ready {
                is_local_ready(e)
            } else {
                node.is_local(e) && e.is_serving_terminating()
            };
        }
    }
    selection
}

#[cfg(test)]
mod tests;
