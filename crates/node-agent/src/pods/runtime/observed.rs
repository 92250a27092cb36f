//! What the runtime holds for one pod: its sandboxes and containers, found by the `io.kubernetes.pod.uid`
//! label, reduced to the fields the lifecycle reads.
//!
//! [`RuntimeView::refresh`] lists the pod's sandboxes and containers and asks for the status only of objects
//! that are new or changed state since the last refresh, so a steady pod costs two list calls per sync. On a
//! real node an exited container's message gets its [termination message](crate::pods::runtime::termination), read once.

use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use runtime_api::{Runtime, RuntimeError, cri};
use tokio::time::Instant;

use crate::density::intern::Interner;
use crate::pods::metrics::PodMetrics;
use crate::pods::runtime::labels;

/// A container's state as the runtime reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CState {
    /// Created, not started.
    Created,
    /// Running.
    Running,
    /// Exited.
    Exited,
    /// The runtime does not know.
    Unknown,
}

impl CState {
    fn from_cri(state: i32) -> Self {
        match cri::ContainerState::try_from(state) {
            Ok(cri::ContainerState::ContainerCreated) => Self::Created,
            Ok(cri::ContainerState::ContainerRunning) => Self::Running,
            Ok(cri::ContainerState::ContainerExited) => Self::Exited,
            _ => Self::Unknown,
        }
    }
}

/// One container instance.
///
/// Kept for every container of every pod between syncs: the image name and digest are shared by every
/// container of the same image (interned), and the sandbox ID with the pod's [`SandboxRecord`], rather than an
/// allocation each per container.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerRecord {
    /// Runtime id.
    pub id: Box<str>,
    /// Container name in the pod spec.
    pub name: String,
    /// Sandbox it runs in (the same allocation as that sandbox's record's).
    pub sandbox_id: Arc<str>,
    /// The restart count it was created with.
    pub restart_count: u32,
    /// The spec hash it was created from.
    pub hash: Option<u64>,
    /// State.
    pub state: CState,
    /// Created, started and finished times, nanoseconds since the epoch (0 = not yet).
    pub created_at: i64,
    /// See `created_at`.
    pub started_at: i64,
    /// See `created_at`.
    pub finished_at: i64,
    /// Exit code (exited only).
    pub exit_code: i32,
    /// The runtime's reason and message, when it gave either (see [`ContainerRecord::reason`]).
    pub ended: Option<Box<EndText>>,
    /// Image as the runtime names it, and the reference (digest) it runs: one copy per pair (see [`ImageNames`]).
    pub images: Arc<ImageNames>,
    /// When this agent first saw the container exited: the restart back-off clock.
    pub exited_seen: Option<Instant>,
    /// When the container started, on the tokio clock (probe delays count from it).
    pub started_seen: Option<Instant>,
}

/// The uid, gid and supplemental groups a container's first process started with (CRI `ContainerStatus.user`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinuxUser {
    /// The uid.
    pub uid: i64,
    /// The primary gid.
    pub gid: i64,
    /// The supplemental groups.
    pub supplemental_groups: Vec<i64>,
}

/// The runtime's words on a container, and the identity it reports the container started with: boxed apart, as
/// a running container has no words, a hollow fleet's runtime reports no identity, and every container's record
/// is held between syncs (two empty strings in place would make every record larger).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct EndText {
    /// `Completed`, `Error`, `OOMKilled`, ...
    pub reason: String,
    /// What the runtime (or the container's termination message) says.
    pub message: String,
    /// The identity its first process started with, when the runtime reports it.
    pub user: Option<LinuxUser>,
}

impl EndText {
    /// `None` when there are no words and no identity.
    pub fn of(reason: String, message: String, user: Option<LinuxUser>) -> Option<Box<Self>> {
        (!reason.is_empty() || !message.is_empty() || user.is_some()).then(|| {
            Box::new(Self {
                reason,
                message,
                user,
            })
        })
    }
}

impl ContainerRecord {
    /// The runtime's reason (`Completed`, `Error`, `OOMKilled`), empty when it gave none.
    pub fn reason(&self) -> &str {
        self.ended.as_ref().map_or("", |e| e.reason.as_str())
    }

    /// The runtime's message, empty when it gave none.
    pub fn message(&self) -> &str {
        self.ended.as_ref().map_or("", |e| e.message.as_str())
    }

    /// The identity the runtime reports the container started with.
    pub fn user(&self) -> Option<&LinuxUser> {
        self.ended.as_ref()?.user.as_ref()
    }

