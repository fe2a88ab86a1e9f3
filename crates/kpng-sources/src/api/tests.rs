use std::collections::BTreeMap;

use kpng_api::global::{GlobalItem, delete_op, model_items, node_item, service_cidr_item};
use kpng_api::localv1;
use kpng_local::project_node_state;
use kpng_model::{GlobalModel, Node, Object, ServiceCidr};
use kpng_store::{SourceEvent, store};
use kpng_testkit::strategies::{NODES, arb_mutation, build};
use proptest::prelude::*;

use super::*;

/// What a default proxy's mirror of `model` holds: no slice without endpoints (they have no
/// item on the wire), no service or slice labelled for another proxy.
fn mirrorable(model: &GlobalModel) -> GlobalModel {
    let mut out = GlobalModel::new();
    for object in model.objects() {
        let keep = match &object {
            Object::EndpointSlice(s) => !s.endpoints.is_empty() && s.proxy_name.is_none(),
            Object::Service(s) => s.proxy_name.is_none(),
            Object::Node(_) | Object::ServiceCidr(_) => true,
        };
        if keep {
            out.apply(object);
        }
    }
    out
}

fn reset_and(items: &[GlobalItem]) -> Vec<localv1::OpItem> {
    let mut ops =
        vec![localv1::OpItem { op: Some(localv1::op_item::Op::Reset(localv1::EmptyOp {})) }];
    ops.extend(set_ops(items));
    ops
}

fn set_ops(items: &[GlobalItem]) -> Vec<localv1::OpItem> {
    items.iter().map(GlobalItem::set_op).collect()
}

/// The model a store holds after `events`.
fn stored(events: Vec<SourceEvent>) -> GlobalModel {
    let (mut writer, reader) = store(&[]);
    writer.apply(events);
    reader.snapshot().model().clone()
}

proptest! {
    /// What a node must enforce is the same from the original model and from its mirror,
    /// whether the mirror was built at once or changed incrementally.
    #[test]
    fn a_mirrored_model_projects_like_the_original(
        a in proptest::collection::vec(arb_mutation(), 0..20),
        b in proptest::collection::vec(arb_mutation(), 0..20),
    ) {
        let (ma, mb) = (build(&a), build(&b));
        let mut mirror = Mirror::default();
        let mut ops = vec![localv1::OpItem { op: Some(localv1::op_item::Op::Reset(localv1::EmptyOp {})) }];
        ops.extend(set_ops(&model_items(&ma)));
        let mut events = mirror.apply(&ops).unwrap();
        // From a to b: delete what b lacks, set what differs.
        let old: BTreeMap<(localv1::Set, String), Vec<u8>> =
            model_items(&ma).into_iter().map(|i| ((i.set, i.path), i.bytes)).collect();
        let new: BTreeMap<(localv1::Set, String), Vec<u8>> =
            model_items(&mb).into_iter().map(|i| ((i.set, i.path), i.bytes)).collect();
        let mut step = Vec::new();
        for (set, path) in old.keys().filter(|k| !new.contains_key(*k)) {
            step.push(delete_op(*set, path));
        }
        for ((set, path), bytes) in &new {
            if old.get(&(*set, path.clone())) != Some(bytes) {
                let item = GlobalItem { set: *set, path: path.clone(), bytes: bytes.clone() };
                step.push(item.set_op());
            }
        }
        events.extend(mirror.apply(&step).unwrap());
        let mirrored = stored(events);
        let mut expected = mirrorable(&mb);
        for node in NODES {
            prop_assert_eq!(project_node_state(&mirrored, node), project_node_state(&expected, node));
        }
        // Every field round-trips (ServiceCIDRs and creation times included); slices come
        // back with their endpoints in address order (copies of one address in theirs).
        let sorted: Vec<Object> = expected.objects().filter_map(|o| match o {
            Object::EndpointSlice(mut s) => {
                s.endpoints.sort_by_key(|e| e.address);
                Some(Object::EndpointSlice(s))
            }
            _ => None,
        }).collect();
        for o in sorted {
            expected.apply(o);
        }
        prop_assert_eq!(mirrored, expected);
    }

    /// A mirror for a named proxy keeps exactly the services and slices labelled with its
    /// name, and a default one exactly the unlabelled ones.
    #[test]
    fn a_mirror_keeps_what_its_proxy_handles(
        mutations in proptest::collection::vec(arb_mutation(), 0..20),
        named in any::<bool>(),
    ) {
        let model = build(&mutations);
        let proxy = named.then(|| "other".to_string());
        let mut mirror = Mirror::for_proxy(proxy.clone());
        let mirrored = stored(mirror.apply(&reset_and(&model_items(&model))).unwrap());
        for s in mirrored.services() {
            prop_assert_eq!(s.proxy_name.as_deref(), proxy.as_deref());
        }
        for s in mirrored.slices() {
            prop_assert_eq!(s.proxy_name.as_deref(), proxy.as_deref());
        }
        let kept = model.services().filter(|s| s.proxy_name.as_deref() == proxy.as_deref()).count();
        prop_assert_eq!(mirrored.services().count(), kept);
        prop_assert_eq!(mirrored.service_cidrs().count(), model.service_cidrs().count());
    }
}

#[test]
fn service_cidrs_are_relisted_and_deleted() {
    let cidr = ServiceCidr::new(
        "kubernetes",
        ["10.96.0.0/16".parse().unwrap(), "fd00::/108".parse().unwrap()],
    );
    let item = service_cidr_item(&cidr);
    let mut mirror = Mirror::default();
    let events = mirror.apply(&reset_and(std::slice::from_ref(&item))).unwrap();
    assert!(events.contains(&SourceEvent::Applied(Object::ServiceCidr(cidr.clone()))));
    assert!(events.contains(&SourceEvent::ListDone(kpng_model::Kind::ServiceCidr)));
    let events = mirror.apply(&[delete_op(item.set, "kubernetes")]).unwrap();
    assert_eq!(
        events,
        [SourceEvent::Deleted(kpng_model::ObjectRef::ServiceCidr("kubernetes".into()))]
    );
}

#[test]
fn a_bad_item_changes_nothing_and_is_named() {
    let mut mirror = Mirror::default();
    let good = node_item(&Node {
        name: "n1".into(),
        labels: Default::default(),
        addresses: Vec::new(),
        pod_cidrs: Vec::new(),
        deleting: false,
        to_be_deleted: false,
    });
    assert_eq!(mirror.apply(&[good.set_op()]).unwrap().len(), 1);
    let bad = GlobalItem {
        set: localv1::Set::GlobalEndpointInfos,
        path: "ns/slice/not-an-ip".into(),
        bytes: Vec::new(),
    };
    let error = mirror.apply(&[delete_op(good.set, "n1"), bad.set_op()]).unwrap_err();
    assert_eq!(error.to_string(), "ns/slice/not-an-ip: field path: invalid IP \"not-an-ip\"");
    assert_eq!(mirror.nodes.len(), 1, "the delete before the bad item was not applied");
}
