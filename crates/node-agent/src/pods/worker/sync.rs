//! One sync of a running pod (the kubelet's SyncPod): refresh the runtime view, compute the [`plan`], then
//! carry it out in order — stop what must stop, create the sandbox, start containers (restart back-off, image
//! ensure, create, start, postStart hook) — and report the resulting status.

use std::time::Duration;

use runtime_api::{Code, RuntimeError, cri};
use tokio::time::Instant;

use crate::pods::actions::action::{self, Where};
use crate::pods::actions::env;
use crate::pods::actions::images::ImageState;
use crate::pods::actions::kill;
use crate::pods::actions::volumes;
use crate::pods::events::EventType;
use crate::pods::metrics::Stage;
use crate::pods::model::gofmt;
use crate::pods::probes::ProbeOutcome;
use crate::pods::runtime::labels;
use crate::pods::runtime::observed::Reread;
use crate::pods::runtime::security;
use crate::pods::runtime::termination;
use crate::pods::runtime::userns;
use crate::pods::status::generate::{self, Inputs};
use crate::pods::status::{Phase, StatusMsg};
use crate::pods::worker::plan::{self, Start};
use crate::pods::worker::state::{LastReport, PodWorker, State};

impl PodWorker {
    fn wake(&mut self, at: Instant) {
        self.wake_at = Some(self.wake_at.map_or(at, |w| w.min(at)));
    }

    fn pod_ip(&self) -> String {
        self.ctx.pod_ip(&self.pod, self.view.sandbox())
    }

    pub(crate) async fn sync_running(&mut self) -> Result<(), RuntimeError> {
        if self.rejected.is_some() {
            // a rejected pod never runs: report Failed, then only wait for the object's deletion
            self.report_status();
            self.state = State::Terminated;
            return Ok(());
        }
        if self.removed || self.pod.deletion.is_some() {
            self.state = State::Terminating;
            return Ok(());
        }
        if self.past_active_deadline() {
            return Ok(());
        }
        let ctx = self.ctx.clone();
        let pod = self.pod.clone();
        // the objects the pod names are followed while it runs, as the kubelet's managers register them
        ctx.objects.register_pod(
            &pod.uid,
            &pod.namespace,
            &crate::pods::actions::object_refs::referenced(&pod),
        );
        self.view
            .refresh(ctx.view_source(), &pod.uid, Reread::Kept)
            .await?;
        if !self.ensure_cgroup().await {
            self.report_status();
            return Ok(());
        }
        if !self.setup_volumes().await {
            self.report_status();
            return Ok(());
        }
        if let Some(t) = self.timeline.as_deref_mut() {
            t.mark(Stage::VolumesReady);
        }
        self.apply_resize().await?;
        for _round in 0..2 {
            let plan = plan::plan(&pod, &self.view, &self.probes);
            if let Some(phase) = plan.terminal {
                self.terminal = Some(phase);
                self.state = State::Terminating;
                return Ok(());
            }
            let pod_ip = self.pod_ip();
            for k in &plan.kill {
                let Some(rec) = self.view.containers.iter().find(|r| *r.id == *k.id).cloned() else {
                    continue;
                };
                let grace = k.grace_secs.unwrap_or(pod.termination_grace_secs);
                let grace = Duration::from_secs(u64::try_from(grace).unwrap_or(0));
                kill::kill_container(&ctx, &pod, (&rec).into(), &pod_ip, grace, k.message.as_deref()).await?;
            }
            if let Some(attempt) = plan.create_sandbox {
                for sb in self.view.sandboxes.iter().filter(|s| s.ready) {
                    kill::stop_sandbox(&ctx, &sb.id).await?;
                }
                if attempt > 0 {
                    let msg = "Pod sandbox changed, it will be killed and re-created.";
                    ctx.events.pod(&pod, EventType::Normal, "SandboxChanged", msg);
                }
                if !self.prepare_claims().await {
                    break;
                }
                self.create_sandbox(attempt).await?;
                self.view
                    .refresh(ctx.view_source(), &pod.uid, Reread::Kept)
                    .await?;
                continue;
            }
            let mut changed = !plan.kill.is_empty();
            for s in &plan.start {
                let started = self.start_one(s).await?;
                changed |= started;
                if !started && s.init {
                    break;
                }
            }
            if changed {
                self.view
                    .refresh(ctx.view_source(), &pod.uid, Reread::Kept)
                    .await?;
            }
            break;
        }
        let view = &self.view;
        self.probes
            .retain(|id| view.containers.iter().any(|c| *c.id == *id && c.running()));
        self.mark_started();
        self.update_prober();
        if !self.counted_running && self.view.sandbox().is_some_and(|s| s.ready) {
            self.counted_running = true;
            ctx.metrics.running_pods(1);
        }
        self.report_status();
        Ok(())
    }