    fn from_status(s: cri::ContainerStatus, sandbox_id: Arc<str>) -> Self {
        let state = CState::from_cri(s.state);
        let exited_seen = (state == CState::Exited).then(|| seen_at(s.finished_at));
        let started_seen = (s.started_at > 0).then(|| seen_at(s.started_at));
        Self {
            name: s
                .labels
                .get(labels::CONTAINER_NAME)
                .cloned()
                .or_else(|| s.metadata.as_ref().map(|m| m.name.clone()))
                .unwrap_or_default(),
            restart_count: labels::restart_count(&s.annotations),
            hash: labels::hash(&s.annotations),
            id: s.id.into(),
            sandbox_id,
            state,
            created_at: s.created_at,
            started_at: s.started_at,
            finished_at: s.finished_at,
            exit_code: s.exit_code,
            ended: EndText::of(
                s.reason,
                s.message,
                s.user.and_then(|u| u.linux).map(|l| LinuxUser {
                    uid: l.uid,
                    gid: l.gid,
                    supplemental_groups: l.supplemental_groups,
                }),
            ),
            images: IMAGES.intern(ImageNames {
                image: s.image.map(|i| i.image).unwrap_or_default().into(),
                image_ref: s.image_ref.into(),
            }),
            exited_seen,
            started_seen,
        }
    }

    /// Whether the container counts as running.
    pub fn running(&self) -> bool {
        self.state == CState::Running
    }

    /// The image as the runtime names it.
    pub fn image(&self) -> &str {
        &self.images.image
    }

    /// The image reference (digest) it runs.
    pub fn image_ref(&self) -> &str {
        &self.images.image_ref
    }

    /// Whether it exited successfully.
    pub fn succeeded(&self) -> bool {
        self.state == CState::Exited && self.exit_code == 0
    }
}

/// An image as the runtime names it and the reference (digest) it resolved to. Every container of an image
/// holds the same pair, so it is one shared copy behind a thin pointer (one word in every container's record,
/// not two shared strings).
#[derive(Debug, PartialEq, Eq, Hash)]
pub struct ImageNames {
    /// The image as the runtime names it.
    pub image: Box<str>,
    /// The reference (digest) the container runs.
    pub image_ref: Box<str>,
}

/// Image name and digest pairs, one copy each.
static IMAGES: Interner<ImageNames> = Interner::new();

/// Maps a wall-clock exit time onto the tokio clock: "now" minus how long ago it happened.
fn seen_at(finished_ns: i64) -> Instant {
    let now = Instant::now();
    let ago_ns = Timestamp::now().as_nanosecond() - i128::from(finished_ns);
    if finished_ns <= 0 || ago_ns <= 0 {
        return now;
    }
    let ago = std::time::Duration::from_nanos(u64::try_from(ago_ns).unwrap_or(u64::MAX));
    now.checked_sub(ago).unwrap_or(now)
}

/// One sandbox.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxRecord {
    /// Runtime id.
    pub id: Arc<str>,
    /// Attempt number from its metadata.
    pub attempt: u32,
    /// Whether it is ready.
    pub ready: bool,
    /// Created time, nanoseconds.
    pub created_at: i64,
    /// Pod IPs, primary first.
    pub ips: Vec<String>,
}

/// Where [`RuntimeView::refresh`] reads a pod's objects: the runtime, each call timed in the pod metrics, and
/// whether an exited container's termination message file is read (only a real node's containers have one).
#[derive(Clone, Copy)]
pub(crate) struct ViewSource<'a> {
    pub runtime: &'a dyn Runtime,
    pub metrics: &'a PodMetrics,
    pub termination_messages: bool,
}

/// Whether [`RuntimeView::refresh`] asks again for the status of containers it saw exited before.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reread {
    /// Known exited containers keep their records (every sync).
    Kept,
    /// Their status is read again (the pod's final status, once).
    Exited,
}

/// A pod's sandboxes and containers, newest first.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RuntimeView {
    /// Sandboxes, newest (highest attempt) first.
    pub sandboxes: Vec<SandboxRecord>,
    /// Containers, newest first within each name.
    pub containers: Vec<ContainerRecord>,
}

impl RuntimeView {
    /// The newest sandbox.
    pub fn sandbox(&self) -> Option<&SandboxRecord> {
        self.sandboxes.first()
    }

    /// The newest instance of container `name`.
    pub fn latest(&self, name: &str) -> Option<&ContainerRecord> {
        self.containers.iter().find(|c| c.name == name)
    }

    /// The newest instance of `name` inside sandbox `sandbox_id`.
    pub fn latest_in(&self, name: &str, sandbox_id: &str) -> Option<&ContainerRecord> {
        self.containers
            .iter()
            .find(|c| c.name == name && *c.sandbox_id == *sandbox_id)
    }

    /// The instance before the newest one of `name`.
    pub fn previous(&self, name: &str) -> Option<&ContainerRecord> {
        self.containers.iter().filter(|c| c.name == name).nth(1)
    }

