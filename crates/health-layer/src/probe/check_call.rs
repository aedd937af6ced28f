//! The checker's own `Check` call: the request for a service name is constant, so it is
//! encoded once and every check sends the same bytes, straight to the probe channel.
//!
//! [`check_on`](super::check_on) goes through tonic's generic client (a codec, an encoding
//! stream per call, a `HealthClient` and a `Request` to build). What the checker sends never
//! changes but for its deadline, so a [`CheckCall`] keeps the framed message and sends it as
//! one body of known length (one `DATA` frame carrying `END_STREAM`), and reads the answer as
//! tonic's unary client does, so that every answer (trailers-only, an HTTP status without
//! `grpc-status`, a compressed or broken message, a broken stream) means what it means to a
//! tonic client. Errors are made as [`check_with`](super::check_with) makes them.

use std::sync::Arc;
use std::time::Duration;

use endpoint_state::time::FAR;
use http::header::{CONTENT_TYPE, TE, USER_AGENT};
use http::{HeaderMap, HeaderValue, Method, Request, StatusCode, Uri, Version};
use http_body_util::{BodyExt, Full};
use prost::Message;
use tonic::codegen::{Bytes, Service};
use tonic::transport::Channel;
use tonic::{Code, Status};
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tower::ServiceExt;

use super::connect::{Direct, Via};
use super::error::ProbeError;
use super::grpc::{ServingStatus, check_outcome};

/// `grpc.health.v1.Health/Check`.
pub(crate) const PATH: &str = "/grpc.health.v1.Health/Check";

/// A `Check` about one service name, encoded once. Cheap to clone.
#[derive(Clone, Debug)]
pub(crate) struct CheckCall {
    service: Arc<str>,
    /// The `HealthCheckRequest`, framed for gRPC (uncompressed).
    body: Bytes,
}

impl CheckCall {
    pub(crate) fn new(service: Arc<str>) -> Self {
        let body = frame_request(&service);
        CheckCall { service, body }
    }

    /// One `Check` through `via` within `timeout` (sent as the call's deadline too), whatever
    /// the server answers. `target` names the endpoint in errors.
    pub(crate) async fn call(
        &self,
        via: &Via,
        target: &Arc<str>,
        timeout: Duration,
    ) -> Result<ServingStatus, ProbeError> {
        let answer = match via {
            Via::Channel(channel) => {
                tokio::time::timeout(timeout, self.exchange(channel.clone(), timeout)).await
            }
            Via::Direct(direct) => {
                tokio::time::timeout(timeout, self.exchange_direct(direct, timeout)).await
            }
        };
        check_outcome(answer, target.clone(), self.service.clone(), timeout)
    }

    /// The call on the checker's own connection: its `HEADERS` and its one `DATA` frame are
    /// handed to the connection together (normally one write), and the answer is read here, as
    /// [`exchange`](Self::exchange) reads it.
    async fn exchange_direct(&self, direct: &Direct, timeout: Duration) -> Result<i32, Status> {
        let mut send = direct.send.clone().ready().await.map_err(h2_status)?;
        let mut request = Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = direct.check_uri.clone();
        let headers = request.headers_mut();
        headers.insert(TE, HeaderValue::from_static("trailers"));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-timeout", grpc_timeout(timeout));
        headers.insert(USER_AGENT, HeaderValue::from_static(USER_AGENT_VALUE));
        let (response, mut stream) = send.send_request(request, false).map_err(h2_status)?;
        stream
            .send_data(self.body.clone(), true)
            .map_err(h2_status)?;
        let (head, mut body) = response.await.map_err(h2_status)?.into_parts();
        if let Some(status) = trailers_only(&head.headers) {
            return Err(status);
        }
        let mut data = Vec::new();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.map_err(h2_status)?;
            let _ = body.flow_control().release_capacity(chunk.len());
            append(&mut data, &chunk)?;
        }
        let trailers = body.trailers().await.map_err(h2_status)?;
        judge(&data, trailers.as_ref(), head.status)
    }

    /// The call, as tonic's unary client makes it: the answer's raw serving status.
    async fn exchange(&self, mut channel: Channel, timeout: Duration) -> Result<i32, Status> {
        let request = self.request(timeout);
        let response = channel
            .ready()
            .await
            .map_err(|e| Status::from_error(Box::new(e)))?
            .call(request)
            .await
            .map_err(|e| Status::from_error(Box::new(e)))?;
        let (head, mut body) = response.into_parts();
        if let Some(status) = trailers_only(&head.headers) {
            return Err(status);
        }
        let mut data = Vec::new();
        let mut trailers = None;
        while let Some(frame) = body.frame().await {
            let frame = frame?;
            if let Some(chunk) = frame.data_ref() {
                append(&mut data, chunk)?;
            } else if let Ok(t) = frame.into_trailers() {
                trailers = Some(t);
            }
        }
        judge(&data, trailers.as_ref(), head.status)
    }

    fn request(&self, timeout: Duration) -> Request<tonic::body::Body> {
        let mut request = Request::new(tonic::body::Body::new(Full::new(self.body.clone())));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = Uri::from_static(PATH);
        *request.version_mut() = Version::HTTP_2;
        let headers = request.headers_mut();
        headers.insert(TE, HeaderValue::from_static("trailers"));
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
        headers.insert("grpc-timeout", grpc_timeout(timeout));
        request
    }
}