    /// `activeDeadlineSeconds` passed since the pod's start: a `DeadlineExceeded` event, and the pod is stopped
    /// (with its own grace period) and Failed, as the kubelet's active deadline handler does. Before then, the
    /// worker wakes at the deadline.
    fn past_active_deadline(&mut self) -> bool {
        use crate::pods::worker::disruption::{DEADLINE_MESSAGE, DEADLINE_REASON, KillCause};
        let Some(deadline) = self.pod.active_deadline_secs() else {
            return false;
        };
        let active = k8s_openapi::jiff::Timestamp::now().as_second() - self.start_time().as_second();
        if active < deadline {
            let left = u64::try_from(deadline - active).unwrap_or(0);
            self.wake(Instant::now() + Duration::from_secs(left));
            return false;
        }
        self.ctx.events.pod(
            &self.pod,
            EventType::Normal,
            DEADLINE_REASON,
            DEADLINE_MESSAGE.to_owned(),
        );
        let grace = self.pod.grace_secs();
        self.stop.get_or_insert_default().order = Some((grace, KillCause::Deadline));
        self.state = State::Terminating;
        true
    }

    /// Makes sure the pod's cgroup exists (a real node with QoS cgroups); `false` when it could not be made: a
    /// `FailedCreatePodContainer` event, retried after the pod worker back-off.
    async fn ensure_cgroup(&mut self) -> bool {
        let Some(cgroups) = self.ctx.config.layout.cgroups.clone() else {
            return true;
        };
        match cgroups.ensure(&self.pod).await {
            Ok(()) => true,
            Err(e) => {
                let msg = format!("unable to ensure pod container exists: {e}");
                self.ctx
                    .events
                    .pod(&self.pod, EventType::Warning, "FailedCreatePodContainer", msg);
                self.wake(Instant::now() + crate::backoff::jittered(Duration::from_secs(10), 0.5));
                false
            }
        }
    }

    /// Sets up (or refreshes) the pod's volumes; `false` while they were never all set up (the pod waits,
    /// retried with back-off). A failure is a `FailedMount` event; once set up, a failed refresh leaves the
    /// running pod alone.
    async fn setup_volumes(&mut self) -> bool {
        if self.pod.volumes.is_empty() {
            return true;
        }
        let ctx = self.ctx.clone();
        let pod = self.pod.clone();
        let vols = self.volumes.get_or_insert_with(Box::default);
        let was_ready = vols.ready(&pod);
        match vols.setup(&ctx, &pod).await {
            Ok(()) => true,
            Err(e) => {
                ctx.events
                    .pod(&pod, EventType::Warning, e.reason(), e.to_string());
                let retry = vols.retry_delay();
                self.wake(Instant::now() + retry);
                was_ready
            }
        }
    }

    /// Prepares the pod's resource claims before its sandbox is made (the DRA manager); `false` when they could
    /// not be: a `FailedPrepareDynamicResources` event, retried after the pod worker back-off.
    async fn prepare_claims(&mut self) -> bool {
        let claims = self.pod.resource_claims();
        if claims.is_empty() {
            return true;
        }
        let pod = &self.pod;
        let result = match &self.ctx.config.dra {
            Some(dra) => {
                let at = crate::dra::PodRef {
                    namespace: &pod.namespace,
                    name: &pod.name,
                    uid: &pod.uid,
                };
                dra.prepare(at, claims).await.map_err(|e| e.0)
            }
            None => Err("prepare dynamic resources: this node prepares no resource claims".to_owned()),
        };
        match result {
            Ok(()) => true,
            Err(e) => {
                let msg = format!("Failed to prepare dynamic resources: {e}");
                self.ctx
                    .events
                    .pod(pod, EventType::Warning, "FailedPrepareDynamicResources", msg);
                self.wake(Instant::now() + crate::backoff::jittered(Duration::from_secs(10), 0.5));
                false
            }
        }
    }

