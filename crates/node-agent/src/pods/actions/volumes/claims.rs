//! A pod's `persistentVolumeClaim` volumes resolved to what their bound PersistentVolume names, as the kubelet's
//! volume manager resolves them before it mounts anything: the claim must exist, not be on its way out (unless
//! `kubernetes.io/pvc-protection` still holds it), be `Bound` and name its volume; the volume must exist and
//! its `claimRef` point back at the claim's UID. Until then the volume is not set up and the pod waits in
//! `ContainerCreating`; the failure is the kubelet's message (`error processing PVC <ns>/<name>: ...`).
//!
//! This module owns [`PersistentSource`], the kinds of PersistentVolume this node mounts: `hostPath` and
//! `local` (mounted from the node's own paths) and `csi` (published by its driver, see
//! [`csi`](super::csi)). A PersistentVolume of any other kind is refused with a message naming the kind.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};

use crate::pods::actions::objects::PodObjects;
use crate::pods::model::spec::volumes::HostPathType;

/// The finalizer that keeps a claim in use from being deleted.
const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";

/// What a PersistentVolume mounts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PersistentSource {
    /// `hostPath`: a path on the node, checked as a pod's own hostPath volume is.
    HostPath {
        /// The path.
        path: String,
        /// The type check.
        kind: HostPathType,
    },
    /// `local`: a directory on the node (a local persistent volume; the scheduler placed the pod by the
    /// volume's node affinity).
    Local {
        /// The path.
        path: String,
    },
    /// `csi`: published by a registered CSI driver into the pod's volume directory.
    Csi(super::csi::CsiSource),
}

/// The kinds a PersistentVolume may have, by their field names, for the message refusing one not mounted here.
fn pv_kind(pv: &PersistentVolume) -> &'static str {
    let Some(s) = pv.spec.as_ref() else {
        return "unknown";
    };
    let kinds: [(&'static str, bool); 20] = [
        ("csi", s.csi.is_some()),
        ("nfs", s.nfs.is_some()),
        ("iscsi", s.iscsi.is_some()),
        ("fc", s.fc.is_some()),
        ("rbd", s.rbd.is_some()),
        ("cephfs", s.cephfs.is_some()),
        ("glusterfs", s.glusterfs.is_some()),
        ("flexVolume", s.flex_volume.is_some()),
        ("awsElasticBlockStore", s.aws_elastic_block_store.is_some()),
        ("azureDisk", s.azure_disk.is_some()),
        ("azureFile", s.azure_file.is_some()),
        ("cinder", s.cinder.is_some()),
        ("gcePersistentDisk", s.gce_persistent_disk.is_some()),
        ("vsphereVolume", s.vsphere_volume.is_some()),
        ("portworxVolume", s.portworx_volume.is_some()),
        ("scaleIO", s.scale_io.is_some()),
        ("storageos", s.storageos.is_some()),
        ("quobyte", s.quobyte.is_some()),
        ("photonPersistentDisk", s.photon_persistent_disk.is_some()),
        ("flocker", s.flocker.is_some()),
    ];
    kinds
        .iter()
        .find(|(_, present)| *present)
        .map_or("unknown", |(name, _)| *name)
}

impl PersistentSource {
    /// What `pv` mounts, or why this node cannot mount it.
    pub fn from_pv(pv: &PersistentVolume) -> Result<Self, String> {
        let spec = pv.spec.as_ref();
        if let Some(h) = spec.and_then(|s| s.host_path.as_ref()) {
            return Ok(Self::HostPath {
                path: h.path.clone(),
                kind: HostPathType::parse(h.type_.as_deref()),
            });
        }
        if let Some(l) = spec.and_then(|s| s.local.as_ref()) {
            return Ok(Self::Local { path: l.path.clone() });
        }
        if let Some(csi) = super::csi::CsiSource::from_pv(pv) {
            return csi.map(Self::Csi);
        }
        Err(format!(
            "PersistentVolume {} is of kind {}, which node-agent does not mount (only hostPath, local and csi)",
            pv.metadata.name.as_deref().unwrap_or_default(),
            pv_kind(pv)
        ))
    }

    /// The node path the pod's containers mount (the volume's root); `None` for a CSI volume, published into
    /// the pod's own directory.
    pub fn path(&self) -> Option<&str> {
        match self {
            Self::HostPath { path, .. } | Self::Local { path } => Some(path),
            Self::Csi(_) => None,
        }
    }
}

