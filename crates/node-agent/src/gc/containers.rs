//! The container garbage collector of one node: lists what the runtime holds, asks the pod manager which pods
//! the node still has, and removes what [`select`](super::select) picks — dead containers (with their log
//! files on a real node), sandboxes, and the log directories of pods that are gone.
//!
//! Everything is read before the pod manager is asked, so a pod admitted meanwhile cannot be mistaken for a
//! deleted one: whatever the runtime listed of it was made by a worker the manager already had. A failed
//! removal is logged and retried at the next pass; only a failed listing fails the pass.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use runtime_api::{Runtime, RuntimeError, cri};

use super::select::{self, ContainerPolicy, Instance, SandboxInstance, Scope, Victim};
use crate::config::GcSettings;
use crate::pods::runtime::labels;
use crate::pods::{KnownPods, PodsQuery};

/// How long a pass waits for the pod manager's answer before treating the pod sources as not seen yet.
const ASK_TIMEOUT: Duration = Duration::from_secs(10);
/// `StopContainer`'s timeout for a container in an unknown state (the kubelet's minimum grace period).
const STOP_TIMEOUT_SECS: i64 = 2;

/// Why a container GC pass failed.
#[derive(Debug, thiserror::Error)]
pub enum ContainerGcError {
    /// Listing containers or sandboxes failed.
    #[error("failed to list {what}: {source}")]
    List {
        /// `containers` or `pod sandboxes`.
        what: &'static str,
        /// The runtime's error.
        #[source]
        source: RuntimeError,
    },
    /// The pod log directory could not be read.
    #[error("failed to read podLogsDirectory {dir:?}: {source}")]
    LogDir {
        /// The directory.
        dir: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What one pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContainerGcReport {
    /// Dead containers removed.
    pub containers: usize,
    /// Sandboxes removed.
    pub sandboxes: usize,
    /// Pod log directories removed.
    pub log_dirs: usize,
    /// Removals that failed (retried at the next pass).
    pub failed: usize,
}

/// The container garbage collector of one node. Cheap to clone; passes never overlap.
#[derive(Clone)]
pub struct ContainerGc {
    inner: Arc<Inner>,
}

struct Inner {
    runtime: Arc<dyn Runtime>,
    policy: ContainerPolicy,
    pods: PodsQuery,
    /// The pod log directory of a real node (container log files and directories are removed there);
    /// `None` on a hollow node, which has no logs on disk.
    pod_logs_dir: Option<PathBuf>,
    /// One pass at a time.
    running: tokio::sync::Mutex<()>,
    clock: WallClock,
}

/// Wall-clock time (what CRI timestamps are) advancing with the tokio clock, so container ages are measured
/// on the same clock as every timer of the agent (and paused in tests). The fake runtime keeps its timestamps
/// the same way: under paused time the two agree when both were made before time was advanced.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WallClock {
    at: tokio::time::Instant,
    ns: i64,
}

impl WallClock {
    pub(crate) fn new() -> Self {
        Self {
            at: tokio::time::Instant::now(),
            ns: i64::try_from(Timestamp::now().as_nanosecond()).unwrap_or(i64::MAX / 2),
        }
    }

    /// Now, in Unix nanoseconds.
    pub(crate) fn now_ns(&self) -> i64 {
        self.ns
            .saturating_add(i64::try_from(self.at.elapsed().as_nanos()).unwrap_or(i64::MAX / 2))
    }
}

impl std::fmt::Debug for ContainerGc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContainerGc")
            .field("policy", &self.inner.policy)
            .finish_non_exhaustive()
    }
}

