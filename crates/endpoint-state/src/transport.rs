//! What a transport error says about a call and its connection, read from the error chain.
//!
//! tonic reports a transport failure as an error (or a `Status` whose `source()` is the
//! cause) wrapping hyper's and h2's errors, and ultimately the socket's `io::Error`. The
//! predicates here walk that chain ([`std::error::Error::source`]) and answer the questions the
//! kit's layers ask of a failure:
//!
//! * [`never_sent`]: the request provably never left this client (connecting was refused, or
//!   the connection closed before taking it) — safe to send again elsewhere;
//! * [`refused_by_server`]: the server refused the stream before processing it (HTTP/2's
//!   "not processed": a `GOAWAY` naming an earlier last stream, or `REFUSED_STREAM`);
//! * [`closed_before_server_spoke`]: the connection failed before the server sent a single
//!   byte — not even the HTTP/2 preface a server sends first — so no server code saw the call
//!   (a connection left in a closing server's accept queue, then reset);
//! * [`too_many_pings`]: the server closed the connection with `GOAWAY ENHANCE_YOUR_CALM` and
//!   the debug data `too_many_pings` — this client pings more often than the server allows
//!   (gRFC A8: double the keepalive interval for new connections).

use std::error::Error;
use std::io;

/// Whether `error` proves the request never left this client: connecting was refused (or the
/// network or local address was unavailable), or hyper's connection closed before taking the
/// request (its request was cancelled).
pub fn never_sent(error: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(error);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return matches!(
                io.kind(),
                io::ErrorKind::ConnectionRefused
                    | io::ErrorKind::NetworkUnreachable
                    | io::ErrorKind::AddrNotAvailable
            );
        }
        if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
            return hyper.is_canceled();
        }
        if e.is::<NeverSent>() {
            return true;
        }
        cur = e.source();
    }
    false
}

/// A request that never left this client: its connection failed or closed before the request
/// was handed to it (the kit's own HTTP/2 connections report this, as hyper's report a
/// cancelled request). [`never_sent`] and [`not_processed`] find it anywhere in an error's
/// chain; the connection's error is its [`source`](Error::source).
#[derive(Debug)]
pub struct NeverSent(pub Box<dyn Error + Send + Sync>);

impl std::fmt::Display for NeverSent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request was not sent: {}", self.0)
    }
}

impl Error for NeverSent {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        Some(&*self.0)
    }
}

/// The words of the error with which a connector that watches its connections (the kit's)
/// fails a connection that closed or broke before the server sent a single byte.
/// [`closed_before_server_spoke`] looks for them: h2 passes an I/O error's words on, but not
/// its type.
pub const CLOSED_BEFORE_SERVER_SPOKE: &str =
    "the connection closed before the server sent anything";

/// Whether `error` is a connection that closed or broke before the server sent a single byte
/// (as a connector reports it with [`CLOSED_BEFORE_SERVER_SPOKE`]). An HTTP/2 server sends its
/// preface before it reads a request, so no server code saw a call sent on it: the calls of
/// a server that stops and resets the connections still in its accept queue (tonic does), or
/// of an address whose process just died. Safe to send again elsewhere; evidence against the
/// target all the same.
pub fn closed_before_server_spoke(error: &(dyn Error + 'static)) -> bool {
    let mut cur = Some(error);
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return io
                .get_ref()
                .is_some_and(|inner| inner.to_string() == CLOSED_BEFORE_SERVER_SPOKE);
        }
        cur = e.source();
    }
    false
}

