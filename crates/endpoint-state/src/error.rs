//! The errors every crate of the kit shares: one boxed error type, one configuration error that
//! names the field, the value and what was expected, and the walks of an error's `source()`
//! chain.

use std::borrow::Cow;
use std::error::Error;
use std::fmt;
use std::sync::Arc;

/// A boxed error, as tower and tonic pass them around.
pub type BoxError = Box<dyn Error + Send + Sync + 'static>;

/// An invalid configuration, refused when the thing it configures is built (nothing has
/// started then). Names the configuration, the field (a path: `open.jitter`,
/// `weights[b2]`), the value as written, and what a valid value looks like.
///
/// Displays as `invalid breaker configuration: open.jitter = 1.5: expected a fraction in
/// [0, 1)`. A configuration that holds another reports the inner error with its field
/// prefixed ([`within`](Self::within)), keeping the inner error as its
/// [`source`](Error::source).
///
/// ```
/// use endpoint_state::ConfigError;
/// let inner = ConfigError::new("breaker", "open.jitter", 1.5, "a fraction in [0, 1)");
/// assert_eq!(
///     inner.to_string(),
///     "invalid breaker configuration: open.jitter = 1.5: expected a fraction in [0, 1)"
/// );
/// let outer = inner.within("grpc-client-kit", "breaker");
/// assert_eq!(outer.field(), "breaker.open.jitter");
/// assert_eq!(
///     outer.to_string(),
///     "invalid grpc-client-kit configuration: breaker.open.jitter = 1.5: expected a fraction in [0, 1)"
/// );
/// ```
#[derive(Debug, Clone)]
pub struct ConfigError {
    config: Cow<'static, str>,
    field: Cow<'static, str>,
    value: String,
    expected: Cow<'static, str>,
    /// Whether `expected` reads after "expected" (from [`new`](Self::new)) or is the whole
    /// problem (from [`problem`](Self::problem)).
    phrase: bool,
    source: Option<Arc<dyn Error + Send + Sync + 'static>>,
}

impl PartialEq for ConfigError {
    /// Two errors are equal when they say the same (their sources are not compared).
    fn eq(&self, other: &Self) -> bool {
        (&self.config, &self.field, &self.value, &self.expected)
            == (&other.config, &other.field, &other.value, &other.expected)
    }
}

impl Eq for ConfigError {}

impl ConfigError {
    /// `field` of the `config` configuration (`"breaker"`, `"health check"`, ...) has `value`,
    /// and a valid one is `expected` (a phrase that reads after "expected").
    pub fn new(
        config: impl Into<Cow<'static, str>>,
        field: impl Into<Cow<'static, str>>,
        value: impl fmt::Display,
        expected: impl Into<Cow<'static, str>>,
    ) -> Self {
        ConfigError {
            config: config.into(),
            field: field.into(),
            value: value.to_string(),
            expected: expected.into(),
            phrase: true,
            source: None,
        }
    }

    /// Like [`new`](Self::new), with the whole problem in words instead of what was expected
    /// (`DNS targets need the dns cargo feature`, `http://a:1 is listed twice`).
    pub fn problem(
        config: impl Into<Cow<'static, str>>,
        field: impl Into<Cow<'static, str>>,
        value: impl fmt::Display,
        problem: impl Into<Cow<'static, str>>,
    ) -> Self {
        ConfigError {
            phrase: false,
            ..ConfigError::new(config, field, value, problem)
        }
    }

    /// The same error, caused by `source` (a parser's error, a template's refusal, ...), which
    /// becomes its [`source`](Error::source).
    pub fn with_source(mut self, source: impl Into<BoxError>) -> Self {
        self.source = Some(Arc::from(source.into()));
        self
    }

    /// The same error as a field of an enclosing configuration: `config` is the outer one, and
    /// the field is prefixed with `prefix.` (unless the prefix is empty). This error becomes the
    /// [`source`](Error::source).
    pub fn within(
        self,
        config: impl Into<Cow<'static, str>>,
        prefix: impl AsRef<str>,
    ) -> ConfigError {
        let prefix = prefix.as_ref();
        let field = if prefix.is_empty() {
            self.field.clone()
        } else {
            Cow::Owned(format!("{prefix}.{}", self.field))
        };
        ConfigError {
            config: config.into(),
            field,
            value: self.value.clone(),
            expected: self.expected.clone(),
            phrase: self.phrase,
            source: Some(Arc::new(self)),
        }
    }

    /// Which configuration (`breaker`, `health check`, `grpc-client-kit`, ...).
    pub fn config(&self) -> &str {
        &self.config
    }

    /// The field at fault, as a path in its configuration.
    pub fn field(&self) -> &str {
        &self.field
    }

    /// The refused value, as written.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// What a valid value looks like (or, for an error made by [`problem`](Self::problem),
    /// what is wrong).
    pub fn expected(&self) -> &str {
        &self.expected
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid {} configuration: {}", self.config, self.field)?;
        if !self.value.is_empty() {
            write!(f, " = {}", self.value)?;
        }
        if self.phrase {
            write!(f, ": expected {}", self.expected)
        } else {
            write!(f, ": {}", self.expected)
        }
    }
}

impl Error for ConfigError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn Error + 'static))
    }
}

/// The first error of type `T` in `err`'s chain (`err` itself included).
///
/// ```
/// use endpoint_state::error::cause_ref;
/// let io = std::io::Error::other("disk full");
/// let status = tonic::Status::from_error(Box::new(io));
/// assert!(cause_ref::<std::io::Error>(&status).is_some());
/// ```
pub fn cause_ref<'a, T: Error + 'static>(err: &'a (dyn Error + 'static)) -> Option<&'a T> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        cur = e.source();
    }
    None
}

/// Whether `err`'s chain (`err` itself included) holds an error of type `T`.
pub fn is_caused_by<T: Error + 'static>(err: &(dyn Error + 'static)) -> bool {
    cause_ref::<T>(err).is_some()
}

/// An error and its whole `source()` chain in words, joined with `: `
/// (`transport error: tcp connect error: Connection refused`), skipping a source whose text
/// is already shown. The form every layer uses for reasons and status messages.
pub fn error_chain(err: &(dyn Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let text = e.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cur = e.source();
    }
    out
}