impl ContainerGc {
    /// A collector for `runtime` with the policy of `settings`, asking `pods` which pods exist. With
    /// `pod_logs_dir` (a real node) log files and the log directories of gone pods are removed too.
    pub fn new(
        runtime: Arc<dyn Runtime>,
        settings: &GcSettings,
        pods: PodsQuery,
        pod_logs_dir: Option<PathBuf>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                runtime,
                policy: ContainerPolicy {
                    min_age: settings.minimum_container_ttl,
                    max_per_container: settings.max_dead_per_container,
                    max_containers: settings.max_dead_containers,
                },
                pods,
                pod_logs_dir,
                running: tokio::sync::Mutex::new(()),
                clock: WallClock::new(),
            }),
        }
    }

    /// The policy.
    pub fn policy(&self) -> ContainerPolicy {
        self.inner.policy
    }

    /// One periodic pass (the kubelet's `GarbageCollect`): dead containers by the policy, all of those of
    /// pods that are gone, inactive sandboxes, log directories of gone pods.
    pub async fn collect(&self) -> Result<ContainerGcReport, ContainerGcError> {
        self.pass(Scope::Deleted).await
    }

    /// A pass that also removes everything of pods that are terminated but not deleted yet (the kubelet's
    /// `DeleteAllUnusedContainers`, run before evicting pods for disk pressure). The policy holds otherwise,
    /// and so does the rule that the two newest instances of each container of a living pod stay.
    pub async fn delete_all_unused(&self) -> Result<ContainerGcReport, ContainerGcError> {
        tracing::info!("attempting to delete unused containers");
        self.pass(Scope::AllUnused).await
    }

    async fn pass(&self, scope: Scope) -> Result<ContainerGcReport, ContainerGcError> {
        let _one = self.inner.running.lock().await;
        let rt = &self.inner.runtime;
        let containers = rt
            .list_containers(cri::ListContainersRequest::default())
            .await
            .map_err(|source| ContainerGcError::List {
                what: "containers",
                source,
            })?
            .containers;
        let sandboxes = rt
            .list_pod_sandbox(cri::ListPodSandboxRequest::default())
            .await
            .map_err(|source| ContainerGcError::List {
                what: "pod sandboxes",
                source,
            })?
            .items;
        let log_dirs = match &self.inner.pod_logs_dir {
            Some(dir) => read_dir_names(dir).await?,
            None => Vec::new(),
        };
        // asked only now: every object listed above was made by a worker the manager already had
        let pods: Option<KnownPods> = tokio::time::timeout(ASK_TIMEOUT, self.inner.pods.known_pods())
            .await
            .ok()
            .flatten();

        let instances: Vec<Instance> = containers.iter().filter_map(instance).collect();
        let now = self.inner.clock.now_ns();
        let victims = select::containers(&instances, now, &self.inner.policy, pods.as_ref(), scope);
        let mut report = ContainerGcReport::default();
        let mut removed: HashSet<&str> = HashSet::new();
        for v in &victims {
            match self.remove_container(v).await {
                Ok(()) => {
                    report.containers += 1;
                    removed.insert(v.id.as_str());
                }
                Err(error) => {
                    report.failed += 1;
                    tracing::warn!(container = %v.id, pod = %v.uid, name = %v.name, %error, "failed to remove a dead container");
                }
            }
        }

        let busy: HashSet<&str> = containers
            .iter()
            .filter(|c| !removed.contains(c.id.as_str()))
            .map(|c| c.pod_sandbox_id.as_str())
            .collect();
        let sandboxes: Vec<SandboxInstance> = sandboxes.iter().filter_map(sandbox_instance).collect();
        for id in select::sandboxes(&sandboxes, &busy, pods.as_ref(), scope) {
            match self.remove_sandbox(&id).await {
                Ok(()) => report.sandboxes += 1,
                Err(error) => {
                    report.failed += 1;
                    tracing::warn!(sandbox = %id, %error, "failed to remove a pod sandbox");
                }
            }
        }

        if let Some(dir) = &self.inner.pod_logs_dir {
            for name in select::log_dirs(&log_dirs, pods.as_ref()) {
                let path = dir.join(name);
                match tokio::fs::remove_dir_all(&path).await {
                    Ok(()) => {
                        report.log_dirs += 1;
                        tracing::info!(path = %path.display(), "removed the log directory of a pod that is gone");
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(error) => {
                        report.failed += 1;
                        tracing::warn!(path = %path.display(), %error, "failed to remove a pod log directory");
                    }
                }
            }
        }
        if report != ContainerGcReport::default() {
            tracing::info!(
                containers = report.containers,
                sandboxes = report.sandboxes,
                log_dirs = report.log_dirs,
                failed = report.failed,
                "container garbage collection"
            );
        }
        Ok(report)
    }

    /// Removes one dead container (stopping it first when its state is unknown) and, on a real node, its log
    /// file.
    async fn remove_container(&self, v: &Victim) -> Result<(), RuntimeError> {
        let rt = &self.inner.runtime;
        if v.stop_first {
            let req = cri::StopContainerRequest {
                container_id: v.id.clone(),
                timeout: STOP_TIMEOUT_SECS,
            };
            ok_if_gone(rt.stop_container(req).await)?;
        }
        if self.inner.pod_logs_dir.is_some() {
            let req = cri::ContainerStatusRequest {
                container_id: v.id.clone(),
                verbose: false,
            };
            let log_path = match rt.container_status(req).await {
                Ok(resp) => resp.status.map(|s| s.log_path).unwrap_or_default(),
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) => return Err(e),
            };
            if !log_path.is_empty()
                && let Err(error) = tokio::fs::remove_file(&log_path).await
                && error.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!(path = %log_path, %error, "failed to remove a container log file");
            }
        }
        let req = cri::RemoveContainerRequest {
            container_id: v.id.clone(),
        };
        ok_if_gone(rt.remove_container(req).await)?;
        tracing::debug!(container = %v.id, pod = %v.uid, name = %v.name, "removed a dead container");
        Ok(())
    }

    /// Stops (in case nobody did) and removes one sandbox.
    async fn remove_sandbox(&self, id: &str) -> Result<(), RuntimeError> {
        let rt = &self.inner.runtime;
        let stop = cri::StopPodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        ok_if_gone(rt.stop_pod_sandbox(stop).await)?;
        let remove = cri::RemovePodSandboxRequest {
            pod_sandbox_id: id.to_owned(),
        };
        ok_if_gone(rt.remove_pod_sandbox(remove).await)?;
        tracing::debug!(sandbox = %id, "removed a pod sandbox");
        Ok(())
    }
}

