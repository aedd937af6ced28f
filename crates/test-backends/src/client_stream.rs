//! A client stream the server ends early.

use futures_core::Stream;
use tonic::client::GrpcService;
use tonic::codegen::{Body, Bytes, StdError};

use crate::pb::{Ping, Pong};

/// The HTTP/2 path of `gck.test.v1.TestService/Upload`: a client-streaming method that
/// no backend implements, so a backend ends every such call at once with `UNIMPLEMENTED`,
/// without reading its request stream — a server ending a client stream early.
pub const UPLOAD_PATH: &str = "/gck.test.v1.TestService/Upload";

/// Calls `Upload` over `channel` (any tonic channel: a `Channel`, the kit's): sends `pings` as
/// the request stream and returns the answer. Against a [`Backend`](crate::Backend), the call
/// ends with `UNIMPLEMENTED` before the stream is read, and the channel must then drop the
/// stream: whoever feeds it sees it closed.
pub async fn upload<T, S>(
    channel: T,
    pings: tonic::Request<S>,
) -> Result<tonic::Response<Pong>, tonic::Status>
where
    T: GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as Body>::Error: Into<StdError> + Send,
    S: Stream<Item = Ping> + Send + 'static,
{
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready()
        .await
        .map_err(|e| tonic::Status::unknown(format!("channel not ready: {}", e.into())))?;
    let path = http::uri::PathAndQuery::from_static(UPLOAD_PATH);
    let codec = tonic_prost::ProstCodec::<Ping, Pong>::default();
    grpc.client_streaming(pings, path, codec).await
}
