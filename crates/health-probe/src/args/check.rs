//! The original's checks of a parsed command line, in its order, with its messages.

use std::path::PathBuf;

use super::flags::Raw;
use super::options::{ArgsError, Command, Options, TlsOptions};

/// The original's checks, in its order, then ours.
pub(super) fn check(raw: Raw) -> Result<Command, ArgsError> {
    if raw.version {
        return Ok(Command::Version);
    }
    let fail = |message: &str| Err(ArgsError::check(message.to_owned()));
    if raw.addrs.is_empty() {
        return fail("-addr not specified");
    }
    let Some(connect_timeout) = raw.connect_timeout.positive() else {
        return fail(&format!(
            "-connect-timeout must be greater than zero (specified: {})",
            raw.connect_timeout
        ));
    };
    let Some(rpc_timeout) = raw.rpc_timeout.positive() else {
        return fail(&format!(
            "-rpc-timeout must be greater than zero (specified: {})",
            raw.rpc_timeout
        ));
    };
    let given = |s: &str| !s.is_empty();
    if !raw.tls && raw.no_verify {
        return fail("specified -tls-no-verify without specifying -tls");
    }
    if !raw.tls && given(&raw.ca_cert) {
        return fail("specified -tls-ca-cert without specifying -tls");
    }
    if !raw.tls && given(&raw.client_cert) {
        return fail("specified -tls-client-cert without specifying -tls");
    }
    if !raw.tls && given(&raw.server_name) {
        return fail("specified -tls-server-name without specifying -tls");
    }
    if given(&raw.client_cert) && !given(&raw.client_key) {
        return fail("specified -tls-client-cert without specifying -tls-client-key");
    }
    if !given(&raw.client_cert) && given(&raw.client_key) {
        return fail("specified -tls-client-key without specifying -tls-client-cert");
    }
    if raw.no_verify && given(&raw.ca_cert) {
        return fail("cannot specify -tls-ca-cert with -tls-no-verify (CA cert would not be used)");
    }
    if raw.no_verify && given(&raw.server_name) {
        return fail(
            "cannot specify -tls-server-name with -tls-no-verify (server name would not be used)",
        );
    }
    let path = |s: String| (!s.is_empty()).then(|| PathBuf::from(s));
    let tls = raw.tls.then(|| TlsOptions {
        no_verify: raw.no_verify,
        ca_cert: path(raw.ca_cert),
        client_cert: path(raw.client_cert),
        client_key: path(raw.client_key),
        server_name: (!raw.server_name.is_empty()).then_some(raw.server_name),
    });
    Ok(Command::Probe(Options {
        addrs: raw.addrs,
        service: raw.service,
        connect_timeout,
        rpc_timeout,
        headers: raw.headers,
        user_agent: raw.user_agent,
        tls,
        gzip: raw.gzip,
        verbose: raw.verbose,
        watch: raw.watch,
    }))
}
