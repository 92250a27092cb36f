//! One certificate from the cluster: a fresh P-256 key, a CertificateSigningRequest naming a signer, and the
//! wait until a certificate is issued, or the request is denied or fails.

use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use kube::api::{Api, ObjectMeta, PostParams};

use rcgen::PublicKeyData;

use super::{CertError, CertPair, NODES_GROUP, node_user};

/// Which certificate is asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signer {
    /// The node's client certificate (`kubernetes.io/kube-apiserver-client-kubelet`).
    KubeletClient,
    /// The kubelet API's serving certificate (`kubernetes.io/kubelet-serving`).
    KubeletServing,
}

impl Signer {
    /// The signer's name in the API.
    pub fn name(self) -> &'static str {
        match self {
            Self::KubeletClient => "kubernetes.io/kube-apiserver-client-kubelet",
            Self::KubeletServing => "kubernetes.io/kubelet-serving",
        }
    }

    /// The key usages asked for with an ECDSA key, as the kubelet asks.
    pub fn usages(self) -> [&'static str; 2] {
        match self {
            Self::KubeletClient => ["digital signature", "client auth"],
            Self::KubeletServing => ["digital signature", "server auth"],
        }
    }
}

/// What a request asks for: the node's identity (`system:node:<node>` in `system:nodes`), and for a serving
/// certificate the names and addresses it serves on.
#[derive(Debug, Clone)]
pub struct CsrTemplate {
    /// The node.
    pub node: String,
    /// The signer.
    pub signer: Signer,
    /// DNS names (serving certificates).
    pub dns_names: Vec<String>,
    /// IP addresses (serving certificates).
    pub ips: Vec<IpAddr>,
}

/// How a request is named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CsrName {
    /// A name derived from the key, the subject and the usages (`node-csr-…`), so that an agent restarted with
    /// the same key finds its earlier request instead of filing another — what TLS bootstrap uses.
    Digest,
    /// A server-generated name (`csr-…`) — what renewals use.
    Generated,
}

/// A fresh P-256 key pair.
pub fn new_key() -> Result<rcgen::KeyPair, CertError> {
    rcgen::KeyPair::generate().map_err(|e| CertError::invalid("a new private key", e))
}

/// The PEM certificate signing request for `template` signed with `key`.
pub fn request_pem(template: &CsrTemplate, key: &rcgen::KeyPair) -> Result<String, CertError> {
    let bad = |e: rcgen::Error| CertError::invalid("the certificate signing request", e);
    let mut params = rcgen::CertificateParams::new(template.dns_names.clone()).map_err(bad)?;
    params.distinguished_name = rcgen::DistinguishedName::new();
    params
        .distinguished_name
        .push(rcgen::DnType::OrganizationName, NODES_GROUP);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, node_user(&template.node));
    for ip in &template.ips {
        params.subject_alt_names.push(rcgen::SanType::IpAddress(*ip));
    }
    params.serialize_request(key).map_err(bad)?.pem().map_err(bad)
}

/// The digest name of a request: `node-csr-` and the unpadded URL-safe base64 of a SHA-512/256 over the
/// public key, the common name, the organization and the usages, each encoded and followed by `|`.
pub fn digest_name(template: &CsrTemplate, key: &rcgen::KeyPair) -> String {
    use base64::Engine;
    let encode = |data: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data);
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA512_256);
    let mut write = |data: &[u8]| {
        ctx.update(encode(data).as_bytes());
        ctx.update(b"|");
    };
    write(&key.subject_public_key_info());
    write(node_user(&template.node).as_bytes());
    write(NODES_GROUP.as_bytes());
    for usage in template.signer.usages() {
        write(usage.as_bytes());
    }
    format!("node-csr-{}", encode(ctx.finish().as_ref()))
}

/// Files a request for `template` with `key` and waits up to `wait` for the certificate. A request of the same
/// digest name already filed (an earlier run with the same key) is waited for instead of filed again.
pub async fn request_certificate(
    client: &kube::Client,
    template: &CsrTemplate,
    key: &rcgen::KeyPair,
    naming: CsrName,
    wait: Duration,
) -> Result<CertPair, CertError> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let pem = request_pem(template, key)?;
    let metadata = match naming {
        CsrName::Digest => ObjectMeta {
            name: Some(digest_name(template, key)),
            ..Default::default()
        },
        CsrName::Generated => ObjectMeta {
            generate_name: Some("csr-".into()),
            ..Default::default()
        },
    };
    let csr = CertificateSigningRequest {
        metadata,
        spec: CertificateSigningRequestSpec {
            request: ByteString(pem.into_bytes()),
            signer_name: template.signer.name().into(),
            usages: Some(template.signer.usages().iter().map(|u| (*u).to_owned()).collect()),
            ..Default::default()
        },
        status: None,
    };
    let name = match api.create(&PostParams::default(), &csr).await {
        Ok(created) => created.metadata.name.unwrap_or_default(),
        Err(kube::Error::Api(status)) if status.code == 409 && naming == CsrName::Digest => {
            let name = csr.metadata.name.clone().unwrap_or_default();
            tracing::info!(csr = %name, "certificate signing request already filed; waiting for it");
            name
        }
        Err(source) => {
            return Err(CertError::Api {
                action: format!(
                    "filing a certificate signing request for {}",
                    template.signer.name()
                ),
                source,
            });
        }
    };
    tracing::info!(csr = %name, signer = template.signer.name(), "certificate signing request filed");
    let settled = |csr: Option<&CertificateSigningRequest>| csr.is_some_and(|c| outcome(c).is_some());
    let done = tokio::time::timeout(wait, kube::runtime::wait::await_condition(api, &name, settled)).await;
    let csr = match done {
        Err(_) => return Err(CertError::Timeout { name, waited: wait }),
        Ok(Err(e)) => {
            return Err(CertError::invalid(
                format!("watching certificate signing request {name}"),
                e,
            ));
        }
        Ok(Ok(None)) => {
            return Err(CertError::invalid(
                format!("certificate signing request {name}"),
                "deleted before a certificate was issued",
            ));
        }
        Ok(Ok(Some(csr))) => csr,
    };
    match outcome(&csr) {
        Some(Outcome::Issued(cert)) => {
            let cert = String::from_utf8(cert)
                .map_err(|_| CertError::invalid(format!("the certificate of {name}"), "not PEM text"))?;
            CertPair::parse(&cert, &key.serialize_pem(), &format!("the certificate of {name}"))
        }
        Some(Outcome::Refused {
            outcome,
            reason,
            message,
        }) => Err(CertError::Refused {
            name,
            outcome,
            reason,
            message,
        }),
        None => Err(CertError::invalid(name, "settled without an outcome")),
    }
}

enum Outcome {
    Issued(Vec<u8>),
    Refused {
        outcome: &'static str,
        reason: String,
        message: String,
    },
}

fn outcome(csr: &CertificateSigningRequest) -> Option<Outcome> {
    let status = csr.status.as_ref()?;
    for condition in status.conditions.iter().flatten() {
        let outcome = match condition.type_.as_str() {
            "Denied" => "denied",
            "Failed" => "failed",
            _ => continue,
        };
        if condition.status == "True" {
            return Some(Outcome::Refused {
                outcome,
                reason: condition.reason.clone().unwrap_or_default(),
                message: condition.message.clone().unwrap_or_default(),
            });
        }
    }
    match &status.certificate {
        Some(cert) if !cert.0.is_empty() => Some(Outcome::Issued(cert.0.clone())),
        _ => None,
    }
}
