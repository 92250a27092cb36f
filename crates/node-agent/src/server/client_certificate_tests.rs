//! The kubelet API's answer to client certificates, over TLS connections to a listening server: as the kubelet,
//! the handshake takes a certificate of any issuer (offering the client CA's subject as a hint) as long as the
//! client signs with its key; a certificate of the client CA names the user; one of another CA, or an expired
//! one, is refused 401 — with anonymous requests allowed too, since a certificate that does not verify is an
//! authentication error rather than no credentials. Authorization is `AlwaysAllow` here, so an authenticated
//! request to `/healthz` is answered 200.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, Mutex};

use rustls::client::ResolvesClientCert;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::sign::CertifiedKey;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::tests::endpoint;
use super::tls::tests::AnyServer;
use super::*;
use crate::config::{AuthorizationMode, KubeletConfig};

/// A CA: its certificate (PEM) and what signs with it.
struct Ca {
    pem: String,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Self {
        let key = rcgen::KeyPair::generate().expect("a key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, name);
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let pem = params.self_signed(&key).expect("a CA").pem();
        Self {
            pem,
            issuer: rcgen::Issuer::new(params, key),
        }
    }

    /// A client certificate for `user` in `group`, valid from `from` for `hours`: the chain and its key.
    fn client(&self, user: &str, group: &str, from: time::OffsetDateTime, hours: i64) -> Identity {
        let key = rcgen::KeyPair::generate().expect("a key");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, user);
        params
            .distinguished_name
            .push(rcgen::DnType::OrganizationName, group);
        params.key_usages = vec![rcgen::KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.not_before = from;
        params.not_after = from + time::Duration::hours(hours);
        let cert = params.signed_by(&key, &self.issuer).expect("a certificate");
        Identity {
            chain: vec![cert.der().clone()],
            key: PrivateKeyDer::from_pem_slice(key.serialize_pem().as_bytes()).expect("the key"),
        }
    }
}

struct Identity {
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
}

/// Presents `identity` whatever the server hints, and keeps the hints it was given.
#[derive(Debug)]
struct Present {
    certified: Arc<CertifiedKey>,
    hints: Mutex<Vec<Vec<u8>>>,
}

impl ResolvesClientCert for Present {
    fn resolve(
        &self,
        root_hint_subjects: &[&[u8]],
        _sigschemes: &[rustls::SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        *self.hints.lock().expect("hints") = root_hint_subjects.iter().map(|h| h.to_vec()).collect();
        Some(self.certified.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A client presenting `chain` and signing the handshake with `key` (not necessarily the chain's own), trusting
/// any server certificate (the server's certificate is not what is tested).
fn client(
    chain: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> (Arc<rustls::ClientConfig>, Option<Arc<Present>>) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyServer(provider.clone())));
    match chain {
        Some((chain, key)) => {
            let key = provider
                .key_provider
                .load_private_key(key)
                .expect("a signing key");
            let present = Arc::new(Present {
                certified: Arc::new(CertifiedKey::new(chain, key)),
                hints: Mutex::default(),
            });
            (
                Arc::new(builder.with_client_cert_resolver(present.clone())),
                Some(present),
            )
        }
        None => (Arc::new(builder.with_no_client_auth()), None),
    }
}

/// GET /healthz over a new connection: the status, or the TLS error.
async fn healthz(addr: SocketAddr, client: Arc<rustls::ClientConfig>) -> Result<u16, String> {
    let tcp = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|e| e.to_string())?;
    let connector = tokio_rustls::TlsConnector::from(client);
    let name = ServerName::try_from("n1").expect("a name");
    let mut tls = connector.connect(name, tcp).await.map_err(|e| e.to_string())?;
    tls.write_all(b"GET /healthz HTTP/1.1\r\nhost: n1\r\nconnection: close\r\n\r\n")
        .await
        .map_err(|e| e.to_string())?;
    let mut answer = Vec::new();
    // TLS 1.3 reports a refused client certificate only when the server's alert is read
    tls.read_to_end(&mut answer).await.map_err(|e| e.to_string())?;
    let answer = String::from_utf8_lossy(&answer);
    answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("no status line in {answer:?}"))
}

#[tokio::test]
async fn a_certificate_of_another_ca_or_expired_is_taken_in_the_handshake_and_refused_401() {
    let dir = tempfile::tempdir().expect("a directory");
    let ca = Ca::new("cluster-ca");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca.pem).expect("the CA file");
    let now = time::OffsetDateTime::now_utc();
    let good = ca.client(
        "system:node:n2",
        "system:nodes",
        now - time::Duration::hours(1),
        2,
    );
    let expired = ca.client(
        "system:node:n2",
        "system:nodes",
        now - time::Duration::hours(3),
        2,
    );
    let foreign = Ca::new("another-ca").client(
        "system:node:n2",
        "system:nodes",
        now - time::Duration::hours(1),
        2,
    );
    let stranger_key = Ca::new("unused").client("x", "y", now, 1).key;

