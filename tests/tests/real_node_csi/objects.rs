//! The API objects a CSI volume test makes: the CSIDriver, a PersistentVolume of the mock driver's and its claim;
//! and the wait for the pod using them.

use std::time::Duration;

use e2e::wait_for;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::CSIDriver;
use kube::api::PostParams;
use kube::{Api, Client};

/// Creates the CSIDriver object `name` with `spec`, unless an earlier run left it.
pub async fn ensure_csi_driver(admin: &Client, name: &str, spec: serde_json::Value) -> anyhow::Result<()> {
    let api: Api<CSIDriver> = Api::all(admin.clone());
    let object: CSIDriver =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}, "spec": spec}))?;
    if api.get_opt(name).await?.is_none() {
        api.create(&PostParams::default(), &object).await?;
    }
    Ok(())
}

/// Creates the PersistentVolume `pv_name` of 1 GiB, `ReadWriteOnce`, retained, of no storage class, on the CSI
/// volume `csi` (its `spec.csi`), unless an earlier run left it.
pub async fn ensure_pv(admin: &Client, pv_name: &str, csi: serde_json::Value) -> anyhow::Result<()> {
    let api: Api<PersistentVolume> = Api::all(admin.clone());
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": pv_name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "csi": csi,
        },
    }))?;
    if api.get_opt(pv_name).await?.is_none() {
        api.create(&PostParams::default(), &pv).await?;
    }
    Ok(())
}

/// Creates the claim `data` in `ns`, bound to the PersistentVolume `pv_name` by name.
pub async fn create_claim(admin: &Client, ns: &str, pv_name: &str) -> anyhow::Result<()> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "", "volumeName": pv_name,
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))?;
    claims.create(&PostParams::default(), &claim).await?;
    Ok(())
}

/// Waits up to `timeout` for the pod `name` to be Running.
pub async fn running(pods: &Api<Pod>, name: &str, timeout: Duration) -> anyhow::Result<()> {
    wait_for(&format!("the pod {name} Running"), timeout, || async {
        let p = pods.get(name).await?;
        Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).then_some(()))
    })
    .await
}
