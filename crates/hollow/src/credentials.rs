//! Per-node credentials: client certificates minted in memory from the cluster's client CA, one per hollow
//! node, naming it the way a kubelet's certificate does — common name `system:node:<node>`, organization
//! `system:nodes` — so the API server's Node authorizer and `NodeRestriction` admission treat every hollow
//! node as the kubelet of that node and of no other.
//!
//! The CA is the one the API server trusts for client certificates (its `--client-ca-file`): its certificate
//! (PEM; the first certificate of the file) and its private key (PEM, PKCS#8 `PRIVATE KEY` or PKCS#1
//! `RSA PRIVATE KEY`, the form kubeadm writes). Nothing minted here is written to disk; node keys are fresh
//! P-256 keys, certificates are valid for a year (never past the CA's own expiry), with a few minutes of
//! allowance for clock skew.
//!
//! TLS client identity belongs to a connection, so per-node credentials mean one connection per node; see
//! [`crate::client_pool::ClientPool::per_node`].

use std::path::Path;
use std::time::Duration;

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use x509_parser::pem::Pem;
use x509_parser::time::ASN1Time;

/// The group every node identity is in.
pub const NODES_GROUP: &str = "system:nodes";

/// How long a minted certificate is valid (at most; never beyond the CA's own expiry).
const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Minted certificates are valid from this long before now, in case the API server's clock is behind.
const CLOCK_SKEW: Duration = Duration::from_secs(5 * 60);

/// The user name of the kubelet of `node`.
pub fn node_user(node: &str) -> String {
    format!("system:node:{node}")
}

/// Errors loading the CA or minting a certificate. Each names the file (or the input) at fault.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// A file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The CA certificate is missing, unparsable, not a CA or expired.
    #[error("{origin}: {message}")]
    Certificate {
        /// The file (or input) the certificate came from.
        origin: String,
        /// What is wrong with it.
        message: String,
    },
    /// The CA key is missing, unparsable or of a kind not supported.
    #[error("{origin}: {message}")]
    Key {
        /// The file (or input) the key came from.
        origin: String,
        /// What is wrong with it.
        message: String,
    },
    /// The key is not the CA certificate's.
    #[error("{key} is not the private key of the CA certificate {cert}")]
    Mismatch {
        /// Where the certificate came from.
        cert: String,
        /// Where the key came from.
        key: String,
    },
    /// Signing a node certificate failed.
    #[error("minting the client certificate of node {node}: {source}")]
    Mint {
        /// The node.
        node: String,
        /// Why.
        #[source]
        source: rcgen::Error,
    },
}

/// One node's client certificate and private key, both PEM.
#[derive(Clone)]
pub struct NodeCredential {
    /// The node it names.
    pub node: String,
    /// The certificate (PEM).
    pub cert_pem: String,
    /// The private key (PKCS#8 PEM).
    pub key_pem: String,
}

impl std::fmt::Debug for NodeCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeCredential")
            .field("node", &self.node)
            .field("cert_pem", &self.cert_pem)
            .field("key_pem", &"[elided]")
            .finish()
    }
}

/// A CA that mints node client certificates.
#[derive(Debug)]
pub struct NodeCa {
    issuer: Issuer<'static, KeyPair>,
    not_after: ASN1Time,
}

impl NodeCa {
    /// Loads the CA certificate and key from PEM files.
    pub fn from_files(cert: &Path, key: &Path) -> Result<Self, CredentialsError> {
        let read = |path: &Path| {
            std::fs::read_to_string(path).map_err(|source| CredentialsError::Read {
                path: path.display().to_string(),
                source,
            })
        };
        Self::from_pem_named(
            &read(cert)?,
            &cert.display().to_string(),
            &read(key)?,
            &key.display().to_string(),
        )
    }

    /// A CA from PEM text; errors call the inputs "CA certificate" and "CA key".
    pub fn from_pem(cert_pem: &str, key_pem: &str) -> Result<Self, CredentialsError> {
        Self::from_pem_named(cert_pem, "CA certificate", key_pem, "CA key")
    }

