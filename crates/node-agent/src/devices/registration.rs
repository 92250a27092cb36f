//! The registration service device plugins call, `v1beta1.Registration` on
//! `<root-dir>/device-plugins/kubelet.sock`: a registration naming another API version, a resource name that is
//! not an extended resource's or a socket outside the directory is refused with the kubelet's message; an
//! accepted one makes the agent connect back to the plugin's socket and follow its devices
//! ([`endpoint::follow`]). A plugin registering again for its resource replaces the earlier connection.

use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt};
use std::path::{Path, PathBuf};

use tokio::net::UnixListener;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use super::v1beta1::registration_server::{Registration, RegistrationServer as GrpcServer};
use super::v1beta1::{Empty, RegisterRequest};
use super::{DeviceManager, PluginOptions, VERSION, endpoint};

/// Why the registration socket could not be set up or served.
#[derive(Debug, thiserror::Error)]
pub enum RegistrationError {
    /// The directory could not be created.
    #[error("creating the device plugin directory {path}: {source}")]
    Dir {
        /// The directory.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Something other than a socket is in the socket's place.
    #[error("{0} exists and is not a socket; remove it to serve device plugin registration there")]
    NotASocket(PathBuf),
    /// Removing an old socket or binding failed.
    #[error("binding the device plugin registration socket {path}: {source}")]
    Bind {
        /// The socket.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The gRPC server failed.
    #[error("serving device plugin registration: {0}")]
    Serve(#[source] tonic::transport::Error),
}

/// Whether `name` is an extended resource's name (a domain-prefixed name outside `kubernetes.io/`, not a quota
/// `requests.` name), as the kubelet checks a plugin's resource name.
pub fn is_extended_resource(name: &str) -> bool {
    let Some((domain, rest)) = name.split_once('/') else {
        return false;
    };
    let native = domain == "kubernetes.io" || domain.ends_with(".kubernetes.io");
    let valid_part = |s: &str, max: usize| {
        !s.is_empty()
            && s.len() <= max
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && s.starts_with(|c: char| c.is_ascii_alphanumeric())
            && s.ends_with(|c: char| c.is_ascii_alphanumeric())
    };
    !native
        && !name.starts_with("requests.")
        && valid_part(domain, 253)
        && valid_part(rest, 63)
        && !rest.contains('/')
}

#[derive(Clone)]
struct Service {
    manager: DeviceManager,
    dir: PathBuf,
    token: CancellationToken,
}

#[tonic::async_trait]
impl Registration for Service {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let r = request.into_inner();
        if r.version != VERSION {
            let message = format!(
                "requested API version {:?} is not supported by kubelet. Supported version is [\"{VERSION}\"]",
                r.version
            );
            tracing::warn!(resource = %r.resource_name, %message, "device plugin refused");
            return Err(Status::unknown(message));
        }
        if !is_extended_resource(&r.resource_name) {
            let message = format!("the ResourceName {:?} is invalid", r.resource_name);
            tracing::warn!(%message, "device plugin refused");
            return Err(Status::unknown(message));
        }
        let endpoint = Path::new(&r.endpoint);
        if r.endpoint.is_empty() || endpoint.is_absolute() || endpoint.components().count() != 1 {
            let message = format!("Invalid endpoint: {:?}", r.endpoint);
            tracing::warn!(resource = %r.resource_name, %message, "device plugin refused");
            return Err(Status::unknown(message));
        }
        let options = r
            .options
            .map(|o| PluginOptions {
                pre_start_required: o.pre_start_required,
                preferred_allocation: o.get_preferred_allocation_available,
            })
            .unwrap_or_default();
        // the plugin serves before it registers: a plugin that cannot be reached is refused
        let socket = self.dir.join(endpoint);
        let channel = endpoint::channel(&socket).await.map_err(|message| {
            tracing::warn!(resource = %r.resource_name, %message, "device plugin refused");
            Status::unknown(message)
        })?;
        tokio::spawn(endpoint::follow(
            self.manager.clone(),
            r.resource_name,
            channel,
            options,
            self.token.clone(),
        ));
        Ok(Response::new(Empty {}))
    }
}

/// The registration service bound to its socket, not yet serving.
pub struct RegistrationServer {
    path: PathBuf,
    listener: UnixListener,
    service: Service,
}

impl std::fmt::Debug for RegistrationServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistrationServer")
            .field("path", &self.path)
            .finish_non_exhaustive()
    }
}

impl RegistrationServer {
    /// Binds `<dir>/kubelet.sock` (the directory made with mode 0750 if missing; a socket left by an earlier run
    /// is replaced, so that plugins watching for it register again), feeding `manager`. Must be called inside
    /// a tokio runtime.
    pub fn bind(dir: &Path, manager: DeviceManager) -> Result<Self, RegistrationError> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(dir)
            .map_err(|source| RegistrationError::Dir {
                path: dir.to_owned(),
                source,
            })?;
        let path = dir.join(super::SOCKET);
        let bind = |source| RegistrationError::Bind {
            path: path.clone(),
            source,
        };
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_socket() => std::fs::remove_file(&path).map_err(bind)?,
            Ok(_) => return Err(RegistrationError::NotASocket(path)),
            Err(_) => {}
        }
        let listener = UnixListener::bind(&path).map_err(bind)?;
        Ok(Self {
            path,
            listener,
            service: Service {
                manager,
                dir: dir.to_owned(),
                token: CancellationToken::new(),
            },
        })
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Serves until `token` fires (the connections to plugins end with it), then removes the socket.
    pub async fn run(self, token: CancellationToken) -> Result<(), RegistrationError> {
        let Self {
            path,
            listener,
            mut service,
        } = self;
        service.token = token.clone();
        tracing::info!(socket = %path.display(), "serving device plugin registration");
        let served = tonic::transport::Server::builder()
            .add_service(GrpcServer::new(service))
            .serve_with_incoming_shutdown(crate::grpc_unix::incoming(listener), token.cancelled_owned())
            .await
            .map_err(RegistrationError::Serve);
        if let Err(error) = std::fs::remove_file(&path)
            && error.kind() != io::ErrorKind::NotFound
        {
            tracing::warn!(socket = %path.display(), %error, "could not remove the device plugin registration socket");
        }
        served
    }
}