fn ok_if_gone<T>(r: Result<T, RuntimeError>) -> Result<(), RuntimeError> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// A listed container of a pod of this agent (labelled with its pod UID); others are not touched.
fn instance(c: &cri::Container) -> Option<Instance> {
    let uid = c.labels.get(labels::POD_UID)?.clone();
    let name = c
        .labels
        .get(labels::CONTAINER_NAME)
        .cloned()
        .or_else(|| c.metadata.as_ref().map(|m| m.name.clone()))?;
    let state = cri::ContainerState::try_from(c.state).ok();
    Some(Instance {
        id: c.id.clone(),
        uid,
        name,
        created_at: c.created_at,
        restart_count: labels::restart_count(&c.annotations),
        running: state == Some(cri::ContainerState::ContainerRunning),
        unknown: !matches!(
            state,
            Some(
                cri::ContainerState::ContainerRunning
                    | cri::ContainerState::ContainerExited
                    | cri::ContainerState::ContainerCreated
            )
        ),
    })
}

/// A listed sandbox of a pod of this agent.
fn sandbox_instance(s: &cri::PodSandbox) -> Option<SandboxInstance> {
    let uid = s
        .metadata
        .as_ref()
        .map(|m| m.uid.clone())
        .filter(|u| !u.is_empty())
        .or_else(|| s.labels.get(labels::POD_UID).cloned())?;
    Some(SandboxInstance {
        id: s.id.clone(),
        uid,
        created_at: s.created_at,
        ready: s.state == cri::PodSandboxState::SandboxReady as i32,
    })
}

/// The entries of the pod log directory (none when it does not exist yet).
async fn read_dir_names(dir: &PathBuf) -> Result<Vec<String>, ContainerGcError> {
    let mut entries = match tokio::fs::read_dir(dir).await {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(ContainerGcError::LogDir {
                dir: dir.clone(),
                source,
            });
        }
    };
    let mut names = Vec::new();
    loop {
        match entries.next_entry().await {
            Ok(Some(entry)) => names.extend(entry.file_name().into_string().ok()),
            Ok(None) => return Ok(names),
            Err(source) => {
                return Err(ContainerGcError::LogDir {
                    dir: dir.clone(),
                    source,
                });
            }
        }
    }
}