    async fn create_sandbox(&mut self, attempt: u32) -> Result<(), RuntimeError> {
        let ctx = self.ctx.clone();
        let pod = self.pod.clone();
        if !pod.host_network
            && let Err(why) = pod.kernel_hostname(&ctx.config.layout.dns.cluster_domain)
        {
            let msg = format!("Failed to create pod sandbox: {why}");
            ctx.events
                .pod(&pod, EventType::Warning, "FailedCreatePodSandBox", msg);
            return Err(RuntimeError::invalid_argument(why));
        }
        let runtime_handler = match pod.runtime_class() {
            "" => String::new(),
            class => match ctx.objects.runtime_handler(class).await {
                Ok(Some(handler)) => handler,
                result => {
                    let why = match result {
                        Err(e) => e.0,
                        _ => format!("runtimeclass.node.k8s.io {class:?} not found"),
                    };
                    let msg = format!("Failed to create pod sandbox: {why}");
                    ctx.events
                        .pod(&pod, EventType::Warning, "FailedCreatePodSandBox", msg);
                    return Err(RuntimeError::not_found(why));
                }
            },
        };
        let mut config = labels::sandbox_config(&pod, attempt, &ctx.config.layout);
        if wants_user_namespace(&pod) {
            let ns = match user_namespace(&ctx, &pod, Some(&runtime_handler)).await {
                Ok(ns) => ns,
                Err(why) => {
                    let msg = format!("Failed to create pod sandbox: {why}");
                    ctx.events
                        .pod(&pod, EventType::Warning, "FailedCreatePodSandBox", msg);
                    return Err(RuntimeError::invalid_argument(why));
                }
            };
            userns::apply_to_sandbox(&mut config, &ns);
        }
        if ctx.config.layout.create_log_dirs
            && let Err(error) = tokio::fs::create_dir_all(&config.log_directory).await
        {
            // the runtime's own error (it cannot open the log file) will say the rest
            tracing::warn!(dir = %config.log_directory, %error, "cannot create the pod log directory");
        }
        let req = cri::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler,
        };
        match ctx.rt("run_podsandbox", ctx.runtime.run_pod_sandbox(req)).await {
            Ok(_) => {
                if let Some(t) = self.timeline.as_deref_mut() {
                    t.mark(Stage::SandboxReady);
                }
                Ok(())
            }
            Err(e) => {
                let msg = format!("Failed to create pod sandbox: {}", e.message);
                ctx.events
                    .pod(&pod, EventType::Warning, "FailedCreatePodSandBox", msg);
                Err(e)
            }
        }
    }

    /// Starts one container; `Ok(false)` when it has to wait (the reason is recorded for the status).
    async fn start_one(&mut self, s: &Start) -> Result<bool, RuntimeError> {
        let ctx = self.ctx.clone();
        let pod = self.pod.clone();
        let Some(c) = pod.container(&s.name) else {
            return Ok(false);
        };
        let Some(sandbox) = self.view.sandbox().filter(|s| s.ready).cloned() else {
            return Ok(false);
        };
        let now = Instant::now();
        if let Some(exited) = s.exited
            && let Err(wait) = self
                .restarts
                .get_or_insert_with(Box::default)
                .try_restart(&s.name, exited, now)
        {
            let msg = format!(
                "back-off {} restarting failed container={} pod={}",
                gofmt::duration(wait.backoff),
                s.name,
                pod.display()
            );
            self.wait_as(&s.name, "CrashLoopBackOff", msg);
            let event = format!(
                "Back-off restarting failed container {} in pod {}",
                s.name,
                pod.display()
            );
            ctx.events
                .container(&pod, &s.name, EventType::Warning, "BackOff", event);
            self.wake(now + wait.remaining);
            return Ok(false);
        }
        let sandbox_config = labels::sandbox_config(&pod, sandbox.attempt, &ctx.config.layout);
        match self.images.ensure(&ctx, &pod, c, &sandbox_config).await {
            ImageState::Waiting { reason, message } => {
                self.wait_as(&s.name, reason, message);
                // a failed pull shows ErrImagePull, then (a second later) ImagePullBackOff until the retry
                let retry = match reason {
                    "ErrImagePull" => Some(Duration::from_secs(1)),
                    _ => self.images.retry_in(&c.image, Instant::now()),
                };
                self.wake(Instant::now() + retry.unwrap_or(Duration::from_secs(10)));
                return Ok(false);
            }
            ImageState::Ready { pulled } => {
                if let (Some(t), Some(d)) = (self.timeline.as_deref_mut(), pulled) {
                    t.add_pulling(d);
                }
            }
        }
        if !s.init
            && pod.containers.last().is_some_and(|last| last.name == s.name)
            && let Some(t) = self.timeline.as_deref_mut()
        {
            t.mark(Stage::ImagesReady);
        }
        let pod_ip = ctx.pod_ip(&pod, Some(&sandbox));
        let host_ip = ctx.host_ips().into_iter().next().unwrap_or_default();
        let resolved = env::resolve(&ctx, &pod, c, &pod_ip, &host_ip)
            .await
            .and_then(|mut r| {
                r.security = Some(security::container(&pod, c, &ctx.config.layout.root_dir())?);
                Ok(r)
            });
        let mut resolved = match resolved {
            Ok(r) => r,
            Err(message) => return Ok(self.wait_after_failure(s, "CreateContainerConfigError", message)),
        };
        if let Some(target) = pod.ephemeral_named(&s.name).and_then(|e| e.target.as_deref()) {
            // a debug container sees the processes of the container it targets
            let target_id = self
                .view
                .latest_in(target, &sandbox.id)
                .filter(|r| r.running())
                .map(|r| r.id.to_string());
            let ns = resolved
                .security
                .as_mut()
                .and_then(|sc| sc.namespace_options.as_mut());
            if let (Some(ns), Some(id)) = (ns, target_id)
                && ns.pid == cri::NamespaceMode::Container as i32
            {
                ns.pid = cri::NamespaceMode::Target as i32;
                ns.target_id = id;
            }
        }
        if security::needs_image_user(&pod, c)
            && let Err(message) = image_user_allowed(&ctx, &pod, c).await
        {
            return Ok(self.wait_after_failure(s, "CreateContainerConfigError", message));
        }
        let sub_paths = match env::sub_paths(c, &resolved.env) {
            Ok(subs) => subs,
            Err(message) => return Ok(self.wait_after_failure(s, "CreateContainerConfigError", message)),
        };
        if let Err(message) =
            volumes::prepare_mounts(&ctx, &pod, c, self.volumes.as_deref(), &sub_paths).await
        {
            return Ok(self.wait_after_failure(s, "CreateContainerConfigError", message));
        }
        let mut mounts = volumes::mounts(&ctx, &pod, c, self.volumes.as_deref(), &sub_paths);
        mounts.extend(termination::mount(ctx.config.layout.pods_dir.as_deref(), &pod, c).await);
        match volumes::etc_hosts(&ctx, &pod, c, &pod_ip).await {
            Ok(hosts) => mounts.extend(hosts),
            Err(message) => return Ok(self.wait_after_failure(s, "CreateContainerConfigError", message)),
        }
        let devices = match volumes::devices(&ctx, &pod, c, self.volumes.as_deref()).await {
            Ok(devices) => devices,
            Err(message) => return Ok(self.wait_after_failure(s, "CreateContainerConfigError", message)),
        };
        let mut config = labels::container_config(
            &pod,
            c,
            s.restart_count,
            resolved,
            mounts,
            ctx.config.layout.memory_capacity,
            // the machine's huge page sizes, as the kubelet reads them; a hollow node's containers get none
            if ctx.config.kind == crate::pods::NodeKind::Real {
                crate::pods::runtime::cgroups::host_page_sizes()
            } else {
                &[]
            },
        );
        // the block volumes first, as the kubelet puts them before the device plugins' devices
        config.devices.splice(0..0, devices);
        if let Some(cgroups) = &ctx.config.layout.cgroups
            && let Some(resources) = config.linux.as_mut().and_then(|l| l.resources.as_mut())
        {
            cgroups.container_resources(resources);
        }
        if let Some(devices) = &ctx.config.devices {
            let wants: Vec<(String, u64)> = pod
                .extended_requests()
                .iter()
                .filter(|(container, _, _)| *container == s.name)
                .map(|(_, resource, n)| (resource.clone(), *n))
                .collect();
            if !wants.is_empty() {
                match devices.container_allocation(&pod.uid, &s.name, &wants).await {
                    Ok(Some(allocation)) => crate::pods::runtime::devices::apply(&mut config, &allocation),
                    Ok(None) => {}
                    Err(message) => {
                        return Ok(self.wait_after_failure(s, "CreateContainerConfigError", message));
                    }
                }
            }
        }
        let uses = pod.container_claims(&c.name);
        if !uses.is_empty() {
            let devices = match &ctx.config.dra {
                Some(dra) => dra.cdi_devices(&pod.namespace, pod.resource_claims(), uses),
                None => Ok(Vec::new()),
            };
            match devices {
                Ok(ids) => {
                    config
                        .cdi_devices
                        .extend(ids.into_iter().map(|name| cri::CdiDevice { name }));
                }
                Err(e) => return Ok(self.wait_after_failure(s, "CreateContainerConfigError", e.0)),
            }
        }
        let mut sandbox_config = sandbox_config;
        if wants_user_namespace(&pod) {
            // the sandbox was given its range; the file in the pod's directory says which
            match user_namespace(&ctx, &pod, None).await {
                Ok(ns) => {
                    userns::apply_to_container(&mut config, &ns);
                    userns::apply_to_sandbox(&mut sandbox_config, &ns);
                }
                Err(message) => return Ok(self.wait_after_failure(s, "CreateContainerConfigError", message)),
            }
        }
        let req = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox.id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let id = match ctx
            .rt("create_container", ctx.runtime.create_container(req))
            .await
        {
            Ok(resp) => resp.container_id,
            Err(e) => return self.start_failed(s, "CreateContainerError", e),
        };
        ctx.events.container(
            &pod,
            &s.name,
            EventType::Normal,
            "Created",
            format!("Created container: {}", s.name),
        );
        let req = cri::StartContainerRequest {
            container_id: id.clone(),
        };
        if let Err(e) = ctx.rt("start_container", ctx.runtime.start_container(req)).await {
            return self.start_failed(s, "RunContainerError", e);
        }
        ctx.events.container(
            &pod,
            &s.name,
            EventType::Normal,
            "Started",
            format!("Started container {}", s.name),
        );
        let kind = if s.init {
            "init_container"
        } else if pod.ephemeral_named(&s.name).is_some() {
            "ephemeral_container"
        } else {
            "container"
        };
        ctx.metrics.container_started(kind);
        self.not_waiting(&s.name);
        if let Some(hook) = &c.post_start {
            let at = Where {
                pod: &pod,
                container: &s.name,
                container_id: &id,
                pod_ip: &pod_ip,
            };
            let grace = Duration::from_secs(u64::try_from(pod.termination_grace_secs).unwrap_or(0));
            if let ProbeOutcome::Failure(out) | ProbeOutcome::Unknown(out) =
                action::run(&ctx, at, hook, grace).await
            {
                let msg = format!("PostStartHook failed: {out}");
                ctx.events
                    .container(&pod, &s.name, EventType::Warning, "FailedPostStartHook", msg);
                let victim = kill::Victim {
                    id: &id,
                    name: &s.name,
                    running: true,
                };
                kill::kill_container(&ctx, &pod, victim, &pod_ip, grace, Some("FailedPostStartHook")).await?;
            }
        }
        Ok(true)
    }

    fn start_failed(
        &mut self,
        s: &Start,
        reason: &'static str,
        e: RuntimeError,
    ) -> Result<bool, RuntimeError> {
        if e.code == Code::Unavailable {
            return Err(e);
        }
        Ok(self.wait_after_failure(s, reason, e.message))
    }

    /// Records why container `s` could not start (a `Failed` event, the waiting reason) and schedules a retry
    /// after the kubelet's pod worker back-off (10 s, jittered by up to half).
    fn wait_after_failure(&mut self, s: &Start, reason: &'static str, msg: String) -> bool {
        self.ctx.events.container(
            &self.pod,
            &s.name,
            EventType::Warning,
            "Failed",
            format!("Error: {msg}"),
        );
        self.wait_as(&s.name, reason, msg);
        self.wake(Instant::now() + crate::backoff::jittered(Duration::from_secs(10), 0.5));
        false
    }

    fn mark_started(&mut self) {
        let Some(t) = self.timeline.as_deref_mut() else {
            return;
        };
        let Some(sandbox) = self.view.sandbox() else {
            return;
        };
        let all = self.pod.containers.iter().all(|c| {
            self.view
                .latest_in(&c.name, &sandbox.id)
                .is_some_and(|r| r.started_at > 0)
        });
        if all {
            t.mark(Stage::ContainersStarted);
        }
    }

    /// Generates the status and hands it to the status manager (which writes only changes).
    pub(crate) fn report_status(&mut self) {
        let host_ips = self.ctx.host_ips();
        let pod = &self.pod;
        let (status, phase) = match &self.rejected {
            Some(r) => (
                generate::rejected(pod, &r.reason, &r.message, self.start_time()),
                Phase::Failed,
            ),
            None => generate::generate(&Inputs {
                pod,
                view: &self.view,
                probes: &self.probes,
                waiting: self
                    .waiting
                    .as_deref()
                    .unwrap_or(&crate::pods::worker::state::NO_WAITING),
                host_ips: &host_ips,
                start_time: Some(self.start_time()),
                old: self.last.as_ref().map(|l| &l.previous),
                runtime_type: &self.ctx.runtime_type,
                terminal: if self.state == State::Syncing {
                    None
                } else {
                    self.terminal
                },
                resizing: self.resize.as_deref().map(|z| generate::Resizing {
                    actuated: &z.actuated,
                    error: z.error.as_deref(),
                    generation: z.generation,
                    since: z.since,
                }),
            }),
        };
        let mut status = status;
        if let Some((_, cause)) = self.killed()
            && phase.is_terminal()
        {
            crate::pods::worker::disruption::mark_status(&mut status, cause, self.pod.generation);
        }
        let timeline = match &self.timeline {
            Some(t) if phase == Phase::Running && t.reached(Stage::ContainersStarted) => self.timeline.take(),
            _ => None,
        };
        if phase.is_terminal() {
            self.timeline = None;
        }
        let fingerprint = crate::pods::status::canonical::hash_of(&status);
        if timeline.is_none() && self.last.as_ref().is_some_and(|l| l.fingerprint == fingerprint) {
            return;
        }
        self.last = Some(LastReport::new(&status, fingerprint));
        self.last_terminal = crate::pods::worker::state::is_terminal(&status);
        self.ctx.status.send(StatusMsg::Set {
            uid: pod.uid.clone(),
            namespace: pod.namespace.clone(),
            name: pod.name.clone(),
            status: Box::new(status),
            timeline,
        });
    }
}

