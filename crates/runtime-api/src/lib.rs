//! The container runtime seen by the node agent.
//!
//! This crate owns one thing: the [`Runtime`] trait, shaped exactly like the CRI v1 `RuntimeService` and
//! `ImageService` (same request and response messages, from the `k8s-cri` crate), plus the [`RuntimeError`]
//! every implementation returns. The agent core depends only on this crate; `cri-real` implements it over a CRI
//! gRPC client (containerd, CRI-O) and `cri-fake` implements it in memory for hollow nodes.
//!
//! Messages are the generated CRI types re-exported as [`cri`], so nothing here hand-writes a CRI message.

use async_trait::async_trait;
use futures::stream::BoxStream;

/// The CRI v1 message types (re-exported from `k8s-cri`).
pub use k8s_cri::v1 as cri;

/// The gRPC status code carried by a [`RuntimeError`]; the same codes a real CRI runtime answers with.
pub use tonic::Code;

/// An error from a container runtime: a gRPC status code and a message, as a CRI runtime reports it.
///
/// Implementations use the codes a real runtime would: `NotFound` for an unknown id, `FailedPrecondition`
/// or `Unknown` for an operation the object's state forbids, `Unavailable` when the runtime cannot be reached,
/// `Unimplemented` for an RPC the runtime does not offer (e.g. `GetContainerEvents` on containerd 1.6).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct RuntimeError {
    /// The gRPC status code.
    pub code: Code,
    /// The runtime's message.
    pub message: String,
}

impl RuntimeError {
    /// An error with the given code and message.
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }

    /// `NotFound`: the named object does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(Code::NotFound, message)
    }

    /// `InvalidArgument`: the request is malformed.
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(Code::InvalidArgument, message)
    }

    /// `FailedPrecondition`: the object's state forbids the operation.
    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(Code::FailedPrecondition, message)
    }

    /// `Unavailable`: the runtime cannot be reached or is not ready.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(Code::Unavailable, message)
    }

    /// `Unimplemented`: the runtime does not offer this call.
    pub fn unimplemented(message: impl Into<String>) -> Self {
        Self::new(Code::Unimplemented, message)
    }

    /// Whether this is a `NotFound` error (the object is already gone).
    pub fn is_not_found(&self) -> bool {
        self.code == Code::NotFound
    }
}

impl From<tonic::Status> for RuntimeError {
    fn from(status: tonic::Status) -> Self {
        Self::new(status.code(), status.message())
    }
}

impl From<RuntimeError> for tonic::Status {
    fn from(err: RuntimeError) -> Self {
        tonic::Status::new(err.code, err.message)
    }
}

/// Result of a runtime call.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// A stream of container lifecycle events (`GetContainerEvents`).
pub type EventStream = BoxStream<'static, Result<cri::ContainerEventResponse>>;