    fn from_pem_named(
        cert_pem: &str,
        cert_origin: &str,
        key_pem: &str,
        key_origin: &str,
    ) -> Result<Self, CredentialsError> {
        let cert_error = |message: String| CredentialsError::Certificate {
            origin: cert_origin.to_owned(),
            message,
        };
        let block = first_block(cert_pem, |label| label == "CERTIFICATE")
            .map_err(|e| cert_error(format!("not PEM: {e}")))?
            .ok_or_else(|| cert_error("no PEM CERTIFICATE block".into()))?;
        let x509 = block
            .parse_x509()
            .map_err(|e| cert_error(format!("not an X.509 certificate: {e}")))?;
        if !x509.is_ca() {
            return Err(cert_error(format!(
                "{} is not a CA certificate (no basicConstraints CA:TRUE)",
                x509.subject()
            )));
        }
        if let Ok(Some(usage)) = x509.key_usage()
            && !usage.value.key_cert_sign()
        {
            return Err(cert_error(format!(
                "{} may not sign certificates (its key usage lacks keyCertSign)",
                x509.subject()
            )));
        }
        let not_after = x509.validity().not_after;
        if not_after < ASN1Time::now() {
            return Err(cert_error(format!("{} expired at {not_after}", x509.subject())));
        }
        let key = load_key(key_pem, key_origin)?;
        if x509.public_key().subject_public_key.data.as_ref() != key.public_key_raw() {
            return Err(CredentialsError::Mismatch {
                cert: cert_origin.to_owned(),
                key: key_origin.to_owned(),
            });
        }
        let issuer = Issuer::from_ca_cert_der(&block.contents.as_slice().into(), key)
            .map_err(|e| cert_error(format!("unusable as an issuer: {e}")))?;
        Ok(Self { issuer, not_after })
    }

