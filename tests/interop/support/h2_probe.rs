//! A raw HTTP/2 client that records what a server does to one connection: every GOAWAY (when,
//! error code, last stream id, debug data, how many of our pings preceded it), the acks of our
//! pings, and when and how the connection closed.
//!
//! tonic's client hides a GOAWAY that arrives while a call is open (it only shows the error that
//! ends a call), so the server settings that act on connections (max age, idle, ping
//! enforcement) are observed here, frame by frame. The probe optionally opens one health `Watch`
//! (a call that never ends: the connection is never idle) and optionally sends PINGs, one at a
//! time, each after the previous one's ack.

use std::fmt;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{Instant, sleep_until};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
/// The stream of the health `Watch`.
const WATCH_STREAM: u32 = 1;

/// What the probe does on its connection.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Probe {
    /// Open a health `Watch` of `""` (the connection then always has a call open).
    pub(crate) watch: bool,
    /// Send this many PINGs: the first as soon as the connection is ready (with `watch`: once the
    /// first status arrived), each next one this long after the previous one's ack. None after a
    /// GOAWAY.
    pub(crate) pings: Option<(u32, Duration)>,
    /// Stop observing after this long (from the TCP connect) if the server has not closed.
    pub(crate) limit: Duration,
}

/// One GOAWAY frame the server sent.
#[derive(Clone, Debug)]
pub(crate) struct GoAway {
    /// When it arrived, from the TCP connect.
    pub(crate) at: Duration,
    /// The HTTP/2 error code (0 `NO_ERROR`, 11 `ENHANCE_YOUR_CALM`).
    pub(crate) code: u32,
    /// The last stream id the server will process.
    pub(crate) last_stream: u32,
    /// The debug data, as text.
    pub(crate) debug: String,
    /// Our PINGs sent before it arrived.
    pub(crate) pings_sent: u32,
}

impl fmt::Display for GoAway {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let code = match self.code {
            0 => "NO_ERROR".to_owned(),
            11 => "ENHANCE_YOUR_CALM".to_owned(),
            other => format!("error code {other}"),
        };
        write!(
            f,
            "GOAWAY {code} at {:.2} s (last stream {}, debug {:?}, after {} of our pings)",
            self.at.as_secs_f64(),
            self.last_stream,
            self.debug,
            self.pings_sent
        )
    }
}

/// Everything the probe saw.
#[derive(Clone, Debug, Default)]
pub(crate) struct Observation {
    /// Every GOAWAY, in order.
    pub(crate) goaways: Vec<GoAway>,
    /// When the connection closed and how (EOF or the I/O error); `None` if still open at the
    /// probe's limit.
    pub(crate) closed: Option<(Duration, String)>,
    /// PINGs sent, and acked by the server.
    pub(crate) pings_sent: u32,
    pub(crate) pings_acked: u32,
    /// When the `Watch`'s first message arrived, and when the server ended the `Watch` stream
    /// (END_STREAM or RST_STREAM), if it did.
    pub(crate) watch_first_message: Option<Duration>,
    pub(crate) watch_ended: Option<Duration>,
}

impl Observation {
    /// The first GOAWAY, if any.
    pub(crate) fn first_goaway(&self) -> Option<&GoAway> {
        self.goaways.first()
    }

    /// When the connection closed, if it did.
    pub(crate) fn closed_at(&self) -> Option<Duration> {
        self.closed.as_ref().map(|(at, _)| *at)
    }
}

impl fmt::Display for Observation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(at) = self.watch_first_message {
            write!(f, "watch status at {:.2} s; ", at.as_secs_f64())?;
        }
        if let Some(at) = self.watch_ended {
            write!(
                f,
                "watch ended by the server at {:.2} s; ",
                at.as_secs_f64()
            )?;
        }
        if self.pings_sent > 0 {
            write!(
                f,
                "pings sent {} acked {}; ",
                self.pings_sent, self.pings_acked
            )?;
        }
        for goaway in &self.goaways {
            write!(f, "{goaway}; ")?;
        }
        match &self.closed {
            Some((at, how)) => write!(f, "closed at {:.2} s ({how})", at.as_secs_f64()),
            None => f.write_str("still open at the probe's limit"),
        }
    }
}

