//! Certificates for the test control plane: one CA signs the API server's serving certificate and every
//! client certificate (admin in `system:masters`, the scheduler, the controller-manager, the API server's
//! kubelet client, and nodes as `system:node:<name>` in `system:nodes`). All are X.509 v3 with key usages,
//! which rustls requires.

use std::net::IpAddr;

use anyhow::Context;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// A certificate and its private key, both PEM.
#[derive(Debug, Clone)]
pub struct Pem {
    /// The certificate.
    pub cert: String,
    /// The private key (PKCS#8).
    pub key: String,
}

/// What a certificate is for.
#[derive(Debug, Clone, Default)]
pub struct CertSpec {
    /// Subject common name (the user name for client certificates).
    pub common_name: String,
    /// Subject organizations (the groups for client certificates).
    pub organizations: Vec<String>,
    /// IP subject alternative names (serving certificates).
    pub ips: Vec<IpAddr>,
    /// DNS subject alternative names (serving certificates).
    pub dns: Vec<String>,
    /// Usable as a TLS server certificate.
    pub server: bool,
    /// Usable as a TLS client certificate.
    pub client: bool,
    /// Valid only in the past: for the two days that ended a day ago (what a certificate never renewed looks
    /// like).
    pub expired: bool,
}

impl CertSpec {
    /// A client certificate for `user` in `groups`.
    pub fn client(user: &str, groups: &[&str]) -> Self {
        Self {
            common_name: user.to_owned(),
            organizations: groups.iter().map(|g| (*g).to_owned()).collect(),
            client: true,
            ..Self::default()
        }
    }

    /// The client certificate a kubelet for `node` presents.
    pub fn node(node: &str) -> Self {
        Self::client(&format!("system:node:{node}"), &["system:nodes"])
    }
}

/// A certificate authority that can sign more certificates.
#[derive(Debug, Clone)]
pub struct Ca {
    pem: Pem,
}

impl Ca {
    /// A new self-signed CA.
    pub fn generate(common_name: &str) -> anyhow::Result<Self> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, common_name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key)?;
        Ok(Self {
            pem: Pem {
                cert: cert.pem(),
                key: key.serialize_pem(),
            },
        })
    }

    /// A CA loaded from PEM (e.g. from a running control plane's directory).
    pub fn from_pem(pem: Pem) -> Self {
        Self { pem }
    }

    /// The CA's own certificate and key.
    pub fn pem(&self) -> &Pem {
        &self.pem
    }

    /// Issues a certificate signed by this CA.
    pub fn issue(&self, spec: &CertSpec) -> anyhow::Result<Pem> {
        let ca_key = KeyPair::from_pem(&self.pem.key).context("parsing CA key")?;
        let issuer = Issuer::from_ca_cert_pem(&self.pem.cert, ca_key).context("parsing CA certificate")?;
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params
            .distinguished_name
            .push(DnType::CommonName, spec.common_name.as_str());
        for org in &spec.organizations {
            params
                .distinguished_name
                .push(DnType::OrganizationName, org.as_str());
        }
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        if spec.server {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        if spec.client {
            params
                .extended_key_usages
                .push(ExtendedKeyUsagePurpose::ClientAuth);
        }
        if spec.expired {
            let now = time::OffsetDateTime::now_utc();
            params.not_before = now - time::Duration::days(3);
            params.not_after = now - time::Duration::days(1);
        }
        for ip in &spec.ips {
            params.subject_alt_names.push(SanType::IpAddress(*ip));
        }
        for name in &spec.dns {
            params
                .subject_alt_names
                .push(SanType::DnsName(name.as_str().try_into()?));
        }
        let cert = params.signed_by(&key, &issuer)?;
        Ok(Pem {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }
}

/// A fresh key pair for service-account token signing: (private key PKCS#8 PEM, public key PEM).
pub fn new_signing_key_pem() -> anyhow::Result<(String, String)> {
    let key = KeyPair::generate()?;
    Ok((key.serialize_pem(), key.public_key_pem()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_certificate_names_the_node_identity() {
        let ca = Ca::generate("test-ca").unwrap();
        let pem = ca.issue(&CertSpec::node("n1")).unwrap();
        assert!(pem.cert.starts_with("-----BEGIN CERTIFICATE-----"));
        assert!(pem.key.contains("PRIVATE KEY"));
        // a CA reloaded from PEM signs too
        let again = Ca::from_pem(ca.pem().clone());
        again
            .issue(&CertSpec::client("admin", &["system:masters"]))
            .unwrap();
    }
}