/// The `user-agent` of the checker's own probe connections.
const USER_AGENT_VALUE: &str = concat!("health-layer/", env!("CARGO_PKG_VERSION"));

/// A trailers-only answer carries its status in the headers (and no message: `OK` there is an
/// error).
fn trailers_only(headers: &HeaderMap) -> Option<Status> {
    let status = Status::from_header_map(headers)?;
    Some(match status.code() {
        Code::Ok => Status::internal("Missing response message."),
        _ => status,
    })
}

/// Adds a piece of the answer's body to `data`, refusing more than [`MAX_ANSWER`] bytes.
fn append(data: &mut Vec<u8>, chunk: &[u8]) -> Result<(), Status> {
    if data.len() + chunk.len() > MAX_ANSWER {
        return Err(Status::out_of_range(format!(
            "Error, decoded message length too large: found more than {MAX_ANSWER} bytes, the limit is: {MAX_ANSWER} bytes"
        )));
    }
    data.extend_from_slice(chunk);
    Ok(())
}

/// A whole answer, as tonic's unary client reads it: its message's raw serving status, or the
/// call's status.
fn judge(
    data: &[u8],
    trailers: Option<&HeaderMap>,
    http_status: StatusCode,
) -> Result<i32, Status> {
    let message = decode_message(data, http_status)?;
    call_status(trailers, http_status)?;
    message.ok_or_else(|| Status::internal("Missing response message."))
}

/// The status of a call that an HTTP/2 error ended, as a tonic `Channel` reports a transport
/// error: `UNKNOWN`, with the error as its source. [`check_outcome`] then makes it what it makes
/// of the `Channel`'s: `UNAVAILABLE` ("connection broken: ..."), and reads from the source how
/// the connection ended (see [`ConnectionEnd`](super::error::ConnectionEnd)), so that a target's
/// reason and the checker's reconnect are the same on both kinds of probe connection.
fn h2_status(error: h2::Error) -> Status {
    let mut status = Status::unknown(error.to_string());
    status.set_source(Arc::new(error));
    status
}

/// The framed `HealthCheckRequest { service }`: the gRPC message prefix (not compressed, the
/// length), then the message as prost encodes it.
fn frame_request(service: &str) -> Bytes {
    let message = HealthCheckRequest {
        service: service.to_owned(),
    }
    .encode_to_vec();
    let mut framed = Vec::with_capacity(5 + message.len());
    framed.push(0);
    framed.extend_from_slice(&(message.len() as u32).to_be_bytes());
    framed.extend_from_slice(&message);
    Bytes::from(framed)
}