/// Connects to `addr` and runs `probe` until the server closes the connection or the limit.
pub(crate) async fn observe(addr: SocketAddr, probe: Probe) -> Observation {
    let start = Instant::now();
    let deadline = start + probe.limit;
    let mut tcp = TcpStream::connect(addr)
        .await
        .unwrap_or_else(|e| panic!("probe cannot connect to {addr}: {e}"));
    let _ = tcp.set_nodelay(true);
    let mut seen = Observation::default();

    let mut out = PREFACE.to_vec();
    frame(&mut out, SETTINGS, 0, 0, &[]);
    if probe.watch {
        let block = watch_headers(&addr.to_string());
        frame(&mut out, HEADERS, END_HEADERS, WATCH_STREAM, &block);
        // HealthCheckRequest { service: "" }: an empty message, uncompressed.
        frame(&mut out, DATA, END_STREAM, WATCH_STREAM, &[0, 0, 0, 0, 0]);
    }
    if let Err(e) = tcp.write_all(&out).await {
        seen.closed = Some((start.elapsed(), format!("write failed: {e}")));
        return seen;
    }

    let (ping_count, ping_every) = probe.pings.unwrap_or((0, Duration::ZERO));
    let mut next_ping = (!probe.watch).then(Instant::now);
    let mut outstanding = false;
    let mut buf = Vec::new();
    let mut chunk = vec![0; 16 * 1024];
    loop {
        let ping_at = next_ping
            .filter(|_| !outstanding && seen.goaways.is_empty() && seen.pings_sent < ping_count);
        let mut reply = Vec::new();
        tokio::select! {
            () = sleep_until(deadline) => break,
            () = sleep_until(ping_at.unwrap_or(deadline)), if ping_at.is_some() => {
                seen.pings_sent += 1;
                frame(&mut reply, PING, 0, 0, &u64::from(seen.pings_sent).to_be_bytes());
                outstanding = true;
                next_ping = None;
            }
            read = tcp.read(&mut chunk) => {
                let n = match read {
                    Ok(0) => {
                        seen.closed = Some((start.elapsed(), "EOF".to_owned()));
                        break;
                    }
                    Ok(n) => n,
                    Err(e) => {
                        seen.closed = Some((start.elapsed(), format!("{e} ({:?})", e.kind())));
                        break;
                    }
                };
                buf.extend_from_slice(&chunk[..n]);
                while let Some((kind, flags, stream, payload)) = take_frame(&mut buf) {
                    let at = start.elapsed();
                    match kind {
                        SETTINGS if flags & ACK == 0 => frame(&mut reply, SETTINGS, ACK, 0, &[]),
                        PING if flags & ACK == 0 => frame(&mut reply, PING, ACK, 0, &payload),
                        PING if outstanding
                            && payload == u64::from(seen.pings_sent).to_be_bytes() =>
                        {
                            seen.pings_acked += 1;
                            outstanding = false;
                            next_ping = Some(Instant::now() + ping_every);
                        }
                        GOAWAY if payload.len() >= 8 => seen.goaways.push(GoAway {
                            at,
                            last_stream: u32_at(&payload, 0) & 0x7fff_ffff,
                            code: u32_at(&payload, 4),
                            debug: String::from_utf8_lossy(&payload[8..]).into_owned(),
                            pings_sent: seen.pings_sent,
                        }),
                        DATA | HEADERS | RST_STREAM if stream == WATCH_STREAM => {
                            if kind == DATA && seen.watch_first_message.is_none() {
                                seen.watch_first_message = Some(at);
                                next_ping = Some(Instant::now());
                            }
                            let ended = kind == RST_STREAM || flags & END_STREAM != 0;
                            if ended && seen.watch_ended.is_none() {
                                seen.watch_ended = Some(at);
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        if !reply.is_empty()
            && let Err(e) = tcp.write_all(&reply).await
        {
            seen.closed = Some((
                start.elapsed(),
                format!("write failed: {e} ({:?})", e.kind()),
            ));
            break;
        }
    }
    seen
}

/// Appends one frame.
fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("a small frame");
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// Takes one whole frame off the front of `buf`: (type, flags, stream, payload).
fn take_frame(buf: &mut Vec<u8>) -> Option<(u8, u8, u32, Vec<u8>)> {
    if buf.len() < 9 {
        return None;
    }
    let len = usize::from(buf[0]) << 16 | usize::from(buf[1]) << 8 | usize::from(buf[2]);
    if buf.len() < 9 + len {
        return None;
    }
    let (kind, flags) = (buf[3], buf[4]);
    let stream = u32_at(buf, 5) & 0x7fff_ffff;
    let payload = buf[9..9 + len].to_vec();
    buf.drain(..9 + len);
    Some((kind, flags, stream, payload))
}

fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(bytes[at..at + 4].try_into().expect("4 bytes"))
}

/// The HPACK block of a `grpc.health.v1.Health/Watch` request: every field a literal without
/// indexing and with a literal name (no table, no Huffman), which any decoder accepts.
fn watch_headers(authority: &str) -> Vec<u8> {
    let fields = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/grpc.health.v1.Health/Watch"),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ];
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x00);
        for text in [name, value] {
            let len = u8::try_from(text.len()).expect("short");
            assert!(len < 0x7f, "a one-byte HPACK length");
            block.push(len);
            block.extend_from_slice(text.as_bytes());
        }
    }
    block
}
