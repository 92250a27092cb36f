//! The kubelet API's TLS: the serving certificate (`tlsCertFile`/`tlsPrivateKeyFile`, or a self-signed one made
//! at start-up like the kubelet's when neither is given), the client certificates
//! (`authentication.x509.clientCAFile`; without it no client certificate is asked for), with the versions and
//! TLS 1.2 cipher suites `tlsMinVersion` and `tlsCipherSuites` allow.
//!
//! Client certificates are taken as the kubelet takes them (Go's `tls.RequestClientCert`): the handshake asks for
//! one, naming the client CA's subjects as hints, and accepts any certificate whose holder proves it has the key
//! (the handshake signature is checked); whether the certificate chains to the client CA is asked afterwards, of
//! the connection's certificates, by [`ClientCa::identify`]. So a certificate of another CA, or an expired one, is
//! no TLS error: the request is answered by the authenticator (401, unless its bearer token authenticates).

use std::net::IpAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::SystemTime;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ResolvesServerCert, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::ServerError;
use super::auth::{ClientCertificate, User};
use crate::config::KubeletConfig;
use crate::config::tls_settings::{self, TlsMinVersion};

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

/// The serving provider: every TLS 1.3 suite, and of the TLS 1.2 ones those `tlsCipherSuites` lists (all when
/// empty), in the library's order of preference.
fn serving_provider(kubelet: &KubeletConfig) -> rustls::crypto::CryptoProvider {
    let mut provider = rustls::crypto::ring::default_provider();
    let wanted = &kubelet.tls_cipher_suites;
    if !wanted.is_empty() {
        provider.cipher_suites.retain(|s| {
            let id = u16::from(s.suite());
            tls_settings::is_tls13(id) || wanted.contains(&id)
        });
    }
    provider
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

/// The kubelet API's TLS: the rustls server configuration and the client CA its connections' certificates are
/// checked against.
#[derive(Debug, Clone)]
pub struct ServerTls {
    /// The server configuration.
    pub config: Arc<rustls::ServerConfig>,
    /// `clientCAFile`'s authorities; `None` when it is not set (no client certificate is asked for).
    pub client_ca: Option<ClientCa>,
}

/// The rustls server configuration for the kubelet API: the certificates `serving` resolves (serverTLSBootstrap),
/// else the configured serving certificate, or a self-signed one for `identity`; a client certificate asked for
/// when `clientCAFile` is set (optional: a request without one is authenticated by its bearer token, or is
/// anonymous) and taken whoever issued it (see the module documentation).
pub fn server_config(
    kubelet: &KubeletConfig,
    identity: &ServingIdentity,
    serving: Option<Arc<dyn ResolvesServerCert>>,
) -> Result<ServerTls, ServerError> {
    let (builder, client_ca) = client_auth(kubelet)?;
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
    Ok(ServerTls {
        config: Arc::new(config),
        client_ca,
    })
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

type WantsServerCert = rustls::ConfigBuilder<rustls::ServerConfig, rustls::server::WantsServerCert>;

/// The TLS server builder up to the serving certificate, asking for a client certificate when `clientCAFile` is
/// set; and that client CA.
fn client_auth(kubelet: &KubeletConfig) -> Result<(WantsServerCert, Option<ClientCa>), ServerError> {
    let versions: &[&'static rustls::SupportedProtocolVersion] = match kubelet.tls_min_version {
        TlsMinVersion::Tls12 => &[&rustls::version::TLS13, &rustls::version::TLS12],
        TlsMinVersion::Tls13 => {
            if !kubelet.tls_cipher_suites.is_empty() {
                tracing::warn!(
                    "tlsCipherSuites is ignored: with tlsMinVersion VersionTLS13 only TLS 1.3 is served, whose \
                     cipher suites are not configurable"
                );
            }
            &[&rustls::version::TLS13]
        }
    };
    let builder = rustls::ServerConfig::builder_with_provider(Arc::new(serving_provider(kubelet)))
        .with_protocol_versions(versions)
        .map_err(|e| ServerError::Tls {
            field: "tlsMinVersion/tlsCipherSuites".into(),
            message: e.to_string(),
        })?;
    Ok(match &kubelet.authentication.client_ca_file {
        Some(path) => {
            let ca = ClientCa::read(path)?;
            let asks = Arc::new(RequestClientCertificate { ca: ca.clone() });
            (builder.with_client_cert_verifier(asks), Some(ca))
        }
        None => (builder.with_no_client_auth(), None),
    })
}

/// The authorities of `authentication.x509.clientCAFile`: a client certificate chaining to one of them (and
/// valid for client authentication, at the time of the check) names the request's user.
#[derive(Debug, Clone)]
pub struct ClientCa {
    /// rustls' verifier of chains to these authorities.
    verifier: Arc<dyn ClientCertVerifier>,
}

impl ClientCa {
    /// The authorities in the PEM file `path`.
    pub fn read(path: &Path) -> Result<Self, ServerError> {
        let field = "authentication.x509.clientCAFile";
        let mut roots = rustls::RootCertStore::empty();
        for cert in read_certs(path, field)? {
            roots.add(cert).map_err(|e| ServerError::Tls {
                field: field.into(),
                message: format!("{}: {e}", path.display()),
            })?;
        }
        let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .allow_unauthenticated()
            .build()
            .map_err(|e| ServerError::Tls {
                field: field.into(),
                message: format!("{}: {e}", path.display()),
            })?;
        Ok(Self { verifier })
    }

    /// What the certificates a client presented (leaf first, then intermediates) say about who it is, checked
    /// now.
    pub fn identify(&self, chain: &[CertificateDer<'_>]) -> ClientCertificate {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return ClientCertificate::Absent;
        };
        if let Err(e) = self
            .verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
        {
            return ClientCertificate::Unverified(format!(
                "verifying certificate {} failed: {e}",
                certificate_name(leaf)
            ));
        }
        match (certificate_user(leaf), not_after(leaf)) {
            (Some(user), Some(not_after)) => ClientCertificate::Verified { user, not_after },
            // chains to the client CA but names nobody (no common name): as if none were presented
            _ => ClientCertificate::Absent,
        }
    }
}

/// The client certificate check of the handshake (see the module documentation): asks for a certificate with
/// the client CA's subjects as hints, takes whichever comes, and checks the handshake signature made with its
/// key.
#[derive(Debug)]
struct RequestClientCertificate {
    ca: ClientCa,
}

impl ClientCertVerifier for RequestClientCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.ca.verifier.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // the chain is the authenticator's to judge (ClientCa::identify), as the kubelet's x509 authenticator
        // judges it after Go's TLS took the certificate
        Ok(ClientCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca.verifier.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.ca.verifier.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.ca.verifier.supported_verify_schemes()
    }
}

/// The user a client certificate names: common name and organizations (groups), as Kubernetes reads them.
pub fn certificate_user(cert: &CertificateDer<'_>) -> Option<User> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let subject = parsed.subject();
    let name = subject
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())?
        .to_owned();
    if name.is_empty() {
        return None;
    }
    let groups = subject
        .iter_organization()
        .filter_map(|o| o.as_str().ok().map(str::to_owned))
        .collect();
    Some(User {
        name,
        groups,
        uid: String::new(),
    })
}

