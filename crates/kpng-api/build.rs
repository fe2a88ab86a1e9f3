//! Compiles the protobuf packages with protox (pure Rust: no protoc needed).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = ["proto/localv1.proto", "proto/globalv1.proto", "proto/aggregatorv1.proto"];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