/// A claim resolved to its bound PersistentVolume.
#[derive(Debug, Clone, PartialEq)]
pub struct BoundClaim {
    /// The PersistentVolume's name.
    pub volume: String,
    /// The claim's UID.
    pub claim_uid: String,
    /// Every mount of it is read-only (the pod's `persistentVolumeClaim.readOnly`).
    pub read_only: bool,
    /// `volumeMode: Block`.
    pub block: bool,
    /// What it mounts.
    pub source: PersistentSource,
    /// The PersistentVolume as read (for sources that need more of it than [`PersistentSource`] keeps).
    pub pv: PersistentVolume,
}

/// Why a claim could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimError {
    /// Not (yet) usable: the claim or its volume is missing, unbound or on its way out. Retried.
    Waiting(String),
    /// Bound to a volume this node cannot mount.
    Refused(String),
}

/// Checks `claim` as the kubelet does before it uses it: the name of its bound volume.
pub fn bound_volume(claim: &PersistentVolumeClaim) -> Result<&str, &'static str> {
    let meta = &claim.metadata;
    let protected = meta.finalizers.iter().flatten().any(|f| f == PVC_PROTECTION);
    if meta.deletion_timestamp.is_some() && !protected {
        return Err("PVC is being deleted");
    }
    let phase = claim.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some("Bound") {
        return Err("PVC is not bound");
    }
    match claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()) {
        Some(name) if !name.is_empty() => Ok(name),
        _ => Err("PVC has empty pvc.Spec.VolumeName"),
    }
}

/// Checks that `pv` is bound to the claim with `claim_uid`.
pub fn check_claim_ref(pv: &PersistentVolume, claim_uid: &str) -> Result<(), String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
        return Err(format!(
            "found PV object {name} but it has a nil pv.Spec.ClaimRef indicating it is not yet bound to the claim"
        ));
    };
    let uid = claim_ref.uid.as_deref().unwrap_or_default();
    if uid != claim_uid {
        return Err(format!(
            "found PV object {name} but its pv.Spec.ClaimRef.UID {uid} does not point to claim.UID {claim_uid}"
        ));
    }
    Ok(())
}

