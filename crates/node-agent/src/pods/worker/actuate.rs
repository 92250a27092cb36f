//! In-place resize, the worker's part: bringing running containers to the resources the node allocated them
//! (the kubelet's resize actuation). When an update changes a running container's allocated CPU or memory, the
//! worker notes what the container runs with ([`Resizing`]); its next sync rewrites the pod cgroup and calls
//! UpdateContainerResources for each such container — the container keeps running, same ID, same restart
//! count — unless the container's `resizePolicy` asks `RestartContainer` for a resource that changed: then the
//! container is stopped and started again with the new resources. Until every container is brought in line,
//! the status carries `PodResizeInProgress` (with reason `Error` and the runtime's message after a failed
//! attempt); when done, a `ResizeCompleted` event.

use std::time::Duration;

use runtime_api::{RuntimeError, cri};

use crate::pods::actions::kill;
use crate::pods::events::EventType;
use crate::pods::model::resize;
use crate::pods::model::spec::DesiredPod;
use crate::pods::runtime::labels;
use crate::pods::runtime::observed::Reread;
use crate::pods::worker::resize::Resizing;
use crate::pods::worker::state::PodWorker;

impl PodWorker {
    /// Before `new` replaces the pod: for each running container whose allocated resources `new` changes,
    /// remember what it runs with now.
    pub(crate) fn note_resize(&mut self, new: &DesiredPod) {
        let old = self.pod.clone();
        for c in old.init_containers.iter().chain(old.containers.iter()) {
            let Some(n) = new.container(&c.name) else {
                continue;
            };
            if n.resources.differs(&c.resources) == (false, false) {
                continue;
            }
            for r in self
                .view
                .containers
                .iter()
                .filter(|r| r.name == c.name && r.running())
            {
                let resizing = self.resize.get_or_insert_with(|| {
                    Box::new(Resizing {
                        since: k8s_openapi::jiff::Timestamp::now().as_second(),
                        ..Default::default()
                    })
                });
                resizing.generation = new.generation;
                resizing.actuated.entry(r.id.to_string()).or_insert(c.resources);
            }
        }
    }

    /// Applies the allocated resources to the containers that do not run with them yet.
    pub(crate) async fn apply_resize(&mut self) -> Result<(), RuntimeError> {
        let Some(mut resizing) = self.resize.take() else {
            return Ok(());
        };
        let ctx = self.ctx.clone();
        let pod = self.pod.clone();
        let view = &self.view;
        resizing
            .actuated
            .retain(|id, _| view.containers.iter().any(|r| *r.id == **id && r.running()));
        let mut to_restart = Vec::new();
        let mut to_update = Vec::new();
        for (id, now) in &resizing.actuated {
            let Some(rec) = view.containers.iter().find(|r| *r.id == **id) else {
                continue;
            };
            let Some(spec) = pod.container(&rec.name) else {
                continue;
            };
            let (cpu, memory) = spec.resources.differs(now);
            if !cpu && !memory {
                continue;
            }
            if (cpu && spec.resize_restart.cpu) || (memory && spec.resize_restart.memory) {
                to_restart.push(rec.clone());
            } else {
                to_update.push((rec.id.to_string(), spec.resources));
            }
        }
        let mut error = None;
        let cgroups = ctx.config.layout.cgroups.clone();
        // the pod's cgroup first, so a container may grow into it; a shrink the kernel refuses while the
        // containers are larger is written again after them
        let mut pod_cgroup_done = match &cgroups {
            Some(cg) => cg.resize(&pod).await.is_ok(),
            None => true,
        };
        let pod_ip = self.pod_ip_for_resize();
        for rec in &to_restart {
            let grace = Duration::from_secs(u64::try_from(pod.termination_grace_secs).unwrap_or(0));
            let msg = format!("Container {} resize requires restart", rec.name);
            if let Err(e) = kill::kill_container(&ctx, &pod, rec.into(), &pod_ip, grace, Some(&msg)).await {
                // tried again at the next sync
                self.resize = Some(resizing);
                return Err(e);
            }
            resizing.actuated.remove(&*rec.id);
        }
        for (id, wanted) in to_update {
            let mut linux = labels::linux_resources(&wanted);
            if let Some(cg) = &cgroups {
                cg.container_resources(&mut linux);
            }
            let req = cri::UpdateContainerResourcesRequest {
                container_id: id.clone(),
                linux: Some(linux),
                ..Default::default()
            };
            match ctx
                .rt("update_container", ctx.runtime.update_container_resources(req))
                .await
            {
                Ok(_) => {
                    resizing.actuated.insert(id, wanted);
                }
                Err(e) => error = Some(e.to_string()),
            }
        }
        if !pod_cgroup_done && let Some(cg) = &cgroups {
            match cg.resize(&pod).await {
                Ok(()) => pod_cgroup_done = true,
                Err(e) => error = Some(e.to_string()),
            }
        }
        if !to_restart.is_empty()
            && let Err(e) = self.view.refresh(ctx.view_source(), &pod.uid, Reread::Kept).await
        {
            self.resize = Some(resizing);
            return Err(e);
        }
        let view = &self.view;
        resizing.actuated.retain(|id, now| {
            view.containers
                .iter()
                .find(|r| *r.id == **id)
                .and_then(|r| pod.container(&r.name))
                .is_some_and(|spec| spec.resources.differs(now) != (false, false))
        });
        if resizing.actuated.is_empty() && pod_cgroup_done && error.is_none() {
            let msg = resize::event_message(&pod, "Pod resize completed", "");
            ctx.events.pod(&pod, EventType::Normal, "ResizeCompleted", msg);
            return Ok(());
        }
        if let Some(e) = &error {
            let msg = resize::event_message(&pod, "Pod resize error", e);
            ctx.events.pod(&pod, EventType::Warning, "ResizeError", msg);
        }
        resizing.error = error;
        self.resize = Some(resizing);
        Ok(())
    }

    fn pod_ip_for_resize(&self) -> String {
        self.ctx.pod_ip(&self.pod, self.view.sandbox())
    }
}
