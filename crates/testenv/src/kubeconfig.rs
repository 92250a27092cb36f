//! Kubeconfig files for the test control plane (certificate paths, not embedded data).

use std::path::Path;

/// Writes a kubeconfig for `server` authenticating with a client certificate.
pub(crate) fn write(
    path: &Path,
    server: &str,
    ca: &Path,
    cert: &Path,
    key: &Path,
    user: &str,
) -> std::io::Result<()> {
    let text = format!(
        r#"apiVersion: v1
kind: Config
clusters:
- name: local
  cluster:
    server: {server}
    certificate-authority: {ca}
contexts:
- name: local
  context:
    cluster: local
    user: "{user}"
current-context: local
users:
- name: "{user}"
  user:
    client-certificate: {cert}
    client-key: {key}
"#,
        ca = ca.display(),
        cert = cert.display(),
        key = key.display(),
    );
    std::fs::write(path, text)
}
