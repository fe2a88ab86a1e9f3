// kpng's socket-level service translation: cgroup sock_addr programs.
//
// A socket in the cgroup that connects (or, unconnected UDP, sends) to a service address is
// pointed at one endpoint of the service before any packet leaves, so packets carry the
// endpoint's address from the first one on: no DNAT, no NAT conntrack entry. Replies
// (recvmsg) and getpeername() show the service address again.
//
// Maps (written by kpng's loader, `crates/kpng-ebpf/src/maps.rs` mirrors every layout):
//   kpng_frontends   (addr, port, proto, family) -> endpoint group, action when it is empty
//   kpng_groups      group -> endpoint count, ClientIP affinity timeout
//   kpng_backends    (group, slot) -> endpoint address and port, slots 0..count
//   kpng_members     (group, endpoint) -> present: the endpoints of affinity groups, and
//                    under (group ^ SERVING) the endpoints that still serve a UDP group's port
//   kpng_cluster_ips cluster IPs: a port they do not define is refused
//   kpng_affinity    (network namespace, group) -> endpoint, last use (LRU)
//   kpng_revnat      (socket, endpoint) -> service address (LRU)
//   kpng_udp_flows   (socket, service address) -> endpoint, last send (LRU)
//
// Addresses and ports are in network byte order; every other number in host order.

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ECONNREFUSED 111

#define FAMILY_V4 4
#define FAMILY_V6 6

// What a frontend does when its group has no endpoint.
#define EMPTY_REJECT 1
#define EMPTY_DROP 2

#define NSEC_PER_SEC 1000000000ULL

// Marks the id of a group's set of serving endpoints in kpng_members (kpng's loader writes
// them under the same id, `GroupId::serving`).
#define SERVING 0x53455256494e4731ULL

struct frontend_key {
	__u32 addr[4];
	__u16 port;
	__u8 proto;
	__u8 family;
};

struct frontend {
	__u64 group;
	__u8 empty;
	__u8 pad[3];
	// UDP: how long an unconnected socket's flow keeps its endpoint without a send
	// (conntrack's UDP stream timeout); 0 for TCP.
	__u32 flow_seconds;
};

struct group {
	__u32 count;
	__u32 affinity_seconds;
};

struct backend_key {
	__u64 group;
	__u32 slot;
	__u32 pad;
};

struct backend {
	__u32 addr[4];
	__u16 port;
	__u8 family;
	__u8 pad;
};

struct member_key {
	__u64 group;
	struct backend backend;
	__u32 pad;
};

struct cluster_ip_key {
	__u32 addr[4];
	__u8 family;
	__u8 pad[3];
};

struct affinity_key {
	__u64 netns;
	__u64 group;
};

struct affinity {
	struct backend backend;
	__u32 pad;
	__u64 last_ns;
};

struct revnat_key {
	__u64 cookie;
	struct backend backend;
	__u32 pad;
};

struct flow_key {
	__u64 cookie;
	struct frontend_key service;
	__u32 pad;
};

struct flow {
	struct backend backend;
	__u32 pad;
	__u64 last_ns;
};

// Sizes are placeholders: the loader sets them from the cluster.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct frontend_key);
	__type(value, struct frontend);
} kpng_frontends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, __u64);
	__type(value, struct group);
} kpng_groups SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct backend_key);
	__type(value, struct backend);
} kpng_backends SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct member_key);
	__type(value, __u8);
} kpng_members SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 1024);
	__type(key, struct cluster_ip_key);
	__type(value, __u8);
} kpng_cluster_ips SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct affinity_key);
	__type(value, struct affinity);
} kpng_affinity SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct revnat_key);
	__type(value, struct backend);
} kpng_revnat SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, struct flow_key);
	__type(value, struct flow);
} kpng_udp_flows SEC(".maps");

static __always_inline int handled_protocol(struct bpf_sock_addr *ctx)
{
	return ctx->protocol == IPPROTO_TCP || ctx->protocol == IPPROTO_UDP;
}

static __always_inline void read_dest(struct bpf_sock_addr *ctx, __u8 family,
				      struct frontend_key *key)
{
	if (family == FAMILY_V4) {
		key->addr[0] = ctx->user_ip4;
	} else {
		key->addr[0] = ctx->user_ip6[0];
		key->addr[1] = ctx->user_ip6[1];
		key->addr[2] = ctx->user_ip6[2];
		key->addr[3] = ctx->user_ip6[3];
	}
	key->port = (__u16)ctx->user_port;
	key->proto = (__u8)ctx->protocol;
	key->family = family;
}

