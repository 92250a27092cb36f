//! In-place resize, the pod manager's part: the node's allocation of each admitted pod's resources. When an
//! update asks a running pod's containers for other CPU or memory, the manager decides as the kubelet's
//! allocation manager does ([`resize`]): a resize that fits becomes the pod's allocation (charged in place of
//! the old one, a `ResizeStarted` event) and goes to the worker, which applies it; one that does not waits
//! `Deferred` (a `ResizeDeferred` event), the worker keeping the allocated resources and reporting the
//! `PodResizePending` condition. Deferred resizes are judged again whenever a pod releases its resources.
//!
//! Once a pod has been resized, its allocation is kept in its pod directory (`allocated_resources`, the
//! kubelet keeps its allocation checkpoint beside its pods too), so that after a restart of node-agent a resize
//! that waited still waits, and the node charges the pod what it allocated rather than what its spec asks.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::pods::events::EventType;
use crate::pods::manager::PodManager;
use crate::pods::model::resize;
use crate::pods::model::resources::ContainerResources;
use crate::pods::model::spec::DesiredPod;
use crate::pods::worker::state::WorkerMsg;

impl PodManager {
    /// What the worker of `uid` runs for the update `desired`: `desired` itself, or — while its resize waits —
    /// `desired` with the allocated resources.
    pub(super) fn allocate(&mut self, uid: &str, desired: Arc<DesiredPod>) -> Arc<DesiredPod> {
        let Some(e) = self.workers.get_mut(uid) else {
            return desired;
        };
        if !e.admitted || e.stopped || desired.deletion.is_some() {
            return desired;
        }
        if !resize::resized(&desired, &e.allocated) {
            e.allocated = desired.clone();
            e.deferred = None;
            return desired;
        }
        let verdict = match self.ctx.node.get() {
            Some(node) => resize::decide(&desired, &e.allocated, &node, &self.committed),
            // no node view yet (a static pod before registration): nothing to judge against
            None => Ok(()),
        };
        match verdict {
            Ok(()) => {
                self.committed.remove(&e.allocated);
                self.committed.add(&desired);
                e.allocated = desired.clone();
                e.deferred = None;
                save(self.ctx.config.layout.pods_dir.as_deref(), &desired);
                let msg = resize::event_message(&desired, "Pod resize started", "");
                self.ctx
                    .events
                    .pod(&desired, EventType::Normal, "ResizeStarted", msg);
                desired
            }
            Err(mut pending) => {
                let before = e.pod.resize_pending();
                let news =
                    before.is_none_or(|b| b.reason != pending.reason || b.generation != pending.generation);
                if let Some(b) = before.filter(|b| b.reason == pending.reason) {
                    pending.since = b.since;
                }
                if news {
                    let prefix = format!("Pod resize {}", pending.reason);
                    let msg = resize::event_message(&desired, &prefix, &pending.message);
                    let reason = if pending.reason == resize::INFEASIBLE {
                        "ResizeInfeasible"
                    } else {
                        "ResizeDeferred"
                    };
                    self.ctx.events.pod(&desired, EventType::Warning, reason, msg);
                }
                save(self.ctx.config.layout.pods_dir.as_deref(), &e.allocated);
                let held = Arc::new(desired.with_allocated(&e.allocated, pending));
                e.deferred = Some(desired);
                held
            }
        }
    }

    /// For a pod that ran before this agent started: its kept allocation, when it differs from its spec —
    /// carrying the `PodResizePending` condition the pod's status held, so the resize is reported as waiting
    /// (since when it waited) until [`Self::retry_deferred`] judges it again.
    pub(super) fn restored(
        &self,
        object: &k8s_openapi::api::core::v1::Pod,
        desired: &DesiredPod,
    ) -> Option<Arc<DesiredPod>> {
        if !super::started_before(object) {
            return None;
        }
        let saved = load(self.ctx.config.layout.pods_dir.as_deref(), &desired.uid)?;
        let allocated = desired.with_resources(&saved);
        if !resize::resized(desired, &allocated) {
            return None;
        }
        Some(Arc::new(match resize::reported_pending(object) {
            Some(pending) => desired.with_allocated(&allocated, pending),
            None => allocated,
        }))
    }

    /// Marks the resize of a pod restored from its kept allocation as waiting: it is judged once every pod of
    /// the same batch is admitted (as the kubelet backfills its pending resizes after adding all pods), so
    /// that a pod listed before the pods that hold the room does not take it.
    pub(super) fn defer_restored(&mut self, desired: Arc<DesiredPod>) {
        if let Some(e) = self.workers.get_mut(&desired.uid) {
            e.deferred = Some(desired);
        }
    }

    /// Judges the resize to `desired` of a pod whose worker runs its allocation, and tells the worker.
    pub(super) fn retry_deferred_of(&mut self, desired: Arc<DesiredPod>) {
        let uid = desired.uid.clone();
        let pod = self.allocate(&uid, desired);
        if let Some(e) = self.workers.get_mut(&uid) {
            e.pod = pod.clone();
            e.deliver(WorkerMsg::Update(pod), &self.tracker);
        }
    }

    /// Judges every deferred resize again (a pod released its resources).
    pub(super) fn retry_deferred(&mut self) {
        let waiting: Vec<Arc<str>> = self
            .workers
            .iter()
            .filter(|(_, e)| e.deferred.is_some() && !e.stopped)
            .map(|(uid, _)| uid.clone())
            .collect();
        for uid in waiting {
            if let Some(d) = self.workers.get_mut(&uid).and_then(|e| e.deferred.take()) {
                self.retry_deferred_of(d);
            }
        }
    }
}

const CHECKPOINT: &str = "allocated_resources";

fn checkpoint(pods_dir: &Path, uid: &str) -> PathBuf {
    pods_dir.join(uid).join(CHECKPOINT)
}

/// Keeps `pod`'s allocation in its pod directory (nothing on a node without pod directories). A failure is
/// logged: the allocation then lives until node-agent restarts.
fn save(pods_dir: Option<&Path>, pod: &DesiredPod) {
    let Some(dir) = pods_dir else {
        return;
    };
    let path = checkpoint(dir, &pod.uid);
    let write = || -> std::io::Result<()> {
        let text = serde_json::to_vec(&pod.resources_by_name()).map_err(std::io::Error::other)?;
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &path)
    };
    if let Err(error) = write() {
        tracing::warn!(pod = %pod.name, path = %path.display(), %error, "pod allocation not kept");
    }
}

/// The allocation kept for pod `uid`, if it was resized before.
pub(super) fn load(pods_dir: Option<&Path>, uid: &str) -> Option<BTreeMap<String, ContainerResources>> {
    let path = checkpoint(pods_dir?, uid);
    let text = match std::fs::read(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "pod allocation unreadable");
            return None;
        }
    };
    match serde_json::from_slice(&text) {
        Ok(saved) => Some(saved),
        Err(error) => {
            tracing::warn!(path = %path.display(), %error, "pod allocation unreadable");
            None
        }
    }
}