    /// Mints a client certificate for the kubelet of `node`: `CN=system:node:<node>, O=system:nodes`, usable
    /// for TLS client authentication only, with a fresh key.
    pub fn issue(&self, node: &str) -> Result<NodeCredential, CredentialsError> {
        let mint = |source| CredentialsError::Mint {
            node: node.to_owned(),
            source,
        };
        let key = KeyPair::generate().map_err(mint)?;
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, node_user(node));
        params
            .distinguished_name
            .push(DnType::OrganizationName, NODES_GROUP);
        params.is_ca = IsCa::ExplicitNoCa;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let now = ASN1Time::now().to_datetime();
        let ca_end = self.not_after.to_datetime();
        params.not_before = now - CLOCK_SKEW;
        params.not_after = (now + VALIDITY).min(ca_end);
        let cert = params.signed_by(&key, &self.issuer).map_err(mint)?;
        Ok(NodeCredential {
            node: node.to_owned(),
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }
}

/// The first PEM block whose label `wanted` accepts.
fn first_block(text: &str, wanted: impl Fn(&str) -> bool) -> Result<Option<Pem>, String> {
    for block in Pem::iter_from_buffer(text.as_bytes()) {
        let block = block.map_err(|e| e.to_string())?;
        if wanted(&block.label) {
            return Ok(Some(block));
        }
    }
    Ok(None)
}

fn load_key(text: &str, origin: &str) -> Result<KeyPair, CredentialsError> {
    let key_error = |message: String| CredentialsError::Key {
        origin: origin.to_owned(),
        message,
    };
    let block = first_block(text, |label| label.ends_with("PRIVATE KEY"))
        .map_err(|e| key_error(format!("not PEM: {e}")))?
        .ok_or_else(|| key_error("no PEM private key block".into()))?;
    let pkcs8 = match block.label.as_str() {
        "PRIVATE KEY" => block.contents,
        "RSA PRIVATE KEY" => rsa_pkcs1_to_pkcs8(&block.contents),
        other => {
            return Err(key_error(format!(
                "{other} keys are not supported; convert it to unencrypted PKCS#8 \
                 (openssl pkcs8 -topk8 -nocrypt -in <key> -out <new key>)"
            )));
        }
    };
    KeyPair::try_from(pkcs8.as_slice()).map_err(|e| key_error(format!("not a usable private key: {e}")))
}

/// A PKCS#1 RSA private key wrapped as PKCS#8 (`PrivateKeyInfo` with the rsaEncryption algorithm), the only
/// form the signing backend reads.
fn rsa_pkcs1_to_pkcs8(pkcs1: &[u8]) -> Vec<u8> {
    // version 0; AlgorithmIdentifier { rsaEncryption (1.2.840.113549.1.1.1), NULL }
    const HEAD: [u8; 18] = [
        0x02, 0x01, 0x00, 0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05,
        0x00,
    ];
    let mut body = HEAD.to_vec();
    der_header(&mut body, 0x04, pkcs1.len());
    body.extend_from_slice(pkcs1);
    let mut out = Vec::with_capacity(body.len() + 6);
    der_header(&mut out, 0x30, body.len());
    out.extend_from_slice(&body);
    out
}

/// Appends a DER tag and definite length.
fn der_header(out: &mut Vec<u8>, tag: u8, len: usize) {
    out.push(tag);
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ca(common_name: &str, is_ca: bool) -> (String, String) {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params.distinguished_name.push(DnType::CommonName, common_name);
        if is_ca {
            params.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
            params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        }
        let cert = params.self_signed(&key).unwrap();
        (cert.pem(), key.serialize_pem())
    }

    fn parse(pem: &str) -> Pem {
        first_block(pem, |l| l == "CERTIFICATE").unwrap().unwrap()
    }

    #[test]
    fn minted_certificates_name_the_node_and_chain_to_the_ca() {
        let (cert, key) = ca("cluster-ca", true);
        let node_ca = NodeCa::from_pem(&cert, &key).unwrap();
        let minted = node_ca.issue("hollow-7").unwrap();
        let block = parse(&minted.cert_pem);
        let x509 = block.parse_x509().unwrap();
        let cns: Vec<_> = x509
            .subject()
            .iter_common_name()
            .map(|a| a.as_str().unwrap())
            .collect();
        let orgs: Vec<_> = x509
            .subject()
            .iter_organization()
            .map(|a| a.as_str().unwrap())
            .collect();
        println!("minted subject: {}", x509.subject());
        assert_eq!(cns, ["system:node:hollow-7"]);
        assert_eq!(orgs, ["system:nodes"]);
        assert!(!x509.is_ca());
        let eku = x509.extended_key_usage().unwrap().unwrap().value;
        assert!(eku.client_auth && !eku.server_auth);
        assert_eq!(x509.issuer().to_string(), "CN=cluster-ca");
        let ca_block = parse(&cert);
        let ca_x509 = ca_block.parse_x509().unwrap();
        x509.verify_signature(Some(ca_x509.public_key()))
            .expect("signed by the CA");
        let validity = x509.validity();
        assert!(validity.is_valid(), "valid now");
        let days = (validity.not_after.timestamp() - validity.not_before.timestamp()) / 86_400;
        assert_eq!(days, 365, "a year (and the skew allowance)");
        // the key is the certificate's
        let node_key = KeyPair::from_pem(&minted.key_pem).unwrap();
        assert_eq!(
            x509.public_key().subject_public_key.data.as_ref(),
            node_key.public_key_raw()
        );
        assert!(
            !format!("{minted:?}").contains("PRIVATE KEY"),
            "Debug hides the key"
        );
        // every node gets its own key
        let other = node_ca.issue("hollow-8").unwrap();
        assert_ne!(other.key_pem, minted.key_pem);
    }

    #[test]
    fn bad_inputs_are_refused_naming_the_file() {
        let dir = std::env::temp_dir().join(format!("hollow-credentials-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let path = dir.join(name);
            std::fs::write(&path, text).unwrap();
            path
        };
        let (cert, key) = ca("cluster-ca", true);
        let (_, other_key) = ca("other-ca", true);
        let (leaf_cert, leaf_key) = ca("not-a-ca", false);
        let ca_crt = write("ca.crt", &cert);
        let ca_key = write("ca.key", &key);
        let cases = [
            (dir.join("missing.crt"), ca_key.clone(), "reading "),
            (ca_crt.clone(), dir.join("missing.key"), "reading "),
            (
                write("garbage.crt", "hello"),
                ca_key.clone(),
                "no PEM CERTIFICATE block",
            ),
            (
                ca_crt.clone(),
                write("garbage.key", &cert),
                "no PEM private key block",
            ),
            (
                write("leaf.crt", &leaf_cert),
                write("leaf.key", &leaf_key),
                "is not a CA certificate",
            ),
            (
                ca_crt.clone(),
                write("other.key", &other_key),
                "is not the private key of the CA certificate",
            ),
            (
                ca_crt.clone(),
                write(
                    "ec.key",
                    "-----BEGIN EC PRIVATE KEY-----\nMAA=\n-----END EC PRIVATE KEY-----\n",
                ),
                "EC PRIVATE KEY keys are not supported",
            ),
        ];
        for (crt, key, expected) in cases {
            let err = NodeCa::from_files(&crt, &key).unwrap_err().to_string();
            println!("{err}");
            assert!(err.contains(expected), "{err:?} lacks {expected:?}");
            let named = [&crt, &key]
                .iter()
                .any(|p| err.contains(&p.display().to_string()));
            assert!(named, "{err:?} names neither file");
        }
        NodeCa::from_files(&ca_crt, &ca_key).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_rsa_pkcs1_ca_key_is_read() {
        // kubeadm writes the cluster CA key as PKCS#1 RSA; the signing backend only reads PKCS#8
        let dir = std::env::temp_dir().join(format!("hollow-rsa-ca-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (crt, key) = (dir.join("ca.crt"), dir.join("ca.key"));
        let openssl = |args: &[&str]| {
            std::process::Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .map(|o| o.status.success())
        };
        // openssl 3 writes PKCS#8 unless told -traditional; 1.1 has no such flag and writes PKCS#1
        let made = openssl(&["genrsa", "-traditional", "-out", "ca.key", "2048"])
            .expect("openssl (installed by hack/setup.sh) makes the RSA CA");
        if !made {
            assert_eq!(openssl(&["genrsa", "-out", "ca.key", "2048"]).ok(), Some(true));
        }
        let made = openssl(&[
            "req",
            "-x509",
            "-new",
            "-key",
            "ca.key",
            "-subj",
            "/CN=rsa-ca",
            "-days",
            "2",
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-out",
            "ca.crt",
        ]);
        assert_eq!(made.ok(), Some(true), "openssl req");
        let key_text = std::fs::read_to_string(&key).unwrap();
        assert!(key_text.contains("BEGIN RSA PRIVATE KEY"), "{key_text}");
        let node_ca = NodeCa::from_files(&crt, &key).unwrap();
        let minted = node_ca.issue("rsa-node").unwrap();
        let block = parse(&minted.cert_pem);
        let x509 = block.parse_x509().unwrap();
        let ca_block = parse(&std::fs::read_to_string(&crt).unwrap());
        x509.verify_signature(Some(ca_block.parse_x509().unwrap().public_key()))
            .expect("signed by the RSA CA");
        assert!(x509.validity().not_after <= ca_block.parse_x509().unwrap().validity().not_after);
        println!("RSA CA minted {}", x509.subject());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn der_lengths() {
        let mut out = Vec::new();
        der_header(&mut out, 0x04, 5);
        der_header(&mut out, 0x04, 0x80);
        der_header(&mut out, 0x04, 1190);
        assert_eq!(out, [0x04, 5, 0x04, 0x81, 0x80, 0x04, 0x82, 0x04, 0xa6]);
    }
}
