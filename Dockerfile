# kpng's image. The runtime needs `nft` (kpng loads its table's fixed chains with `nft -f`
# at start-up; every later change goes over netlink), so it is a slim Debian with nftables
# rather than a distroless image.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p kpng && strip target/release/kpng

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends nftables \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/kpng /usr/local/bin/kpng
ENTRYPOINT ["/usr/local/bin/kpng"]
