//! Serving a [`Runtime`] as CRI v1 over gRPC on a unix socket: the k8s-cri `RuntimeService` and `ImageService`
//! servers, forwarding each call to the runtime. Calls the trait does not cover (Exec, Attach, PortForward,
//! CheckpointContainer, metrics, RuntimeConfig) answer
//! `Unimplemented`. PullImage ends at the caller's deadline (`grpc-timeout`) with `DeadlineExceeded`. Works for
//! any runtime, not only the fake.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use k8s_cri::v1::image_service_server::{ImageService, ImageServiceServer};
use k8s_cri::v1::runtime_service_server::{RuntimeService, RuntimeServiceServer};
use runtime_api::{Runtime, cri};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// Largest message accepted or sent (as the kubelet allows).
const MAX_MESSAGE: usize = 16 * 1024 * 1024;

/// Why serving failed.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Something already answers on the socket.
    #[error("{} is in use by a running server", path.display())]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// The socket could not be created.
    #[error("cannot listen on {}", path.display())]
    Bind {
        /// The socket path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The gRPC server failed.
    #[error("CRI gRPC server failed")]
    Transport(#[source] tonic::transport::Error),
}

/// The CRI gRPC services over a runtime.
pub struct CriServer<R: ?Sized> {
    runtime: Arc<R>,
}

impl<R: ?Sized> Clone for CriServer<R> {
    fn clone(&self) -> Self {
        CriServer {
            runtime: Arc::clone(&self.runtime),
        }
    }
}

impl<R: Runtime + ?Sized> CriServer<R> {
    /// Serve `runtime`.
    pub fn new(runtime: Arc<R>) -> Self {
        CriServer { runtime }
    }

    /// The tonic `RuntimeService` server.
    pub fn runtime_service(&self) -> RuntimeServiceServer<Self> {
        RuntimeServiceServer::new(self.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }

    /// The tonic `ImageService` server.
    pub fn image_service(&self) -> ImageServiceServer<Self> {
        ImageServiceServer::new(self.clone())
            .max_decoding_message_size(MAX_MESSAGE)
            .max_encoding_message_size(MAX_MESSAGE)
    }
}

/// Create the listening socket, replacing a stale socket file nobody answers on.
pub fn bind(path: impl AsRef<Path>) -> Result<UnixListener, ServeError> {
    let path = path.as_ref();
    if path.exists() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            return Err(ServeError::InUse {
                path: path.to_owned(),
            });
        }
        std::fs::remove_file(path).map_err(|source| ServeError::Bind {
            path: path.to_owned(),
            source,
        })?;
    }
    UnixListener::bind(path).map_err(|source| ServeError::Bind {
        path: path.to_owned(),
        source,
    })
}

/// Serve `runtime` on an already bound listener until `shutdown` completes.
pub async fn serve_on<R, F>(listener: UnixListener, runtime: Arc<R>, shutdown: F) -> Result<(), ServeError>
where
    R: Runtime + ?Sized,
    F: Future<Output = ()> + Send,
{
    let server = CriServer::new(runtime);
    tonic::transport::Server::builder()
        .add_service(server.runtime_service())
        .add_service(server.image_service())
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(ServeError::Transport)
}

/// Serve `runtime` as CRI v1 on the unix socket `path` until `shutdown` completes, then remove the socket.
pub async fn serve<R, F>(runtime: R, path: impl AsRef<Path>, shutdown: F) -> Result<(), ServeError>
where
    R: Runtime,
    F: Future<Output = ()> + Send,
{
    let path = path.as_ref();
    let listener = bind(path)?;
    tracing::info!(socket = %path.display(), "serving CRI v1");
    let result = serve_on(listener, Arc::new(runtime), shutdown).await;
    if let Err(error) = std::fs::remove_file(path) {
        tracing::debug!(%error, socket = %path.display(), "socket already gone");
    }
    result
}

fn unimplemented(call: &str) -> Status {
    Status::unimplemented(format!("{call} is not implemented by this runtime"))
}

/// Implement a generated service trait: forward the first list of calls to the runtime, answer the second list
/// with `Unimplemented`, and take the remaining items as written. (One macro, so `async_trait` sees every method.)
macro_rules! forward {
    (
        impl $service:ident { $($call:ident($req:ident) -> $resp:ident;)* }
        unimplemented { $($none:ident($nreq:ident) -> $nresp:ident;)* }
        $($rest:tt)*
    ) => {
        #[async_trait]
        impl<R: Runtime + ?Sized> $service for CriServer<R> {
            $(
                async fn $call(&self, request: Request<cri::$req>) -> Result<Response<cri::$resp>, Status> {
                    self.runtime.$call(request.into_inner()).await.map(Response::new).map_err(Status::from)
                }
            )*
            $(
                async fn $none(&self, _request: Request<cri::$nreq>) -> Result<Response<cri::$nresp>, Status> {
                    Err(unimplemented(stringify!($none)))
                }
            )*
            $($rest)*
        }
    };
}

