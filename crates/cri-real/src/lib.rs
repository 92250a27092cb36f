//! The [`runtime_api::Runtime`] trait over a CRI v1 gRPC client on a unix socket (containerd, CRI-O, or
//! `cri-fake` serving).
//!
//! This crate owns the connection to a real container runtime: parsing the endpoint, dialling the unix socket,
//! per-call deadlines (the kubelet's defaults: 2 minutes per runtime request, longer for image pulls), and turning
//! gRPC failures into [`RuntimeError`]s with the runtime's own code (`Unavailable` when the socket is down,
//! `DeadlineExceeded` when a call outlives its deadline). It adds no behaviour of its own: every trait method is
//! one RPC.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use runtime_api::{Runtime, cri};
//! let runtime = cri_real::RemoteRuntime::connect("unix:///run/containerd/containerd.sock").await?;
//! let version = runtime.version(cri::VersionRequest { version: "v1".into() }).await?;
//! println!("{} {}", version.runtime_name, version.runtime_version);
//! # Ok(()) }
//! ```

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use futures::StreamExt;
use hyper_util::rt::TokioIo;
use k8s_cri::v1::image_service_client::ImageServiceClient;
use k8s_cri::v1::runtime_service_client::RuntimeServiceClient;
use runtime_api::{Code, EventStream, Result, Runtime, RuntimeError, cri};
use tonic::transport::{Channel, Endpoint, Uri};

/// Settings for a [`RemoteRuntime`]. `Default` gives the kubelet's values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    /// Deadline of every call except image pulls (`--runtime-request-timeout`, default 2 minutes).
    pub request_timeout: Duration,
    /// Deadline of `PullImage` (default 30 minutes: pulls are long-running).
    pub pull_timeout: Duration,
    /// Deadline for dialling the socket when connecting eagerly (default 10 seconds).
    pub connect_timeout: Duration,
    /// Largest message accepted or sent (the kubelet allows 16 MiB).
    pub max_message_size: usize,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        Self {
            request_timeout: Duration::from_secs(120),
            pull_timeout: Duration::from_secs(30 * 60),
            connect_timeout: Duration::from_secs(10),
            max_message_size: 16 * 1024 * 1024,
        }
    }
}

/// Why a [`RemoteRuntime`] could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The endpoint is not `unix:///absolute/path` or an absolute path.
    #[error("invalid CRI endpoint {endpoint:?}: expected unix:///path/to/socket or an absolute socket path")]
    InvalidEndpoint {
        /// The endpoint as given.
        endpoint: String,
    },
    /// Dialling the socket failed.
    #[error("cannot connect to the CRI runtime at {}", path.display())]
    Connect {
        /// The socket path.
        path: PathBuf,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// Dialling the socket did not finish within [`RemoteConfig::connect_timeout`].
    #[error("timed out connecting to the CRI runtime at {}", path.display())]
    Timeout {
        /// The socket path.
        path: PathBuf,
    },
}

impl From<ConnectError> for RuntimeError {
    fn from(err: ConnectError) -> Self {
        let code = match err {
            ConnectError::InvalidEndpoint { .. } => Code::InvalidArgument,
            ConnectError::Connect { .. } | ConnectError::Timeout { .. } => Code::Unavailable,
        };
        let mut message = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        RuntimeError::new(code, message)
    }
}

/// Parse a CRI endpoint (`unix:///run/containerd/containerd.sock` or `/run/containerd/containerd.sock`) into the
/// socket path.
pub fn socket_path(endpoint: &str) -> std::result::Result<PathBuf, ConnectError> {
    let path = endpoint.strip_prefix("unix://").unwrap_or(endpoint);
    if path.starts_with('/') {
        Ok(PathBuf::from(path))
    } else {
        Err(ConnectError::InvalidEndpoint {
            endpoint: endpoint.to_owned(),
        })
    }
}

/// A CRI v1 runtime reached over gRPC on a unix socket. Cheap to clone (the clients share one HTTP/2
/// connection, re-dialled on failure).
#[derive(Debug, Clone)]
pub struct RemoteRuntime {
    runtime: RuntimeServiceClient<Channel>,
    images: ImageServiceClient<Channel>,
    config: RemoteConfig,
}

