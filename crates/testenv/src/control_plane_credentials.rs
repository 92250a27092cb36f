//! Credentials and clients of a control plane for tests: the admin's, node kubeconfigs and clients minted from
//! its CA, kubelet serving certificates, client certificates for any user, `kubectl`.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;

use kube::{Client, Config};

use super::{ControlPlane, config_from_file, write_pem};
use crate::kubeconfig;
use crate::pki::{Ca, CertSpec, Pem};

impl ControlPlane {
    /// The admin kubeconfig (`system:masters`).
    pub fn admin_kubeconfig(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// A kube client config for the admin.
    pub async fn admin_config(&self) -> anyhow::Result<Config> {
        config_from_file(&self.admin_kubeconfig()).await
    }

    /// A client for the admin. Build clients inside the runtime that uses them.
    pub async fn admin_client(&self) -> anyhow::Result<Client> {
        Ok(Client::try_from(self.admin_config().await?)?)
    }

    /// `kubectl --kubeconfig <admin>`.
    pub fn kubectl(&self) -> std::process::Command {
        let mut cmd = std::process::Command::new(&self.info.binaries.kubectl);
        cmd.arg("--kubeconfig").arg(self.admin_kubeconfig());
        cmd
    }

    /// The cluster CA (certificate and key from `pki/`).
    fn ca(&self) -> anyhow::Result<Ca> {
        let pki = self.dir.join("pki");
        Ok(Ca::from_pem(Pem {
            cert: std::fs::read_to_string(pki.join("ca.crt"))?,
            key: std::fs::read_to_string(pki.join("ca.key"))?,
        }))
    }

    /// Mints a client certificate for `system:node:<node>` (group `system:nodes`) and writes a kubeconfig for
    /// it; returns its path. Idempotent per node name.
    pub fn node_kubeconfig(&self, node: &str) -> anyhow::Result<PathBuf> {
        let ca = self.ca()?;
        let nodes = self.dir.join("nodes");
        std::fs::create_dir_all(&nodes)?;
        let (crt, key) = write_pem(&nodes, node, &ca.issue(&CertSpec::node(node))?)?;
        let path = nodes.join(format!("{node}.kubeconfig"));
        kubeconfig::write(
            &path,
            &self.info.server,
            &self.client_ca_file(),
            &crt,
            &key,
            &format!("system:node:{node}"),
        )?;
        Ok(path)
    }

    /// The cluster CA's certificate: what a kubelet's `authentication.x509.clientCAFile` names so that the
    /// API server's kubelet client certificate (`kube-apiserver-kubelet-client`, in `system:masters`) is
    /// accepted.
    pub fn client_ca_file(&self) -> PathBuf {
        self.dir.join("pki").join("ca.crt")
    }

    /// Mints a kubelet serving certificate for 127.0.0.1 and `localhost` signed by the cluster CA (which the
    /// API server checks kubelets against, `--kubelet-certificate-authority`), writes it under `serving/`;
    /// returns the certificate and key paths (`tlsCertFile`, `tlsPrivateKeyFile`).
    pub fn kubelet_serving_certificate(&self, name: &str) -> anyhow::Result<(PathBuf, PathBuf)> {
        let ca = self.ca()?;
        let dir = self.dir.join("serving");
        std::fs::create_dir_all(&dir)?;
        let pem = ca.issue(&CertSpec {
            common_name: format!("{name}@kubelet-serving"),
            ips: vec![IpAddr::V4(Ipv4Addr::LOCALHOST)],
            dns: vec!["localhost".into()],
            server: true,
            ..CertSpec::default()
        })?;
        write_pem(&dir, name, &pem)
    }

    /// A client certificate for `user` in `groups`, signed by the cluster CA (as any client of the API
    /// server or of a kubelet with `clientCAFile` presents); returns the certificate and key PEM.
    pub fn client_certificate(&self, user: &str, groups: &[&str]) -> anyhow::Result<Pem> {
        let ca = self.ca()?;
        ca.issue(&CertSpec::client(user, groups))
    }

    /// A client authenticated as the kubelet of `node`.
    pub async fn node_client(&self, node: &str) -> anyhow::Result<Client> {
        let path = self.node_kubeconfig(node)?;
        Ok(Client::try_from(config_from_file(&path).await?)?)
    }
}
