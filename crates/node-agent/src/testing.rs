//! A minimal scriptable [`Runtime`] for this crate's unit tests of the runtime health monitor and of whole
//! agents: `Status` and `Version` answer (and are counted); the lists answer once asked to (a node holding one
//! sandbox that is not the agent's, nothing else), and can be made to hang; the container event stream can be
//! made to open (and stay quiet) or to hang; everything else is `Unimplemented`. Pod lifecycle tests use the `cri-fake` runtime instead. [`api`] is an API server double.

pub(crate) mod api;

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};

use async_trait::async_trait;
use runtime_api::{EventStream, Result, Runtime, RuntimeError, cri};

#[derive(Debug, Default)]
pub(crate) struct TestRuntime {
    runtime_down: AtomicBool,
    network_down: AtomicBool,
    unreachable: AtomicBool,
    status_calls: AtomicUsize,
    version_calls: AtomicUsize,
    /// How the lists answer: [`LISTS_UNIMPLEMENTED`], [`LISTS_ANSWER`] or [`LISTS_STALLED`].
    lists: AtomicU8,
    /// Wakes the list calls waiting while the lists are stalled.
    lists_changed: tokio::sync::Notify,
    /// How `GetContainerEvents` answers: [`EVENTS_UNIMPLEMENTED`], [`EVENTS_QUIET`] or [`EVENTS_STALLED`].
    events: AtomicU8,
}

const EVENTS_UNIMPLEMENTED: u8 = 0;
const EVENTS_QUIET: u8 = 1;
const EVENTS_STALLED: u8 = 2;

const LISTS_UNIMPLEMENTED: u8 = 0;
const LISTS_ANSWER: u8 = 1;
const LISTS_STALLED: u8 = 2;

/// The sandbox the lists report: ready, and not labelled as one of the agent's pods.
fn foreign_sandbox() -> cri::PodSandbox {
    cri::PodSandbox {
        id: "not-the-agents".into(),
        metadata: Some(cri::PodSandboxMetadata {
            name: "foreign".into(),
            uid: "foreign".into(),
            namespace: "elsewhere".into(),
            attempt: 0,
        }),
        state: cri::PodSandboxState::SandboxReady as i32,
        ..Default::default()
    }
}

impl TestRuntime {
    pub(crate) fn new() -> Self {
        Self::default()
    }
    pub(crate) fn set_runtime_ready(&self, ready: bool) {
        self.runtime_down.store(!ready, Ordering::SeqCst);
    }
    pub(crate) fn set_network_ready(&self, ready: bool) {
        self.network_down.store(!ready, Ordering::SeqCst);
    }
    pub(crate) fn set_unreachable(&self, unreachable: bool) {
        self.unreachable.store(unreachable, Ordering::SeqCst);
    }
    pub(crate) fn status_calls(&self) -> usize {
        self.status_calls.load(Ordering::SeqCst)
    }
    pub(crate) fn version_calls(&self) -> usize {
        self.version_calls.load(Ordering::SeqCst)
    }
    /// `ListPodSandbox`, `ListContainers` and `ListImages` answer (until now `Unimplemented`).
    pub(crate) fn answer_lists(&self) {
        self.lists.store(LISTS_ANSWER, Ordering::SeqCst);
        self.lists_changed.notify_waiters();
    }

    /// `ListPodSandbox` and `ListContainers` never answer while `stalled` (calls in flight answer once it is
    /// lifted); `ListImages` answers on.
    pub(crate) fn stall_lists(&self, stalled: bool) {
        let mode = if stalled { LISTS_STALLED } else { LISTS_ANSWER };
        self.lists.store(mode, Ordering::SeqCst);
        self.lists_changed.notify_waiters();
    }

    /// `GetContainerEvents` opens a stream that never says anything (`quiet`), or never answers.
    pub(crate) fn events(&self, quiet: bool) {
        let mode = if quiet { EVENTS_QUIET } else { EVENTS_STALLED };
        self.events.store(mode, Ordering::SeqCst);
    }

    /// Waits while the lists are stalled; whether they answer.
    async fn lists(&self, stalls: bool) -> Result<()> {
        loop {
            // made before the mode is read: a change in between still wakes it
            let changed = self.lists_changed.notified();
            match self.lists.load(Ordering::SeqCst) {
                LISTS_UNIMPLEMENTED => return Err(RuntimeError::unimplemented("lists")),
                LISTS_STALLED if stalls => changed.await,
                _ => return Ok(()),
            }
        }
    }

    fn check(&self) -> Result<()> {
        if self.unreachable.load(Ordering::SeqCst) {
            Err(RuntimeError::unavailable("connection refused"))
        } else {
            Ok(())
        }
    }
}

fn cond(t: &str, ok: bool, reason: &str) -> cri::RuntimeCondition {
    cri::RuntimeCondition {
        r#type: t.into(),
        status: ok,
        reason: if ok { String::new() } else { reason.into() },
        message: if ok { String::new() } else { "test says so".into() },
    }
}

