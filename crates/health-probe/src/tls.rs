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

/// The most bytes read from a `-tls-ca-cert`, `-tls-client-cert` or `-tls-client-key` file:
/// 1 MiB, far beyond any certificate chain or key, so that a wrong path (a log, a device, a
/// pipe that never ends) is refused instead of read whole.
pub(crate) const MAX_PEM_FILE: u64 = 1024 * 1024;

/// The TLS side of every connection the probe makes.
#[derive(Clone)]
pub(crate) struct TlsSetup {
    pub(crate) config: Arc<ClientConfig>,
    /// `-tls-server-name`, already checked.
    server_name: Option<ServerName<'static>>,
    /// What went wrong loading the platform's roots while some loaded: printed, not fatal.
    pub(crate) warnings: Vec<String>,
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
        let mut warnings = Vec::new();
        let builder = if options.no_verify {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AcceptAnyServerCert {
                    algorithms: provider.signature_verification_algorithms,
                }))
        } else {
            let roots = match &options.ca_cert {
                Some(path) => roots_from_file(path)?,
                None => system_roots(rustls_native_certs::load_native_certs(), &mut warnings)?,
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
            warnings,
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
    let pem = read_capped(path).map_err(|e| failed(&e))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
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

/// The platform's trusted roots, as `rustls-native-certs` found them. None found and none
/// failing (a bare container): an empty store, so every server certificate fails verification
/// at connect time, as it would with the original. Roots that could not be loaded are
/// reported: as an error when none loaded (the probe could verify nothing), else as warnings.
fn system_roots(
    found: rustls_native_certs::CertificateResult,
    warnings: &mut Vec<String>,
) -> Result<RootCertStore, TlsInitError> {
    let mut roots = RootCertStore::empty();
    let (added, ignored) = roots.add_parsable_certificates(found.certs);
    let errors: Vec<String> = found.errors.iter().map(ToString::to_string).collect();
    if added == 0 && !errors.is_empty() {
        return Err(TlsInitError(format!(
            "failed to load the system's root CA certificates: {}",
            errors.join("; ")
        )));
    }
    for error in errors {
        warnings.push(format!(
            "warning: some of the system's root CA certificates could not be loaded: {error}"
        ));
    }
    if ignored > 0 {
        warnings.push(format!(
            "warning: {ignored} of the system's root CA certificates could not be parsed"
        ));
    }
    Ok(roots)
}

/// A file's bytes, refused beyond [`MAX_PEM_FILE`].
fn read_capped(path: &Path) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let file = std::fs::File::open(path).map_err(|e| e.to_string())?;
    let mut bytes = Vec::new();
    file.take(MAX_PEM_FILE + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > MAX_PEM_FILE {
        return Err(format!(
            "the file is larger than {} KiB: not a PEM file of certificates or a key",
            MAX_PEM_FILE / 1024
        ));
    }
    Ok(bytes)
}

fn key_pair(
    cert: &Path,
    key: &Path,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), String> {
    let pem = read_capped(cert).map_err(|e| format!("{}: {e}", cert.display()))?;
    let chain = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!("{}: no certificate found", cert.display()));
    }
    let pem = read_capped(key).map_err(|e| format!("{}: {e}", key.display()))?;
    let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| format!("{}: {e}", key.display()))?;
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

#[cfg(test)]
mod tests {
    use std::io::Write;

    use rustls_native_certs::{CertificateResult, Error, ErrorKind};

    use super::*;

    fn options(ca_cert: Option<&Path>, cert: Option<&Path>, key: Option<&Path>) -> TlsOptions {
        TlsOptions {
            no_verify: false,
            ca_cert: ca_cert.map(Path::to_owned),
            client_cert: cert.map(Path::to_owned),
            client_key: key.map(Path::to_owned),
            server_name: None,
        }
    }

    /// A file of `n` bytes, all of them a PEM-looking comment.
    fn big_file(n: usize) -> tempfile::NamedTempFile {
        let mut file = tempfile::NamedTempFile::new().unwrap();
        file.write_all(&vec![b'#'; n]).unwrap();
        file
    }

    fn err(result: Result<TlsSetup, TlsInitError>) -> String {
        match result {
            Ok(_) => panic!("accepted"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn tls_files_are_read_up_to_a_cap() {
        let big = big_file(MAX_PEM_FILE as usize + 1);
        let text = err(TlsSetup::new(&options(Some(big.path()), None, None)));
        assert!(text.contains("larger than 1024 KiB"), "{text}");
        let text = err(TlsSetup::new(&options(
            None,
            Some(big.path()),
            Some(big.path()),
        )));
        assert!(text.contains("larger than 1024 KiB"), "{text}");
        // At the cap, the file is read (and found to hold no certificate).
        let at_cap = big_file(MAX_PEM_FILE as usize);
        let text = err(TlsSetup::new(&options(Some(at_cap.path()), None, None)));
        assert!(text.contains("no root CA certs parsed"), "{text}");
    }

    fn failed_load() -> Error {
        Error {
            context: "failed to read PEM from file",
            kind: ErrorKind::Os("permission denied".into()),
        }
    }

    #[test]
    fn system_roots_that_all_fail_to_load_are_an_error() {
        let mut found = CertificateResult::default();
        found.errors.push(failed_load());
        let mut warnings = Vec::new();
        let text = system_roots(found, &mut warnings).unwrap_err().to_string();
        assert!(
            text.contains("failed to load the system's root CA certificates")
                && text.contains("permission denied"),
            "{text}"
        );
    }

    #[test]
    fn system_roots_that_partly_fail_to_load_are_a_warning() {
        let ca = rcgen::generate_simple_self_signed(vec!["ca.test".to_owned()]).unwrap();
        let mut found = CertificateResult::default();
        found.certs.push(ca.cert.der().clone());
        found.errors.push(failed_load());
        let mut warnings = Vec::new();
        let roots = system_roots(found, &mut warnings).unwrap();
        assert_eq!(roots.len(), 1);
        assert_eq!(warnings.len(), 1);
        assert!(warnings[0].contains("permission denied"), "{warnings:?}");
        // Nothing found and nothing failing (a bare container): no error, no warning.
        let mut warnings = Vec::new();
        assert!(
            system_roots(CertificateResult::default(), &mut warnings)
                .unwrap()
                .is_empty()
        );
        assert!(warnings.is_empty());
    }
}