// `family` is the hook's (a constant once inlined): a v4 hook may not touch user_ip6.
static __always_inline void write_dest(struct bpf_sock_addr *ctx, __u8 family,
				       const struct backend *b)
{
	if (b->family != family)
		return;
	if (family == FAMILY_V4) {
		ctx->user_ip4 = b->addr[0];
	} else {
		ctx->user_ip6[0] = b->addr[0];
		ctx->user_ip6[1] = b->addr[1];
		ctx->user_ip6[2] = b->addr[2];
		ctx->user_ip6[3] = b->addr[3];
	}
	ctx->user_port = (__u32)b->port;
}

// The endpoint at a random slot of the group, or NULL. A slot written while the group
// shrinks may be gone for an instant: slot 0 is tried next.
static __always_inline struct backend *pick_random(__u64 group, __u32 count)
{
	struct backend_key key = { .group = group, .slot = bpf_get_prandom_u32() % count };
	struct backend *b = bpf_map_lookup_elem(&kpng_backends, &key);
	if (!b) {
		key.slot = 0;
		b = bpf_map_lookup_elem(&kpng_backends, &key);
	}
	return b;
}

// ClientIP affinity: the endpoint this client (its network namespace) used last, while it
// is recent and still in the group; otherwise a random one, remembered.
static __always_inline int pick_affine(struct bpf_sock_addr *ctx, __u64 group,
				       const struct group *g, struct backend *out)
{
	struct affinity_key key = { .netns = bpf_get_netns_cookie(ctx), .group = group };
	__u64 now = bpf_ktime_get_ns();
	struct affinity *seen = bpf_map_lookup_elem(&kpng_affinity, &key);
	if (seen && now - seen->last_ns <= (__u64)g->affinity_seconds * NSEC_PER_SEC) {
		struct member_key member = { .group = group, .backend = seen->backend };
		if (bpf_map_lookup_elem(&kpng_members, &member)) {
			*out = seen->backend;
			seen->last_ns = now;
			return 1;
		}
	}
	struct backend *b = pick_random(group, g->count);
	if (!b)
		return 0;
	struct affinity fresh = { .backend = *b, .last_ns = now };
	bpf_map_update_elem(&kpng_affinity, &key, &fresh, BPF_ANY);
	*out = *b;
	return 1;
}

// An unconnected UDP socket's flow to a service keeps its endpoint, as conntrack keeps a
// flow's: while the endpoint still serves the port (it may have left the set this node
// picks from, terminating) and the flow has sent within the frontend's timeout. Returns 1
// with the endpoint in `out` when the flow goes on.
static __always_inline int follow_flow(const struct flow_key *key, __u64 group, __u32 seconds,
				       struct backend *out)
{
	struct flow *seen = bpf_map_lookup_elem(&kpng_udp_flows, key);
	__u64 now = bpf_ktime_get_ns();
	if (!seen || now - seen->last_ns > (__u64)seconds * NSEC_PER_SEC)
		return 0;
	struct member_key serving = { .group = group ^ SERVING, .backend = seen->backend };
	if (!bpf_map_lookup_elem(&kpng_members, &serving))
		return 0;
	seen->last_ns = now;
	*out = seen->backend;
	return 1;
}

static __always_inline void remember_flow(const struct flow_key *key, const struct backend *b)
{
	struct flow fresh = { .backend = *b, .last_ns = bpf_ktime_get_ns() };
	bpf_map_update_elem(&kpng_udp_flows, key, &fresh, BPF_ANY);
}

// An IPv4 address as an IPv6 socket names it (::ffff:a.b.c.d).
static __always_inline int v4_mapped(const __u32 *addr)
{
	return addr[0] == 0 && addr[1] == 0 && addr[2] == bpf_htonl(0xffff);
}

