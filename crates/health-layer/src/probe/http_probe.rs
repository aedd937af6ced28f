//! The HTTP probe: GET one URL on the target, judge the status and the body.

use std::fmt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Arc;
use std::time::Duration;

use http::{HeaderMap, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Limited};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use endpoint_state::ConfigError;
use endpoint_state::error::error_chain as chain;
use endpoint_state::time::{Secs, after};

use super::error::{ProbeError, ProbeFailure};
use super::panic_message;

/// What an HTTP probe's predicate sees.
#[derive(Debug)]
pub struct HttpAnswer<'a> {
    /// The response status.
    pub status: StatusCode,
    /// The response headers.
    pub headers: &'a HeaderMap,
    /// The body (at most [`HttpProbe::max_body`] bytes).
    pub body: &'a [u8],
}

type Predicate = Arc<dyn Fn(&HttpAnswer<'_>) -> Result<(), String> + Send + Sync>;

/// GET a path on each target (plain HTTP/1.1, a fresh connection per probe) and judge the
/// answer: by default, status `200` means healthy. [`accept_status`](Self::accept_status) and
/// [`require_json_key`](Self::require_json_key) cover the usual cases, [`predicate`](Self::predicate)
/// anything else.
///
/// The URL is the target's endpoint URI (scheme and authority) with this probe's path, so
/// target `http://10.0.0.7:8080` and path `/records/health-check` give
/// `http://10.0.0.7:8080/records/health-check`. Only `http` is supported; use a
/// [`CustomProbe`](super::CustomProbe) for anything the built-in probe does not do.
///
/// With the cargo feature `serde` it deserializes from its plain settings:
/// `{ path = "/healthz", accept_status = [200, 404], require_json_key = "ok", max_body = 65536 }`
/// (only `path` is required); a predicate is code.
///
/// A service whose only cheap probe is a lookup of a record that does not exist, answering
/// `404` with a JSON body such as `{"ok": true, "found": false}`:
///
/// ```
/// use health_layer::probe::HttpProbe;
/// let probe = HttpProbe::new("/records/health-check-missing")
///     .accept_status([200, 404])
///     .require_json_key("ok");
/// # let _ = probe;
/// ```
#[derive(Clone)]
pub struct HttpProbe {
    path: String,
    accept: Vec<u16>,
    json_key: Option<String>,
    predicate: Option<Predicate>,
    max_body: usize,
}

impl fmt::Debug for HttpProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpProbe")
            .field("path", &self.path)
            .field("accept", &self.accept)
            .field("json_key", &self.json_key)
            .field("custom_predicate", &self.predicate.is_some())
            .field("max_body", &self.max_body)
            .finish()
    }
}

impl HttpProbe {
    /// A probe of `path` (with its query, if any), healthy on status `200`.
    pub fn new(path: impl Into<String>) -> Self {
        HttpProbe {
            path: path.into(),
            accept: vec![200],
            json_key: None,
            predicate: None,
            max_body: 64 * 1024,
        }
    }

    /// The statuses that may count as healthy (replaces the default `[200]`). Invalid codes
    /// are rejected when the checker is built.
    pub fn accept_status(mut self, codes: impl IntoIterator<Item = u16>) -> Self {
        self.accept = codes.into_iter().collect();
        self
    }

    /// Also require the body to be a JSON object with this key (any value).
    pub fn require_json_key(mut self, key: impl Into<String>) -> Self {
        self.json_key = Some(key.into());
        self
    }