/// A container runtime with the CRI v1 `RuntimeService` and `ImageService` calls the node agent uses.
///
/// Every method takes and returns the CRI message of the same name. Implementations must be cheap to share
/// (`Arc<dyn Runtime>`); one hollow-fleet process holds thousands of them.
#[async_trait]
pub trait Runtime: Send + Sync + 'static {
    /// `Version`: runtime name and version.
    async fn version(&self, req: cri::VersionRequest) -> Result<cri::VersionResponse>;
    /// `Status`: runtime conditions (RuntimeReady, NetworkReady).
    async fn status(&self, req: cri::StatusRequest) -> Result<cri::StatusResponse>;

    /// `RunPodSandbox`: create and start a pod sandbox (network namespace, pod IP).
    async fn run_pod_sandbox(&self, req: cri::RunPodSandboxRequest) -> Result<cri::RunPodSandboxResponse>;
    /// `StopPodSandbox`: stop every container of the sandbox and tear its network down. Idempotent.
    async fn stop_pod_sandbox(&self, req: cri::StopPodSandboxRequest) -> Result<cri::StopPodSandboxResponse>;
    /// `RemovePodSandbox`: remove a sandbox and its containers. Idempotent.
    async fn remove_pod_sandbox(
        &self,
        req: cri::RemovePodSandboxRequest,
    ) -> Result<cri::RemovePodSandboxResponse>;
    /// `PodSandboxStatus`.
    async fn pod_sandbox_status(
        &self,
        req: cri::PodSandboxStatusRequest,
    ) -> Result<cri::PodSandboxStatusResponse>;
    /// `ListPodSandbox`, with the CRI filter (id, state, label selector).
    async fn list_pod_sandbox(&self, req: cri::ListPodSandboxRequest) -> Result<cri::ListPodSandboxResponse>;

    /// `CreateContainer` inside a sandbox.
    async fn create_container(
        &self,
        req: cri::CreateContainerRequest,
    ) -> Result<cri::CreateContainerResponse>;
    /// `StartContainer`.
    async fn start_container(&self, req: cri::StartContainerRequest) -> Result<cri::StartContainerResponse>;
    /// `StopContainer` with a grace period in seconds. Idempotent.
    async fn stop_container(&self, req: cri::StopContainerRequest) -> Result<cri::StopContainerResponse>;
    /// `RemoveContainer`. Idempotent.
    async fn remove_container(
        &self,
        req: cri::RemoveContainerRequest,
    ) -> Result<cri::RemoveContainerResponse>;
    /// `ListContainers`, with the CRI filter (id, state, sandbox id, label selector).
    async fn list_containers(&self, req: cri::ListContainersRequest) -> Result<cri::ListContainersResponse>;
    /// `ContainerStatus`.
    async fn container_status(
        &self,
        req: cri::ContainerStatusRequest,
    ) -> Result<cri::ContainerStatusResponse>;
    /// `UpdateContainerResources`: change a running container's CPU and memory (its cgroup) in place, for an
    /// in-place pod resize. Runtimes that cannot answer `Unimplemented` (the default).
    async fn update_container_resources(
        &self,
        req: cri::UpdateContainerResourcesRequest,
    ) -> Result<cri::UpdateContainerResourcesResponse> {
        let _ = req;
        Err(RuntimeError::unimplemented(
            "UpdateContainerResources: this runtime does not update resources",
        ))
    }

    /// `ExecSync`: run a command in a container and collect its output.
    async fn exec_sync(&self, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse>;

    /// `Exec`: the URL of the runtime's streaming server where one exec session is served. Runtimes without a
    /// streaming server answer `Unimplemented` (the default).
    async fn exec(&self, req: cri::ExecRequest) -> Result<cri::ExecResponse> {
        let _ = req;
        Err(RuntimeError::unimplemented(
            "Exec: this runtime serves no streams",
        ))
    }
    /// `Attach`: the URL where a stream attached to a container's stdio is served (default `Unimplemented`).
    async fn attach(&self, req: cri::AttachRequest) -> Result<cri::AttachResponse> {
        let _ = req;
        Err(RuntimeError::unimplemented(
            "Attach: this runtime serves no streams",
        ))
    }
    /// `PortForward`: the URL where port forwarding into a sandbox is served (default `Unimplemented`).
    async fn port_forward(&self, req: cri::PortForwardRequest) -> Result<cri::PortForwardResponse> {
        let _ = req;
        Err(RuntimeError::unimplemented(
            "PortForward: this runtime serves no streams",
        ))
    }

    /// `ReopenContainerLog`: the runtime closes a running container's log file and opens `logPath` again (the
    /// log rotation renamed the old file). Runtimes without it answer `Unimplemented` (the default).
    async fn reopen_container_log(
        &self,
        req: cri::ReopenContainerLogRequest,
    ) -> Result<cri::ReopenContainerLogResponse> {
        let _ = req;
        Err(RuntimeError::unimplemented(
            "ReopenContainerLog: this runtime does not reopen logs",
        ))
    }

    /// `ContainerStats`.
    async fn container_stats(&self, req: cri::ContainerStatsRequest) -> Result<cri::ContainerStatsResponse>;
    /// `ListContainerStats`.
    async fn list_container_stats(
        &self,
        req: cri::ListContainerStatsRequest,
    ) -> Result<cri::ListContainerStatsResponse>;
    /// `PodSandboxStats`.
    async fn pod_sandbox_stats(
        &self,
        req: cri::PodSandboxStatsRequest,
    ) -> Result<cri::PodSandboxStatsResponse>;
    /// `ListPodSandboxStats`.
    async fn list_pod_sandbox_stats(
        &self,
        req: cri::ListPodSandboxStatsRequest,
    ) -> Result<cri::ListPodSandboxStatsResponse>;
    /// `UpdateRuntimeConfig` (the node's pod CIDR).
    async fn update_runtime_config(
        &self,
        req: cri::UpdateRuntimeConfigRequest,
    ) -> Result<cri::UpdateRuntimeConfigResponse>;

    /// `GetContainerEvents`: a stream of container events. Runtimes without it answer `Unimplemented`, and the
    /// agent falls back to relisting.
    async fn get_container_events(&self, req: cri::GetEventsRequest) -> Result<EventStream>;

    /// `ListImages`.
    async fn list_images(&self, req: cri::ListImagesRequest) -> Result<cri::ListImagesResponse>;
    /// `ImageStatus`: `image` is `None` when the image is not present.
    async fn image_status(&self, req: cri::ImageStatusRequest) -> Result<cri::ImageStatusResponse>;
    /// `PullImage`.
    async fn pull_image(&self, req: cri::PullImageRequest) -> Result<cri::PullImageResponse>;
    /// `RemoveImage`. Idempotent.
    async fn remove_image(&self, req: cri::RemoveImageRequest) -> Result<cri::RemoveImageResponse>;
    /// `ImageFsInfo`.
    async fn image_fs_info(&self, req: cri::ImageFsInfoRequest) -> Result<cri::ImageFsInfoResponse>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_round_trip_keeps_code_and_message() {
        let err = RuntimeError::not_found("container \"abc\" not found");
        let status: tonic::Status = err.clone().into();
        assert_eq!(status.code(), Code::NotFound);
        let back = RuntimeError::from(status);
        assert_eq!(back, err);
        assert!(back.is_not_found());
        assert_eq!(back.to_string(), "NotFound: container \"abc\" not found");
    }
}
