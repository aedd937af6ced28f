//! Whether a reply's data is made of gRPC messages a client can decode, read as it passes.
//!
//! A gRPC message is a 5-byte prefix — a compression flag (0, or 1 when the response named a
//! `grpc-encoding`) and a 4-byte big-endian length — then that many bytes. The check reads the
//! prefixes only (it skips over each message's bytes), keeps 5 bytes of state, and copies
//! nothing. It cannot tell a message that does not decode as the expected protobuf: that
//! takes the codec, which only the client has. [`MessagePrefixes`] is the reading position
//! alone, for any other reader of message prefixes (the kit's message size limits).

use std::fmt;

use bytes::Buf;

/// Why a reply's data is not gRPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Malformed {
    /// A compression flag other than 0 and 1.
    Flag(u8),
    /// A compressed message, but the response named no `grpc-encoding`.
    Uncompressed,
}

impl fmt::Display for Malformed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Malformed::Flag(flag) => write!(
                f,
                "compression flag {flag:#04x} (valid flags are 0 and 1): not a gRPC message"
            ),
            Malformed::Uncompressed => {
                f.write_str("a compressed message, but the response named no grpc-encoding")
            }
        }
    }
}

/// The reading position in a stream of gRPC messages, for whoever needs each message's prefix
/// as the data passes (the classifier here; the kit's message size limits): a message is a
/// 5-byte prefix — a compression flag and a 4-byte big-endian length — then that many bytes,
/// which are skipped, never copied. A prefix split across frames is put together (5 bytes of
/// state).
///
/// ```
/// use endpoint_state::classify::{MessagePrefixes, Prefix};
/// let mut prefixes = MessagePrefixes::new();
/// let mut seen = Vec::new();
/// // Two messages (3 and 0 bytes long), the second prefix split across two frames.
/// for frame in [&b"\0\0\0\0\x03abc\0\0"[..], b"\0\0\0"] {
///     prefixes.read(frame, |p| -> Result<(), ()> {
///         seen.push(p);
///         Ok(())
///     }).unwrap();
/// }
/// assert_eq!(seen, [Prefix::Flag(0), Prefix::Length(3), Prefix::Flag(0), Prefix::Length(0)]);
/// ```
#[derive(Debug, Clone, Default)]
pub struct MessagePrefixes {
    /// Bytes of the current message still to skip.
    skip: u64,
    /// The prefix read so far (its first `have` bytes).
    prefix: [u8; 5],
    have: u8,
}

/// A part of a message's prefix, as [`MessagePrefixes::read`] comes to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Prefix {
    /// The compression flag (`0`, or `1` for a compressed message), as soon as it arrives.
    Flag(u8),
    /// The message's length, once the whole prefix has arrived.
    Length(u32),
}

impl MessagePrefixes {
    /// At the start of a stream of messages.
    pub fn new() -> Self {
        MessagePrefixes::default()
    }

    /// Reads `bytes`, the next data of the stream, telling `seen` each part of a prefix as it
    /// arrives. The first `Err` from `seen` stops the reading and is returned (the position is
    /// then undefined: stop reading this stream).
    pub fn read<E>(
        &mut self,
        mut bytes: &[u8],
        mut seen: impl FnMut(Prefix) -> Result<(), E>,
    ) -> Result<(), E> {
        while !bytes.is_empty() {
            if self.skip > 0 {
                let n = usize::try_from(self.skip).map_or(bytes.len(), |s| s.min(bytes.len()));
                bytes = &bytes[n..];
                self.skip -= n as u64;
                continue;
            }
            let want = 5 - usize::from(self.have);
            let n = want.min(bytes.len());
            if self.have == 0 {
                seen(Prefix::Flag(bytes[0]))?;
            }
            self.prefix[usize::from(self.have)..usize::from(self.have) + n]
                .copy_from_slice(&bytes[..n]);
            self.have += n as u8;
            bytes = &bytes[n..];
            if self.have < 5 {
                return Ok(());
            }
            self.have = 0;
            let [_, a, b, c, d] = self.prefix;
            let len = u32::from_be_bytes([a, b, c, d]);
            self.skip = u64::from(len);
            seen(Prefix::Length(len))?;
        }
        Ok(())
    }
}

/// Whether a reply's data is gRPC messages a client can decode, read as it passes.
#[derive(Debug, Clone)]
pub(crate) struct Frames {
    prefixes: MessagePrefixes,
    /// Whether the response named a `grpc-encoding` (so compressed messages are fine).
    compressed_ok: bool,
    /// Whether the check still runs (it stops at the first verdict, or when the data cannot
    /// be read without copying it).
    on: bool,
}

impl Frames {
    pub(crate) fn new(compressed_ok: bool) -> Self {
        Frames {
            prefixes: MessagePrefixes::new(),
            compressed_ok,
            on: true,
        }
    }

    /// Reads one data frame. `Err` at the first prefix that no client can decode; after that
    /// (or after data it cannot see whole) it checks nothing more.
    pub(crate) fn feed(&mut self, data: &impl Buf) -> Result<(), Malformed> {
        if !self.on {
            return Ok(());
        }
        let chunk = data.chunk();
        if chunk.len() < data.remaining() {
            // Data in several pieces: not worth copying to check. Stop here (a well-formed
            // reply is never taken for a malformed one).
            self.on = false;
            return Ok(());
        }
        let result = self.read(chunk);
        if result.is_err() {
            self.on = false;
        }
        result
    }

    fn read(&mut self, bytes: &[u8]) -> Result<(), Malformed> {
        let compressed_ok = self.compressed_ok;
        // The flag is judged as soon as it arrives.
        self.prefixes.read(bytes, |prefix| match prefix {
            Prefix::Flag(0) | Prefix::Length(_) => Ok(()),
            Prefix::Flag(1) if compressed_ok => Ok(()),
            Prefix::Flag(1) => Err(Malformed::Uncompressed),
            Prefix::Flag(flag) => Err(Malformed::Flag(flag)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(chunks: &[&[u8]], compressed_ok: bool) -> Result<(), Malformed> {
        let mut frames = Frames::new(compressed_ok);
        for chunk in chunks {
            frames.feed(&bytes::Bytes::copy_from_slice(chunk))?;
        }
        Ok(())
    }

    #[test]
    fn reads_prefixes_across_frames() {
        let hello = b"\0\0\0\0\x05hello";
        assert_eq!(check(&[hello, hello], false), Ok(()));
        // A prefix and a message split anywhere.
        for at in 0..hello.len() {
            let (a, b) = hello.split_at(at);
            assert_eq!(check(&[a, b, hello], false), Ok(()), "split at {at}");
            assert_eq!(
                check(&[a, b, b"\x02\0\0\0\0"], false),
                Err(Malformed::Flag(2)),
                "split at {at}"
            );
        }
        // An empty message, then another.
        assert_eq!(check(&[b"\0\0\0\0\0\0\0\0\0\x01x"], false), Ok(()));
        assert_eq!(check(&[b"<html>"], false), Err(Malformed::Flag(b'<')));
        assert_eq!(
            check(&[b"\x01\0\0\0\x01x"], false),
            Err(Malformed::Uncompressed)
        );
        assert_eq!(check(&[b"\x01\0\0\0\x01x"], true), Ok(()));
        // A long message is skipped, not read.
        let mut big = vec![0u8, 0, 1, 0, 0];
        big.resize(5 + 65_536, 0xff);
        assert_eq!(
            check(&[&big[..1000], &big[1000..], b"\x07"], false),
            Err(Malformed::Flag(7))
        );
    }
}
