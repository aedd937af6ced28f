//! Compiles `proto/greeter.proto` without `protoc`: protox (a protobuf compiler in Rust) makes
//! the file descriptor set, tonic-prost-build generates the messages, the client and the server.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/greeter.proto");
    let descriptors = protox::compile(["greeter.proto"], ["proto"])?;
    tonic_prost_build::configure().compile_fds(descriptors)?;
    Ok(())
}