    /// Judge answers with `f` instead (it replaces the status and JSON checks): `Ok(())` is
    /// healthy, `Err(reason)` unhealthy with that reason. A predicate that panics makes the
    /// probe fail (the panic is caught and logged); the target keeps being probed.
    pub fn predicate<F>(mut self, f: F) -> Self
    where
        F: Fn(&HttpAnswer<'_>) -> Result<(), String> + Send + Sync + 'static,
    {
        self.predicate = Some(Arc::new(f));
        self
    }

    /// The most body bytes read (default 64 KiB); a longer body is a failure.
    pub fn max_body(mut self, bytes: usize) -> Self {
        self.max_body = bytes;
        self
    }

    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if !self.path.starts_with('/') || self.path.parse::<http::uri::PathAndQuery>().is_err() {
            return Err(invalid("path", &self.path, "a URI path starting with '/'"));
        }
        if self.predicate.is_none()
            && (self.accept.is_empty() || self.accept.iter().any(|s| !(100..=599).contains(s)))
        {
            return Err(invalid(
                "accept_status",
                &self.accept,
                "one or more HTTP status codes between 100 and 599",
            ));
        }
        if self.max_body == 0 {
            return Err(invalid("max_body", self.max_body, "at least one byte"));
        }
        Ok(())
    }

    /// The URL probed for a target whose endpoint URI is `base`.
    pub(crate) fn url_for(&self, base: &Uri) -> Result<Uri, String> {
        if base.scheme_str() != Some("http") {
            return Err(format!(
                "the built-in HTTP probe speaks plain http only, not {:?}",
                base.scheme_str().unwrap_or("")
            ));
        }
        let authority = base
            .authority()
            .ok_or_else(|| "the target has no host".to_owned())?;
        Uri::builder()
            .scheme("http")
            .authority(authority.clone())
            .path_and_query(self.path.as_str())
            .build()
            .map_err(|e| e.to_string())
    }

    fn judge(&self, target: &str, answer: &HttpAnswer<'_>) -> Result<(), String> {
        if let Some(predicate) = &self.predicate {
            // A predicate that panics judges nothing: a failed probe, logged; the target keeps
            // being probed.
            return catch_unwind(AssertUnwindSafe(|| predicate(answer))).unwrap_or_else(|payload| {
                let message = panic_message(&*payload);
                tracing::error!(backend = %target, panic = %message, "HTTP probe predicate panicked: counted as a failed probe");
                Err(format!("the predicate panicked: {message}"))
            });
        }
        if !self.accept.contains(&answer.status.as_u16()) {
            return Err(format!(
                "status not accepted (healthy is {:?})",
                self.accept
            ));
        }
        if let Some(key) = &self.json_key {
            let is_object_with_key = serde_json::from_slice::<serde_json::Value>(answer.body)
                .ok()
                .and_then(|v| v.as_object().map(|o| o.contains_key(key)))
                .unwrap_or(false);
            if !is_object_with_key {
                let content_type = answer
                    .headers
                    .get(http::header::CONTENT_TYPE)
                    .and_then(|v| v.to_str().ok())
                    .unwrap_or("no content-type");
                return Err(format!(
                    "body is not a JSON object with key {key:?} ({content_type}: {:?})",
                    snippet(answer.body)
                ));
            }
        }
        Ok(())
    }