impl RemoteRuntime {
    /// Connect with the default [`RemoteConfig`], dialling the socket now.
    pub async fn connect(endpoint: &str) -> std::result::Result<Self, ConnectError> {
        Self::connect_with(endpoint, RemoteConfig::default()).await
    }

    /// Connect with `config`, dialling the socket now: fails if nothing listens there.
    pub async fn connect_with(
        endpoint: &str,
        config: RemoteConfig,
    ) -> std::result::Result<Self, ConnectError> {
        let path = socket_path(endpoint)?;
        let endpoint = endpoint_for();
        let dial = endpoint.connect_with_connector(unix_connector(path.clone()));
        let channel = match tokio::time::timeout(config.connect_timeout, dial).await {
            Ok(Ok(channel)) => channel,
            Ok(Err(source)) => return Err(ConnectError::Connect { path, source }),
            Err(_) => return Err(ConnectError::Timeout { path }),
        };
        Ok(Self::from_channel(channel, config))
    }

    /// Set up a client that dials the socket on first use (and again after every failure); calls made while
    /// nothing listens fail with `Unavailable`.
    pub fn connect_lazy(endpoint: &str, config: RemoteConfig) -> std::result::Result<Self, ConnectError> {
        let path = socket_path(endpoint)?;
        let channel = endpoint_for().connect_with_connector_lazy(unix_connector(path));
        Ok(Self::from_channel(channel, config))
    }

    fn from_channel(channel: Channel, config: RemoteConfig) -> Self {
        let size = config.max_message_size;
        Self {
            runtime: RuntimeServiceClient::new(channel.clone())
                .max_decoding_message_size(size)
                .max_encoding_message_size(size),
            images: ImageServiceClient::new(channel)
                .max_decoding_message_size(size)
                .max_encoding_message_size(size),
            config,
        }
    }

    /// The settings this client uses.
    pub fn config(&self) -> &RemoteConfig {
        &self.config
    }
}

/// The HTTP/2 endpoint the channel speaks to; the authority is a placeholder, the connector ignores it.
fn endpoint_for() -> Endpoint {
    Endpoint::from_static("http://cri.invalid")
}

fn unix_connector(
    path: PathBuf,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<tokio::net::UnixStream>,
    Error = std::io::Error,
    Future = impl Future<Output = std::io::Result<TokioIo<tokio::net::UnixStream>>> + Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |_: Uri| {
        let path = path.clone();
        async move { dial(&path).await }
    })
}

async fn dial(path: &Path) -> std::io::Result<TokioIo<tokio::net::UnixStream>> {
    Ok(TokioIo::new(tokio::net::UnixStream::connect(path).await?))
}

/// One unary RPC with a deadline: sets `grpc-timeout` for the server and enforces it locally too.
macro_rules! rpc {
    ($self:ident, $client:ident, $method:ident, $req:expr) => {
        rpc!($self, $client, $method, $req, $self.config.request_timeout)
    };
    ($self:ident, $client:ident, $method:ident, $req:expr, $timeout:expr) => {{
        let timeout: Duration = $timeout;
        let mut client = $self.$client.clone();
        let mut request = tonic::Request::new($req);
        request.set_timeout(timeout);
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(timeout, client.$method(request)).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            // a server enforcing the grpc-timeout header may answer Cancelled (tonic does) at the deadline
            Ok(Err(status)) if status.code() == Code::Cancelled && started.elapsed() >= timeout => {
                Err(deadline(stringify!($method), timeout))
            }
            Ok(Err(status)) => Err(RuntimeError::from(status)),
            Err(_) => Err(deadline(stringify!($method), timeout)),
        }
    }};
}

fn deadline(method: &str, timeout: Duration) -> RuntimeError {
    RuntimeError::new(
        Code::DeadlineExceeded,
        format!("{method}: no answer within {timeout:?}"),
    )
}

#[async_trait]
impl Runtime for RemoteRuntime {
    async fn version(&self, req: cri::VersionRequest) -> Result<cri::VersionResponse> {
        rpc!(self, runtime, version, req)
    }

    async fn status(&self, req: cri::StatusRequest) -> Result<cri::StatusResponse> {
        rpc!(self, runtime, status, req)
    }

