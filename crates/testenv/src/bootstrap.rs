//! TLS bootstrap for test nodes, set up as a cluster sets it up for its kubelets: a bootstrap token (a
//! `bootstrap.kubernetes.io/token` Secret in `kube-system`, authenticating as `system:bootstrap:<id>` in
//! `system:bootstrappers`), the bindings that let bootstrapping nodes file certificate signing requests and have
//! their node-client requests approved by the controller-manager, and nodes have their self-renewals approved;
//! and a bootstrap kubeconfig presenting that token.

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::Api;
use kube::api::PostParams;

use crate::ControlPlane;

/// A bootstrap token: `<id>.<secret>`.
#[derive(Debug, Clone)]
pub struct BootstrapToken {
    /// The token's id (6 characters of `[a-z0-9]`).
    pub id: String,
    /// The token's secret (16 characters of `[a-z0-9]`).
    pub secret: String,
}

impl BootstrapToken {
    /// The token `id.secret`.
    pub fn new(id: &str, secret: &str) -> Self {
        Self {
            id: id.to_owned(),
            secret: secret.to_owned(),
        }
    }

    /// The user the token authenticates as: what a CSR filed with it names as its requester.
    pub fn user(&self) -> String {
        format!("system:bootstrap:{}", self.id)
    }

    /// Creates the token's Secret and the bindings bootstrapping nodes get (kept when they exist already).
    pub async fn create(&self, admin: &kube::Client) -> anyhow::Result<()> {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": format!("bootstrap-token-{}", self.id), "namespace": "kube-system"},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {
                "token-id": self.id,
                "token-secret": self.secret,
                "usage-bootstrap-authentication": "true",
            },
        }))?;
        create_or_keep(&Api::namespaced(admin.clone(), "kube-system"), &secret).await?;
        let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
        for (name, role, group) in [
            (
                "testenv-bootstrappers",
                "system:node-bootstrapper",
                "system:bootstrappers",
            ),
            (
                "testenv-bootstrap-approve",
                "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
                "system:bootstrappers",
            ),
            (
                "testenv-renewal-approve",
                "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
                "system:nodes",
            ),
        ] {
            let binding: ClusterRoleBinding = serde_json::from_value(serde_json::json!({
                "metadata": {"name": name},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
                "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}],
            }))?;
            create_or_keep(&bindings, &binding).await?;
        }
        Ok(())
    }

    /// Writes a bootstrap kubeconfig for `cp` presenting the token at `path`.
    pub fn write_kubeconfig(&self, path: &Path, cp: &ControlPlane) -> anyhow::Result<()> {
        std::fs::write(
            path,
            format!(
                "apiVersion: v1\nkind: Config\nclusters:\n- name: local\n  cluster:\n    server: {}\n    \
                 certificate-authority: {}\ncontexts:\n- name: boot\n  context:\n    cluster: local\n    \
                 user: boot\ncurrent-context: boot\nusers:\n- name: boot\n  user:\n    token: {}.{}\n",
                cp.server(),
                cp.client_ca_file().display(),
                self.id,
                self.secret
            ),
        )?;
        Ok(())
    }

    /// Waits (at most 30 s) until the API server acts on the token and the bindings: the bootstrap kubeconfig at
    /// `path` authenticates, may file CSRs and may have node-client requests approved. A node started before
    /// that may meet a 401 or 403 and, as the kubelet does, exit on its refused bootstrap request.
    pub async fn wait_allowed(&self, path: &Path) -> anyhow::Result<()> {
        let kubeconfig = kube::config::Kubeconfig::read_from(path)?;
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await?;
        let client = kube::Client::try_from(config)?;
        crate::access::wait_allowed(&client, &crate::access::node_bootstrap(), Duration::from_secs(30)).await
    }
}

async fn create_or_keep<K>(api: &Api<K>, object: &K) -> anyhow::Result<()>
where
    K: kube::Resource
        + Clone
        + k8s_openapi::serde::Serialize
        + k8s_openapi::serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    match api.create(&PostParams::default(), object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}
