//! The CRI calls of [`FakeRuntime`]: argument checks and error codes as containerd gives them (the conformance
//! walk-through in `crates/cri-real/tests` holds the two side by side), scripted latencies, and the state
//! transitions of `store.rs`. This module owns the trait implementation and the runtime-wide calls; the
//! per-object calls live in `sandboxes`, `containers` and `images` (which also answers the stats calls).

mod containers;
mod images;
mod sandboxes;

use async_trait::async_trait;
use futures::StreamExt;
use runtime_api::{Code, EventStream, Result, Runtime, RuntimeError, cri};

use crate::runtime::FakeRuntime;
use crate::script::ScriptError;

fn invalid(err: ScriptError) -> RuntimeError {
    RuntimeError::invalid_argument(err.to_string())
}

fn unknown(message: impl Into<String>) -> RuntimeError {
    RuntimeError::new(Code::Unknown, message)
}

fn map_iter(map: &std::collections::HashMap<String, String>) -> impl Iterator<Item = (&str, &str)> + Clone {
    map.iter().map(|(k, v)| (k.as_str(), v.as_str()))
}

#[async_trait]
impl Runtime for FakeRuntime {
    async fn version(&self, _req: cri::VersionRequest) -> Result<cri::VersionResponse> {
        self.check_reachable()?;
        Ok(cri::VersionResponse {
            version: "0.1.0".into(),
            runtime_name: self.inner.names.name.to_string(),
            runtime_version: self.inner.names.version.to_string(),
            runtime_api_version: "v1".into(),
        })
    }

    async fn status(&self, _req: cri::StatusRequest) -> Result<cri::StatusResponse> {
        self.check_reachable()?;
        let st = self.lock();
        let condition = |kind: &str, ok: bool, reason: &str, message: &str| cri::RuntimeCondition {
            r#type: kind.into(),
            status: ok,
            reason: if ok { String::new() } else { reason.into() },
            message: if ok { String::new() } else { message.into() },
        };
        Ok(cri::StatusResponse {
            status: Some(cri::RuntimeStatus {
                conditions: vec![
                    condition(
                        "RuntimeReady",
                        st.runtime_ready,
                        "RuntimeNotReady",
                        "cri-fake: runtime marked not ready",
                    ),
                    condition(
                        "NetworkReady",
                        st.network_ready && st.ipam.is_some(),
                        "NetworkPluginNotReady",
                        if st.ipam.is_none() {
                            "Network plugin returns error: cni plugin not initialized"
                        } else {
                            "cri-fake: network plugin marked not ready"
                        },
                    ),
                ],
            }),
            runtime_handlers: vec![cri::RuntimeHandler {
                name: String::new(),
                features: Some(cri::RuntimeHandlerFeatures::default()),
            }],
            features: Some(cri::RuntimeFeatures::default()),
            ..Default::default()
        })
    }

    async fn run_pod_sandbox(&self, req: cri::RunPodSandboxRequest) -> Result<cri::RunPodSandboxResponse> {
        sandboxes::run_pod_sandbox(self, req).await
    }

    async fn stop_pod_sandbox(&self, req: cri::StopPodSandboxRequest) -> Result<cri::StopPodSandboxResponse> {
        sandboxes::stop_pod_sandbox(self, req).await
    }

    async fn remove_pod_sandbox(
        &self,
        req: cri::RemovePodSandboxRequest,
    ) -> Result<cri::RemovePodSandboxResponse> {
        sandboxes::remove_pod_sandbox(self, req).await
    }

    async fn pod_sandbox_status(
        &self,
        req: cri::PodSandboxStatusRequest,
    ) -> Result<cri::PodSandboxStatusResponse> {
        sandboxes::pod_sandbox_status(self, req).await
    }

    async fn list_pod_sandbox(&self, req: cri::ListPodSandboxRequest) -> Result<cri::ListPodSandboxResponse> {
        sandboxes::list_pod_sandbox(self, req).await
    }

    async fn create_container(
        &self,
        req: cri::CreateContainerRequest,
    ) -> Result<cri::CreateContainerResponse> {
        containers::create_container(self, req).await
    }

    async fn start_container(&self, req: cri::StartContainerRequest) -> Result<cri::StartContainerResponse> {
        containers::start_container(self, req).await
    }

