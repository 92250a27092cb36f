//! The node's certificates from the cluster's certificates API, as a kubelet gets them: its client
//! certificate through TLS bootstrap (`--bootstrap-kubeconfig`) and renewal (`rotateCertificates`), and its
//! serving certificate from the `kubernetes.io/kubelet-serving` signer (`serverTLSBootstrap`).
//!
//! * [`csr`] asks for one certificate: a fresh P-256 key, a CertificateSigningRequest for a signer, and the
//!   wait until the cluster issues (or denies) it;
//! * [`store`] keeps certificates in the certificate directory as the kubelet does (`<prefix>-<time>.pem`,
//!   certificate and key in one file, `<prefix>-current.pem` a symlink to the newest);
//! * [`bootstrap`] turns a bootstrap kubeconfig into the node's own credentials and kubeconfig;
//! * [`rotation`] renews a certificate at 70–90 % of its lifetime and hands the new one on;
//! * [`client`] is an API client whose identity can be replaced while it is in use;
//! * [`serving`] is the kubelet API's serving certificate, issued and renewed while the server runs.

pub mod bootstrap;
pub mod client;
pub mod csr;
pub mod rotation;
pub mod serving;
pub mod store;

use std::time::{Duration, SystemTime};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// The user name of the kubelet of `node`.
pub fn node_user(node: &str) -> String {
    format!("system:node:{node}")
}

/// The group every kubelet is in.
pub const NODES_GROUP: &str = "system:nodes";

/// Errors getting, storing or using a certificate. Each names what it was about.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file or directory.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A certificate, key or kubeconfig could not be understood.
    #[error("{origin}: {message}")]
    Invalid {
        /// Where it came from.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// The API server refused or failed a request.
    #[error("{action}: {source}")]
    Api {
        /// What was being done.
        action: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The certificate signing request was denied or failed.
    #[error("certificate signing request {name} {outcome}: {reason}: {message}")]
    Refused {
        /// The CSR's name.
        name: String,
        /// `denied` or `failed`.
        outcome: &'static str,
        /// The condition's reason.
        reason: String,
        /// The condition's message.
        message: String,
    },
    /// No certificate was issued in time.
    #[error("certificate signing request {name}: no certificate issued within {waited:?}")]
    Timeout {
        /// The CSR's name.
        name: String,
        /// How long the request was waited for.
        waited: Duration,
    },
}

impl CertError {
    pub(crate) fn io(path: &std::path::Path, source: std::io::Error) -> Self {
        Self::Io {
            path: path.display().to_string(),
            source,
        }
    }

    pub(crate) fn invalid(origin: impl Into<String>, message: impl std::fmt::Display) -> Self {
        Self::Invalid {
            origin: origin.into(),
            message: message.to_string(),
        }
    }
}

/// A certificate (PEM, leaf first) with its private key (PEM) and its validity.
#[derive(Clone)]
pub struct CertPair {
    /// The certificate chain, PEM.
    pub cert_pem: String,
    /// The private key, PEM.
    pub key_pem: String,
    /// The leaf's validity start.
    pub not_before: SystemTime,
    /// The leaf's validity end.
    pub not_after: SystemTime,
    /// The leaf's serial number (hex), to tell certificates apart in logs and tests.
    pub serial: String,
}

impl std::fmt::Debug for CertPair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertPair")
            .field("serial", &self.serial)
            .field("not_before", &self.not_before)
            .field("not_after", &self.not_after)
            .finish_non_exhaustive()
    }
}

