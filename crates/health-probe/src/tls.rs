//! `-tls` and its options, as a rustls client configuration (ring provider, ALPN `h2`).
//!
//! Built once before any connection, like the original's `buildCredentials`: an unreadable
//! CA file or client key pair is a bad argument (exit code 1), not a connection failure.

use std::fmt;
use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{self, WebPkiSupportedAlgorithms};
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use tokio_rustls::rustls::{
    self, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
};

use crate::args::TlsOptions;
use crate::target::Target;

/// The TLS side of every connection the probe makes.
#[derive(Clone)]
pub(crate) struct TlsSetup {
    pub(crate) config: Arc<ClientConfig>,
    /// `-tls-server-name`, already checked.
    server_name: Option<ServerName<'static>>,
}

impl fmt::Debug for TlsSetup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsSetup")
            .field("server_name", &self.server_name)
            .field("alpn", &"h2")
            .finish_non_exhaustive()
    }
}

impl TlsSetup {
    /// Builds the client configuration from the options.
    pub(crate) fn new(options: &TlsOptions) -> Result<Self, TlsInitError> {
        let provider = Arc::new(crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsInitError(format!("no usable TLS versions: {e}")))?;
        let builder = if options.no_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert {
                    algorithms: provider.signature_verification_algorithms,
                }))
        } else {
            let roots = match &options.ca_cert {
                Some(path) => roots_from_file(path)?,
                None => system_roots(),
            };
            builder.with_root_certificates(roots)
        };
        let mut config = match (&options.client_cert, &options.client_key) {
            (Some(cert), Some(key)) => {
                let (chain, key) = key_pair(cert, key).map_err(|e| {
                    TlsInitError(format!(
                        "failed to load tls client cert/key pair. error={e}"
                    ))
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    TlsInitError(format!(
                        "failed to load tls client cert/key pair. error={e}"
                    ))
                })?
            }
            _ => builder.with_no_client_auth(),
        };
        config.alpn_protocols = vec![b"h2".to_vec()];
        let server_name = options
            .server_name
            .as_deref()
            .map(|name| {
                ServerName::try_from(name.to_owned())
                    .map_err(|e| TlsInitError(format!("invalid -tls-server-name {name:?}: {e}")))
            })
            .transpose()?;
        Ok(TlsSetup {
            config: Arc::new(config),
            server_name,
        })
    }

    /// The name the server's certificate must carry (and the SNI sent): `-tls-server-name`,
    /// else the address's host (a DNS name or an IP address).
    pub(crate) fn server_name_for(
        &self,
        target: &Target,
    ) -> Result<ServerName<'static>, rustls::pki_types::InvalidDnsNameError> {
        match &self.server_name {
            Some(name) => Ok(name.clone()),
            None => ServerName::try_from(target.host().to_owned()),
        }
    }
}

fn roots_from_file(path: &Path) -> Result<RootCertStore, TlsInitError> {
    let shown = path.display();
    let failed = |e: &dyn fmt::Display| {
        TlsInitError(format!(
            "failed to load root CA certificates from file ({shown}) error={e}"
        ))
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| failed(&e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| failed(&e))?;
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(TlsInitError(format!(
            "no root CA certs parsed from file {shown}"
        )));
    }
    Ok(roots)
}

/// The platform's trusted roots. Possibly none (a bare container): then every server
/// certificate fails verification at connect time, as it would with the original.
fn system_roots() -> RootCertStore {
    let found = rustls_native_certs::load_native_certs();
    let mut roots = RootCertStore::empty();
    roots.add_parsable_certificates(found.certs);
    roots
}

fn key_pair(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{}: {e}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate found", cert.display()));
    }
    let key = PrivateKeyDer::from_pem_file(key).map_err(|e| format!("{}: {e}", key.display()))?;
    Ok((chain, key))
}

/// `-tls-no-verify`: any certificate is accepted, but the handshake signatures are still
/// checked (the server must hold the key of the certificate it shows).
#[derive(Debug)]
struct AcceptAnyServerCert {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AcceptAnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// The TLS options cannot be turned into credentials (unreadable CA file, no certificate in
/// it, bad client key pair, invalid server name). Exit code 1, printed as
/// `failed to initialize tls credentials. error=...` like the original.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsInitError(String);

impl fmt::Display for TlsInitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "failed to initialize tls credentials. error={}", self.0)
    }
}

impl std::error::Error for TlsInitError {}