// Points a connect() or sendmsg() at an endpoint. Returns what the hook returns: 1 to let
// the call go on (translated or untouched), 0 to fail it with ECONNREFUSED. `unconnected`:
// a sendmsg() of an unconnected UDP socket, whose flows keep their endpoints.
static __always_inline int translate(struct bpf_sock_addr *ctx, __u8 family, int unconnected)
{
	if (!handled_protocol(ctx))
		return 1;
	struct frontend_key key = {};
	read_dest(ctx, family, &key);
	// The socket's own view of the service address, for replies and getpeername().
	struct backend service = { .port = key.port, .family = family };
	__builtin_memcpy(service.addr, key.addr, sizeof(service.addr));
	// An IPv6 socket reaching an IPv4 service through a v4-mapped address.
	int mapped = family == FAMILY_V6 && v4_mapped(key.addr);
	if (mapped) {
		key.addr[0] = key.addr[3];
		key.addr[2] = 0;
		key.addr[3] = 0;
		key.family = FAMILY_V4;
	}
	struct frontend *fe = bpf_map_lookup_elem(&kpng_frontends, &key);
	if (!fe) {
		// A cluster IP on a port (or protocol) its service does not define is refused.
		struct cluster_ip_key ip = { .family = key.family };
		__builtin_memcpy(ip.addr, key.addr, sizeof(ip.addr));
		if (bpf_map_lookup_elem(&kpng_cluster_ips, &ip))
			goto reject;
		return 1;
	}
	__u64 group = fe->group;
	__u8 empty = fe->empty;
	__u32 flow_seconds = fe->flow_seconds;
	struct group *g = bpf_map_lookup_elem(&kpng_groups, &group);
	struct backend chosen;
	if (!g || g->count == 0)
		goto empty;
	struct flow_key flow = { .cookie = bpf_get_socket_cookie(ctx), .service = key };
	int flows = unconnected && flow_seconds && key.proto == IPPROTO_UDP;
	if (flows && follow_flow(&flow, group, flow_seconds, &chosen)) {
		// The flow's endpoint, as conntrack would keep it.
	} else if (g->affinity_seconds) {
		if (!pick_affine(ctx, group, g, &chosen))
			goto empty;
	} else {
		struct backend *b = pick_random(group, g->count);
		if (!b)
			goto empty;
		chosen = *b;
	}
	if (chosen.family != key.family)
		return 1;
	if (flows)
		remember_flow(&flow, &chosen);
	if (mapped) {
		chosen.addr[3] = chosen.addr[0];
		chosen.addr[0] = 0;
		chosen.addr[1] = 0;
		chosen.addr[2] = bpf_htonl(0xffff);
		chosen.family = FAMILY_V6;
	}
	// Remember the service address for replies and getpeername().
	struct revnat_key rkey = { .cookie = bpf_get_socket_cookie(ctx), .backend = chosen };
	bpf_map_update_elem(&kpng_revnat, &rkey, &service, BPF_ANY);
	write_dest(ctx, family, &chosen);
	return 1;
empty:
	// Dropping is left to the packet path (nftables drops what upstream drops).
	if (empty == EMPTY_DROP)
		return 1;
reject:
	bpf_set_retval(-ECONNREFUSED);
	return 0;
}

// Shows the service address in place of the endpoint's (recvmsg, getpeername).
static __always_inline int restore(struct bpf_sock_addr *ctx, __u8 family)
{
	struct revnat_key key = { .cookie = bpf_get_socket_cookie(ctx) };
	struct frontend_key peer = {};
	read_dest(ctx, family, &peer);
	__builtin_memcpy(key.backend.addr, peer.addr, sizeof(peer.addr));
	key.backend.port = peer.port;
	key.backend.family = family;
	struct backend *service = bpf_map_lookup_elem(&kpng_revnat, &key);
	if (service)
		write_dest(ctx, family, service);
	return 1;
}

SEC("cgroup/connect4")
int kpng_connect4(struct bpf_sock_addr *ctx)
{
	return translate(ctx, FAMILY_V4, 0);
}

SEC("cgroup/connect6")
int kpng_connect6(struct bpf_sock_addr *ctx)
{
	return translate(ctx, FAMILY_V6, 0);
}

SEC("cgroup/sendmsg4")
int kpng_sendmsg4(struct bpf_sock_addr *ctx)
{
	return translate(ctx, FAMILY_V4, 1);
}

SEC("cgroup/sendmsg6")
int kpng_sendmsg6(struct bpf_sock_addr *ctx)
{
	return translate(ctx, FAMILY_V6, 1);
}

SEC("cgroup/recvmsg4")
int kpng_recvmsg4(struct bpf_sock_addr *ctx)
{
	return restore(ctx, FAMILY_V4);
}

SEC("cgroup/recvmsg6")
int kpng_recvmsg6(struct bpf_sock_addr *ctx)
{
	return restore(ctx, FAMILY_V6);
}

SEC("cgroup/getpeername4")
int kpng_getpeername4(struct bpf_sock_addr *ctx)
{
	return restore(ctx, FAMILY_V4);
}

SEC("cgroup/getpeername6")
int kpng_getpeername6(struct bpf_sock_addr *ctx)
{
	return restore(ctx, FAMILY_V6);
}

char LICENSE[] SEC("license") = "Apache-2.0";