macro_rules! runtime_impl {
    ($($name:ident($req:ty) -> $resp:ty;)*) => {
#[async_trait]
impl Runtime for TestRuntime {
    $(
        async fn $name(&self, _req: $req) -> Result<$resp> {
            Err(RuntimeError::unimplemented(stringify!($name)))
        }
    )*

    async fn version(&self, _req: cri::VersionRequest) -> Result<cri::VersionResponse> {
        self.check()?;
        self.version_calls.fetch_add(1, Ordering::SeqCst);
        Ok(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: "fake-runtime".into(),
            runtime_version: "0.1.0".into(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self, _req: cri::StatusRequest) -> Result<cri::StatusResponse> {
        self.status_calls.fetch_add(1, Ordering::SeqCst);
        self.check()?;
        Ok(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![
                    cond("RuntimeReady", !self.runtime_down.load(Ordering::SeqCst), "RuntimeDown"),
                    cond("NetworkReady", !self.network_down.load(Ordering::SeqCst), "NetworkPluginNotReady"),
                ],
            }),
            ..Default::default()
        })
    }

    async fn list_pod_sandbox(&self, _req: cri::ListPodSandboxRequest) -> Result<cri::ListPodSandboxResponse> {
        self.lists(true).await?;
        Ok(cri::ListPodSandboxResponse { items: vec![foreign_sandbox()] })
    }

    async fn list_containers(&self, _req: cri::ListContainersRequest) -> Result<cri::ListContainersResponse> {
        self.lists(true).await?;
        Ok(cri::ListContainersResponse::default())
    }

    async fn list_images(&self, _req: cri::ListImagesRequest) -> Result<cri::ListImagesResponse> {
        self.lists(false).await?;
        Ok(cri::ListImagesResponse::default())
    }

    async fn get_container_events(&self, _req: cri::GetEventsRequest) -> Result<EventStream> {
        match self.events.load(Ordering::SeqCst) {
            EVENTS_UNIMPLEMENTED => Err(RuntimeError::unimplemented("get_container_events")),
            EVENTS_QUIET => Ok(Box::pin(futures::stream::pending())),
            _ => std::future::pending().await,
        }
    }
}
    };
}

runtime_impl! {
    run_pod_sandbox(cri::RunPodSandboxRequest) -> cri::RunPodSandboxResponse;
    stop_pod_sandbox(cri::StopPodSandboxRequest) -> cri::StopPodSandboxResponse;
    remove_pod_sandbox(cri::RemovePodSandboxRequest) -> cri::RemovePodSandboxResponse;
    pod_sandbox_status(cri::PodSandboxStatusRequest) -> cri::PodSandboxStatusResponse;
    create_container(cri::CreateContainerRequest) -> cri::CreateContainerResponse;
    start_container(cri::StartContainerRequest) -> cri::StartContainerResponse;
    stop_container(cri::StopContainerRequest) -> cri::StopContainerResponse;
    remove_container(cri::RemoveContainerRequest) -> cri::RemoveContainerResponse;
    container_status(cri::ContainerStatusRequest) -> cri::ContainerStatusResponse;
    exec_sync(cri::ExecSyncRequest) -> cri::ExecSyncResponse;
    container_stats(cri::ContainerStatsRequest) -> cri::ContainerStatsResponse;
    list_container_stats(cri::ListContainerStatsRequest) -> cri::ListContainerStatsResponse;
    pod_sandbox_stats(cri::PodSandboxStatsRequest) -> cri::PodSandboxStatsResponse;
    update_runtime_config(cri::UpdateRuntimeConfigRequest) -> cri::UpdateRuntimeConfigResponse;
    list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest) -> cri::ListPodSandboxStatsResponse;
    image_status(cri::ImageStatusRequest) -> cri::ImageStatusResponse;
    pull_image(cri::PullImageRequest) -> cri::PullImageResponse;
    remove_image(cri::RemoveImageRequest) -> cri::RemoveImageResponse;
    image_fs_info(cri::ImageFsInfoRequest) -> cri::ImageFsInfoResponse;
}

/// Lets `total` of paused time pass in 100 ms steps, running whatever each step woke (a jump in one step would
/// fire every timer due within it at once, and run the tasks they wake only after it).
pub(crate) async fn pass(total: std::time::Duration) {
    let step = std::time::Duration::from_millis(100);
    let mut left = total;
    while !left.is_zero() {
        let d = step.min(left);
        tokio::time::advance(d).await;
        // a request through a client hops through its buffer task and back: a few turns of the scheduler
        for _ in 0..16 {
            tokio::task::yield_now().await;
        }
        left -= d;
    }
}

/// Runs a sandbox on `rt` for pod `name` of UID `uid` (namespace `default`, labelled with the UID as the agent
/// labels its own) and returns its ID: a sandbox the tests' pod events did not make.
pub(crate) async fn run_sandbox(rt: &dyn Runtime, name: &str, uid: &str) -> String {
    rt.run_pod_sandbox(cri::RunPodSandboxRequest {
        config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: name.into(),
                uid: uid.into(),
                namespace: "default".into(),
                attempt: 0,
            }),
            labels: crate::pods::runtime::labels::selector(uid),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap()
    .pod_sandbox_id
}