    async fn stop_container(&self, req: cri::StopContainerRequest) -> Result<cri::StopContainerResponse> {
        containers::stop_container(self, req).await
    }

    async fn remove_container(
        &self,
        req: cri::RemoveContainerRequest,
    ) -> Result<cri::RemoveContainerResponse> {
        containers::remove_container(self, req).await
    }

    async fn list_containers(&self, req: cri::ListContainersRequest) -> Result<cri::ListContainersResponse> {
        containers::list_containers(self, req).await
    }

    async fn container_status(
        &self,
        req: cri::ContainerStatusRequest,
    ) -> Result<cri::ContainerStatusResponse> {
        containers::container_status(self, req).await
    }

    async fn exec_sync(&self, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse> {
        containers::exec_sync(self, req).await
    }

    async fn update_container_resources(
        &self,
        req: cri::UpdateContainerResourcesRequest,
    ) -> Result<cri::UpdateContainerResourcesResponse> {
        containers::update_container_resources(self, req).await
    }

    async fn reopen_container_log(
        &self,
        req: cri::ReopenContainerLogRequest,
    ) -> Result<cri::ReopenContainerLogResponse> {
        containers::reopen_container_log(self, req).await
    }

    async fn container_stats(&self, req: cri::ContainerStatsRequest) -> Result<cri::ContainerStatsResponse> {
        images::container_stats(self, req).await
    }

    async fn list_container_stats(
        &self,
        req: cri::ListContainerStatsRequest,
    ) -> Result<cri::ListContainerStatsResponse> {
        images::list_container_stats(self, req).await
    }

    async fn pod_sandbox_stats(
        &self,
        req: cri::PodSandboxStatsRequest,
    ) -> Result<cri::PodSandboxStatsResponse> {
        images::pod_sandbox_stats(self, req).await
    }

    async fn list_pod_sandbox_stats(
        &self,
        req: cri::ListPodSandboxStatsRequest,
    ) -> Result<cri::ListPodSandboxStatsResponse> {
        images::list_pod_sandbox_stats(self, req).await
    }

    async fn update_runtime_config(
        &self,
        req: cri::UpdateRuntimeConfigRequest,
    ) -> Result<cri::UpdateRuntimeConfigResponse> {
        self.check_reachable()?;
        let cidr = req
            .runtime_config
            .and_then(|c| c.network_config)
            .map(|n| n.pod_cidr)
            .unwrap_or_default();
        if cidr.trim().is_empty() {
            return Ok(cri::UpdateRuntimeConfigResponse {});
        }
        let mut ipam =
            crate::ipam::Ipam::new(&cidr).map_err(|e| RuntimeError::invalid_argument(e.to_string()))?;
        let mut st = self.lock();
        for sb in st.sandboxes.values() {
            ipam.reserve(&sb.ips.to_vec());
        }
        st.ipam = Some(ipam);
        Ok(cri::UpdateRuntimeConfigResponse {})
    }

    async fn get_container_events(&self, _req: cri::GetEventsRequest) -> Result<EventStream> {
        self.check_reachable()?;
        // a linked queue, next to nothing while idle (tokio's unbounded channel allocates its first block up
        // front): every hollow node holds one of these streams for its PLEG
        let (tx, rx) = futures::channel::mpsc::unbounded();
        self.lock().subscribers.push(tx);
        Ok(rx.map(|e: Box<cri::ContainerEventResponse>| Ok(*e)).boxed())
    }

    async fn list_images(&self, req: cri::ListImagesRequest) -> Result<cri::ListImagesResponse> {
        images::list_images(self, req).await
    }

    async fn image_status(&self, req: cri::ImageStatusRequest) -> Result<cri::ImageStatusResponse> {
        images::image_status(self, req).await
    }

    async fn pull_image(&self, req: cri::PullImageRequest) -> Result<cri::PullImageResponse> {
        images::pull_image(self, req).await
    }

    async fn remove_image(&self, req: cri::RemoveImageRequest) -> Result<cri::RemoveImageResponse> {
        images::remove_image(self, req).await
    }

    async fn image_fs_info(&self, _req: cri::ImageFsInfoRequest) -> Result<cri::ImageFsInfoResponse> {
        images::image_fs_info(self, _req).await
    }
}
