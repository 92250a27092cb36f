//! The Helm chart in `charts/hollow` as the tests use it: helm commands against a control plane, rendering to
//! objects, and the ports a fleet on the host network would take.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, bail};

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/hollow")
}

/// `helm` (built by `hack/build-helm.sh`), talking to `cp` when given (its admin kubeconfig).
pub fn helm(cp: Option<&testenv::ControlPlane>) -> anyhow::Result<Command> {
    let mut cmd = Command::new(testenv::assets::helm()?);
    if let Some(cp) = cp {
        cmd.arg("--kubeconfig").arg(cp.admin_kubeconfig());
    }
    Ok(cmd)
}

/// Runs `cmd`; its stdout, or an error with everything it printed.
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `helm template <release> charts/hollow <args>` as objects.
pub fn render(release: &str, args: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = run(helm(None)?
        .args(["template", release])
        .arg(chart_dir())
        .args(args))?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_json::Value = serde::Deserialize::deserialize(doc).context("rendered YAML")?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The rendered object of this kind (the first).
pub fn find<'a>(docs: &'a [serde_json::Value], kind: &str) -> anyhow::Result<&'a serde_json::Value> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .with_context(|| format!("no {kind} rendered"))
}

/// A port `p` such that `p..p + count` are all free on 127.0.0.1 now.
pub fn free_ports(count: u16) -> anyhow::Result<u16> {
    for _ in 0..50 {
        let first = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if first.checked_add(count).is_none() {
            continue;
        }
        let all_free = (first..first + count).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        if all_free {
            return Ok(first);
        }
    }
    bail!("no {count} consecutive free ports on 127.0.0.1")
}
