//! A target as the user writes it, as the kit names it: the scheme and host lowercased, user
//! info refused, the endpoint (and connector) from the template. Every address that enters
//! the kit — the builder's list, `Kit::add_target`, a discovery source — is resolved here; a
//! `dns:` name's addresses by [`resolved_address`].

use std::sync::Arc;

use endpoint_state::ConfigError;

use crate::registry::NewTarget;
use crate::target::Target;
use crate::template::EndpointTemplate;

/// A target's name, endpoint and connector, from the address as written: normalized
/// ([`normalize`]), refused — naming `field` and the address — when it is not a valid address,
/// has no host, carries user info, or the endpoint template refuses it.
pub(crate) fn resolve_target(
    template: &EndpointTemplate,
    field: &str,
    target: &Target,
) -> Result<NewTarget, ConfigError> {
    let t = target.uri();
    let uri = normalize(t);
    let bad = |why: String| {
        ConfigError::problem(
            crate::error::CONFIG,
            field.to_owned(),
            format!("{t:?}"),
            why,
        )
    };
    let parsed: http::Uri = uri
        .parse()
        .map_err(|e| bad(format!("not a valid address: {e}")))?;
    if let Some(authority) = parsed.authority()
        && let Some((_, host)) = authority.as_str().rsplit_once('@')
    {
        // The credentials are not repeated in the error either.
        let shown = format!("{}://***@{host}", parsed.scheme_str().unwrap_or("http"));
        return Err(ConfigError::problem(
            crate::error::CONFIG,
            field.to_owned(),
            format!("{shown:?}"),
            "the address carries user info (credentials), which would appear in every \
             status, log line and metric label that names the target: give credentials as \
             call metadata or in the endpoint template instead",
        ));
    }
    if parsed.host().is_none() {
        return Err(bad("the address has no host".to_owned()));
    }
    let (endpoint, connector) = template
        .transport(&uri)
        .map_err(|e| bad(format!("the endpoint template refused it: {e}")))?;
    Ok(NewTarget {
        name: Arc::from(uri),
        endpoint,
        connector,
        address: None,
        options: target.options().clone(),
    })
}

/// One address a `dns:` name resolved to: named `scheme://ADDRESS` (`name`), its endpoint made
/// by the template from the **name** (`scheme://HOST:PORT`), so that the channel sends the
/// name as `:authority` and TLS verifies the server as the name (gRPC's behaviour), while
/// every connection goes to `address`.
#[cfg(feature = "dns")]
pub(crate) fn resolved_address(
    template: &EndpointTemplate,
    name: Arc<str>,
    host_uri: &str,
    address: std::net::SocketAddr,
    options: &crate::target::TargetOptions,
) -> Result<NewTarget, crate::error::BoxError> {
    let (endpoint, connector) = template.transport(host_uri)?;
    Ok(NewTarget {
        name,
        endpoint,
        connector,
        address: Some(address),
        options: options.clone(),
    })
}

/// A target's name: `10.0.0.7:50051` means `http://10.0.0.7:50051`, and the scheme and the
/// host are lowercased (URIs compare them without case), so that `HTTP://Billing:1` and
/// `http://billing:1` are one target — listed twice, they are refused as a duplicate.
pub(crate) fn normalize(target: &str) -> String {
    let target = target.trim();
    let (scheme, rest) = match target.split_once("://") {
        Some((scheme, rest)) => (scheme.to_ascii_lowercase(), rest.trim_end_matches('/')),
        None => ("http".to_owned(), target),
    };
    let (authority, path) = match rest.find('/') {
        Some(at) => rest.split_at(at),
        None => (rest, ""),
    };
    format!("{scheme}://{}{path}", authority.to_ascii_lowercase())
}