/// Whether `error` proves the server did not process the call although it is alive: it
/// refused the stream ([`refused_by_server`]), or hyper's connection closed before taking the
/// request (a connection the server was closing). A refused connection is not among these: it
/// is evidence that the backend is down.
pub fn not_processed(error: &(dyn Error + 'static)) -> bool {
    if refused_by_server(error) {
        return true;
    }
    let mut cur = Some(error);
    while let Some(e) = cur {
        if let Some(hyper) = e.downcast_ref::<hyper::Error>() {
            return hyper.is_canceled();
        }
        if e.is::<NeverSent>() {
            return true;
        }
        cur = e.source();
    }
    false
}

/// Whether `error` is the server refusing the call's stream, which HTTP/2 defines as "not
/// processed, safe to retry": its `GOAWAY` named a last stream below this one (or arrived
/// before this one was opened), or it reset the stream with `REFUSED_STREAM`. h2 reports
/// exactly these as a remote `GOAWAY` error or a remote `REFUSED_STREAM` reset on the stream;
/// a stream the server took that then breaks reports another reset or a broken pipe.
pub fn refused_by_server(error: &(dyn Error + 'static)) -> bool {
    h2_error(error).is_some_and(|h2| {
        h2.is_remote()
            && (h2.is_go_away()
                || (h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM)))
    })
}

/// The HTTP/2 error code `ENHANCE_YOUR_CALM`.
pub const ENHANCE_YOUR_CALM: u32 = 0xb;

/// The `GOAWAY` debug data with which gRPC servers refuse a client's pings (gRFC A8).
pub const TOO_MANY_PINGS: &str = "too_many_pings";

/// Whether a `GOAWAY` with this error code and debug data is a server refusing a client's
/// pings (gRFC A8): `ENHANCE_YOUR_CALM` and `too_many_pings`.
pub fn goaway_is_too_many_pings(code: u32, debug: &[u8]) -> bool {
    code == ENHANCE_YOUR_CALM && debug == TOO_MANY_PINGS.as_bytes()
}

/// Whether `error` is the server closing the connection with `GOAWAY ENHANCE_YOUR_CALM` and
/// the debug data `too_many_pings` (gRFC A8): this client sent HTTP/2 pings more often than the
/// server's policy allows (C-core, grpc-go and grpc-java servers allow one every 5 minutes by
/// default, without data in between). h2 reports it so only to a stream opened after the
/// `GOAWAY`; a stream in flight sees a broken pipe (health-layer reads the frame itself).
pub fn too_many_pings(error: &(dyn Error + 'static)) -> bool {
    h2_error(error).is_some_and(|h2| {
        let debug = format!("({:?})", bytes_of(TOO_MANY_PINGS));
        h2.is_go_away()
            && h2.is_remote()
            && h2.reason() == Some(h2::Reason::from(ENHANCE_YOUR_CALM))
            // h2 shows the GOAWAY's debug data in its message (there is no accessor).
            && h2.to_string().ends_with(&debug)
    })
}

/// How h2 prints debug data (as `Bytes`' `Debug`: `b"..."`).
fn bytes_of(s: &str) -> BytesDebug<'_> {
    BytesDebug(s.as_bytes())
}

struct BytesDebug<'a>(&'a [u8]);

impl std::fmt::Debug for BytesDebug<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("b\"")?;
        for &b in self.0 {
            write!(f, "{}", std::ascii::escape_default(b))?;
        }
        f.write_str("\"")
    }
}

/// The first `h2::Error` in `error`'s chain.
fn h2_error<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a h2::Error> {
    let mut cur = Some(error);
    while let Some(e) = cur {
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            return Some(h2);
        }
        cur = e.source();
    }
    None
}

#[cfg(test)]
mod silent_tests {
    use super::*;

    #[test]
    fn a_connection_closed_before_the_server_spoke_is_told_through_h2() {
        let io = io::Error::new(io::ErrorKind::ConnectionReset, CLOSED_BEFORE_SERVER_SPOKE);
        assert!(closed_before_server_spoke(&io));
        // h2 keeps the words, not the type (an error made again from its kind and its words):
        // still told.
        let words = io.get_ref().map(|inner| inner.to_string()).unwrap();
        let again = io::Error::new(io.kind(), words);
        assert!(closed_before_server_spoke(&again));
        let plain = io::Error::from(io::ErrorKind::ConnectionReset);
        assert!(!closed_before_server_spoke(&plain));
    }
}

#[cfg(test)]
mod tests {
    use std::fmt;
    use std::sync::Arc;

    use tonic::Status;

    use super::*;

    #[derive(Debug)]
    struct Wrap(Box<dyn Error + Send + Sync>);
    impl fmt::Display for Wrap {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("wrapped")
        }
    }
    impl Error for Wrap {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&*self.0)
        }
    }

    #[test]
    fn only_errors_that_prove_the_request_never_left_are_never_sent() {
        for kind in [
            io::ErrorKind::ConnectionRefused,
            io::ErrorKind::NetworkUnreachable,
            io::ErrorKind::AddrNotAvailable,
        ] {
            assert!(
                never_sent(&Wrap(Box::new(io::Error::from(kind)))),
                "{kind:?}"
            );
        }
        for kind in [
            io::ErrorKind::ConnectionReset,
            io::ErrorKind::BrokenPipe,
            io::ErrorKind::TimedOut,
            io::ErrorKind::HostUnreachable,
            io::ErrorKind::UnexpectedEof,
        ] {
            assert!(
                !never_sent(&Wrap(Box::new(io::Error::from(kind)))),
                "{kind:?}"
            );
        }
        assert!(!never_sent(&Status::unavailable("backend said so")));
        // A status made from a transport error carries its cause as its source.
        let mut status = Status::unavailable("b0: transport error");
        status.set_source(Arc::new(io::Error::from(io::ErrorKind::ConnectionRefused)));
        assert!(never_sent(&Wrap(Box::new(status))));
        // A connection that closed before it took the request (the kit's own HTTP/2 client
        // says so), whatever its own error.
        let closed = NeverSent(Box::new(io::Error::from(io::ErrorKind::BrokenPipe)));
        assert!(never_sent(&Wrap(Box::new(closed))));
        let closed = NeverSent(Box::new(io::Error::from(io::ErrorKind::BrokenPipe)));
        assert!(not_processed(&Wrap(Box::new(closed))));
        assert!(!not_processed(&Wrap(Box::new(io::Error::from(
            io::ErrorKind::BrokenPipe
        )))));
    }

    #[test]
    fn local_resets_are_neither_refused_nor_too_many_pings() {
        // Resets the server sent: only REFUSED_STREAM says it did not process the stream (and
        // h2 makes no remote GOAWAY error outside a connection; the kit's tests/retry.rs and
        // health-layer's tests/keepalive.rs have real ones).
        assert!(!refused_by_server(&h2::Error::from(h2::Reason::CANCEL)));
        assert!(!refused_by_server(&io::Error::from(
            io::ErrorKind::ConnectionReset
        )));
        assert!(!too_many_pings(&h2::Error::from(
            h2::Reason::ENHANCE_YOUR_CALM
        )));
        assert!(!too_many_pings(&Status::resource_exhausted(
            "too_many_pings"
        )));
    }
}

