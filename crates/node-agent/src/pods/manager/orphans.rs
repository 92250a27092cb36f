//! Housekeeping of what pods the agent neither knows nor runs left behind — pods deleted while the agent was
//! down (a forced delete, or the pod garbage collector), or whose worker could not finish its clean-up: their
//! sandboxes and containers in the runtime and, on a real node, their directory `<root-dir>/pods/<uid>`
//! (volumes, termination-message files, `etc-hosts`) and their pod cgroup. As the kubelet's housekeeping
//! (`HandlePodCleanups`: runtime pods without a pod, `cleanupOrphanedPodDirs`, `cleanupOrphanedPodCgroups`),
//! per pod and in that order: the runtime's objects are stopped and removed, then the directory (its tmpfs
//! volumes unmounted first, nothing removed while anything else is mounted in it), then — only once the
//! directory is gone, so memory-backed volumes no longer charge it — the cgroup. Resource claims prepared for
//! such a pod are released once its runtime objects are gone.
//!
//! Devices a device plugin gave such a pod are freed as soon as the pod is known to be gone ([`free_devices`]),
//! before its containers are stopped, as the kubelet frees them: the pods admitted after the list may take them.
//!
//! The pod manager runs a sweep after every full list of the API's pods (once every static source has been
//! read) and, on a real node, every [`PERIOD`] (a hollow node has neither directories nor cgroups, and sweeps
//! only after a list).

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use runtime_api::cri;
use tokio_util::task::TaskTracker;

use crate::pods::actions::kill;
use crate::pods::actions::volumes;
use crate::pods::runtime::labels;
use crate::pods::runtime::observed::{Reread, RuntimeView};
use crate::pods::worker::AgentCtx;

/// How often a real node sweeps (the kubelet's housekeeping runs every 2 s; a node-agent pod worker cleans up
/// after its own pod, so the sweep only catches what was left while the agent was down or could not be
/// removed then).
pub(crate) const PERIOD: Duration = Duration::from_secs(10);

/// The pods being removed now (a sweep does not start a second removal of one).
#[derive(Debug, Default)]
pub(crate) struct Orphans {
    in_flight: Arc<Mutex<HashSet<String>>>,
}

/// What the node holds of one orphaned pod.
#[derive(Debug, Default, Clone, Copy)]
struct Held {
    runtime: bool,
    dir: bool,
    cgroup: bool,
    /// Resource claims prepared for it (released once its containers are gone, as the kubelet's DRA
    /// reconcile loop releases those of pods no longer active).
    claims: bool,
}

impl Orphans {
    /// Whether this node has anything but runtime objects to sweep: a real node's pod directories and cgroups.
    pub(crate) fn periodic(ctx: &AgentCtx) -> bool {
        ctx.config.kind == crate::pods::NodeKind::Real
    }

    /// Finds what the runtime, the pods directory and the pod cgroups hold of pods not in `keep`, and removes
    /// it in the background (one task per pod). The finding is done before returning, so a pod the manager
    /// starts afterwards is never taken for an orphan.
    pub(crate) async fn sweep(&self, ctx: &Arc<AgentCtx>, keep: &HashSet<String>, tracker: &TaskTracker) {
        let mut found: std::collections::HashMap<String, Held> = std::collections::HashMap::new();
        match ctx
            .rt(
                "list_podsandbox",
                ctx.runtime
                    .list_pod_sandbox(cri::ListPodSandboxRequest::default()),
            )
            .await
        {
            Ok(r) => {
                for s in r.items {
                    if let Some(uid) = s.labels.get(labels::POD_UID) {
                        found.entry(uid.clone()).or_default().runtime = true;
                    }
                }
            }
            Err(error) => {
                // without the runtime's list, a directory may belong to a pod still running: sweep nothing
                tracing::warn!(%error, "cannot list sandboxes for orphan cleanup");
                return;
            }
        }
        if Self::periodic(ctx) {
            let (pods_dir, cgroups) = (
                ctx.config.layout.pods_dir.clone(),
                ctx.config.layout.cgroups.clone(),
            );
            let listed = tokio::task::spawn_blocking(move || {
                let dirs = pods_dir.as_deref().map(pod_dirs).unwrap_or_default();
                let cgroups = cgroups.map(|c| c.pod_uids()).unwrap_or_default();
                (dirs, cgroups)
            })
            .await;
            if let Ok((dirs, cgroups)) = listed {
                for uid in dirs {
                    found.entry(uid).or_default().dir = true;
                }
                for uid in cgroups {
                    found.entry(uid).or_default().cgroup = true;
                }
            }
        }
        if let Some(dra) = &ctx.config.dra {
            for uid in dra.claims().into_iter().flat_map(|c| c.pods) {
                found.entry(uid).or_default().claims = true;
            }
        }
        let Ok(mut in_flight) = self.in_flight.lock() else {
            return;
        };
        for (uid, held) in found {
            if keep.contains(&uid) || !in_flight.insert(uid.clone()) {
                continue;
            }
            let (ctx, in_flight) = (ctx.clone(), self.in_flight.clone());
            tracker.spawn(async move {
                remove(&ctx, &uid, held).await;
                if let Ok(mut set) = in_flight.lock() {
                    set.remove(&uid);
                }
            });
        }
    }
}