    /// Re-reads the pod's objects from the runtime. A container seen before in the same state keeps its record,
    /// unless `exited` is [`Reread::Exited`]: then an exited container's status is asked for again (its reason
    /// can still change after its exit was first seen, e.g. to `OOMKilled` when the runtime learns of the
    /// kernel's OOM kill after the exit itself).
    pub async fn refresh(
        &mut self,
        from: ViewSource<'_>,
        uid: &str,
        exited: Reread,
    ) -> Result<(), RuntimeError> {
        let sandboxes = from
            .metrics
            .runtime_op(
                "list_podsandbox",
                from.runtime.list_pod_sandbox(cri::ListPodSandboxRequest {
                    filter: Some(cri::PodSandboxFilter {
                        label_selector: labels::selector(uid),
                        ..Default::default()
                    }),
                }),
            )
            .await?
            .items;
        let mut fresh_sandboxes = Vec::with_capacity(sandboxes.len());
        for sb in sandboxes {
            let ready = sb.state == cri::PodSandboxState::SandboxReady as i32;
            if let Some(known) = self.sandboxes.iter().find(|k| *k.id == sb.id && k.ready == ready) {
                fresh_sandboxes.push(known.clone());
                continue;
            }
            let mut ips = self
                .sandboxes
                .iter()
                .find(|k| *k.id == sb.id)
                .map(|k| k.ips.clone())
                .unwrap_or_default();
            if ready {
                match from
                    .metrics
                    .runtime_op(
                        "podsandbox_status",
                        from.runtime.pod_sandbox_status(cri::PodSandboxStatusRequest {
                            pod_sandbox_id: sb.id.clone(),
                            verbose: false,
                        }),
                    )
                    .await
                {
                    Ok(resp) => {
                        if let Some(net) = resp.status.and_then(|s| s.network) {
                            ips.clear();
                            ips.extend(std::iter::once(net.ip).filter(|ip| !ip.is_empty()));
                            ips.extend(net.additional_ips.into_iter().map(|i| i.ip));
                        }
                    }
                    Err(e) if e.is_not_found() => continue,
                    Err(e) => return Err(e),
                }
            }
            fresh_sandboxes.push(SandboxRecord {
                attempt: sb.metadata.map(|m| m.attempt).unwrap_or(0),
                id: sb.id.into(),
                ready,
                created_at: sb.created_at,
                ips,
            });
        }
        fresh_sandboxes.sort_by_key(|s| std::cmp::Reverse((s.attempt, s.created_at)));

        let containers = from
            .metrics
            .runtime_op(
                "list_containers",
                from.runtime.list_containers(cri::ListContainersRequest {
                    filter: Some(cri::ContainerFilter {
                        label_selector: labels::selector(uid),
                        ..Default::default()
                    }),
                }),
            )
            .await?
            .containers;
        let mut fresh = Vec::with_capacity(containers.len());
        for c in containers {
            let state = CState::from_cri(c.state);
            let reuse = exited == Reread::Kept || state != CState::Exited;
            if let Some(known) = self
                .containers
                .iter()
                .find(|k| reuse && *k.id == *c.id && k.state == state)
            {
                fresh.push(known.clone());
                continue;
            }
            let id = c.id;
            // the sandbox's own ID when it is listed (one allocation for the pod's records)
            let sandbox_id = match fresh_sandboxes.iter().find(|s| *s.id == c.pod_sandbox_id) {
                Some(s) => s.id.clone(),
                None => Arc::from(c.pod_sandbox_id),
            };
            let asked = from.metrics.runtime_op(
                "container_status",
                from.runtime.container_status(cri::ContainerStatusRequest {
                    container_id: id,
                    verbose: false,
                }),
            );
            // Every sync and every termination holds this refresh: the answer is matched in the statement that
            // awaits it (bound apart, its room would be kept across the wait below), and the status waits for its
            // termination message inside a boxed read, so the refresh holds room for neither.
            let s = match asked.await {
                Ok(resp) => match resp.status {
                    Some(s) => s,
                    None => continue,
                },
                Err(e) if e.is_not_found() => continue,
                Err(e) => return Err(e),
            };
            let s = if from.termination_messages && CState::from_cri(s.state) == CState::Exited {
                // a real node: what the container left in its termination message file
                Box::pin(with_termination_message(s)).await
            } else {
                s
            };
            let mut rec = ContainerRecord::from_status(s, sandbox_id);
            // keep the clocks of what was seen before
            if let Some(known) = self.containers.iter().find(|k| k.id == rec.id) {
                rec.exited_seen = known.exited_seen.or(rec.exited_seen);
                rec.started_seen = known.started_seen.or(rec.started_seen);
            }
            fresh.push(rec);
        }
        fresh.sort_by(|a, b| {
            (&a.name, std::cmp::Reverse((a.restart_count, a.created_at)))
                .cmp(&(&b.name, std::cmp::Reverse((b.restart_count, b.created_at))))
        });
        self.sandboxes = fresh_sandboxes;
        self.containers = fresh;
        Ok(())
    }
}

/// `status` with the message its container left in its termination message file.
async fn with_termination_message(mut status: cri::ContainerStatus) -> cri::ContainerStatus {
    status.message = crate::pods::runtime::termination::read(&status).await;
    status
}
