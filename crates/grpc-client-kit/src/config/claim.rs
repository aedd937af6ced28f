//! A map whose keys are shared between two readers: the kit takes its own keys from a table,
//! and a layer's configuration reads the rest — in one pass, so that a format's errors still
//! point at the right place (`health.timout`, `breaker.open.jitter`).

use std::marker::PhantomData;

use serde::de::{DeserializeSeed, Deserializer, IntoDeserializer, MapAccess};

/// A [`MapAccess`] that hands the keys `claims` says are its own to `take` (which must read
/// their value), and every other key to whoever reads this map.
pub(crate) struct Claim<A, C, T> {
    inner: A,
    claims: C,
    take: T,
}

impl<'de, A, C, T> Claim<A, C, T>
where
    A: MapAccess<'de>,
    C: Fn(&str) -> bool,
    T: FnMut(&str, &mut A) -> Result<(), A::Error>,
{
    pub(crate) fn new(inner: A, claims: C, take: T) -> Self {
        Claim {
            inner,
            claims,
            take,
        }
    }
}

/// A key, read once: either the reader's (its seed's value) or a claimed one (its name).
enum Key<V> {
    Theirs(V),
    Claimed(String),
}

/// Reads a key as a string, then gives it to the reader's seed unless it is claimed. Reading it
/// inside the map's own `next_key_seed` keeps a path-tracking format's idea of where it is.
struct Peek<'a, K, C> {
    seed: &'a mut Option<K>,
    claims: &'a C,
}

impl<'de, K, C> DeserializeSeed<'de> for Peek<'_, K, C>
where
    K: DeserializeSeed<'de>,
    C: Fn(&str) -> bool,
{
    type Value = Key<K::Value>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        let key = <String as serde::Deserialize>::deserialize(deserializer)?;
        if (self.claims)(&key) {
            return Ok(Key::Claimed(key));
        }
        let seed = self.seed.take().expect("one key per call");
        seed.deserialize(key.into_deserializer()).map(Key::Theirs)
    }
}

impl<'de, A, C, T> MapAccess<'de> for Claim<A, C, T>
where
    A: MapAccess<'de>,
    C: Fn(&str) -> bool,
    T: FnMut(&str, &mut A) -> Result<(), A::Error>,
{
    type Error = A::Error;

    fn next_key_seed<K: DeserializeSeed<'de>>(
        &mut self,
        seed: K,
    ) -> Result<Option<K::Value>, A::Error> {
        let mut seed = Some(seed);
        loop {
            let peek = Peek {
                seed: &mut seed,
                claims: &self.claims,
            };
            match self.inner.next_key_seed(peek)? {
                None => return Ok(None),
                Some(Key::Theirs(value)) => return Ok(Some(value)),
                Some(Key::Claimed(key)) => (self.take)(&key, &mut self.inner)?,
            }
        }
    }

    fn next_value_seed<V: DeserializeSeed<'de>>(&mut self, seed: V) -> Result<V::Value, A::Error> {
        self.inner.next_value_seed(seed)
    }
}

/// Reads `T` from a table whose `enabled` key (default `true`) is the kit's: `None` when it
/// says `false`.
pub(crate) struct Switched<T>(pub(crate) Option<T>);

impl<'de, T: serde::Deserialize<'de>> serde::Deserialize<'de> for Switched<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit<T>(PhantomData<T>);
        impl<'de, T: serde::Deserialize<'de>> serde::de::Visitor<'de> for Visit<T> {
            type Value = Switched<T>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a table of settings (`enabled = false` turns it off)")
            }

            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Switched<T>, A::Error> {
                let mut enabled = true;
                let config =
                    T::deserialize(serde::de::value::MapAccessDeserializer::new(Claim::new(
                        map,
                        |key: &str| key == "enabled",
                        |_: &str, map: &mut A| {
                            enabled = map.next_value()?;
                            Ok(())
                        },
                    )))?;
                Ok(Switched(enabled.then_some(config)))
            }
        }
        deserializer.deserialize_map(Visit(PhantomData))
    }
}
