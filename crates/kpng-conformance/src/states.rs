//! The node states the checks apply: a fixed pair that exercises every kind of change
//! (an endpoint added and one removed, a service removed, one added, a NodePort, both
//! families), and random histories over testkit's small universe.

use kpng_model::global::ServiceType;
use kpng_model::{GlobalModel, LocalState, Object, Protocol};
use kpng_testkit::builders::{endpoint, node, service, slice};
use kpng_testkit::strategies::{Mutation, arb_mutation};
use proptest::prelude::*;

/// The node the states are projected for.
pub const NODE: &str = "n0";

fn model(objects: Vec<Object>) -> LocalState {
    let mut model = GlobalModel::new();
    for object in objects {
        model.apply(object).expect("a sample object");
    }
    kpng_local::project_node_state(&model, NODE)
}

/// Two states of one node: the second changes every kind of thing the first has.
pub fn pair() -> (LocalState, LocalState) {
    let http = [("http", Protocol::Tcp, 80)];
    let dns = [("dns", Protocol::Udp, 53)];
    let web = service("a", "web", &["10.96.0.10"], &http);
    let dns_service = service("a", "dns", &["10.96.0.53"], &dns);
    let dual = service("b", "dual", &["10.96.0.12", "fd00::12"], &http);
    let mut nodeport = service("b", "np", &["10.96.0.20"], &http);
    nodeport.service_type = ServiceType::NodePort;
    nodeport.ports[0].node_port = Some(30080);
    let base = vec![
        Object::Node(node(NODE, None, &["192.0.2.10"])),
        Object::Service(web.clone()),
        Object::Service(dns_service.clone()),
        Object::Service(dual.clone()),
        Object::EndpointSlice(slice(
            "b",
            "dual-v6",
            "dual",
            &http,
            vec![endpoint("fd00:244::3", "n1")],
        )),
        Object::EndpointSlice(slice(
            "b",
            "dual-v4",
            "dual",
            &http,
            vec![endpoint("10.244.1.3", "n1")],
        )),
        Object::EndpointSlice(slice("a", "dns-1", "dns", &dns, vec![endpoint("10.244.0.5", NODE)])),
    ];
    let mut a = base.clone();
    a.push(Object::EndpointSlice(slice(
        "a",
        "web-1",
        "web",
        &http,
        vec![endpoint("10.244.0.10", NODE), endpoint("10.244.1.10", "n1")],
    )));
    let mut b: Vec<Object> = base
        .into_iter()
        .filter(|o| !matches!(o, Object::Service(s) if s.key == dns_service.key))
        .collect();
    b.push(Object::EndpointSlice(slice(
        "a",
        "web-1",
        "web",
        &http,
        vec![
            endpoint("10.244.1.10", "n1"),
            endpoint("10.244.2.10", "n2"),
            endpoint("10.244.2.11", "n2"),
        ],
    )));
    b.push(Object::Service(nodeport));
    b.push(Object::EndpointSlice(slice(
        "b",
        "np-1",
        "np",
        &http,
        vec![endpoint("10.244.2.20", "n2")],
    )));
    (model(a), model(b))
}

/// A step of a random history: a few mutations.
pub fn arb_step() -> impl Strategy<Value = Vec<Mutation>> {
    proptest::collection::vec(arb_mutation(), 1..4)
}

/// A model changed a step at a time, projected for [`NODE`] after each.
#[derive(Debug, Default)]
pub struct History {
    model: GlobalModel,
}

impl History {
    /// Applies `mutations`; the node state after them.
    pub fn step(&mut self, mutations: &[Mutation]) -> LocalState {
        for mutation in mutations {
            mutation.apply_to(&mut self.model);
        }
        kpng_local::project_node_state(&self.model, NODE)
    }

    /// The node state after the last step, read from the model a service at a time.
    pub fn view(&self) -> kpng_local::OnDemand<'_> {
        kpng_local::OnDemand::new(&self.model, NODE, &kpng_local::NodeLocal::default())
    }
}
