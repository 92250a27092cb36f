//! Per-node credentials by TLS bootstrap (`--node-credentials bootstrap`): every hollow node asks the cluster for
//! its own client certificate, as a kubelet with `--bootstrap-kubeconfig` does — a fresh P-256 key and a
//! certificate signing request for `system:node:<name>` to the `kubernetes.io/kube-apiserver-client-kubelet`
//! signer, filed with the bootstrap identity (typically a bootstrap token in `system:bootstrappers`) and approved
//! by the cluster's approver (the controller-manager's, when that group holds the standard `nodeclient`
//! binding). The fleet then needs no CA private key. Keys and certificates stay in memory; certificates are not
//! renewed (the controller-manager signs for a year by default).

use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use node_agent::certs::csr::{CsrName, CsrTemplate, Signer, new_key, request_certificate};

use crate::credentials::NodeCredential;

/// How many requests are in flight at once.
pub const CONCURRENT_REQUESTS: usize = 32;
/// How long one node's request is waited for.
pub const REQUEST_WAIT: Duration = Duration::from_secs(300);

/// Errors obtaining the certificates.
#[derive(Debug, thiserror::Error)]
#[error("TLS bootstrap of node {node}: {source}")]
pub struct BootstrapError {
    /// The node.
    pub node: String,
    /// Why.
    #[source]
    pub source: node_agent::certs::CertError,
}

/// One certificate per name in `names` (same order), requested with `bootstrap`'s identity.
pub async fn issue_all(
    bootstrap: &kube::Client,
    names: &[String],
) -> Result<Vec<NodeCredential>, BootstrapError> {
    futures::stream::iter(names)
        .map(|node| async move {
            let failed = |source| BootstrapError {
                node: node.clone(),
                source,
            };
            let key = new_key().map_err(failed)?;
            let template = CsrTemplate {
                node: node.clone(),
                signer: Signer::KubeletClient,
                dns_names: vec![],
                ips: vec![],
            };
            let pair = request_certificate(bootstrap, &template, &key, CsrName::Digest, REQUEST_WAIT)
                .await
                .map_err(failed)?;
            Ok(NodeCredential {
                node: node.clone(),
                cert_pem: pair.cert_pem,
                key_pem: pair.key_pem,
            })
        })
        .buffered(CONCURRENT_REQUESTS)
        .try_collect()
        .await
}
