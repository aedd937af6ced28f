//! Targets from a discovery source of the user's ([`KitBuilder::discover`]): any
//! `tower::discover::Discover` keyed by target URI — Kubernetes EndpointSlices, Consul, a
//! registry of your own — whose changes the kit's discovery task applies as they come, through
//! the same door as every other target ([`Registry::add`] / [`Registry::remove`]).
//!
//! [`KitBuilder::discover`]: crate::KitBuilder::discover

use std::fmt;
use std::future::poll_fn;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use futures_core::Stream;
use pin_project_lite::pin_project;
use tokio::sync::watch;
use tower::discover::{Change, Discover};

use crate::builder::{normalize, resolve_target};
use crate::error::BoxError;
use crate::registry::Registry;
use crate::target::{Target, TargetOptions};

/// One change from a source: keyed by the target's URI as written.
type SourceChange = Result<Change<String, TargetOptions>, BoxError>;

/// A discovery source, its types erased.
pub(crate) struct Source {
    inner: Pin<Box<dyn Stream<Item = SourceChange> + Send>>,
}

impl fmt::Debug for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Source").finish_non_exhaustive()
    }
}

impl Source {
    pub(crate) fn new<D>(discover: D) -> Self
    where
        D: Discover + Send + 'static,
        D::Key: AsRef<str>,
        D::Service: Into<TargetOptions>,
        D::Error: Into<BoxError>,
    {
        Source {
            inner: Box::pin(Adapt { discover }),
        }
    }
}

pin_project! {
    struct Adapt<D> {
        #[pin]
        discover: D,
    }
}

impl<D> Stream for Adapt<D>
where
    D: Discover,
    D::Key: AsRef<str>,
    D::Service: Into<TargetOptions>,
    D::Error: Into<BoxError>,
{
    type Item = SourceChange;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.project().discover.poll_discover(cx).map(|change| {
            change.map(|change| {
                change.map_err(Into::into).map(|change| match change {
                    Change::Insert(key, options) => {
                        Change::Insert(key.as_ref().to_owned(), options.into())
                    }
                    Change::Remove(key) => Change::Remove(key.as_ref().to_owned()),
                })
            })
        })
    }
}

/// What the source gave when polled.
enum Next {
    Change(SourceChange),
    /// Nothing more for now.
    Idle,
    /// The source ended.
    End,
}

/// The longest wait after errors in a row from the source (from 100 ms, doubling).
const MAX_ERROR_WAIT: Duration = Duration::from_secs(5);

/// The discovery task: applies every change of `source` to the registry until it ends (the
/// targets then stay as they are) or the kit stops. `ready` becomes `true` once a first batch
/// of changes is in (or the source ended).
pub(crate) async fn run(mut source: Source, registry: Arc<Registry>, ready: watch::Sender<bool>) {
    let mut applied = false;
    let mut errors: u32 = 0;
    loop {
        let next = poll_fn(|cx| match source.inner.as_mut().poll_next(cx) {
            Poll::Ready(Some(change)) => Poll::Ready(Next::Change(change)),
            Poll::Ready(None) => Poll::Ready(Next::End),
            Poll::Pending if applied && !*ready.borrow() => Poll::Ready(Next::Idle),
            Poll::Pending => Poll::Pending,
        })
        .await;
        match next {
            Next::Change(Ok(change)) => {
                errors = 0;
                apply(&registry, change).await;
                applied = true;
            }
            Next::Change(Err(error)) => {
                errors = errors.saturating_add(1);
                let wait = Duration::from_millis(100)
                    .saturating_mul(1 << errors.saturating_sub(1).min(6))
                    .min(MAX_ERROR_WAIT);
                tracing::warn!(%error, errors, "the discovery source failed; keeping the targets known");
                tokio::time::sleep(wait).await;
            }
            Next::Idle => {
                ready.send_replace(true);
            }
            Next::End => {
                tracing::info!(
                    targets = registry.names().len(),
                    "the discovery source ended; the targets stay as they are"
                );
                ready.send_replace(true);
                return;
            }
        }
    }
}

/// Applies one change: an insert resolves the target as the builder would (a bad one is
/// logged, naming it, and skipped); an insert of a target already there with other options
/// replaces it; a remove drains it (its calls in flight finish).
async fn apply(registry: &Registry, change: Change<String, TargetOptions>) {
    match change {
        Change::Insert(uri, options) => {
            let target = Target::with_options(uri, options);
            let new = match resolve_target(registry.template(), "discover", &target) {
                Ok(new) => new,
                Err(error) => {
                    tracing::warn!(target_uri = target.uri(), %error, "the discovery source gave a target the kit cannot use; skipped");
                    return;
                }
            };
            match registry.options(&new.name) {
                Some(known) if known == new.options => {
                    tracing::debug!(backend = %new.name, "the discovery source inserted a target already known");
                    return;
                }
                Some(_) => {
                    tracing::info!(backend = %new.name, "the discovery source changed a target's options: replacing it");
                    registry.remove(&new.name).await;
                }
                None => {}
            }
            registry.add(new).await;
        }
        Change::Remove(uri) => {
            let name: Arc<str> = Arc::from(normalize(&uri));
            if !registry.remove(&name).await {
                tracing::debug!(backend = %name, "the discovery source removed a target not known");
            }
        }
    }
}