    async fn run_pod_sandbox(&self, req: cri::RunPodSandboxRequest) -> Result<cri::RunPodSandboxResponse> {
        rpc!(self, runtime, run_pod_sandbox, req)
    }

    async fn stop_pod_sandbox(&self, req: cri::StopPodSandboxRequest) -> Result<cri::StopPodSandboxResponse> {
        rpc!(self, runtime, stop_pod_sandbox, req)
    }

    async fn remove_pod_sandbox(
        &self,
        req: cri::RemovePodSandboxRequest,
    ) -> Result<cri::RemovePodSandboxResponse> {
        rpc!(self, runtime, remove_pod_sandbox, req)
    }

    async fn pod_sandbox_status(
        &self,
        req: cri::PodSandboxStatusRequest,
    ) -> Result<cri::PodSandboxStatusResponse> {
        rpc!(self, runtime, pod_sandbox_status, req)
    }

    async fn list_pod_sandbox(&self, req: cri::ListPodSandboxRequest) -> Result<cri::ListPodSandboxResponse> {
        rpc!(self, runtime, list_pod_sandbox, req)
    }

    async fn create_container(
        &self,
        req: cri::CreateContainerRequest,
    ) -> Result<cri::CreateContainerResponse> {
        rpc!(self, runtime, create_container, req)
    }

    async fn start_container(&self, req: cri::StartContainerRequest) -> Result<cri::StartContainerResponse> {
        rpc!(self, runtime, start_container, req)
    }

    async fn stop_container(&self, req: cri::StopContainerRequest) -> Result<cri::StopContainerResponse> {
        // the runtime may wait the whole grace period before killing: allow for it on top of the deadline
        let grace = Duration::from_secs(u64::try_from(req.timeout).unwrap_or(0));
        rpc!(
            self,
            runtime,
            stop_container,
            req,
            self.config.request_timeout + grace
        )
    }

    async fn remove_container(
        &self,
        req: cri::RemoveContainerRequest,
    ) -> Result<cri::RemoveContainerResponse> {
        rpc!(self, runtime, remove_container, req)
    }

    async fn list_containers(&self, req: cri::ListContainersRequest) -> Result<cri::ListContainersResponse> {
        rpc!(self, runtime, list_containers, req)
    }

    async fn container_status(
        &self,
        req: cri::ContainerStatusRequest,
    ) -> Result<cri::ContainerStatusResponse> {
        rpc!(self, runtime, container_status, req)
    }