/// An HTTP/2 client connection builder with hyper's client defaults, which a tonic `Channel`
/// keeps unless its `Endpoint` says otherwise: a 2 MiB stream window and a 5 MiB connection
/// window (no adaptive window), 16 KiB frames and header lists, at most 1 MiB buffered to send
/// per stream, at most 1,024 streams reset for local errors, no server push. The kit's own
/// HTTP/2 connections and the health checker's probe connections start from it, so that they
/// behave on the wire as a `Channel` would.
///
/// One difference: hyper also caps the streams opened before the server's `SETTINGS` at 100,
/// and keeps that cap when the server's `SETTINGS` name no limit (as tonic's servers do). This
/// builder does as gRPC's own clients do instead: no limit until the server names one (RFC
/// 9113 §6.5.2). A stream a server refuses for that is one it never processed, which the
/// kit's transparent retry sends again; with the cap, a connection holding 100 long streams
/// would make every further call on it wait.
///
/// ```
/// # async fn f(io: tokio::io::DuplexStream) -> Result<(), h2::Error> {
/// let (send, connection) = endpoint_state::transport::http2_client()
///     .handshake::<_, bytes::Bytes>(io)
///     .await?;
/// # drop((send, connection)); Ok(()) }
/// ```
pub fn http2_client() -> h2::client::Builder {
    /// hyper 1's client defaults (`proto/h2/client.rs`, `Config::default`).
    const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
    const CONNECTION_WINDOW: u32 = 5 * 1024 * 1024;
    const MAX_FRAME: u32 = 16 * 1024;
    const MAX_HEADER_LIST: u32 = 16 * 1024;
    const MAX_SEND_BUFFER: usize = 1024 * 1024;
    const MAX_LOCAL_ERROR_RESETS: usize = 1024;
    let mut builder = h2::client::Builder::new();
    builder
        .max_local_error_reset_streams(Some(MAX_LOCAL_ERROR_RESETS))
        .initial_window_size(STREAM_WINDOW)
        .initial_connection_window_size(CONNECTION_WINDOW)
        .max_frame_size(MAX_FRAME)
        .max_header_list_size(MAX_HEADER_LIST)
        .max_send_buffer_size(MAX_SEND_BUFFER)
        .enable_push(false);
    builder
}

/// The URI a connector is asked to connect when the connection must go to `address` rather
/// than to wherever the endpoint's host resolves: `uri` with its authority replaced by the
/// address (scheme and path kept). The endpoint itself keeps naming the server — its
/// `:authority` and its TLS server name — as gRPC does for a name resolved to addresses.
///
/// ```
/// use endpoint_state::transport::redirect_uri;
/// let uri: http::Uri = "https://billing.internal:443/".parse().unwrap();
/// let to = redirect_uri(&uri, "10.0.0.7:443".parse().unwrap());
/// assert_eq!(to.to_string(), "https://10.0.0.7:443/");
/// let v6 = redirect_uri(&uri, "[::1]:443".parse().unwrap());
/// assert_eq!(v6.to_string(), "https://[::1]:443/");
/// ```
pub fn redirect_uri(uri: &http::Uri, address: std::net::SocketAddr) -> http::Uri {
    let mut parts = uri.clone().into_parts();
    // A socket address always makes a valid authority (`1.2.3.4:5`, `[::1]:5`).
    parts.authority = address.to_string().parse().ok();
    if parts.scheme.is_none() {
        parts.scheme = Some(http::uri::Scheme::HTTP);
    }
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
    }
    http::Uri::from_parts(parts).unwrap_or_else(|_| uri.clone())
}
