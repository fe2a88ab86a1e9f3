//! The fan-out against the reference: each node's stream must say exactly what projecting
//! that node alone gives, however the nodes share variants.

use std::collections::BTreeSet;

use kpng_api::localv1;
use kpng_local::{full_state_ops, project_node_state};
use kpng_model::{Changes, GlobalModel, LocalState, Op};
use kpng_testkit::strategies::{NODES, arb_mutation};
use proptest::prelude::*;
use prost::Message;

use super::*;

/// The members: the universe's nodes and two that no object names.
const MEMBERS: [&str; 5] = [NODES[0], NODES[1], NODES[2], "m0", "m1"];

fn decode(frames: impl IntoIterator<Item = Frame>) -> Vec<Op> {
    frames
        .into_iter()
        .map(|f| {
            let item = localv1::OpItem::decode(f.bytes().as_ref()).expect("a valid OpItem");
            kpng_api::local::decode_op(&item).expect("a valid op")
        })
        .collect()
}

struct Node {
    feed: Arc<Feed<NodeContent>>,
    /// What a client that replays every change set holds.
    replayed: LocalState,
    sent: Option<u64>,
}

impl Node {
    /// The ops since the previous call, as a client would get them.
    fn next(&mut self) -> Vec<Op> {
        let (version, answer) = self.feed.lock().since(self.sent);
        self.sent = Some(version);
        decode(answer)
    }
}

fn start(fanout: &mut Fanout, model: &GlobalModel) -> Vec<Node> {
    let nodes: Vec<Node> = MEMBERS
        .iter()
        .map(|_| Node {
            feed: Feed::new(NodeContent::default()),
            replayed: LocalState::default(),
            sent: None,
        })
        .collect();
    let joining = MEMBERS
        .iter()
        .zip(&nodes)
        .map(|(name, n)| Member { name: name.to_string(), feed: Arc::downgrade(&n.feed) })
        .collect();
    fanout.step(model, Some(&Changes::All), joining);
    nodes
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn every_node_gets_its_own_projection(
        first in proptest::collection::vec(arb_mutation(), 0..20),
        batches in proptest::collection::vec(proptest::collection::vec(arb_mutation(), 1..6), 1..8),
    ) {
        let mut model = GlobalModel::new();
        for m in &first {
            m.apply_to(&mut model);
        }
        let mut fanout = Fanout::default();
        let mut nodes = start(&mut fanout, &model);
        for (name, node) in MEMBERS.iter().zip(&mut nodes) {
            let ops = node.next();
            let expected: Vec<Op> = full_state_ops(&project_node_state(&model, name)).collect();
            prop_assert_eq!(&ops, &expected, "first state of {}", name);
            for op in &ops {
                node.replayed.apply(op).expect("the full state applies");
            }
        }
        for (i, batch) in batches.iter().enumerate() {
            let mut touched = BTreeSet::new();
            for m in batch {
                touched.extend(m.apply_to(&mut model));
            }
            let changes = if i % 3 == 2 { Changes::All } else { Changes::Touched(touched) };
            fanout.step(&model, Some(&changes), Vec::new());
            for (name, node) in MEMBERS.iter().zip(&mut nodes) {
                let expected = project_node_state(&model, name);
                let ops = node.next();
                for op in &ops {
                    node.replayed.apply(op).expect("each op fits the state");
                }
                prop_assert_eq!(&node.replayed, &expected, "node {} after batch {}", name, i);
                // A client that joins now gets the same state whole.
                let mut fresh = LocalState::default();
                for op in decode(node.feed.lock().since(None).1) {
                    fresh.apply(&op).expect("the full state applies");
                }
                prop_assert_eq!(&fresh, &expected);
            }
        }
    }
}

#[test]
fn nodes_share_the_frames_of_a_service_they_get_alike() {
    use kpng_model::Object;
    use kpng_testkit::builders::{endpoint, node, service, slice};
    let http = ("http", kpng_model::Protocol::Tcp, 80);
    let mut model = GlobalModel::new();
    model.apply(Object::Service(service("ns", "web", &["10.96.0.1"], &[http]))).unwrap();
    let eps = vec![endpoint("10.1.0.1", "a"), endpoint("10.1.0.2", "b")];
    model
        .apply(Object::EndpointSlice(slice("ns", "web-1", "web", &[("http", http.1, 8080)], eps)))
        .unwrap();
    for name in ["a", "b", "c", "d"] {
        model.apply(Object::Node(node(name, Some("z1"), &["192.168.0.1"]))).unwrap();
    }
    let mut fanout = Fanout::default();
    let feeds: Vec<_> = (0..4).map(|_| Feed::new(NodeContent::default())).collect();
    let joining = ["a", "b", "c", "d"]
        .iter()
        .zip(&feeds)
        .map(|(name, feed)| Member { name: name.to_string(), feed: Arc::downgrade(feed) })
        .collect();
    fanout.step(&model, Some(&Changes::All), joining);
    let frames = |i: usize| feeds[i].lock().content.snapshot.services[0].clone().unwrap();
    assert!(Arc::ptr_eq(&frames(2), &frames(3)), "c and d run no endpoint: one copy");
    assert!(!Arc::ptr_eq(&frames(0), &frames(1)), "a and b each run one");
    assert!(!Arc::ptr_eq(&frames(0), &frames(2)));
}