    for anonymous in [false, true] {
        let mut kubelet = KubeletConfig::default();
        kubelet.authentication.client_ca_file = Some(ca_file.clone());
        kubelet.authentication.anonymous_enabled = anonymous;
        kubelet.authorization.mode = AuthorizationMode::AlwaysAllow;
        let token = CancellationToken::new();
        let server = KubeletServer::new(
            Arc::new(kubelet),
            &ServingIdentity::default(),
            None,
            token.clone(),
        )
        .expect("a server");
        let addr = server
            .serve_node(SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0), endpoint())
            .expect("a listener");

        let (config, present) = client(Some((good.chain.clone(), good.key.clone_key())));
        assert_eq!(
            healthz(addr, config).await,
            Ok(200),
            "the client CA's certificate"
        );
        // the CA's subject was offered as a hint, as the kubelet offers its ClientCAs
        let hints = present.expect("a resolver").hints.lock().expect("hints").clone();
        let ca_der = CertificateDer::from_pem_slice(ca.pem.as_bytes()).expect("the CA");
        let (_, ca_cert) = x509_parser::parse_x509_certificate(ca_der.as_ref()).expect("the CA parses");
        assert_eq!(
            hints,
            vec![ca_cert.subject().as_raw().to_vec()],
            "anonymous={anonymous}"
        );

        for (what, identity) in [("another CA's", &foreign), ("an expired", &expired)] {
            let (config, _) = client(Some((identity.chain.clone(), identity.key.clone_key())));
            assert_eq!(
                healthz(addr, config).await,
                Ok(401),
                "{what} certificate: the handshake completes and the request is unauthorized \
                 (anonymous={anonymous})"
            );
        }
        // the handshake signature is still checked: a certificate without its key is refused in the handshake
        let (config, _) = client(Some((good.chain.clone(), stranger_key.clone_key())));
        let refused = healthz(addr, config).await;
        assert!(
            refused.is_err(),
            "a handshake signed with another key: {refused:?}"
        );

        let (config, _) = client(None);
        let want = if anonymous { 200 } else { 401 };
        assert_eq!(
            healthz(addr, config).await,
            Ok(want),
            "no certificate (anonymous={anonymous})"
        );
        token.cancel();
        server.stopped().await;
    }
}

#[test]
fn a_verified_certificate_stops_naming_its_user_when_it_expires() {
    let dir = tempfile::tempdir().expect("a directory");
    let ca = Ca::new("cluster-ca");
    let ca_file = dir.path().join("ca.crt");
    std::fs::write(&ca_file, &ca.pem).expect("the CA file");
    let client_ca = tls::ClientCa::read(&ca_file).expect("the client CA");
    let now = time::OffsetDateTime::now_utc();
    let good = ca.client("alice", "devs", now - time::Duration::hours(1), 2);
    let identified = client_ca.identify(&good.chain);
    let ClientCertificate::Verified { user, not_after } = &identified else {
        panic!("not verified: {identified:?}");
    };
    assert_eq!(
        (user.name.as_str(), user.groups.as_slice()),
        ("alice", &["devs".to_owned()][..])
    );
    assert_eq!(
        identified.user_at(*not_after - std::time::Duration::from_secs(1)),
        Ok(Some(user))
    );
    let late = identified.user_at(*not_after).expect_err("expired");
    assert!(late.contains("alice") && late.contains("expired"), "{late}");

    let foreign = Ca::new("another-ca").client("alice", "devs", now - time::Duration::hours(1), 2);
    let ClientCertificate::Unverified(why) = client_ca.identify(&foreign.chain) else {
        panic!("another CA's certificate verified");
    };
    assert!(why.contains("another-ca") && why.contains("alice"), "{why}");
    assert_eq!(client_ca.identify(&[]), ClientCertificate::Absent);
}