/// `grpc-timeout` for `timeout`: whole milliseconds (rounded down), so that the header stays
/// the same from one check to the next and HPACK sends it as an index into its table instead
/// of a new literal every time (tonic writes the finest unit, which changes with every call).
/// Below a millisecond, or beyond 8 digits of them, the finest unit with at most 8 digits, as
/// tonic writes it. tonic refuses (panics on) a deadline beyond 8 digits of hours: one beyond
/// any timer is no deadline in practice, so it is capped as [`check_with`](super::check_with)
/// caps it.
fn grpc_timeout(timeout: Duration) -> HeaderValue {
    const MAX: u128 = 99_999_999;
    let timeout = timeout.min(FAR);
    let units: [(u128, u8); 6] = [
        (timeout.as_millis(), b'm'),
        (timeout.as_nanos(), b'n'),
        (timeout.as_micros(), b'u'),
        (u128::from(timeout.as_secs()), b'S'),
        (u128::from(timeout.as_secs() / 60), b'M'),
        (u128::from(timeout.as_secs() / 3600), b'H'),
    ];
    let (value, unit) = units
        .into_iter()
        .find(|&(value, unit)| value <= MAX && (value > 0 || unit == b'n'))
        .unwrap_or((MAX, b'H'));
    let mut text = [0u8; 9];
    let mut digits = 0;
    let mut rest = value;
    loop {
        text[digits] = b'0' + (rest % 10) as u8;
        digits += 1;
        rest /= 10;
        if rest == 0 {
            break;
        }
    }
    text[..digits].reverse();
    text[digits] = unit;
    HeaderValue::from_bytes(&text[..=digits]).expect("digits and a unit letter")
}

/// The most an answer may carry (tonic's default for a received message).
const MAX_ANSWER: usize = 4 * 1024 * 1024;

/// The first message of an answer's body, framed for gRPC (`None`: no message), its raw
/// serving status; errors as tonic's decoder says them.
fn decode_message(data: &[u8], http_status: StatusCode) -> Result<Option<i32>, Status> {
    let Some((&flag, rest)) = data.split_first() else {
        return Ok(None);
    };
    match flag {
        0 => {}
        1 => {
            return Err(Status::internal(
                "protocol error: received message with compressed-flag but no grpc-encoding was specified",
            ));
        }
        f => {
            return Err(Status::internal(format!(
                "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1) while receiving response with status: {http_status}"
            )));
        }
    }
    let (Some(len), Some(rest)) = (rest.get(..4), rest.get(4..)) else {
        return Ok(None);
    };
    let len = u32::from_be_bytes(len.try_into().expect("four bytes")) as usize;
    let message = rest.get(..len).ok_or_else(|| {
        Status::internal("protocol error: the answer ended in the middle of a message")
    })?;
    decode_status(message)
        .map(Some)
        .ok_or_else(|| Status::internal("failed to decode Protobuf message: HealthCheckResponse"))
}

/// The call's status, from its trailers or else its HTTP status, as tonic infers it.
fn call_status(trailers: Option<&HeaderMap>, http_status: StatusCode) -> Result<(), Status> {
    if let Some(status) = trailers.and_then(Status::from_header_map) {
        return match status.code() {
            Code::Ok => Ok(()),
            _ => Err(status),
        };
    }
    // https://github.com/grpc/grpc/blob/master/doc/http-grpc-status-mapping.md
    let code = match http_status {
        StatusCode::BAD_REQUEST => Code::Internal,
        StatusCode::UNAUTHORIZED => Code::Unauthenticated,
        StatusCode::FORBIDDEN => Code::PermissionDenied,
        StatusCode::NOT_FOUND => Code::Unimplemented,
        StatusCode::TOO_MANY_REQUESTS
        | StatusCode::BAD_GATEWAY
        | StatusCode::SERVICE_UNAVAILABLE
        | StatusCode::GATEWAY_TIMEOUT => Code::Unavailable,
        StatusCode::OK => {
            return Err(Status::unknown(
                "protocol error: missing grpc-status trailer, stream was terminated without a final status (possible truncation by a proxy or load balancer)",
            ));
        }
        _ => Code::Unknown,
    };
    Err(Status::new(
        code,
        format!(
            "grpc-status header missing, mapped from HTTP status code {}",
            http_status.as_u16()
        ),
    ))
}

