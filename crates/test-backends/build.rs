//! Generates the tonic client and server for `gck.test.v1.TestService` without protoc: the
//! messages are hand-written prost structs in `src/pb.rs`, the service is described here.

use tonic_build::manual::{Builder, Method, Service};

fn main() {
    let service = Service::builder()
        .name("TestService")
        .package("gck.test.v1")
        .comment("The test service served by every backend.")
        .method(
            Method::builder()
                .name("unary")
                .route_name("Unary")
                .comment("Answers one `Ping` with one `Pong` naming the backend.")
                .input_type("crate::pb::Ping")
                .output_type("crate::pb::Pong")
                .codec_path("tonic_prost::ProstCodec")
                .build(),
        )
        .method(
            Method::builder()
                .name("server_stream")
                .route_name("ServerStream")
                .comment("Answers one `StreamPing` with `count` `Pong`s naming the backend.")
                .input_type("crate::pb::StreamPing")
                .output_type("crate::pb::Pong")
                .codec_path("tonic_prost::ProstCodec")
                .server_streaming()
                .build(),
        )
        .build();

    Builder::new().compile(&[service]);
    println!("cargo:rerun-if-changed=build.rs");
}
