//! The kubelet API's TLS: the serving certificate (`tlsCertFile`/`tlsPrivateKeyFile`, or a self-signed one made
//! at start-up like the kubelet's when neither is given) and the client certificate verifier
//! (`authentication.x509.clientCAFile`; without it no client certificate is asked for).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ResolvesServerCert, WebPkiClientVerifier};

use super::ServerError;
use crate::config::KubeletConfig;

/// Who the self-signed certificate is for: DNS names and IP addresses put in its subject alternative names.
#[derive(Debug, Clone, Default)]
pub struct ServingIdentity {
    /// Host names (the first is the subject's common name).
    pub hostnames: Vec<String>,
    /// IP addresses the nodes publish.
    pub ips: Vec<IpAddr>,
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read_certs(path: &Path, field: &str) -> Result<Vec<CertificateDer<'static>>, ServerError> {
    let bad = |message: String| ServerError::Tls {
        field: field.to_owned(),
        message,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(format!("{}: {e}", path.display())))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(format!("{}: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(bad(format!("{}: no PEM certificate in the file", path.display())));
    }
    Ok(certs)
}

/// A self-signed serving certificate and key (PEM) for `identity`, valid for a year, as the kubelet makes when no
/// serving certificate is configured.
pub fn self_signed(identity: &ServingIdentity) -> Result<(String, String), ServerError> {
    let err = |e: rcgen::Error| ServerError::Tls {
        field: "tlsCertFile".into(),
        message: format!("making a self-signed serving certificate: {e}"),
    };
    let key = rcgen::KeyPair::generate().map_err(err)?;
    let mut params = rcgen::CertificateParams::new(identity.hostnames.clone()).map_err(err)?;
    let cn = identity
        .hostnames
        .first()
        .cloned()
        .unwrap_or_else(|| "node-agent".to_owned());
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, format!("{cn}-ca@self-signed"));
    for ip in &identity.ips {
        params.subject_alt_names.push(rcgen::SanType::IpAddress(*ip));
    }
    params.key_usages = vec![
        rcgen::KeyUsagePurpose::DigitalSignature,
        rcgen::KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(365);
    let cert = params.self_signed(&key).map_err(err)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// The rustls server configuration for the kubelet API: the certificates `serving` resolves (serverTLSBootstrap),
/// else the configured serving certificate, or a self-signed one for `identity`; client certificates verified against `clientCAFile` when set (optional: a request without
/// one is authenticated by its bearer token, or is anonymous).
pub fn server_config(
    kubelet: &KubeletConfig,
    identity: &ServingIdentity,
    serving: Option<Arc<dyn ResolvesServerCert>>,
) -> Result<Arc<rustls::ServerConfig>, ServerError> {
    let builder = client_auth(kubelet)?;
    let mut config = match serving {
        Some(resolver) => builder.with_cert_resolver(resolver),
        None => {
            let (chain, key) = serving_pair(kubelet, identity)?;
            builder
                .with_single_cert(chain, key)
                .map_err(|e| ServerError::Tls {
                    field: "tlsCertFile".into(),
                    message: e.to_string(),
                })?
        }
    };
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

type ServingPair = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

/// The configured serving certificate and key, or a self-signed pair for `identity`.
fn serving_pair(kubelet: &KubeletConfig, identity: &ServingIdentity) -> Result<ServingPair, ServerError> {
    Ok(match (&kubelet.tls_cert_file, &kubelet.tls_private_key_file) {
        (Some(cert), Some(key)) => {
            let chain = read_certs(cert, "tlsCertFile")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| ServerError::Tls {
                field: "tlsPrivateKeyFile".into(),
                message: format!("{}: {e}", key.display()),
            })?;
            (chain, key)
        }
        (None, None) => {
            let (cert, key) = self_signed(identity)?;
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes())
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| ServerError::Tls {
                    field: "tlsCertFile".into(),
                    message: e.to_string(),
                })?;
            let key = PrivateKeyDer::from_pem_slice(key.as_bytes()).map_err(|e| ServerError::Tls {
                field: "tlsPrivateKeyFile".into(),
                message: e.to_string(),
            })?;
            (chain, key)
        }
        (Some(_), None) | (None, Some(_)) => {
            return Err(ServerError::Tls {
                field: "tlsCertFile/tlsPrivateKeyFile".into(),
                message: "both or neither must be set".into(),
            });
        }
    })
}

/// The TLS server builder up to the serving certificate: client certificates verified against `clientCAFile`
/// when set.
fn client_auth(
    kubelet: &KubeletConfig,
) -> Result<rustls::ConfigBuilder<rustls::ServerConfig, rustls::server::WantsServerCert>, ServerError> {
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| ServerError::Tls {
            field: "tlsMinVersion".into(),
            message: e.to_string(),
        })?;
    Ok(match &kubelet.authentication.client_ca_file {
        Some(path) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in read_certs(path, "authentication.x509.clientCAFile")? {
                roots.add(cert).map_err(|e| ServerError::Tls {
                    field: "authentication.x509.clientCAFile".into(),
                    message: format!("{}: {e}", path.display()),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .allow_unauthenticated()
                .build()
                .map_err(|e| ServerError::Tls {
                    field: "authentication.x509.clientCAFile".into(),
                    message: e.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    })
}

/// The user a verified client certificate names: common name and organizations (groups), as Kubernetes reads
/// them.
pub fn certificate_user(cert: &CertificateDer<'_>) -> Option<super::auth::User> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_owned();
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(super::auth::User {
        name,
        groups,
        uid: String::new(),
    })
}
