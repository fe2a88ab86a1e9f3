//! Real packets through a real kernel: kpng programs a node namespace, and clients in other
//! namespaces talk to pods through it. Every scenario runs against every dataplane backend
//! (`on_dataplane!`); the few that exercise one backend's own machinery are listed for
//! that backend only.

mod aggregation;
mod annotations;
mod attachment;
mod chains;
mod harness;
mod kube_proxy;
mod lifecycle;
mod local;
mod nftlb;
mod parity;
mod pods;
mod repair;
mod services;

/// The body of the probing processes on the node ([`local::Local`]: this binary again); it
/// does nothing as a test of its own.
#[test]
fn local_probes() {
    local::serve_when_asked();
}

/// `to-nftlb` expresses cluster IPs only: its scenario is its own.
#[test]
fn nftlb_serves_cluster_ips_follows_endpoints_and_cleans_up() {
    nftlb::to_nftlb_serves_cluster_ips_follows_endpoints_and_cleans_up();
}

/// kpng in kube-proxy's place: kubeadm's command line and configuration, in each mode.
#[test]
fn kube_proxy_is_replaced_in_nftables_mode() {
    kube_proxy::kube_proxy_is_replaced_in_nftables_mode();
}

#[test]
fn kube_proxy_is_replaced_in_iptables_mode() {
    kube_proxy::kube_proxy_is_replaced_in_iptables_mode();
}

#[test]
fn kube_proxy_ipvs_mode_is_refused_by_name() {
    kube_proxy::ipvs_mode_is_refused_by_name();
}

/// One `#[test]` per scenario and dataplane: `nft::<scenario>`, `aggregated::<scenario>`,
/// `iptables::<scenario>`, `ebpf::<scenario>`.
macro_rules! on_dataplane {
    ($dp:ident, $dataplane:expr; $($module:ident :: $name:ident),* $(,)?) => {
        mod $dp {
            $(
                #[test]
                fn $name() {
                    crate::harness::run(stringify!($name), $dataplane, crate::$module::$name);
                }
            )*
        }
    };
}

/// Every scenario that holds whatever the dataplane, then `$own`: the scenarios of that
/// backend's own machinery (repairs of its tables or maps), and
/// `service_proxy_name_selects_the_services_kpng_proxies` on the packet-path backends.
macro_rules! on_every_dataplane {
    ($dp:ident, $dataplane:expr; $($own:tt)*) => {
        on_dataplane!($dp, $dataplane;
            services::cluster_ip_node_port_and_rejects,
            pods::pods_reach_cluster_ips_over_every_kind_of_socket,
            services::external_ips_and_load_balancer_source_ranges,
            services::external_traffic_policy_local,
            services::internal_policy_local_terminating_fallback_and_dual_stack,
            services::sctp_cluster_ip_and_node_port,
            services::node_ports_on_primary_or_chosen_addresses,
            services::node_ports_on_every_address_of_a_family_without_a_primary_ip,
            services::client_ip_affinity_sticks_across_addresses,
            services::masquerade_all_and_cluster_cidr,
            lifecycle::restart_changes_nothing_and_keeps_established_connections,
            lifecycle::udp_flows_move_when_their_endpoint_goes,
            lifecycle::updates_apply_while_traffic_flows,
            pods::pods_keep_connecting_while_endpoints_come_and_go,
            lifecycle::health_check_node_ports_follow_local_endpoints_and_ports,
            lifecycle::a_second_kpng_on_the_node_exits_naming_the_first,
            lifecycle::conntrack_is_tuned_at_start_up,
            parity::udp_flows_to_an_endpoint_that_still_serves_are_kept,
            parity::a_pods_unconnected_udp_flow_keeps_an_endpoint_that_still_serves,
            parity::a_pods_connected_udp_socket_leaves_an_endpoint_that_is_gone,
            parity::client_ip_affinity_survives_a_scale_down,
            parity::node_ports_follow_addresses_added_after_start,
            parity::hairpin_without_node_name,
            parity::unallocated_service_addresses_are_dropped,
            parity::service_cidr_objects_take_effect_as_they_change,
            parity::pods_are_recognised_by_interface_or_bridge,
            $($own)*
        );
    };
}

on_every_dataplane!(nft, crate::harness::Dataplane::Nft;
    parity::service_proxy_name_selects_the_services_kpng_proxies,
    repair::a_rejected_transaction_is_retried_and_the_table_rebuilt,
    repair::a_flushed_table_is_repaired_at_the_next_verification,
    repair::idle_verifications_read_nothing_back_until_another_transaction,
    repair::deleted_and_foreign_rules_are_repaired,
    repair::a_refused_repair_keeps_every_rule_in_force,
    annotations::round_robin_takes_the_endpoints_in_turn,
    annotations::hash_persistence_keeps_a_client_on_one_endpoint,
    annotations::symmetric_hash_keeps_each_flow_on_one_endpoint,
    annotations::stateless_dnat_rewrites_both_ways_without_conntrack,
    annotations::direct_server_return_answers_the_client_straight,
    annotations::persistence_sticks_until_its_timeout,
    annotations::dnat_shows_the_client_and_snat_always_masquerades,
    annotations::new_connections_are_logged_with_the_service_name,
    annotations::the_ftp_helper_follows_active_data_connections,
);

on_every_dataplane!(aggregated, crate::harness::Dataplane::aggregated();
    parity::service_proxy_name_selects_the_services_kpng_proxies,
    repair::a_rejected_transaction_is_retried_and_the_table_rebuilt,
    annotations::round_robin_takes_the_endpoints_in_turn,
    annotations::hash_persistence_keeps_a_client_on_one_endpoint,
    annotations::symmetric_hash_keeps_each_flow_on_one_endpoint,
    annotations::stateless_dnat_rewrites_both_ways_without_conntrack,
    annotations::direct_server_return_answers_the_client_straight,
    annotations::persistence_sticks_until_its_timeout,
    annotations::dnat_shows_the_client_and_snat_always_masquerades,
    annotations::new_connections_are_logged_with_the_service_name,
);

on_every_dataplane!(ebpf, crate::harness::Dataplane::ebpf();
    lifecycle::maps_grow_under_established_connections_and_cleanup_honours_the_backend,
    repair::programs_and_maps_removed_behind_kpngs_back_are_restored,
    repair::detached_programs_and_a_recreated_cgroup_are_attached_again,
);

on_every_dataplane!(iptables, crate::harness::Dataplane::Iptables;
    parity::service_proxy_name_selects_the_services_kpng_proxies,
    repair::idle_verifications_read_nothing_back_until_another_transaction,
    chains::a_refused_restore_is_retried_and_the_chains_rebuilt,
    chains::a_flushed_chain_is_repaired_at_the_next_verification,
    chains::deleted_and_foreign_rules_are_repaired,
    chains::cleanup_removes_exactly_kpngs_chains,
    chains::the_legacy_variant_serves_restarts_and_cleans_up,
    chains::auto_mode_follows_the_variant_the_kubelet_uses,
    chains::waiting_for_the_xtables_lock_is_logged_with_its_path,
    chains::localhost_node_ports_and_the_martians_they_let_in,
);
