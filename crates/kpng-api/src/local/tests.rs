use kpng_local::{full_state_ops, project_node_state};
use kpng_model::LocalState;
use kpng_testkit::strategies::{NODES, arb_mutation, build};
use proptest::prelude::*;

use super::*;

fn roundtrip(op: &Op) -> Op {
    let bytes = encode_op(op).encode_to_vec();
    decode_op(&localv1::OpItem::decode(bytes.as_slice()).unwrap()).unwrap()
}

proptest! {
    #[test]
    fn every_enls_op_survives_the_wire(
        mutations in proptest::collection::vec(arb_mutation(), 0..25),
        node in proptest::sample::select(&NODES[..]),
    ) {
        let state: LocalState = project_node_state(&build(&mutations), node);
        for op in full_state_ops(&state) {
            prop_assert_eq!(roundtrip(&op), op.clone());
            if let Op::Set(item) = &op {
                let delete = Op::Delete(item.item_ref());
                prop_assert_eq!(roundtrip(&delete), delete);
            }
        }
        decoded_ops_share_their_service_keys_and_port_lists(&state)?;
    }
}

/// Decoded one after the other, with [`share_with_previous`], the ops of `state` are still
/// equal to those sent, and consecutive endpoints of one service share their service key
/// and, exactly when the lists are equal, their port list.
fn decoded_ops_share_their_service_keys_and_port_lists(
    state: &LocalState,
) -> Result<(), TestCaseError> {
    let sent: Vec<Op> = full_state_ops(state).collect();
    let mut decoded: Vec<Op> = Vec::new();
    for op in &sent {
        let mut op = roundtrip(op);
        share_with_previous(decoded.last(), &mut op);
        decoded.push(op);
    }
    prop_assert_eq!(&decoded, &sent);
    for pair in decoded.windows(2) {
        let [
            Op::Set(Item::Endpoint { service: s1, endpoint: e1 }),
            Op::Set(Item::Endpoint { service: s2, endpoint: e2 }),
        ] = pair
        else {
            continue;
        };
        if s1 == s2 {
            prop_assert!(std::sync::Arc::ptr_eq(s1.name(), s2.name()));
            prop_assert_eq!(std::sync::Arc::ptr_eq(&e1.ports, &e2.ports), e1.ports == e2.ports);
        }
    }
    Ok(())
}

#[test]
fn old_fields_are_filled_for_old_clients() {
    let key = ServiceKey::new("ns", "web");
    let endpoint = LocalEndpoint {
        ip: "10.1.0.5".parse().unwrap(),
        local: true,
        ready: true,
        serving: true,
        terminating: false,
        pod_name: Some("web-0".into()),
        ports: vec![EndpointPort {
            name: "http".into(),
            protocol: kpng_model::Protocol::Tcp,
            port: 8080,
            cluster: true,
            local: true,
        }]
        .into(),
    };
    let item = encode_op(&Op::Set(Item::Endpoint { service: key, endpoint }));
    let Some(op_item::Op::Set(value)) = item.op else { panic!("not a set: {item:?}") };
    let reference = value.r#ref.unwrap();
    assert_eq!(reference.set, localv1::Set::EndpointsSet as i32);
    assert_eq!(reference.path, "ns/web/10.1.0.5");
    let wire = localv1::Endpoint::decode(value.bytes.as_slice()).unwrap();
    assert_eq!(wire.ips.unwrap().v4, ["10.1.0.5"]);
    assert!(wire.local);
    assert_eq!(wire.port_overrides, [localv1::PortName { name: "http".into(), port: 8080 }]);
    assert_eq!(wire.scopes, Some(localv1::EndpointScopes { internal: true, external: true }));
}

#[test]
fn bad_messages_name_the_object_and_field() {
    let bad_ip = localv1::OpItem {
        op: Some(op_item::Op::Delete(localv1::Ref {
            set: localv1::Set::EndpointsSet as i32,
            path: "ns/web/10.0.0.300".into(),
        })),
    };
    let error = decode_op(&bad_ip).unwrap_err().to_string();
    assert!(error.contains("ns/web/10.0.0.300") && error.contains("field path"), "{error}");

    let wire = localv1::Service {
        r#type: "ClusterIP".into(),
        ports: vec![localv1::PortMapping {
            name: "p".into(),
            protocol: 9,
            port: 80,
            ..Default::default()
        }],
        ..Default::default()
    };
    let error = decode_service(&wire, "ns/web").unwrap_err().to_string();
    assert_eq!(error, "ns/web: field ports[0].protocol: unknown protocol 9");

    let global = value(localv1::Set::GlobalNodeInfos, "n1".into(), Vec::new());
    let error = decode_op(&global).unwrap_err().to_string();
    assert!(error.contains("GlobalNodeInfos in a node-local stream"), "{error}");
}