/// Frees the devices held by pods not in `keep` (their assignments restored from the checkpoint of an agent
/// that was down when they were deleted).
pub(crate) fn free_devices(ctx: &AgentCtx, keep: &HashSet<String>) {
    if let Some(devices) = &ctx.config.devices
        && devices.retain_pods(|uid| keep.contains(uid))
    {
        tracing::info!("freed the devices of pods that no longer exist");
    }
}

/// The pod directories under `pods_dir` (their names are pod UIDs).
fn pod_dirs(pods_dir: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(pods_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|name| !name.starts_with('.'))
        .collect()
}

/// Removes what the node holds of orphaned pod `uid`, each step only once the one before succeeded.
async fn remove(ctx: &AgentCtx, uid: &str, held: Held) {
    if held.runtime {
        if let Err(error) = remove_from_runtime(ctx, uid).await {
            tracing::warn!(%uid, %error, "orphan cleanup failed: runtime objects not removed");
            return;
        }
        tracing::info!(%uid, "removed the runtime objects of a pod that no longer exists");
    }
    if held.claims
        && let Some(dra) = &ctx.config.dra
    {
        if let Err(error) = dra.unprepare(uid).await {
            tracing::warn!(%uid, %error, "orphan cleanup failed: resource claims not released");
            return;
        }
        tracing::info!(%uid, "released the resource claims of a pod that no longer exists");
    }
    // a pod that just lost its sandbox has its directory and cgroup still, even if the listing missed them
    let pods_dir = ctx.config.layout.pods_dir.clone();
    if let Some(pods_dir) = pods_dir.filter(|_| held.runtime || held.dir) {
        let dir: PathBuf = volumes::pod_dir(&pods_dir, uid);
        let existed = dir.exists();
        // the CSI volumes of a pod deleted while the agent was down are unpublished (and unstaged) first
        if let Some(drivers) = &ctx.config.csi_drivers
            && let Err(error) = volumes::csi::tear_down(drivers, &pods_dir, &dir).await
        {
            tracing::warn!(%uid, %error, "orphaned pod's CSI volumes not torn down");
            return;
        }
        // its local block volumes unmapped (loop devices detached) before the directory goes
        let root = pods_dir.parent().unwrap_or(&pods_dir).to_owned();
        let remove = move || {
            volumes::block::unmap_local(&root, &dir)?;
            volumes::disk::remove_pod_dir(&dir)
        };
        match tokio::task::spawn_blocking(remove).await {
            Ok(Ok(())) if existed => {
                tracing::info!(%uid, "removed the directory of a pod that no longer exists");
            }
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%uid, %error, "orphaned pod directory not removed");
                return;
            }
            Err(error) => {
                tracing::warn!(%uid, %error, "orphaned pod directory not removed");
                return;
            }
        }
    }
    if let Some(cgroups) = ctx.config.layout.cgroups.clone()
        && (held.runtime || held.cgroup)
    {
        match cgroups.remove_orphan(uid).await {
            Ok(()) if held.cgroup => {
                tracing::info!(%uid, "removed the cgroup of a pod that no longer exists")
            }
            Ok(()) => {}
            Err(error) => tracing::warn!(%uid, %error, "orphaned pod cgroup not removed"),
        }
    }
}

/// Stops and removes what the runtime holds of pod `uid`. Its object is gone, and with it the grace period
/// (which ran out while nobody watched), so containers get the 2 s minimum and no preStop hook.
async fn remove_from_runtime(ctx: &AgentCtx, uid: &str) -> Result<(), runtime_api::RuntimeError> {
    let mut view = RuntimeView::default();
    view.refresh(ctx.view_source(), uid, Reread::Kept).await?;
    for c in view.containers.iter().filter(|c| c.running()) {
        kill::stop_container(ctx, &c.id, 2).await?;
    }
    kill::remove_pod(ctx, &view).await
}
