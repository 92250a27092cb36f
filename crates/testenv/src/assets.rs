//! Where the control-plane binaries come from.
//!
//! Order: a directory named by `KUBEBUILDER_ASSETS` holding `kube-apiserver`, `kube-scheduler`,
//! `kube-controller-manager` and `kubectl` (and optionally `etcd`); otherwise the build cache
//! `${NODE_AGENT_CACHE:-$HOME/.cache/node-agent}/kubernetes/<version>/bin`, filled on demand by
//! `hack/build-kubernetes.sh` (idempotent). etcd defaults to the binary shipped by `etcd-bin-vendored`.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// The pinned Kubernetes release, read from the repository's `KUBERNETES_VERSION` file.
pub fn kubernetes_version() -> &'static str {
    include_str!("../../../KUBERNETES_VERSION").trim()
}

/// Paths of every binary the control plane needs.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Binaries {
    /// etcd.
    pub etcd: PathBuf,
    /// kube-apiserver.
    pub kube_apiserver: PathBuf,
    /// kube-scheduler.
    pub kube_scheduler: PathBuf,
    /// kube-controller-manager.
    pub kube_controller_manager: PathBuf,
    /// kubectl.
    pub kubectl: PathBuf,
}

const KUBE_BINARIES: [&str; 4] = [
    "kube-apiserver",
    "kube-scheduler",
    "kube-controller-manager",
    "kubectl",
];

impl Binaries {
    fn in_dir(dir: &Path, etcd: PathBuf) -> Self {
        Self {
            etcd,
            kube_apiserver: dir.join("kube-apiserver"),
            kube_scheduler: dir.join("kube-scheduler"),
            kube_controller_manager: dir.join("kube-controller-manager"),
            kubectl: dir.join("kubectl"),
        }
    }
}

fn vendored_etcd() -> anyhow::Result<PathBuf> {
    etcd_bin_vendored::etcd_bin_path()
        .map(Path::to_path_buf)
        .map_err(|e| anyhow::anyhow!("no vendored etcd: {e}"))
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The version-keyed cache directory the build script fills.
pub fn cache_bin_dir() -> PathBuf {
    let cache = std::env::var_os("NODE_AGENT_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let home = std::env::var_os("HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("/tmp"));
            home.join(".cache/node-agent")
        });
    cache.join("kubernetes").join(kubernetes_version()).join("bin")
}

fn all_present(dir: &Path) -> bool {
    KUBE_BINARIES.iter().all(|b| dir.join(b).is_file())
}

/// Finds the binaries, building Kubernetes into the cache first if it is not there yet (about 5 minutes cold).
pub fn locate() -> anyhow::Result<Binaries> {
    if let Some(dir) = std::env::var_os("KUBEBUILDER_ASSETS").map(PathBuf::from) {
        if !all_present(&dir) {
            bail!(
                "KUBEBUILDER_ASSETS={} lacks one of {:?}",
                dir.display(),
                KUBE_BINARIES
            );
        }
        let etcd = dir.join("etcd");
        let etcd = if etcd.is_file() { etcd } else { vendored_etcd()? };
        return Ok(Binaries::in_dir(&dir, etcd));
    }
    let dir = cache_bin_dir();
    if !all_present(&dir) {
        let script = repo_root().join("hack/build-kubernetes.sh");
        tracing::info!(script = %script.display(), "building Kubernetes binaries into the cache");
        let status = Command::new("bash")
            .arg(&script)
            .status()
            .with_context(|| format!("running {}", script.display()))?;
        if !status.success() || !all_present(&dir) {
            bail!(
                "{} failed ({status}); binaries missing in {}",
                script.display(),
                dir.display()
            );
        }
    }
    Ok(Binaries::in_dir(&dir, vendored_etcd()?))
}

/// The pinned `kubeadm`, from the same `k8s.io/kubernetes` build as the control plane (`hack/build-kubernetes.sh`,
/// which builds it when the cache lacks it).
pub fn kubeadm() -> anyhow::Result<PathBuf> {
    let script = repo_root().join("hack/build-kubernetes.sh");
    let out = Command::new("bash")
        .arg(&script)
        .arg("kubeadm")
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} kubeadm failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("kubeadm"))
}

/// The pinned `helm` binary, built into the cache by `hack/build-helm.sh` when missing.
pub fn helm() -> anyhow::Result<PathBuf> {
    let script = repo_root().join("hack/build-helm.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}

/// The pinned Rancher local-path-provisioner, built into the cache by `hack/build-local-path-provisioner.sh`
/// when missing.
pub fn local_path_provisioner() -> anyhow::Result<PathBuf> {
    let script = repo_root().join("hack/build-local-path-provisioner.sh");
    let out = Command::new("bash")
        .arg(&script)
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!(
            "{} failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
}
