//! Reading the core's types from a configuration file (feature `serde`).

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Unexpected, Visitor};
use tonic::Code;

use crate::classify::{FailureCodes, code_by_name};

/// A set of gRPC codes written by name, as gRPC writes them (`["UNAVAILABLE", "INTERNAL"]`,
/// any case), or by number (`["14"]`). An unknown name is refused at its place in the list.
impl<'de> Deserialize<'de> for FailureCodes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let codes = Vec::<CodeName>::deserialize(d)?;
        Ok(FailureCodes::from_codes(codes.into_iter().map(|c| c.0)))
    }
}

/// One code, by name or number.
struct CodeName(Code);

impl<'de> Deserialize<'de> for CodeName {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        // Refused inside the string's own deserializer, so that a format that knows where
        // the string stands (TOML's spans) points at it.
        d.deserialize_str(CodeVisitor)
    }
}

struct CodeVisitor;

impl Visitor<'_> for CodeVisitor {
    type Value = CodeName;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a gRPC status code (UNAVAILABLE, DEADLINE_EXCEEDED, INTERNAL, ...)")
    }

    fn visit_str<E: de::Error>(self, name: &str) -> Result<CodeName, E> {
        code_by_name(name)
            .map(CodeName)
            .ok_or_else(|| E::invalid_value(Unexpected::Str(name), &self))
    }
}
