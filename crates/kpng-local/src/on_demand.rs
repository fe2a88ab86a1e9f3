//! [`OnDemand`]: one node's ENLS read straight from the global model, nothing held but the
//! node.

use std::borrow::Cow;

use kpng_model::local::LocalServiceState;
use kpng_model::{GlobalModel, Kind, LocalNode, NodeState, ServiceKey};

use crate::project::{NodeLocal, project_node_with, project_service};
use crate::select::NodeView;

/// The ENLS of one node as a view of the global model: each service is projected when it is
/// read, and dropped by the reader. It reads exactly as [`project_node_state_with`] would
/// build it, without a copy of every service and endpoint beside the model; what it costs
/// instead is a projection per read, so a reader asks for the services it needs.
///
/// [`project_node_state_with`]: crate::project_node_state_with
pub struct OnDemand<'a> {
    model: &'a GlobalModel,
    name: &'a str,
    node: Option<Cow<'a, LocalNode>>,
}

impl<'a> OnDemand<'a> {
    /// The ENLS of node `name` in `model`, with what only the node knows.
    pub fn new(model: &'a GlobalModel, name: &'a str, local: &NodeLocal) -> Self {
        let node = project_node_with(model, name, local).map(Cow::Owned);
        OnDemand { model, name, node }
    }

    /// The ENLS of node `name` in `model`, whose node part, `node`, is already projected.
    pub fn with_node(
        model: &'a GlobalModel,
        name: &'a str,
        node: Option<Cow<'a, LocalNode>>,
    ) -> Self {
        OnDemand { model, name, node }
    }

    fn view(&self) -> NodeView<'_> {
        NodeView { name: self.name, zone: self.node.as_ref().and_then(|n| n.zone.as_deref()) }
    }
}

impl std::fmt::Debug for OnDemand<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnDemand")
            .field("node", &self.name)
            .field("services", &self.service_count())
            .finish_non_exhaustive()
    }
}

impl NodeState for OnDemand<'_> {
    fn node(&self) -> Option<&LocalNode> {
        self.node.as_deref()
    }

    fn service(&self, key: &ServiceKey) -> Option<Cow<'_, LocalServiceState>> {
        project_service(self.model, key, &self.view()).map(Cow::Owned)
    }

    fn services(&self) -> Box<dyn Iterator<Item = Cow<'_, LocalServiceState>> + '_> {
        let (model, view) = (self.model, self.view());
        let project = move |s: &kpng_model::Service| project_service(model, &s.key, &view);
        Box::new(model.services().filter_map(project).map(Cow::Owned))
    }

    fn service_count(&self) -> usize {
        self.model.len(Kind::Service)
    }
}

#[cfg(test)]
mod tests {
    use kpng_model::{LocalState, ServiceKey};
    use kpng_testkit::strategies::{NODES, arb_mutation, build};
    use proptest::prelude::*;

    use super::*;
    use crate::project_node_state_with;

    /// Everything `state` answers, each service asked for by key as well as walked.
    fn read(state: &dyn NodeState, absent: &ServiceKey) -> (Option<LocalNode>, Vec<String>) {
        let walked: Vec<LocalServiceState> = state.services().map(Cow::into_owned).collect();
        assert_eq!(walked.len(), state.service_count());
        for service in &walked {
            let key = &service.service.key;
            assert_eq!(state.service(key).as_deref(), Some(service), "{key}");
        }
        assert!(state.service(absent).is_none());
        let services = walked.iter().map(|s| format!("{s:?}")).collect();
        (state.node().cloned(), services)
    }

    #[test]
    fn a_view_follows_the_zone_of_its_node() {
        use kpng_model::global::Hints;
        use kpng_model::{Object, Protocol};
        use kpng_testkit::builders::{endpoint, node, service, slice};

        let mut model = GlobalModel::new();
        let http = ("http", Protocol::Tcp, 80);
        model.apply(Object::Service(service("ns", "web", &["10.96.0.1"], &[http])));
        let hinted = |ip, zone: &str| {
            let mut e = endpoint(ip, "b");
            e.set_hints(Hints::new(vec![zone.into()], vec![]));
            e
        };
        let endpoints = vec![hinted("10.0.0.1", "z1"), hinted("10.0.0.2", "z2")];
        let ports = [("http", Protocol::Tcp, 8080)];
        model.apply(Object::EndpointSlice(slice("ns", "web-1", "web", &ports, endpoints)));
        model.apply(Object::Node(node("a", Some("z2"), &["192.168.0.1"])));
        let view = OnDemand::new(&model, "a", &NodeLocal::default());
        let web = view.service(&ServiceKey::new("ns", "web")).unwrap();
        let ips: Vec<String> = web.endpoints.keys().map(ToString::to_string).collect();
        assert_eq!(ips, ["10.0.0.2"], "only the endpoint hinted for the node's zone");
    }

    proptest! {
        #[test]
        fn a_view_of_the_model_reads_as_the_state_projected_whole(
            mutations in proptest::collection::vec(arb_mutation(), 0..40),
            node in 0..NODES.len(),
            cidr in any::<bool>(),
        ) {
            let model = build(&mutations);
            let local = NodeLocal {
                service_cidrs: cidr.then(|| "10.100.0.0/16".parse().unwrap()).into_iter().collect(),
                ..NodeLocal::default()
            };
            let name = NODES[node];
            let held: LocalState = project_node_state_with(&model, name, &local);
            let view = OnDemand::new(&model, name, &local);
            let absent = ServiceKey::new("absent", "none");
            let (node, services) = read(&view, &absent);
            prop_assert_eq!(&node, &held.node);
            prop_assert_eq!(services, read(&held, &absent).1);
            prop_assert_eq!(view.service_count(), held.services.len());
        }
    }
}
