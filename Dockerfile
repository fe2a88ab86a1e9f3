# kpng's image. kpng speaks netlink to the kernel and needs no other program; `nft` is
# kept in the image for whoever debugs a node (`kubectl exec ... nft list table ip kpng`).
FROM rust:1-bookworm AS build
# to-ebpf's programs are compiled by the build with clang against libbpf's headers; a
# missing toolchain fails the build rather than leaving to-ebpf out.
RUN apt-get update \
    && apt-get install -y --no-install-recommends clang llvm libbpf-dev \
    && rm -rf /var/lib/apt/lists/*
ENV KPNG_EBPF_REQUIRE=1
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p kpng && strip target/release/kpng

FROM debian:bookworm-slim
# iptables for to-iptables; iproute2 and ipset to remove what kube-proxy's IPVS mode left.
RUN apt-get update \
    && apt-get install -y --no-install-recommends nftables iptables iproute2 ipset \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/kpng /usr/local/bin/kpng
# Started under this name (kubeadm's DaemonSet runs /usr/local/bin/kube-proxy), kpng takes
# kube-proxy's command line and KubeProxyConfiguration: swapping the image is enough.
RUN ln -s kpng /usr/local/bin/kube-proxy
ENTRYPOINT ["/usr/local/bin/kpng"]