forward! {
    impl RuntimeService {
        version(VersionRequest) -> VersionResponse;
        run_pod_sandbox(RunPodSandboxRequest) -> RunPodSandboxResponse;
        stop_pod_sandbox(StopPodSandboxRequest) -> StopPodSandboxResponse;
        remove_pod_sandbox(RemovePodSandboxRequest) -> RemovePodSandboxResponse;
        pod_sandbox_status(PodSandboxStatusRequest) -> PodSandboxStatusResponse;
        list_pod_sandbox(ListPodSandboxRequest) -> ListPodSandboxResponse;
        create_container(CreateContainerRequest) -> CreateContainerResponse;
        start_container(StartContainerRequest) -> StartContainerResponse;
        stop_container(StopContainerRequest) -> StopContainerResponse;
        remove_container(RemoveContainerRequest) -> RemoveContainerResponse;
        list_containers(ListContainersRequest) -> ListContainersResponse;
        container_status(ContainerStatusRequest) -> ContainerStatusResponse;
        exec_sync(ExecSyncRequest) -> ExecSyncResponse;
        reopen_container_log(ReopenContainerLogRequest) -> ReopenContainerLogResponse;
        update_container_resources(UpdateContainerResourcesRequest) -> UpdateContainerResourcesResponse;
        container_stats(ContainerStatsRequest) -> ContainerStatsResponse;
        list_container_stats(ListContainerStatsRequest) -> ListContainerStatsResponse;
        pod_sandbox_stats(PodSandboxStatsRequest) -> PodSandboxStatsResponse;
        list_pod_sandbox_stats(ListPodSandboxStatsRequest) -> ListPodSandboxStatsResponse;
        update_runtime_config(UpdateRuntimeConfigRequest) -> UpdateRuntimeConfigResponse;
        status(StatusRequest) -> StatusResponse;
    }

    unimplemented {
        exec(ExecRequest) -> ExecResponse;
        attach(AttachRequest) -> AttachResponse;
        port_forward(PortForwardRequest) -> PortForwardResponse;
        checkpoint_container(CheckpointContainerRequest) -> CheckpointContainerResponse;
        list_metric_descriptors(ListMetricDescriptorsRequest) -> ListMetricDescriptorsResponse;
        list_pod_sandbox_metrics(ListPodSandboxMetricsRequest) -> ListPodSandboxMetricsResponse;
        runtime_config(RuntimeConfigRequest) -> RuntimeConfigResponse;
    }

    type GetContainerEventsStream = futures::stream::BoxStream<'static, Result<cri::ContainerEventResponse, Status>>;

    async fn get_container_events(
        &self,
        request: Request<cri::GetEventsRequest>,
    ) -> Result<Response<Self::GetContainerEventsStream>, Status> {
        let events = self.runtime.get_container_events(request.into_inner()).await.map_err(Status::from)?;
        Ok(Response::new(events.map(|item| item.map_err(Status::from)).boxed()))
    }
}

forward! {
    impl ImageService {
        list_images(ListImagesRequest) -> ListImagesResponse;
        image_status(ImageStatusRequest) -> ImageStatusResponse;
        remove_image(RemoveImageRequest) -> RemoveImageResponse;
        image_fs_info(ImageFsInfoRequest) -> ImageFsInfoResponse;
    }
    unimplemented {}

    async fn pull_image(
        &self,
        request: Request<cri::PullImageRequest>,
    ) -> Result<Response<cri::PullImageResponse>, Status> {
        let deadline = request.metadata().get("grpc-timeout").and_then(|v| v.to_str().ok()).and_then(grpc_timeout);
        let pull = self.runtime.pull_image(request.into_inner());
        let Some(deadline) = deadline else {
            return pull.await.map(Response::new).map_err(Status::from);
        };
        // A pull is abandoned at the caller's deadline with DEADLINE_EXCEEDED, as a runtime pulling under the
        // request context does. The transport drops the call at the deadline too, answering only CANCELLED, so
        // this gives up a little earlier (5 %, at least 5 ms, at most 100 ms) for its answer to be the one sent.
        let margin = (deadline / 20).clamp(Duration::from_millis(5), Duration::from_millis(100));
        match tokio::time::timeout(deadline.saturating_sub(margin), pull).await {
            Ok(result) => result.map(Response::new).map_err(Status::from),
            Err(_) => Err(Status::deadline_exceeded(format!(
                "failed to pull image: context deadline exceeded ({deadline:?})"
            ))),
        }
    }
}

/// A `grpc-timeout` header value (up to 8 digits and a unit: H, M, S, m, u, n) as a duration.
fn grpc_timeout(value: &str) -> Option<Duration> {
    let (digits, unit) = value.split_at(value.len().checked_sub(1)?);
    if digits.is_empty() || digits.len() > 8 {
        return None;
    }
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.checked_mul(3600)?),
        "M" => Duration::from_secs(n.checked_mul(60)?),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::grpc_timeout;
    use std::time::Duration;

    #[test]
    fn grpc_timeout_headers_parse() {
        assert_eq!(grpc_timeout("300m"), Some(Duration::from_millis(300)));
        assert_eq!(grpc_timeout("2S"), Some(Duration::from_secs(2)));
        assert_eq!(grpc_timeout("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(grpc_timeout("5u"), Some(Duration::from_micros(5)));
        for bad in ["", "m", "123456789m", "10x", "-1S"] {
            assert_eq!(grpc_timeout(bad), None, "{bad:?}");
        }
    }
}
