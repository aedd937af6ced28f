//! HTTP/2 framing, as much as the guard needs: the connection preface, frame headers, a reader
//! that cuts a byte stream into whole frames, and the one frame the guard writes (its GOAWAY).

use std::io;

use bytes::{BufMut, Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;

/// The client connection preface (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// Length of a frame header.
pub(super) const HEADER_LEN: usize = 9;
/// Largest frame (header included) the proxy buffers; a longer one closes the connection. Each
/// direction therefore holds at most this much plus one read chunk.
const MAX_FRAME_LEN: usize = 16 * 1024 * 1024;
/// Smallest read: bytes reserved for one read from a socket.
const READ_CHUNK: usize = 16 * 1024;

pub(super) const DATA: u8 = 0x0;
pub(super) const HEADERS: u8 = 0x1;
pub(super) const RST_STREAM: u8 = 0x3;
pub(super) const PING: u8 = 0x6;
pub(super) const GOAWAY: u8 = 0x7;
/// `END_STREAM` on DATA and HEADERS, `ACK` on PING.
pub(super) const FLAG_END_STREAM_OR_ACK: u8 = 0x1;
/// `ENHANCE_YOUR_CALM`.
const ENHANCE_YOUR_CALM: u32 = 0xb;
/// Debug data of the GOAWAY, as gRPC servers send it.
const TOO_MANY_PINGS: &[u8] = b"too_many_pings";

/// `GOAWAY(last_stream, ENHANCE_YOUR_CALM, "too_many_pings")` on stream 0.
pub(super) fn goaway_frame(last_stream: u32) -> Bytes {
    let payload_len = 8 + TOO_MANY_PINGS.len();
    let mut frame = BytesMut::with_capacity(HEADER_LEN + payload_len);
    frame.put_uint(payload_len as u64, 3);
    frame.put_u8(GOAWAY);
    frame.put_u8(0);
    frame.put_u32(0);
    frame.put_u32(last_stream & 0x7fff_ffff);
    frame.put_u32(ENHANCE_YOUR_CALM);
    frame.put_slice(TOO_MANY_PINGS);
    frame.freeze()
}

/// The 9-byte header of a frame.
#[derive(Clone, Copy, Debug)]
pub(super) struct FrameHeader {
    /// Payload length.
    pub(super) len: usize,
    pub(super) kind: u8,
    pub(super) flags: u8,
    pub(super) stream: u32,
}

impl FrameHeader {
    pub(super) fn parse(b: &[u8]) -> Self {
        Self {
            len: (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]),
            kind: b[3],
            flags: b[4],
            stream: u32::from_be_bytes([b[5], b[6], b[7], b[8]]) & 0x7fff_ffff,
        }
    }
}

/// What a [`FrameReader`] yields: the preface, or a whole frame (header included).
pub(super) enum Unit {
    Preface(Bytes),
    Frame(FrameHeader, Bytes),
}

impl Unit {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Unit::Preface(bytes) | Unit::Frame(_, bytes) => bytes,
        }
    }
}

/// Cuts one direction's bytes into the preface (client side only) and whole frames.
pub(super) struct FrameReader {
    buf: BytesMut,
    expect_preface: bool,
}

impl FrameReader {
    pub(super) fn new(expect_preface: bool) -> Self {
        Self {
            buf: BytesMut::new(),
            expect_preface,
        }
    }

    /// The next preface or frame; `None` when the peer closed between two frames. Cancel-safe.
    pub(super) async fn next(&mut self, r: &mut OwnedReadHalf) -> io::Result<Option<Unit>> {
        loop {
            if let Some(unit) = self.split()? {
                return Ok(Some(unit));
            }
            let missing = self.wanted() - self.buf.len();
            self.buf.reserve(missing.max(READ_CHUNK));
            if r.read_buf(&mut self.buf).await? == 0 {
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "connection closed inside a frame",
                ));
            }
        }
    }

    /// Bytes the unit at the front needs in total (known once its header is in).
    fn wanted(&self) -> usize {
        if self.expect_preface {
            PREFACE.len()
        } else if self.buf.len() < HEADER_LEN {
            HEADER_LEN
        } else {
            HEADER_LEN + FrameHeader::parse(&self.buf).len
        }
    }

    /// Takes the unit at the front if it is whole.
    fn split(&mut self) -> io::Result<Option<Unit>> {
        if self.expect_preface {
            let n = self.buf.len().min(PREFACE.len());
            if self.buf[..n] != PREFACE[..n] {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "client did not send the HTTP/2 preface",
                ));
            }
            if n < PREFACE.len() {
                return Ok(None);
            }
            self.expect_preface = false;
            return Ok(Some(Unit::Preface(self.buf.split_to(n).freeze())));
        }
        if self.buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let header = FrameHeader::parse(&self.buf);
        let total = HEADER_LEN + header.len;
        if total > MAX_FRAME_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("frame of {total} bytes exceeds {MAX_FRAME_LEN}"),
            ));
        }
        if self.buf.len() < total {
            return Ok(None);
        }
        Ok(Some(Unit::Frame(header, self.buf.split_to(total).freeze())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn goaway_frame_is_well_formed() {
        let frame = goaway_frame(7);
        let parsed = FrameHeader::parse(&frame);
        assert_eq!((parsed.kind, parsed.flags, parsed.stream), (GOAWAY, 0, 0));
        assert_eq!(parsed.len, frame.len() - HEADER_LEN);
        assert_eq!(&frame[9..13], &7u32.to_be_bytes());
        assert_eq!(&frame[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        assert_eq!(&frame[17..], TOO_MANY_PINGS);
    }
}