/// `runAsNonRoot` without `runAsUser`: the image's user, from `ImageStatus`, must not be root.
async fn image_user_allowed(
    ctx: &crate::pods::worker::AgentCtx,
    pod: &crate::pods::model::spec::DesiredPod,
    c: &crate::pods::model::spec::ContainerSpec,
) -> Result<(), String> {
    let spec = cri::ImageSpec {
        image: c.image.clone(),
        user_specified_image: c.image.clone(),
        ..Default::default()
    };
    let request = cri::ImageStatusRequest {
        image: Some(spec),
        verbose: false,
    };
    let status = ctx
        .rt("image_status", ctx.runtime.image_status(request))
        .await
        .map_err(|e| format!("Failed to inspect image {:?}: {e}", c.image))?;
    let image = status.image.unwrap_or_default();
    security::verify_image_user(pod, c, image.uid.map(|u| u.value), &image.username)
}

fn wants_user_namespace(pod: &crate::pods::model::spec::DesiredPod) -> bool {
    pod.security.as_deref().is_some_and(|p| p.user_namespace)
}

/// The user namespace of a pod with `hostUsers: false`: with `handler` (a new sandbox's runtime handler), first
/// whether the runtime supports one for that handler (its `Status`), then the pod's range, allocated on first
/// use.
async fn user_namespace(
    ctx: &crate::pods::worker::AgentCtx,
    pod: &crate::pods::model::spec::DesiredPod,
    handler: Option<&str>,
) -> Result<cri::UserNamespace, String> {
    if let Some(handler) = handler {
        let status = ctx
            .rt(
                "status",
                ctx.runtime.status(cri::StatusRequest { verbose: false }),
            )
            .await
            .map_err(|e| e.message)?;
        match userns::handler_supports(&status.runtime_handlers, handler) {
            Ok(true) => {}
            Ok(false) => return Err(userns::unsupported(handler)),
            Err(e) => return Err(format!("{}: {e}", userns::unsupported(handler))),
        }
    }
    let Some(pods_dir) = ctx.config.layout.pods_dir.clone() else {
        return Err("user namespaces are given only to pods with a pod directory on this node".into());
    };
    let uid = pod.uid.to_string();
    tokio::task::spawn_blocking(move || userns::get_or_allocate(&pods_dir, &uid))
        .await
        .map_err(|e| e.to_string())?
        .map(userns::Range::cri)
}
