//! Real-backend fixtures that every layer's tests share: channels to a [`Backend`] (connected
//! now, or on the first call), and the failures each layer that reads outcomes must see alike —
//! a [`refused`] connection, a [local timeout](LocalTimeout), and an error in the trailers
//! after a streamed message ([`failing_stream`]).
//!
//! ```
//! use test_backends::fixture::{self, LocalTimeout};
//! use test_backends::pb::{Ping, test_service_client::TestServiceClient};
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> std::io::Result<()> {
//! let (_stopped, channel) = fixture::refused("b0").await?;
//! let status = TestServiceClient::new(channel).unary(Ping::default()).await.unwrap_err();
//! assert_eq!(status.code(), tonic::Code::Unavailable);
//!
//! let slow = LocalTimeout::start("b1").await?;
//! let status = TestServiceClient::new(slow.channel).unary(Ping::default()).await.unwrap_err();
//! LocalTimeout::assert_cancelled(&status);
//! # Ok(())
//! # }
//! ```

use std::io;
use std::time::Duration;

use bytes::Bytes;
use tonic::Code;
use tonic::client::GrpcService;
use tonic::codec::Streaming;
use tonic::codegen::StdError;
use tonic::transport::{Channel, Endpoint};

use crate::Backend;
use crate::pb::test_service_client::TestServiceClient;
use crate::pb::{Pong, StreamPing};

/// How long a fixture's channel may take to connect: ample on loopback, and short enough that
/// nothing in a test hangs for long.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// An endpoint for `uri` (`http://127.0.0.1:PORT`) with [`CONNECT_TIMEOUT`].
///
/// # Panics
///
/// If `uri` is not a valid URI.
pub fn endpoint(uri: impl Into<String>) -> Endpoint {
    Endpoint::from_shared(uri.into())
        .expect("a valid uri")
        .connect_timeout(CONNECT_TIMEOUT)
}

/// A channel to `backend`, connected now.
///
/// # Panics
///
/// If the backend does not accept the connection.
pub async fn connect(backend: &Backend) -> Channel {
    endpoint(backend.uri())
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connecting to {}: {e}", backend.name()))
}

/// A channel to `backend` that connects on its first call (and again after each failure).
pub fn connect_lazy(backend: &Backend) -> Channel {
    endpoint(backend.uri()).connect_lazy()
}

/// A refused connection: a backend named `name` that has been stopped (its port refuses
/// connections), and a lazy channel to it. Every call fails with `UNAVAILABLE`, and
/// "connection refused" is in its error's chain. [`Backend::restart`] serves again.
pub async fn refused(name: &str) -> io::Result<(Backend, Channel)> {
    let backend = Backend::start(name).await?;
    let channel = connect_lazy(&backend);
    backend.stop().await;
    Ok((backend, channel))
}

/// An error in the trailers after a streamed message: `backend` fails its next call with
/// `code`, and `client` (whatever its stack) opens a `ServerStream` of 3 messages. The stream
/// yields one message, then the error — which is known only once the trailers are read.
///
/// # Panics
///
/// If the stream cannot be opened.
pub async fn failing_stream<T>(
    backend: &Backend,
    client: &mut TestServiceClient<T>,
    code: Code,
) -> Streaming<Pong>
where
    T: GrpcService<tonic::body::Body>,
    T::Error: Into<StdError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<StdError> + Send,
{
    backend.fail_next(1, code);
    client
        .server_stream(StreamPing { count: 3 })
        .await
        .expect("the stream opens before it fails")
        .into_inner()
}

/// A local timeout: a backend that answers only after [`SERVER_DELAY`](Self::SERVER_DELAY),
/// and a channel whose own timeout, [`CLIENT_TIMEOUT`](Self::CLIENT_TIMEOUT), ends every call
/// first. tonic reports its own timeout as `CANCELLED` (`Timeout expired`); what a layer makes
/// of it (a classifier counts `DEADLINE_EXCEEDED`) is the layer's test.
#[derive(Debug)]
pub struct LocalTimeout {
    /// The slow backend (its delay can be changed, or cleared).
    pub backend: Backend,
    /// A channel to it, connected, with the short timeout.
    pub channel: Channel,
}

impl LocalTimeout {
    /// How long the backend takes to answer.
    pub const SERVER_DELAY: Duration = Duration::from_secs(5);
    /// The channel's own timeout.
    pub const CLIENT_TIMEOUT: Duration = Duration::from_millis(100);

    /// Starts the backend named `name` and connects the channel.
    pub async fn start(name: &str) -> io::Result<Self> {
        let backend = Backend::start(name).await?;
        backend.set_delay(Self::SERVER_DELAY);
        let channel = endpoint(backend.uri())
            .timeout(Self::CLIENT_TIMEOUT)
            .connect()
            .await
            .map_err(io::Error::other)?;
        Ok(LocalTimeout { backend, channel })
    }

    /// Asserts that `status` is tonic's own report of its timeout: `CANCELLED`.
    ///
    /// # Panics
    ///
    /// If it is anything else.
    #[track_caller]
    pub fn assert_cancelled(status: &tonic::Status) {
        assert_eq!(
            status.code(),
            Code::Cancelled,
            "tonic's own word for its timeout: {status:?}"
        );
    }
}