    /// GET the URL for `base`; healthy if the answer satisfies the predicate.
    pub(crate) async fn probe(
        &self,
        target: &Arc<str>,
        base: &Uri,
        limit: Duration,
    ) -> Result<(), ProbeError> {
        let deadline = after(limit);
        let url = self
            .url_for(base)
            .map_err(|reason| http_failure(target, base.to_string(), None, reason))?;
        let url_text = url.to_string();
        let authority = url.authority().expect("built with one").clone();
        let port = authority.port_u16().unwrap_or(80);

        // An IPv6 literal is written in brackets in a URI (`[::1]`), not in an address lookup.
        let host = authority.host();
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        let connect = TcpStream::connect((host, port));
        let stream = match tokio::time::timeout_at(deadline, connect).await {
            Ok(Ok(stream)) => stream,
            Ok(Err(e)) => {
                return Err(ProbeError::new(
                    target.clone(),
                    ProbeFailure::Connect {
                        timed_out: None,
                        source: Some(Box::new(e)),
                    },
                ));
            }
            Err(_) => {
                return Err(ProbeError::new(
                    target.clone(),
                    ProbeFailure::Connect {
                        timed_out: Some(limit),
                        source: None,
                    },
                ));
            }
        };
        let _ = stream.set_nodelay(true);

        let exchange = async {
            let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .map_err(|e| chain(&e))?;
            // Origin form (`GET /path HTTP/1.1` and a Host header), as servers expect from a
            // client that is not talking to a proxy.
            let origin_form = url
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/")
                .to_owned();
            let request = http::Request::get(origin_form)
                .header(http::header::HOST, authority.as_str())
                .header(http::header::USER_AGENT, "health-layer")
                .body(Empty::<Bytes>::new())
                .map_err(|e| e.to_string())?;
            let max_body = self.max_body;
            let work = async move {
                let response = sender.send_request(request).await.map_err(|e| chain(&e))?;
                let (parts, body) = response.into_parts();
                let body = Limited::new(body, max_body)
                    .collect()
                    .await
                    .map_err(|e| format!("reading the body: {e}"))?
                    .to_bytes();
                Ok::<_, String>((parts.status, parts.headers, body))
            };
            // The connection is driven right here, next to the request: nothing outlives the
            // probe.
            drive_with(work, conn).await
        };

        match tokio::time::timeout_at(deadline, exchange).await {
            Err(_) => Err(http_failure(
                target,
                url_text,
                None,
                format!("no answer within {}", Secs(limit)),
            )),
            Ok(Err(reason)) => Err(http_failure(target, url_text, None, reason)),
            Ok(Ok((status, headers, body))) => {
                let answer = HttpAnswer {
                    status,
                    headers: &headers,
                    body: &body,
                };
                self.judge(target, &answer)
                    .map_err(|reason| http_failure(target, url_text, Some(status), reason))
            }
        }
    }
}

/// A setting of the probe that cannot work (the value as `Debug` writes it).
fn invalid(setting: &'static str, value: impl fmt::Debug, expected: &'static str) -> ConfigError {
    ConfigError::new("HTTP probe", setting, format!("{value:?}"), expected)
}

fn http_failure(
    target: &Arc<str>,
    url: String,
    status: Option<StatusCode>,
    reason: String,
) -> ProbeError {
    ProbeError::new(
        target.clone(),
        ProbeFailure::Http {
            url,
            status,
            reason,
        },
    )
}

/// The first characters of a body, for an error message.
fn snippet(body: &[u8]) -> String {
    endpoint_state::text::clip(&String::from_utf8_lossy(body), 60).into_owned()
}

/// Runs `work` while driving `conn` (the HTTP/1 connection): an error of the connection ends
/// the exchange; a connection that ends cleanly lets `work` finish with what it delivered.
async fn drive_with<W, C, T, E>(work: W, conn: C) -> Result<T, String>
where
    W: std::future::Future<Output = Result<T, String>>,
    C: std::future::Future<Output = Result<(), E>>,
    E: std::error::Error + 'static,
{
    let mut work = std::pin::pin!(work);
    let mut conn = std::pin::pin!(conn);
    let mut conn_done = false;
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(out) = work.as_mut().poll(cx) {
            return std::task::Poll::Ready(out);
        }
        if !conn_done {
            match conn.as_mut().poll(cx) {
                std::task::Poll::Ready(Err(e)) => {
                    return std::task::Poll::Ready(Err(chain(&e)));
                }
                std::task::Poll::Ready(Ok(())) => {
                    conn_done = true;
                    // Whatever the connection delivered is in `work`'s hands now.
                    if let std::task::Poll::Ready(out) = work.as_mut().poll(cx) {
                        return std::task::Poll::Ready(out);
                    }
                }
                std::task::Poll::Pending => {}
            }
        }
        std::task::Poll::Pending
    })
    .await
}
