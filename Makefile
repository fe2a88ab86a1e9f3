# The same checks CI runs (.ci/run), without installing packages.
.PHONY: check test fmt clippy doc example

check: fmt clippy doc test

fmt:
	cargo fmt --all -- --check

clippy:
	cargo clippy --workspace --all-targets -- -D warnings

doc:
	RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps -q

test:
	cargo test --workspace

example:
	cargo run --release -- file --input examples/cluster.yaml to-local --node node-a to-nft --dry-run --once