/// The end of a certificate's validity.
fn not_after(cert: &CertificateDer<'_>) -> Option<SystemTime> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let secs = u64::try_from(parsed.validity().not_after.timestamp()).ok()?;
    Some(SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(secs))
}

/// A certificate as a log line names it: its subject, issuer and serial number.
fn certificate_name(cert: &CertificateDer<'_>) -> String {
    match x509_parser::parse_x509_certificate(cert.as_ref()) {
        Ok((_, parsed)) => format!(
            "subject \"{}\", issuer \"{}\", serial {}",
            parsed.subject(),
            parsed.issuer(),
            parsed.raw_serial_as_string()
        ),
        Err(_) => "(not a parsable certificate)".to_owned(),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rustls::pki_types::ServerName;
    use rustls::{CipherSuite, ProtocolVersion, SupportedCipherSuite};

    fn identity() -> ServingIdentity {
        ServingIdentity {
            hostnames: vec!["node-a".into()],
            ips: vec![],
        }
    }

    /// A client's server-certificate check that takes any certificate (the tests here test the client's side
    /// of the handshake, not the server's certificate) but still checks the handshake's signatures.
    #[derive(Debug)]
    pub(crate) struct AnyServer(pub(crate) Arc<rustls::crypto::CryptoProvider>);
    impl rustls::client::danger::ServerCertVerifier for AnyServer {
        fn verify_server_cert(
            &self,
            _: &CertificateDer<'_>,
            _: &[CertificateDer<'_>],
            _: &ServerName<'_>,
            _: &[u8],
            _: rustls::pki_types::UnixTime,
        ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        }
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &rustls::DigitallySignedStruct,
        ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.0.signature_verification_algorithms,
            )
        }
        fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
            self.0.signature_verification_algorithms.supported_schemes()
        }
    }
    /// A client trusting no one (the server's certificate is not what is tested) offering only `versions` and
    /// `suites`.
    fn client(
        versions: &[&'static rustls::SupportedProtocolVersion],
        suites: &[SupportedCipherSuite],
    ) -> Arc<rustls::ClientConfig> {
        let mut provider = rustls::crypto::ring::default_provider();
        provider.cipher_suites = suites.to_vec();
        let provider = Arc::new(provider);
        let config = rustls::ClientConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(versions)
            .expect("client versions")
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServer(provider)))
            .with_no_client_auth();
        Arc::new(config)
    }

    /// A handshake between the kubelet API's TLS configuration for `kubelet` and `client`: the version and suite
    /// agreed, or the client's error.
    async fn handshake(
        kubelet: &KubeletConfig,
        client: Arc<rustls::ClientConfig>,
    ) -> Result<(ProtocolVersion, CipherSuite), String> {
        let server = server_config(kubelet, &identity(), None)
            .expect("server config")
            .config;
        let (a, b) = tokio::io::duplex(64 * 1024);
        let acceptor = tokio_rustls::TlsAcceptor::from(server);
        let server = tokio::spawn(async move { acceptor.accept(b).await.map(|_| ()) });
        let connector = tokio_rustls::TlsConnector::from(client);
        let name = ServerName::try_from("node-a").expect("server name");
        let answer = match connector.connect(name, a).await {
            Ok(stream) => {
                let (_, conn) = stream.get_ref();
                Ok((
                    conn.protocol_version().expect("version"),
                    conn.negotiated_cipher_suite().expect("suite").suite(),
                ))
            }
            Err(e) => Err(e.to_string()),
        };
        let _ = server.await;
        answer
    }

    use rustls::crypto::ring::cipher_suite as suites;

    #[tokio::test]
    async fn tls_min_version_13_refuses_a_client_offering_only_tls_12() {
        let mut kubelet = KubeletConfig {
            tls_min_version: TlsMinVersion::Tls13,
            ..KubeletConfig::default()
        };
        let tls12_only = client(
            &[&rustls::version::TLS12],
            rustls::crypto::ring::ALL_CIPHER_SUITES,
        );
        let refused = handshake(&kubelet, tls12_only.clone()).await;
        assert!(refused.is_err(), "a TLS 1.2 client was served: {refused:?}");
        let any = client(
            &[&rustls::version::TLS13, &rustls::version::TLS12],
            rustls::crypto::ring::ALL_CIPHER_SUITES,
        );
        assert_eq!(
            handshake(&kubelet, any).await.map(|(v, _)| v),
            Ok(ProtocolVersion::TLSv1_3)
        );
        // the default (VersionTLS12) serves the same TLS 1.2 client
        kubelet.tls_min_version = TlsMinVersion::Tls12;
        assert_eq!(
            handshake(&kubelet, tls12_only).await.map(|(v, _)| v),
            Ok(ProtocolVersion::TLSv1_2)
        );
    }

    #[tokio::test]
    async fn tls_cipher_suites_restrict_tls_12_and_leave_tls_13_alone() {
        // the self-signed serving key is ECDSA: its TLS 1.2 suites are the ECDHE_ECDSA ones
        let kubelet = KubeletConfig {
            tls_cipher_suites: vec![0xc02c], // TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            ..KubeletConfig::default()
        };
        let unlisted = client(
            &[&rustls::version::TLS12],
            &[
                suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                suites::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
            ],
        );
        let refused = handshake(&kubelet, unlisted).await;
        assert!(refused.is_err(), "an unlisted suite was served: {refused:?}");
        let listed = client(
            &[&rustls::version::TLS12],
            &[
                suites::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
                suites::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
            ],
        );
        assert_eq!(
            handshake(&kubelet, listed).await,
            Ok((
                ProtocolVersion::TLSv1_2,
                CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            ))
        );
        let tls13 = client(
            &[&rustls::version::TLS13],
            &[suites::TLS13_CHACHA20_POLY1305_SHA256],
        );
        assert_eq!(
            handshake(&kubelet, tls13).await,
            Ok((
                ProtocolVersion::TLSv1_3,
                CipherSuite::TLS13_CHACHA20_POLY1305_SHA256
            ))
        );
    }
}
