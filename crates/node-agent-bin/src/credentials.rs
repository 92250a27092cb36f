//! The node's credentials in the binary: the API client from `--kubeconfig` (obtained first by TLS bootstrap
//! with `--bootstrap-kubeconfig` when needed), its client certificate renewed when `rotateCertificates` is set,
//! and the kubelet API's serving certificate from the cluster when `serverTLSBootstrap` is set.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::SystemTime;

use anyhow::Context;
use node_agent::certs::CertPair;
use node_agent::certs::bootstrap::{CredentialPaths, client_store, load_or_bootstrap};
use node_agent::certs::client::{IdentitySwitch, Protocol, switchable_client};
use node_agent::certs::csr::{CsrTemplate, Signer};
use node_agent::certs::rotation::Renewal;
use node_agent::certs::serving::{self, ServingCert};
use node_agent::certs::store::CertStore;
use node_agent::config::KubeletConfig;
use tokio_util::sync::CancellationToken;

/// The node's API client, and what renews its certificate when `rotateCertificates` is set.
pub struct NodeClient {
    /// The client the agent uses.
    pub client: kube::Client,
    renew: Option<(IdentitySwitch, CertPair)>,
    cert_dir: PathBuf,
}

/// Loads (or bootstraps) the node's credentials and builds its client.
pub async fn connect(
    kubeconfig: Option<PathBuf>,
    bootstrap_kubeconfig: Option<PathBuf>,
    cert_dir: PathBuf,
    kubelet: &KubeletConfig,
    node: &str,
) -> anyhow::Result<NodeClient> {
    let kubeconfig = kubeconfig
        .context("--kubeconfig is required (the node's credentials, or where TLS bootstrap writes them)")?;
    let paths = CredentialPaths {
        kubeconfig: kubeconfig.clone(),
        bootstrap_kubeconfig,
        cert_dir: cert_dir.clone(),
    };
    let creds = load_or_bootstrap(&paths, node)
        .await
        .with_context(|| format!("node credentials ({})", kubeconfig.display()))?;
    if !kubelet.rotate_certificates {
        let client = kube::Client::try_from(creds.config).context("building the API client")?;
        return Ok(NodeClient {
            client,
            renew: None,
            cert_dir,
        });
    }
    let Some(mut cert) = creds.cert else {
        anyhow::bail!(
            "rotateCertificates: {} authenticates without a client certificate, so there is nothing to renew",
            kubeconfig.display()
        );
    };
    // a renewal stored by an earlier run outlives the certificate the kubeconfig names
    if let Ok(Some(stored)) = client_store(&cert_dir).load()
        && stored.valid_at(SystemTime::now())
        && stored.not_after > cert.not_after
    {
        cert = stored;
    }
    let (client, switch) =
        switchable_client(&creds.config, &cert, Protocol::Http1).context("building the API client")?;
    Ok(NodeClient {
        client,
        renew: Some((switch, cert)),
        cert_dir,
    })
}

impl NodeClient {
    /// The task renewing the client certificate (with `rotateCertificates`) until `token` fires, for the caller to
    /// run with its agent's tasks.
    pub fn rotation(
        &mut self,
        node: &str,
        token: CancellationToken,
    ) -> Option<impl Future<Output = ()> + Send + 'static + use<>> {
        let (switch, cert) = self.renew.take()?;
        let node = node.to_owned();
        let renewal = Renewal {
            client: self.client.clone(),
            template: Box::new(move || CsrTemplate {
                node: node.clone(),
                signer: Signer::KubeletClient,
                dns_names: vec![],
                ips: vec![],
            }),
            store: client_store(&self.cert_dir),
        };
        Some(renewal.run(
            cert,
            move |pair| match switch.install(pair) {
                Ok(()) => tracing::info!(serial = %pair.serial, "API client now authenticates with the renewed certificate"),
                Err(e) => tracing::error!(error = %e, "renewed client certificate unusable"),
            },
            token,
        ))
    }

    /// With `serverTLSBootstrap`: the serving certificate from the cluster for `hostname` and `ip`, and the task
    /// renewing it until `token` fires (for the caller to run with its agent's tasks).
    pub fn serving(
        &self,
        kubelet: &KubeletConfig,
        node: &str,
        hostname: &str,
        ip: IpAddr,
        token: CancellationToken,
    ) -> Option<(
        Arc<ServingCert>,
        impl Future<Output = ()> + Send + 'static + use<>,
    )> {
        if !kubelet.server_tls_bootstrap {
            return None;
        }
        if kubelet.tls_cert_file.is_some() {
            tracing::warn!("serverTLSBootstrap is set: tlsCertFile and tlsPrivateKeyFile are not used");
        }
        let node = node.to_owned();
        let hostname = hostname.to_owned();
        let renewal = Renewal {
            client: self.client.clone(),
            template: Box::new(move || CsrTemplate {
                node: node.clone(),
                signer: Signer::KubeletServing,
                dns_names: vec![hostname.clone()],
                ips: vec![ip],
            }),
            store: CertStore::new(&self.cert_dir, "kubelet-server"),
        };
        Some(serving::start(renewal, token))
    }
}
