//! The request's hash for [`Strategy::RingHash`](crate::Strategy::RingHash): an explicit
//! [`RequestHash`] extension, or the XXH64 of a configured header (gRFC A76).

use std::hash::Hasher as _;

use http::HeaderName;
use twox_hash::XxHash64;

/// A request's hash for [`Strategy::RingHash`](crate::Strategy::RingHash), set as a request
/// extension: it wins over the configured `request_hash_header`.
///
/// Requests with the same hash go to the same endpoint (while it is eligible). Any 64-bit
/// value does; [`RequestHash::of`] hashes bytes the way the balancer hashes a header value
/// (XXH64, seed 0), so that a key set here and the same key sent in the header land alike.
///
/// ```
/// use balance_layer::RequestHash;
/// let mut req = http::Request::new(());
/// req.extensions_mut().insert(RequestHash::of(b"user-42"));
/// // With tonic: `request.extensions_mut().insert(RequestHash::of(b"user-42"))`.
/// # use balance_layer::RequestHashKey;
/// assert_eq!(req.request_hash(None), Some(RequestHash::of(b"user-42").0));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RequestHash(pub u64);

impl RequestHash {
    /// The hash of `key`: XXH64 with seed 0, the hash gRPC's `ring_hash` uses (gRFC A42).
    pub fn of(key: &[u8]) -> RequestHash {
        RequestHash(xxh64(key))
    }
}

/// A request that may carry a hash for [`Strategy::RingHash`](crate::Strategy::RingHash).
///
/// Implemented for `http::Request` and `tonic::Request`: a [`RequestHash`] extension if the
/// request has one; else, when the strategy names a `request_hash_header`, the XXH64 of that
/// header's values joined by `,` (gRFC A76), if any is not empty; else `None`, and the call
/// goes to a random endpoint. Any other request type needs a one-line implementation; the
/// default says "no hash":
///
/// ```
/// struct Job(u32);
/// impl balance_layer::RequestHashKey for Job {}
/// impl balance_layer::RequestDeadline for Job {}
/// ```
///
/// or gives its own:
///
/// ```
/// use balance_layer::{RequestHash, RequestHashKey};
/// struct Job { tenant: String }
/// impl RequestHashKey for Job {
///     fn request_hash(&self, _header: Option<&http::HeaderName>) -> Option<u64> {
///         Some(RequestHash::of(self.tenant.as_bytes()).0)
///     }
/// }
/// ```
pub trait RequestHashKey {
    /// The request's hash, if it has one; `header` is the strategy's `request_hash_header`.
    /// Called once per call, only under [`Strategy::RingHash`](crate::Strategy::RingHash).
    fn request_hash(&self, header: Option<&HeaderName>) -> Option<u64> {
        let _ = header;
        None
    }
}

impl<B> RequestHashKey for http::Request<B> {
    fn request_hash(&self, header: Option<&HeaderName>) -> Option<u64> {
        if let Some(RequestHash(hash)) = self.extensions().get::<RequestHash>() {
            return Some(*hash);
        }
        let values = self.headers().get_all(header?);
        joined_hash(values.iter().map(|v| v.as_bytes()))
    }
}

impl<T> RequestHashKey for tonic::Request<T> {
    fn request_hash(&self, header: Option<&HeaderName>) -> Option<u64> {
        if let Some(RequestHash(hash)) = self.extensions().get::<RequestHash>() {
            return Some(*hash);
        }
        let values = self.metadata().get_all(header?.as_str());
        joined_hash(values.iter().map(|v| v.as_encoded_bytes()))
    }
}

/// XXH64, seed 0.
pub(crate) fn xxh64(bytes: &[u8]) -> u64 {
    XxHash64::oneshot(0, bytes)
}

/// The XXH64 of `values` joined by `,`, without building the joined value; `None` when no
/// value has anything in it (no value, or only empty ones).
fn joined_hash<'a>(values: impl Iterator<Item = &'a [u8]>) -> Option<u64> {
    let mut hasher = XxHash64::with_seed(0);
    let mut any = false;
    for (i, value) in values.enumerate() {
        if i > 0 {
            hasher.write(b",");
        }
        hasher.write(value);
        any |= !value.is_empty();
    }
    any.then(|| hasher.finish())
}

/// Parses a `request_hash_header`: a gRPC metadata name (upper case read as lower case), not
/// a binary one. The error is what was expected.
pub(crate) fn header_name(name: &str) -> Result<HeaderName, &'static str> {
    if name.is_empty() {
        return Err("a header name (or no header at all)");
    }
    let lower = name.to_ascii_lowercase();
    if !lower
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("a header name of lowercase letters, digits, '-', '_' and '.'");
    }
    if lower.ends_with("-bin") {
        return Err("a header that is not binary (a name not ending in -bin, gRFC A76)");
    }
    HeaderName::from_bytes(lower.as_bytes()).map_err(|_| "a valid header name")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(name: &str) -> HeaderName {
        header_name(name).unwrap()
    }

    #[test]
    fn http_requests_hash_the_header_values_joined_by_commas() {
        let h = header("x-user-id");
        let req = http::Request::builder()
            .header("x-user-id", "a")
            .header("x-user-id", "b")
            .body(())
            .unwrap();
        assert_eq!(req.request_hash(Some(&h)), Some(xxh64(b"a,b")));
        // No header configured, the header absent, or only empty values: no hash.
        assert_eq!(req.request_hash(None), None);
        assert_eq!(req.request_hash(Some(&header("x-other"))), None);
        let empty = http::Request::builder()
            .header("x-user-id", "")
            .body(())
            .unwrap();
        assert_eq!(empty.request_hash(Some(&h)), None);
    }

    #[test]
    fn tonic_requests_read_their_metadata_and_extensions() {
        let h = header("x-user-id");
        let mut req = tonic::Request::new(());
        assert_eq!(req.request_hash(Some(&h)), None);
        req.metadata_mut()
            .insert("x-user-id", "user-7".parse().unwrap());
        assert_eq!(req.request_hash(Some(&h)), Some(xxh64(b"user-7")));
        req.extensions_mut().insert(RequestHash(42));
        assert_eq!(req.request_hash(Some(&h)), Some(42));
    }

    #[test]
    fn xxh64_is_the_reference_function() {
        // XXH64 with seed 0 of the empty input and of "a" (the reference implementation's
        // published values).
        assert_eq!(xxh64(b""), 0xEF46_DB37_51D8_E999);
        assert_eq!(xxh64(b"a"), 0xD24E_C4F1_A98C_6E5B);
    }

    #[test]
    fn header_names_are_checked_and_read_in_lower_case() {
        assert_eq!(header("X-User-Id").as_str(), "x-user-id");
        assert!(header_name("").is_err());
        assert!(header_name("x-data-bin").is_err());
        assert!(header_name("x user").is_err());
        assert!(header_name(":authority").is_err());
    }
}