    async fn exec_sync(&self, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse> {
        // like the kubelet: the command's own timeout plus the usual request deadline
        let own = Duration::from_secs(u64::try_from(req.timeout).unwrap_or(0));
        rpc!(self, runtime, exec_sync, req, self.config.request_timeout + own)
    }

    async fn exec(&self, req: cri::ExecRequest) -> Result<cri::ExecResponse> {
        rpc!(self, runtime, exec, req)
    }

    async fn attach(&self, req: cri::AttachRequest) -> Result<cri::AttachResponse> {
        rpc!(self, runtime, attach, req)
    }

    async fn port_forward(&self, req: cri::PortForwardRequest) -> Result<cri::PortForwardResponse> {
        rpc!(self, runtime, port_forward, req)
    }

    async fn update_container_resources(
        &self,
        req: cri::UpdateContainerResourcesRequest,
    ) -> Result<cri::UpdateContainerResourcesResponse> {
        rpc!(self, runtime, update_container_resources, req)
    }

    async fn reopen_container_log(
        &self,
        req: cri::ReopenContainerLogRequest,
    ) -> Result<cri::ReopenContainerLogResponse> {
        rpc!(self, runtime, reopen_container_log, req)
    }

    async fn container_stats(&self, req: cri::ContainerStatsRequest) -> Result<cri::ContainerStatsResponse> {
        rpc!(self, runtime, container_stats, req)
    }

    async fn list_container_stats(
        &self,
        req: cri::ListContainerStatsRequest,
    ) -> Result<cri::ListContainerStatsResponse> {
        rpc!(self, runtime, list_container_stats, req)
    }

    async fn pod_sandbox_stats(
        &self,
        req: cri::PodSandboxStatsRequest,
    ) -> Result<cri::PodSandboxStatsResponse> {
        rpc!(self, runtime, pod_sandbox_stats, req)
    }

    async fn list_pod_sandbox_stats(
        &self,
        req: cri::ListPodSandboxStatsRequest,
    ) -> Result<cri::ListPodSandboxStatsResponse> {
        rpc!(self, runtime, list_pod_sandbox_stats, req)
    }

    async fn update_runtime_config(
        &self,
        req: cri::UpdateRuntimeConfigRequest,
    ) -> Result<cri::UpdateRuntimeConfigResponse> {
        rpc!(self, runtime, update_runtime_config, req)
    }

    async fn get_container_events(&self, req: cri::GetEventsRequest) -> Result<EventStream> {
        // containerd subscribes at once but sends the call's response headers with its first event, so on a
        // quiet runtime the call stays unanswered though the stream is open. A refusal (`Unimplemented`, a
        // runtime without events) comes at once: wait that long for one, then hand out the stream, whose first
        // item arrives with the runtime's first event.
        let mut client = self.runtime.clone();
        let mut call = Box::pin(async move { client.get_container_events(req).await });
        match tokio::time::timeout(EVENTS_REFUSAL_WAIT, &mut call).await {
            Ok(Ok(response)) => Ok(events(response)),
            Ok(Err(status)) => Err(RuntimeError::from(status)),
            Err(_) => Ok(futures::stream::once(call)
                .flat_map(|answer| match answer {
                    Ok(response) => events(response),
                    Err(status) => {
                        futures::stream::once(std::future::ready(Err(RuntimeError::from(status)))).boxed()
                    }
                })
                .boxed()),
        }
    }

    async fn list_images(&self, req: cri::ListImagesRequest) -> Result<cri::ListImagesResponse> {
        rpc!(self, images, list_images, req)
    }

    async fn image_status(&self, req: cri::ImageStatusRequest) -> Result<cri::ImageStatusResponse> {
        rpc!(self, images, image_status, req)
    }

    async fn pull_image(&self, req: cri::PullImageRequest) -> Result<cri::PullImageResponse> {
        rpc!(self, images, pull_image, req, self.config.pull_timeout)
    }

    async fn remove_image(&self, req: cri::RemoveImageRequest) -> Result<cri::RemoveImageResponse> {
        rpc!(self, images, remove_image, req)
    }

    async fn image_fs_info(&self, req: cri::ImageFsInfoRequest) -> Result<cri::ImageFsInfoResponse> {
        rpc!(self, images, image_fs_info, req)
    }
}

/// How long opening the runtime's event stream waits for a refusal before the stream counts as open.
const EVENTS_REFUSAL_WAIT: Duration = Duration::from_secs(2);

/// The events of an answered `GetContainerEvents` call.
fn events(response: tonic::Response<tonic::Streaming<cri::ContainerEventResponse>>) -> EventStream {
    response
        .into_inner()
        .map(|item| item.map_err(RuntimeError::from))
        .boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_parse_to_socket_paths() {
        assert_eq!(
            socket_path("unix:///run/x.sock").unwrap(),
            PathBuf::from("/run/x.sock")
        );
        assert_eq!(socket_path("/run/x.sock").unwrap(), PathBuf::from("/run/x.sock"));
        for bad in ["tcp://127.0.0.1:1", "unix://relative.sock", "run/x.sock", ""] {
            let err = socket_path(bad).unwrap_err();
            assert!(matches!(err, ConnectError::InvalidEndpoint { .. }), "{bad}");
            assert_eq!(RuntimeError::from(err).code, Code::InvalidArgument);
        }
    }

    #[tokio::test]
    async fn missing_socket_is_unavailable() {
        let dir = std::env::temp_dir().join(format!("cri-real-test-{}", std::process::id()));
        let endpoint = format!("unix://{}/none.sock", dir.display());

        let err = RemoteRuntime::connect(&endpoint).await.unwrap_err();
        assert!(matches!(err, ConnectError::Connect { .. }), "{err:?}");
        assert_eq!(RuntimeError::from(err).code, Code::Unavailable);

        let lazy = RemoteRuntime::connect_lazy(&endpoint, RemoteConfig::default()).unwrap();
        let err = lazy.version(cri::VersionRequest::default()).await.unwrap_err();
        assert_eq!(err.code, Code::Unavailable, "{err}");
    }
}
