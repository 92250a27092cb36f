//! A minimal scriptable [`Runtime`] for this crate's unit tests of the runtime health monitor: `Status` and
//! `Version` answer (and are counted); everything else is `Unimplemented`. Pod lifecycle tests use the
//! `cri-fake` runtime instead.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use async_trait::async_trait;
use runtime_api::{EventStream, Result, Runtime, RuntimeError, cri};

#[derive(Debug, Default)]
pub(crate) struct TestRuntime {
    runtime_down: AtomicBool,
    network_down: AtomicBool,
    unreachable: AtomicBool,
    status_calls: AtomicUsize,
    version_calls: AtomicUsize,
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

    async fn get_container_events(&self, _req: cri::GetEventsRequest) -> Result<EventStream> {
        Err(RuntimeError::unimplemented("get_container_events"))
    }
}
    };
}

runtime_impl! {
    run_pod_sandbox(cri::RunPodSandboxRequest) -> cri::RunPodSandboxResponse;
    stop_pod_sandbox(cri::StopPodSandboxRequest) -> cri::StopPodSandboxResponse;
    remove_pod_sandbox(cri::RemovePodSandboxRequest) -> cri::RemovePodSandboxResponse;
    pod_sandbox_status(cri::PodSandboxStatusRequest) -> cri::PodSandboxStatusResponse;
    list_pod_sandbox(cri::ListPodSandboxRequest) -> cri::ListPodSandboxResponse;
    create_container(cri::CreateContainerRequest) -> cri::CreateContainerResponse;
    start_container(cri::StartContainerRequest) -> cri::StartContainerResponse;
    stop_container(cri::StopContainerRequest) -> cri::StopContainerResponse;
    remove_container(cri::RemoveContainerRequest) -> cri::RemoveContainerResponse;
    list_containers(cri::ListContainersRequest) -> cri::ListContainersResponse;
    container_status(cri::ContainerStatusRequest) -> cri::ContainerStatusResponse;
    exec_sync(cri::ExecSyncRequest) -> cri::ExecSyncResponse;
    container_stats(cri::ContainerStatsRequest) -> cri::ContainerStatsResponse;
    list_container_stats(cri::ListContainerStatsRequest) -> cri::ListContainerStatsResponse;
    pod_sandbox_stats(cri::PodSandboxStatsRequest) -> cri::PodSandboxStatsResponse;
    list_images(cri::ListImagesRequest) -> cri::ListImagesResponse;
    update_runtime_config(cri::UpdateRuntimeConfigRequest) -> cri::UpdateRuntimeConfigResponse;
    list_pod_sandbox_stats(cri::ListPodSandboxStatsRequest) -> cri::ListPodSandboxStatsResponse;
    image_status(cri::ImageStatusRequest) -> cri::ImageStatusResponse;
    pull_image(cri::PullImageRequest) -> cri::PullImageResponse;
    remove_image(cri::RemoveImageRequest) -> cri::RemoveImageResponse;
    image_fs_info(cri::ImageFsInfoRequest) -> cri::ImageFsInfoResponse;
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
