//! Compiles the aggregator's wire package from its `.proto` alone, as another vendor's
//! producer would: no kpng crate is used.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../../crates/kpng-api/proto";
    let file = format!("{proto}/aggregatorv1.proto");
    println!("cargo:rerun-if-changed={file}");
    let descriptors = protox::compile([file.as_str()], [proto])?;
    tonic_prost_build::configure().build_server(false).compile_fds(descriptors)?;
    Ok(())
}