/// The `status` field of an encoded `HealthCheckResponse`; `None` when it is malformed.
fn decode_status(message: &[u8]) -> Option<i32> {
    HealthCheckResponse::decode(message).ok().map(|r| r.status)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_framed_protobuf() {
        // `HealthCheckRequest { service }` in protobuf's wire format: field 1, length, bytes.
        assert_eq!(&frame_request("")[..], [0, 0, 0, 0, 0], "an empty message");
        assert_eq!(&frame_request("x")[..], [0, 0, 0, 0, 3, 0x0a, 1, b'x']);
        let long = "s".repeat(300);
        let framed = frame_request(&long);
        assert_eq!(
            &framed[..8],
            [0, 0, 0, 1, 0x2f, 0x0a, 0xac, 0x02],
            "303 bytes; 300 = ac 02"
        );
        assert_eq!(&framed[8..], long.as_bytes());
    }

    #[test]
    fn the_answer_decodes_as_protobuf_says() {
        assert_eq!(decode_status(&[]), Some(0), "the default: UNKNOWN");
        assert_eq!(decode_status(&[0x08, 1]), Some(1));
        assert_eq!(decode_status(&[0x08, 2]), Some(2));
        // A negative enum value takes ten bytes.
        let minus_one = [
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01,
        ];
        assert_eq!(decode_status(&minus_one), Some(-1));
        // Unknown fields are skipped; the last value wins.
        assert_eq!(
            decode_status(&[0x08, 1, 0x12, 2, b'h', b'i', 0x08, 2]),
            Some(2)
        );
        assert_eq!(decode_status(&[0x08]), None, "truncated");
        assert_eq!(decode_status(&[0x0f]), None, "no such wire type");
    }

    #[test]
    fn a_message_is_read_from_its_frame_and_its_status_from_the_trailers() {
        let ok = StatusCode::OK;
        assert_eq!(
            decode_message(&[0, 0, 0, 0, 2, 0x08, 1], ok).unwrap(),
            Some(1)
        );
        assert_eq!(decode_message(&[], ok).unwrap(), None);
        let compressed = decode_message(&[1, 0, 0, 0, 2, 0x08, 1], ok).unwrap_err();
        assert_eq!(compressed.code(), Code::Internal);
        assert!(
            decode_message(&[0, 0, 0, 0, 9, 0x08], ok).is_err(),
            "cut short"
        );

        let mut trailers = HeaderMap::new();
        trailers.insert("grpc-status", HeaderValue::from_static("0"));
        assert!(call_status(Some(&trailers), ok).is_ok());
        trailers.insert("grpc-status", HeaderValue::from_static("5"));
        trailers.insert(
            "grpc-message",
            HeaderValue::from_static("unknown%20service"),
        );
        let not_found = call_status(Some(&trailers), ok).unwrap_err();
        assert_eq!(
            (not_found.code(), not_found.message()),
            (Code::NotFound, "unknown service")
        );
        assert_eq!(call_status(None, ok).unwrap_err().code(), Code::Unknown);
        let mapped = call_status(None, StatusCode::SERVICE_UNAVAILABLE).unwrap_err();
        assert_eq!(mapped.code(), Code::Unavailable);
        assert_eq!(
            mapped.message(),
            "grpc-status header missing, mapped from HTTP status code 503"
        );
    }

    #[test]
    fn an_http2_error_is_a_broken_connection_as_on_a_channel() {
        use std::error::Error;
        // (A lost connection, an io error, is one too: `tests/check_real.rs`.)
        for reason in [
            h2::Reason::REFUSED_STREAM,
            h2::Reason::CANCEL,
            h2::Reason::PROTOCOL_ERROR,
        ] {
            let error = h2::Error::from(reason);
            let text = error.to_string();
            let status = h2_status(error);
            let source = status.source().expect("the cause is kept");
            assert!(source.downcast_ref::<h2::Error>().is_some(), "{status:?}");
            let outcome = check_outcome(Ok(Err(status)), "t", "".into(), Duration::from_secs(1));
            let error = outcome.unwrap_err();
            assert_eq!(error.code(), Some(Code::Unavailable), "{error}");
            assert!(error.connection_ended(), "{error}");
            assert_eq!(
                error.reason(),
                format!("UNAVAILABLE: connection broken: {text}")
            );
        }
    }

    #[test]
    fn grpc_timeout_is_whole_milliseconds_and_has_at_most_8_digits() {
        let cases = [
            (Duration::ZERO, "0n"),
            (Duration::from_nanos(5), "5n"),
            (Duration::from_micros(999), "999000n"),
            (Duration::from_millis(1), "1m"),
            (Duration::from_micros(4_999_873), "4999m"),
            (Duration::from_secs(5), "5000m"),
            (Duration::from_secs(99_999), "99999000m"),
            (Duration::from_secs(200_000), "200000S"),
            (Duration::MAX, "15768000M"), // capped at 30 years
        ];
        for (timeout, text) in cases {
            assert_eq!(grpc_timeout(timeout), text, "{timeout:?}");
        }
    }
}
