//! The benchmark's nodes and pods with claims, for the hollow fleet alone (KWOK has no DRA or CSI node side):
//! the profiles that give each hollow node a DRA driver or a CSI driver, the storage controllers a CSI fleet needs
//! (the e2e suite's mock CSI driver's controller, the real external-provisioner and external-attacher, each built
//! on first use), and the pods: pods with a claim from a ResourceClaimTemplate, allocated by the real scheduler's
//! DRA plugin; pods each with a PersistentVolumeClaim of a CSI StorageClass, provisioned by the external-provisioner,
//! bound straight to the nodes like the plain pods and attached by the external-attacher.

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::cluster::create_all;
use anyhow::Context;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaimTemplate};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;
use testenv::process::Proc;

/// The DRA driver of the benchmark's DRA nodes.
pub const DRA_DRIVER: &str = "gpu.density.test";
/// Devices in each DRA node's ResourceSlice.
pub const DRA_DEVICES: usize = 8;
/// The CSI driver of the benchmark's storage nodes (the mock driver's controller knows one node ID: its name).
pub const CSI_DRIVER: &str = "csi-mock.density.test";

/// The capacity of a default hollow node, so a profile's nodes differ from plain ones only by their driver.
const CAPACITY: &str = "{cpu: \"8\", memory: 32Gi, pods: \"110\", ephemeral-storage: 100Gi}";

/// A profile file giving every node a DRA driver publishing a ResourceSlice of [`DRA_DEVICES`] devices.
pub fn dra_profile() -> String {
    format!(
        "profiles:\n  - name: dra\n    weight: 1\n    capacity: {CAPACITY}\n    \
         dra: {{driver: {DRA_DRIVER}, devices: {DRA_DEVICES}}}\n"
    )
}

/// A profile file giving every node the CSI driver [`CSI_DRIVER`].
pub fn csi_profile() -> String {
    format!(
        "profiles:\n  - name: csi\n    weight: 1\n    capacity: {CAPACITY}\n    \
         csi: {{driver: {CSI_DRIVER}, nodeId: {CSI_DRIVER}, maxVolumes: 64}}\n"
    )
}

/// Creates `total` pods in `default`, each with a claim from a ResourceClaimTemplate of one device of
/// [`DRA_DRIVER`], left to the scheduler (its DRA plugin allocates the claims the resource-claim controller
/// makes), and waits until all are Running. Returns the seconds from the first create to all Running.
pub async fn run_dra_pods(client: &kube::Client, total: usize) -> anyhow::Result<f64> {
    let class: DeviceClass = serde_json::from_value(json!({
        "metadata": {"name": "density-gpu"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRA_DRIVER}\"")}}]},
    }))?;
    Api::<DeviceClass>::all(client.clone())
        .create(&PostParams::default(), &class)
        .await?;
    let template: ResourceClaimTemplate = serde_json::from_value(json!({
        "metadata": {"name": "one-gpu"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu",
            "exactly": {"deviceClassName": "density-gpu"}}]}}},
    }))?;
    Api::<ResourceClaimTemplate>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &template)
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let start = tokio::time::Instant::now();
    create_all(&pods, total, |i| {
        json!({
            "metadata": {"name": format!("density-{i}"), "labels": {"app": "density"}},
            "spec": {
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                    "resources": {"claims": [{"name": "gpu"}]}}],
                "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                "tolerations": [{"operator": "Exists"}],
            },
        })
    })
    .await?;
    eprintln!(
        "density: {total} pods with claims created after {:.1} s",
        start.elapsed().as_secs_f64()
    );
    super::cluster::wait_running(&pods, total, start).await
}

/// Creates `total` PersistentVolumeClaims of a CSI StorageClass (bound as soon as the provisioner has made their
/// volumes) and a pod using each, bound straight to the fleet's nodes (`<prefix>-0` …, round robin) like the
/// plain pods; the driver's `CSIDriver` asks for attachment, so each pod waits for its `VolumeAttachment`. Waits
/// until all are Running; returns the seconds from the first create to all Running.
pub async fn run_pvc_pods(
    client: &kube::Client,
    prefix: &str,
    nodes: usize,
    total: usize,
) -> anyhow::Result<f64> {
    Api::<CSIDriver>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": CSI_DRIVER},
                "spec": {"attachRequired": true, "podInfoOnMount": false}}))?,
        )
        .await?;
    Api::<StorageClass>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "density"}, "provisioner": CSI_DRIVER,
                "reclaimPolicy": "Delete", "volumeBindingMode": "Immediate"}))?,
        )
        .await?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let start = tokio::time::Instant::now();
    create_all(&claims, total, |i| {
        json!({
            "metadata": {"name": format!("data-{i}")},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "density",
                     "resources": {"requests": {"storage": "1Gi"}}},
        })
    })
    .await?;
    create_all(&pods, total, |i| {
        json!({
            "metadata": {"name": format!("density-{i}"), "labels": {"app": "density"}},
            "spec": {
                "nodeName": format!("{prefix}-{}", i % nodes),
                "containers": [{"name": "pause", "image": "registry.k8s.io/pause:3.10",
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": format!("data-{i}")}}],
                "tolerations": [{"operator": "Exists"}],
            },
        })
    })
    .await?;
    eprintln!(
        "density: {total} claims and pods using them created after {:.1} s",
        start.elapsed().as_secs_f64()
    );
    super::cluster::wait_running(&pods, total, start).await
}

/// Runs `hack/<script>` (which builds a binary on first use and caches it); the binary's path.
fn built(script: &str) -> anyhow::Result<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../hack")
        .join(script);
    let out = std::process::Command::new("bash")
        .arg(&path)
        .output()
        .with_context(|| format!("running {}", path.display()))?;
    anyhow::ensure!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// The storage controllers of a CSI fleet: the mock driver's controller on a socket, the external-provisioner
/// and the external-attacher beside it.
pub struct Storage {
    procs: Vec<Proc>,
    _dir: tempfile::TempDir,
}

impl Storage {
    /// Builds (first use) and starts them against the cluster of `kubeconfig`.
    pub async fn start(kubeconfig: &Path) -> anyhow::Result<Self> {
        let (mock, provisioner, attacher) = (
            built("build-csi-mock-driver.sh")?,
            built("build-external-provisioner.sh")?,
            built("build-external-attacher.sh")?,
        );
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("csi.sock");
        let mut procs = vec![Proc::start(
            "csi-mock-driver",
            &mock,
            &[
                "--name".into(),
                CSI_DRIVER.into(),
                "--csi-endpoint".into(),
                socket.display().to_string(),
            ],
            &dir.path().join("driver.log"),
        )?];
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !socket.exists() {
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "the mock CSI driver's socket did not appear within 30 s"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (name, program) in [("csi-provisioner", &provisioner), ("csi-attacher", &attacher)] {
            let args = [
                format!("--csi-address={}", socket.display()),
                format!("--kubeconfig={}", kubeconfig.display()),
                "--leader-election=false".into(),
                "--timeout=30s".into(),
                "--worker-threads=50".into(),
                "--kube-api-qps=200".into(),
                "--kube-api-burst=400".into(),
            ];
            procs.push(Proc::start(
                name,
                program,
                &args,
                &dir.path().join(format!("{name}.log")),
            )?);
        }
        Ok(Self { procs, _dir: dir })
    }

    /// Stops them.
    pub async fn stop(self) -> anyhow::Result<()> {
        for p in self.procs {
            p.stop(Duration::from_secs(10)).await?;
        }
        Ok(())
    }
}
