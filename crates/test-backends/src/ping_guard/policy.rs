//! The ping policy a gRPC server enforces, and how one connection's frames are judged by it:
//! its open streams, and its client PINGs counted as strikes.

use std::collections::HashMap;
use std::io;
use std::time::Duration;

use tokio::time::Instant;

use super::frame::{
    DATA, FLAG_END_STREAM_OR_ACK, FrameHeader, GOAWAY, HEADER_LEN, HEADERS, RST_STREAM,
};

/// Open streams tracked per connection; a client opening more closes the connection.
const MAX_TRACKED_STREAMS: usize = 10_000;
/// The interval a server requires between pings when no call is open and pings without calls
/// are not permitted: two hours, as gRPC C-core and grpc-go (i.e. every such ping but the first
/// is a strike).
const IDLE_MIN_INTERVAL: Duration = Duration::from_secs(2 * 60 * 60);

/// A gRPC server's policy on client PINGs (gRFC A8; C-core's
/// `GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS`, `GRPC_ARG_HTTP2_MAX_PING_STRIKES`,
/// `GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS`; grpc-go's `EnforcementPolicy`).
///
/// A client PING (without `ACK`) is a **strike** when it comes less than the allowed interval
/// after the previous client PING on the same connection. The allowed interval is
/// [`min_interval`](Self::min_interval) while a call is open (or when
/// [`permit_without_calls`](Self::permit_without_calls)), and two hours otherwise. Every
/// HEADERS or DATA frame the server sends resets the count: strikes go back to zero and the next
/// PING is not judged against the one before (C-core's "ping without data" reset, which grpc-go
/// also does). When the strikes exceed [`max_strikes`](Self::max_strikes), the client is sent
/// `GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings")` and the connection is closed. Every other
/// PING, strike or not, is forwarded (and answered by the server).
///
/// The default is gRPC's: 5 minutes, 2 strikes, no pings without calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PingPolicy {
    /// The shortest interval between two client PINGs, with no server HEADERS or DATA between
    /// them, that is not a strike.
    pub min_interval: Duration,
    /// Strikes tolerated on a connection: the strike that makes the count exceed it is punished,
    /// so `0` punishes the first one, `2` the third (grpc-go's meaning; C-core reads `0` as "no
    /// limit", which this policy does not offer).
    pub max_strikes: u32,
    /// Whether PINGs are judged against `min_interval` also when no call is open. When `false`,
    /// with no call open, every PING after the first is a strike (allowed interval: two hours).
    pub permit_without_calls: bool,
}

impl Default for PingPolicy {
    fn default() -> Self {
        Self {
            min_interval: Duration::from_secs(5 * 60),
            max_strikes: 2,
            permit_without_calls: false,
        }
    }
}

/// What to do with a client frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    Forward,
    GoAway,
}

/// One connection's open streams and ping accounting.
#[derive(Debug, Default)]
pub(super) struct Streams {
    /// Open streams: whether the client, and the server, have ended their side.
    open: HashMap<u32, (bool, bool)>,
    /// The highest stream id the client opened (and the proxy forwarded).
    pub(super) highest_client_stream: u32,
    /// The previous client PING since the server last sent HEADERS or DATA.
    last_ping: Option<Instant>,
    strikes: u32,
}

impl Streams {
    pub(super) fn on_client_frame(&mut self, header: &FrameHeader) -> io::Result<()> {
        let id = header.stream;
        match header.kind {
            HEADERS => {
                if id % 2 == 1 && id > self.highest_client_stream {
                    if self.open.len() >= MAX_TRACKED_STREAMS {
                        return Err(io::Error::new(
                            io::ErrorKind::InvalidData,
                            "too many open streams to track",
                        ));
                    }
                    self.highest_client_stream = id;
                    self.open.insert(id, (false, false));
                }
                if header.flags & FLAG_END_STREAM_OR_ACK != 0 {
                    self.end(id, true);
                }
            }
            DATA if header.flags & FLAG_END_STREAM_OR_ACK != 0 => self.end(id, true),
            RST_STREAM => {
                self.open.remove(&id);
            }
            _ => {}
        }
        Ok(())
    }

    pub(super) fn on_server_frame(&mut self, header: &FrameHeader, frame: &[u8]) {
        let id = header.stream;
        match header.kind {
            HEADERS | DATA => {
                // The server sent something: pings are judged afresh (C-core's
                // `ResetPingStrikes`, grpc-go's `resetPingStrikes`).
                self.last_ping = None;
                self.strikes = 0;
                if header.flags & FLAG_END_STREAM_OR_ACK != 0 {
                    self.end(id, false);
                }
            }
            RST_STREAM => {
                self.open.remove(&id);
            }
            GOAWAY if frame.len() >= HEADER_LEN + 4 => {
                let bytes = [frame[9], frame[10], frame[11], frame[12]];
                let last = u32::from_be_bytes(bytes) & 0x7fff_ffff;
                self.open.retain(|&id, _| id <= last);
            }
            _ => {}
        }
    }