impl CertPair {
    /// Reads the certificates and the private key out of `cert_pem` and `key_pem` (they may be one and the same
    /// text, as in the kubelet's `<prefix>-current.pem`). `origin` names them in errors.
    pub fn parse(cert_pem: &str, key_pem: &str, origin: &str) -> Result<Self, CertError> {
        let certs = CertificateDer::pem_slice_iter(cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CertError::invalid(origin, pem_error(&e)))?;
        let leaf = certs
            .first()
            .ok_or_else(|| CertError::invalid(origin, "no PEM certificate"))?;
        PrivateKeyDer::from_pem_slice(key_pem.as_bytes())
            .map_err(|e| CertError::invalid(origin, format!("no usable private key: {}", pem_error(&e))))?;
        let (_, parsed) = x509_parser::parse_x509_certificate(leaf.as_ref())
            .map_err(|e| CertError::invalid(origin, format!("the certificate is not valid X.509: {e}")))?;
        let time = |t: x509_parser::time::ASN1Time| {
            let secs = t.timestamp();
            if secs >= 0 {
                SystemTime::UNIX_EPOCH + Duration::from_secs(secs.unsigned_abs())
            } else {
                SystemTime::UNIX_EPOCH
            }
        };
        // only the certificates and the key, each once: the stored file holds both
        let cert_only = certs
            .iter()
            .map(|c| pem_block("CERTIFICATE", c.as_ref()))
            .collect::<String>();
        let key_only =
            key_block(key_pem).ok_or_else(|| CertError::invalid(origin, "no private key block"))?;
        Ok(Self {
            cert_pem: cert_only,
            key_pem: key_only,
            not_before: time(parsed.validity().not_before),
            not_after: time(parsed.validity().not_after),
            serial: parsed.raw_serial_as_string(),
        })
    }

    /// Whether the certificate is valid at `now`.
    pub fn valid_at(&self, now: SystemTime) -> bool {
        self.not_before <= now && now < self.not_after
    }

    /// The time to renew at: 70 % of the lifetime plus `jitter` (0 to 1) times another 20 %, as the kubelet's
    /// certificate manager picks it.
    pub fn rotation_deadline(&self, jitter: f64) -> SystemTime {
        let total = self
            .not_after
            .duration_since(self.not_before)
            .unwrap_or(Duration::ZERO);
        self.not_before + total.mul_f64(0.7 + 0.2 * jitter.clamp(0.0, 1.0))
    }

    /// The rustls form: the chain and the key.
    pub fn rustls(&self) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), CertError> {
        let chain = CertificateDer::pem_slice_iter(self.cert_pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| CertError::invalid(&self.serial, e))?;
        let key = PrivateKeyDer::from_pem_slice(self.key_pem.as_bytes())
            .map_err(|e| CertError::invalid(&self.serial, e))?;
        Ok((chain, key))
    }
}

/// A PEM error in words (the library's own message prints the lines it means as lists of byte values).
fn pem_error(e: &rustls::pki_types::pem::Error) -> String {
    use rustls::pki_types::pem::Error;
    match e {
        // the library keeps the block's label only (`CERTIFICATE`)
        Error::MissingSectionEnd { end_marker } => format!(
            "a PEM block is cut off: no \"-----END {}-----\" line follows it",
            String::from_utf8_lossy(end_marker)
        ),
        Error::IllegalSectionStart { line } => {
            format!("malformed PEM line {:?}", String::from_utf8_lossy(line))
        }
        other => other.to_string(),
    }
}

fn pem_block(tag: &str, der: &[u8]) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(der);
    let mut out = format!("-----BEGIN {tag}-----\n");
    for line in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(line));
        out.push('\n');
    }
    out.push_str(&format!("-----END {tag}-----\n"));
    out
}

/// The first private-key PEM block of `text` (any of the PKCS#8, SEC1 or PKCS#1 forms), verbatim.
fn key_block(text: &str) -> Option<String> {
    let begin = text.find("-----BEGIN ")?;
    let mut rest = &text[begin..];
    loop {
        let header_end = rest.find('\n')?;
        let header = &rest[..header_end];
        let tag = header
            .trim()
            .strip_prefix("-----BEGIN ")?
            .strip_suffix("-----")?
            .to_owned();
        let end_marker = format!("-----END {tag}-----");
        let end = rest.find(&end_marker)? + end_marker.len();
        if tag.ends_with("PRIVATE KEY") {
            return Some(format!("{}\n", &rest[..end]));
        }
        let next = rest[end..].find("-----BEGIN ")?;
        rest = &rest[end + next..];
    }
}

#[cfg(test)]
mod tests;