/// Resolves claim `name` of `namespace` (mounted read-only when `read_only`) to its bound PersistentVolume.
pub async fn resolve(
    objects: &dyn PodObjects,
    namespace: &str,
    name: &str,
    read_only: bool,
) -> Result<BoundClaim, ClaimError> {
    let processing = |why: &str| format!("error processing PVC {namespace}/{name}: {why}");
    let claim = match objects.claim(namespace, name).await {
        Ok(Some(claim)) => claim,
        Ok(None) => {
            let why =
                format!("failed to fetch PVC from API server: persistentvolumeclaims \"{name}\" not found");
            return Err(ClaimError::Waiting(processing(&why)));
        }
        Err(e) => {
            let why = format!("failed to fetch PVC from API server: {}", e.0);
            return Err(ClaimError::Waiting(processing(&why)));
        }
    };
    let volume = bound_volume(&claim).map_err(|why| ClaimError::Waiting(processing(why)))?;
    let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
    let pv = match objects.persistent_volume(volume).await {
        Ok(Some(pv)) => pv,
        Ok(None) => {
            let why = format!(
                "failed to fetch PV {volume} from API server: persistentvolumes \"{volume}\" not found"
            );
            return Err(ClaimError::Waiting(processing(&why)));
        }
        Err(e) => {
            let why = format!("failed to fetch PV {volume} from API server: {}", e.0);
            return Err(ClaimError::Waiting(processing(&why)));
        }
    };
    check_claim_ref(&pv, &claim_uid).map_err(|why| ClaimError::Waiting(processing(&why)))?;
    let source = PersistentSource::from_pv(&pv).map_err(ClaimError::Refused)?;
    let spec = pv.spec.as_ref();
    Ok(BoundClaim {
        volume: volume.to_owned(),
        claim_uid,
        read_only,
        block: spec.and_then(|s| s.volume_mode.as_deref()) == Some("Block"),
        source,
        pv,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn claim(value: serde_json::Value) -> PersistentVolumeClaim {
        serde_json::from_value(value).unwrap()
    }

    fn pv(value: serde_json::Value) -> PersistentVolume {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn only_a_bound_claim_names_its_volume() {
        let bound = json!({"metadata": {"name": "c", "uid": "u1"}, "spec": {"volumeName": "pv1"},
            "status": {"phase": "Bound"}});
        assert_eq!(bound_volume(&claim(bound.clone())), Ok("pv1"));
        let pending = json!({"metadata": {"name": "c"}, "spec": {}, "status": {"phase": "Pending"}});
        assert_eq!(bound_volume(&claim(pending)), Err("PVC is not bound"));
        let unnamed = json!({"metadata": {"name": "c"}, "spec": {}, "status": {"phase": "Bound"}});
        assert_eq!(
            bound_volume(&claim(unnamed)),
            Err("PVC has empty pvc.Spec.VolumeName")
        );
        // being deleted: usable only while the protection finalizer holds it
        let mut deleting = bound;
        deleting["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        assert_eq!(
            bound_volume(&claim(deleting.clone())),
            Err("PVC is being deleted")
        );
        deleting["metadata"]["finalizers"] = json!([PVC_PROTECTION]);
        assert_eq!(bound_volume(&claim(deleting)), Ok("pv1"));
    }

    #[test]
    fn a_volume_must_point_back_at_the_claim() {
        let unbound = pv(json!({"metadata": {"name": "pv1"}, "spec": {"hostPath": {"path": "/d"}}}));
        assert!(
            check_claim_ref(&unbound, "u1")
                .unwrap_err()
                .contains("nil pv.Spec.ClaimRef")
        );
        let other = pv(json!({"metadata": {"name": "pv1"},
            "spec": {"hostPath": {"path": "/d"}, "claimRef": {"name": "c", "uid": "u2"}}}));
        assert_eq!(
            check_claim_ref(&other, "u1").unwrap_err(),
            "found PV object pv1 but its pv.Spec.ClaimRef.UID u2 does not point to claim.UID u1"
        );
        let ours = pv(json!({"metadata": {"name": "pv1"},
            "spec": {"hostPath": {"path": "/d"}, "claimRef": {"name": "c", "uid": "u1"}}}));
        assert_eq!(check_claim_ref(&ours, "u1"), Ok(()));
    }

    #[test]
    fn host_path_and_local_volumes_are_mounted_others_refused_by_kind() {
        let host = pv(json!({"metadata": {"name": "a"},
            "spec": {"hostPath": {"path": "/srv/a", "type": "DirectoryOrCreate"}}}));
        assert_eq!(
            PersistentSource::from_pv(&host),
            Ok(PersistentSource::HostPath {
                path: "/srv/a".into(),
                kind: HostPathType::DirectoryOrCreate
            })
        );
        let local = pv(json!({"metadata": {"name": "b"}, "spec": {"local": {"path": "/mnt/disk"}}}));
        assert_eq!(
            PersistentSource::from_pv(&local).map(|s| s.path().map(str::to_owned)),
            Ok(Some("/mnt/disk".to_owned()))
        );
        let nfs = pv(json!({"metadata": {"name": "n"}, "spec": {"nfs": {"server": "s", "path": "/"}}}));
        assert_eq!(
            PersistentSource::from_pv(&nfs).unwrap_err(),
            "PersistentVolume n is of kind nfs, which node-agent does not mount (only hostPath, local and csi)"
        );
    }

    #[test]
    fn csi_volumes_name_their_driver_and_secrets() {
        let csi = pv(json!({"metadata": {"name": "c"}, "spec": {
            "accessModes": ["ReadWriteOnce"], "mountOptions": ["noatime"],
            "csi": {"driver": "csi.example.com", "volumeHandle": "vol-1", "fsType": "ext4",
                    "volumeAttributes": {"tier": "fast"}}}}));
        let Ok(PersistentSource::Csi(source)) = PersistentSource::from_pv(&csi) else {
            panic!("a csi source");
        };
        assert_eq!(
            (source.driver.as_str(), source.volume_handle.as_str()),
            ("csi.example.com", "vol-1")
        );
        assert_eq!(
            (source.fs_type.as_str(), source.mount_flags.clone()),
            ("ext4", vec!["noatime".to_owned()])
        );
        assert_eq!(source.attributes.get("tier").map(String::as_str), Some("fast"));
        assert_eq!(
            PersistentSource::Csi(source).path(),
            None,
            "published into the pod's own directory"
        );
        let secret = pv(json!({"metadata": {"name": "s"}, "spec": {
            "csi": {"driver": "d", "volumeHandle": "h",
                    "nodeStageSecretRef": {"name": "stage", "namespace": "ns-1"},
                    "nodePublishSecretRef": {"name": "x", "namespace": "y"}}}}));
        let Ok(PersistentSource::Csi(source)) = PersistentSource::from_pv(&secret) else {
            panic!("a csi source");
        };
        assert_eq!(source.stage_secret, Some(("ns-1".into(), "stage".into())));
        assert_eq!(source.publish_secret, Some(("y".into(), "x".into())));
    }
}