    /// Marks one side of stream `id` ended; forgets the stream once both are.
    fn end(&mut self, id: u32, by_client: bool) {
        if let Some(ends) = self.open.get_mut(&id) {
            if by_client {
                ends.0 = true;
            } else {
                ends.1 = true;
            }
            if ends.0 && ends.1 {
                self.open.remove(&id);
            }
        }
    }

    /// Judges a client PING received at `now`: whether it is a strike, and the verdict.
    pub(super) fn on_client_ping(&mut self, now: Instant, policy: &PingPolicy) -> (bool, Verdict) {
        let allowed = if self.open.is_empty() && !policy.permit_without_calls {
            IDLE_MIN_INTERVAL
        } else {
            policy.min_interval
        };
        let strike = self
            .last_ping
            .is_some_and(|previous| now.duration_since(previous) < allowed);
        self.last_ping = Some(now);
        if !strike {
            return (false, Verdict::Forward);
        }
        self.strikes = self.strikes.saturating_add(1);
        if self.strikes > policy.max_strikes {
            (true, Verdict::GoAway)
        } else {
            (true, Verdict::Forward)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ping_guard::frame::{DATA, FLAG_END_STREAM_OR_ACK, HEADERS, RST_STREAM};

    fn header(kind: u8, flags: u8, stream: u32) -> FrameHeader {
        FrameHeader {
            len: 0,
            kind,
            flags,
            stream,
        }
    }

    const POLICY: PingPolicy = PingPolicy {
        min_interval: Duration::from_millis(300),
        max_strikes: 1,
        permit_without_calls: false,
    };

    #[test]
    fn streams_close_when_both_sides_end_or_on_reset() {
        let mut s = Streams::default();
        s.on_client_frame(&header(HEADERS, 0, 1)).unwrap();
        s.on_client_frame(&header(DATA, FLAG_END_STREAM_OR_ACK, 1))
            .unwrap();
        s.on_client_frame(&header(HEADERS, FLAG_END_STREAM_OR_ACK, 3))
            .unwrap();
        assert_eq!(s.open.len(), 2);
        s.on_server_frame(&header(HEADERS, 0, 1), &[]);
        s.on_server_frame(&header(HEADERS, FLAG_END_STREAM_OR_ACK, 1), &[]);
        assert_eq!(s.open.len(), 1);
        s.on_server_frame(&header(RST_STREAM, 0, 3), &[]);
        assert!(s.open.is_empty());
        assert_eq!(s.highest_client_stream, 3);
    }

    #[test]
    fn strikes_count_fast_pings_and_server_data_resets_them() {
        let mut s = Streams::default();
        s.on_client_frame(&header(HEADERS, 0, 1)).unwrap();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        assert_eq!(s.on_client_ping(at(0), &POLICY), (false, Verdict::Forward));
        assert_eq!(s.on_client_ping(at(100), &POLICY), (true, Verdict::Forward));
        s.on_server_frame(&header(DATA, 0, 1), &[]);
        assert_eq!(
            s.on_client_ping(at(200), &POLICY),
            (false, Verdict::Forward)
        );
        assert_eq!(
            s.on_client_ping(at(500), &POLICY),
            (false, Verdict::Forward)
        );
        assert_eq!(s.on_client_ping(at(600), &POLICY), (true, Verdict::Forward));
        assert_eq!(s.on_client_ping(at(700), &POLICY), (true, Verdict::GoAway));
    }

    #[test]
    fn without_calls_every_ping_after_the_first_is_a_strike_unless_permitted() {
        let t0 = Instant::now();
        let hour_later = t0 + Duration::from_secs(3600);
        let mut s = Streams::default();
        assert_eq!(s.on_client_ping(t0, &POLICY), (false, Verdict::Forward));
        assert_eq!(
            s.on_client_ping(hour_later, &POLICY),
            (true, Verdict::Forward)
        );

        let permit = PingPolicy {
            permit_without_calls: true,
            ..POLICY
        };
        let mut s = Streams::default();
        s.on_client_ping(t0, &permit);
        assert_eq!(
            s.on_client_ping(hour_later, &permit),
            (false, Verdict::Forward)
        );
    }
}
