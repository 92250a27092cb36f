//! The watcher: which sockets are in the registry directory, which of them are registered, and the
//! registration exchange with each plugin.
//!
//! The directory (and its subdirectories; names starting with `.` are skipped, as the kubelet skips them) is
//! scanned once a second, the kubelet's own reconcile period. A socket is known by its inode and modification
//! time, so a plugin that restarts and binds its socket anew is deregistered and registered again. A failed
//! registration is tried again, after 1 s at first and twice as long each time up to about two minutes (the
//! kubelet's operation backoff), and at once when the socket is replaced.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::v1::registration_client::RegistrationClient;
use super::v1::{InfoRequest, RegistrationStatus};
use super::{Plugin, PluginHandler};

/// How often the directory is looked at.
const PERIOD: Duration = Duration::from_secs(1);
/// How long connecting to a registration socket may take.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a plugin may take to answer `GetInfo`.
const INFO_TIMEOUT: Duration = Duration::from_secs(1);
/// How long a plugin may take to take its verdict.
const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);
/// The first wait before a failed registration is tried again, and the longest.
const FIRST_RETRY: Duration = Duration::from_secs(1);
const LAST_RETRY: Duration = Duration::from_secs(122);

/// A socket file as found: a new socket at the same path has another identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    inode: u64,
    modified: i64,
    modified_nsec: i64,
}

/// A failed registration, and when to try again.
#[derive(Debug)]
struct Retry {
    identity: Identity,
    at: Instant,
    delay: Duration,
}

/// Watches one registry directory and registers the plugins whose sockets appear there with the handler
/// registered for their kind.
pub struct PluginWatcher {
    dir: PathBuf,
    handlers: BTreeMap<String, Arc<dyn PluginHandler>>,
    registered: BTreeMap<PathBuf, (Identity, Plugin)>,
    retries: BTreeMap<PathBuf, Retry>,
}

impl std::fmt::Debug for PluginWatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PluginWatcher")
            .field("dir", &self.dir)
            .field("handlers", &self.handlers.keys().collect::<Vec<_>>())
            .field("registered", &self.registered.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// Why a registration did not happen (logged; the plugin hears it through `NotifyRegistrationStatus` when it
/// could be told).
#[derive(Debug, thiserror::Error)]
pub enum RegisterError {
    /// The socket could not be connected to.
    #[error("dial failed at socket {socket}: {message}")]
    Dial {
        /// The registration socket.
        socket: PathBuf,
        /// The cause.
        message: String,
    },
    /// `GetInfo` failed.
    #[error("failed to get plugin info using RPC GetInfo at socket {socket}: {message}")]
    Info {
        /// The registration socket.
        socket: PathBuf,
        /// The cause.
        message: String,
    },
    /// The plugin was refused (no handler for its kind, validation or registration failed); it was told.
    #[error("{0}")]
    Refused(String),
    /// The verdict could not be delivered.
    #[error("failed to send registration status at socket {socket}: {message}")]
    Notify {
        /// The registration socket.
        socket: PathBuf,
        /// The cause.
        message: String,
    },
}

impl PluginWatcher {
    /// A watcher of `dir` with no handlers yet.
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self {
            dir: dir.into(),
            handlers: BTreeMap::new(),
            registered: BTreeMap::new(),
            retries: BTreeMap::new(),
        }
    }

    /// Hands plugins of `kind` to `handler`.
    pub fn handler(mut self, kind: &str, handler: Arc<dyn PluginHandler>) -> Self {
        self.handlers.insert(kind.to_owned(), handler);
        self
    }

    /// The directory watched.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The plugins registered now.
    pub fn registered(&self) -> impl Iterator<Item = &Plugin> {
        self.registered.values().map(|(_, p)| p)
    }

    /// Creates the directory (mode 0750, as the kubelet does) if it is missing.
    pub fn create_dir(&self) -> io::Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o750)
            .create(&self.dir)
    }

    /// Creates the directory and reconciles once a second until `token` fires. Registered plugins stay
    /// registered when the watcher stops (their `CSINode` entries outlive an agent restart, as the kubelet's do).
    pub fn run(mut self, token: CancellationToken) -> impl Future<Output = ()> + Send + 'static {
        async move {
            if let Err(error) = self.create_dir() {
                tracing::error!(dir = %self.dir.display(), %error, "cannot create the plugin registry directory");
            }
            let mut tick = tokio::time::interval(PERIOD);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    () = token.cancelled() => return,
                    _ = tick.tick() => self.reconcile().await,
                }
            }
        }
    }

    /// One pass: deregisters the plugins whose sockets went or were replaced, registers those whose sockets
    /// are new (or due for another try).
    pub async fn reconcile(&mut self) {
        let found = scan(&self.dir);
        let gone: Vec<PathBuf> = self
            .registered
            .iter()
            .filter(|(path, (identity, _))| found.get(*path) != Some(identity))
            .map(|(path, _)| path.clone())
            .collect();
        for path in gone {
            if let Some((_, plugin)) = self.registered.remove(&path) {
                tracing::info!(kind = %plugin.kind, name = %plugin.name, socket = %path.display(), "plugin deregistered: its socket is gone");
                if let Some(handler) = self.handlers.get(&plugin.kind) {
                    handler.deregister(&plugin).await;
                }
            }
        }
        self.retries
            .retain(|path, retry| found.get(path) == Some(&retry.identity));
        let now = Instant::now();
        for (path, identity) in found {
            if self.registered.contains_key(&path) {
                continue;
            }
            let delay = match self.retries.get(&path) {
                Some(retry) if retry.at > now => continue,
                Some(retry) => (retry.delay * 2).min(LAST_RETRY),
                None => FIRST_RETRY,
            };
            match self.register(&path).await {
                Ok(plugin) => {
                    tracing::info!(kind = %plugin.kind, name = %plugin.name, endpoint = %plugin.endpoint.display(), "plugin registered");
                    self.retries.remove(&path);
                    self.registered.insert(path, (identity, plugin));
                }
                Err(error) => {
                    tracing::warn!(socket = %path.display(), %error, retry_in = ?delay, "plugin registration failed");
                    let at = Instant::now() + delay;
                    self.retries.insert(path, Retry { identity, at, delay });
                }
            }
        }
    }

    /// The registration exchange with the plugin on `socket`.
    async fn register(&self, socket: &Path) -> Result<Plugin, RegisterError> {
        let mut client = tokio::time::timeout(DIAL_TIMEOUT, connect(socket))
            .await
            .map_err(|_| "timed out".to_owned())
            .and_then(|r| r.map_err(|e| e.to_string()))
            .map_err(|message| RegisterError::Dial {
                socket: socket.to_owned(),
                message,
            })?;
        let info = tokio::time::timeout(INFO_TIMEOUT, client.get_info(InfoRequest {}))
            .await
            .map_err(|_| "timed out".to_owned())
            .and_then(|r| r.map_err(|s| s.message().to_owned()))
            .map_err(|message| RegisterError::Info {
                socket: socket.to_owned(),
                message,
            })?
            .into_inner();
        let plugin = Plugin {
            socket: socket.to_owned(),
            endpoint: if info.endpoint.is_empty() {
                socket.to_owned()
            } else {
                PathBuf::from(info.endpoint)
            },
            kind: info.r#type,
            name: info.name,
            versions: info.supported_versions,
        };
        let refused = match self.handlers.get(&plugin.kind) {
            None => Some(format!(
                "no handler registered for plugin type: {} at socket {}",
                plugin.kind,
                socket.display()
            )),
            Some(handler) => match handler.validate(&plugin).await {
                Err(e) => Some(format!("plugin validation failed with err: {e}")),
                Ok(()) => match handler.register(&plugin).await {
                    Err(e) => Some(format!("plugin registration failed with err: {e}")),
                    Ok(()) => None,
                },
            },
        };
        let status = RegistrationStatus {
            plugin_registered: refused.is_none(),
            error: refused.clone().unwrap_or_default(),
        };
        let told = tokio::time::timeout(NOTIFY_TIMEOUT, client.notify_registration_status(status))
            .await
            .map_err(|_| "timed out".to_owned())
            .and_then(|r| r.map_err(|s| s.message().to_owned()));
        if let Some(refused) = refused {
            return Err(RegisterError::Refused(refused));
        }
        if let Err(message) = told {
            // a plugin that cannot hear it was registered is not: it would not know to serve
            if let Some(handler) = self.handlers.get(&plugin.kind) {
                handler.deregister(&plugin).await;
            }
            return Err(RegisterError::Notify {
                socket: socket.to_owned(),
                message,
            });
        }
        Ok(plugin)
    }
}

/// A client of the registration service on `socket`.
async fn connect(
    socket: &Path,
) -> Result<RegistrationClient<tonic::transport::Channel>, tonic::transport::Error> {
    let path = socket.to_owned();
    // the URI is required by the channel but not used: every connection goes to the socket
    let channel = tonic::transport::Endpoint::from_static("http://plugin-registration.invalid")
        .connect_with_connector(tower::service_fn(move |_: tonic::codegen::http::Uri| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await?;
    Ok(RegistrationClient::new(channel))
}

/// The sockets under `dir` (any depth), by path. A missing or unreadable directory holds none.
fn scan(dir: &Path) -> BTreeMap<PathBuf, Identity> {
    let mut found = BTreeMap::new();
    let mut dirs = vec![dir.to_owned()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            if entry.file_name().to_string_lossy().starts_with('.') {
                continue;
            }
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                dirs.push(entry.path());
            } else if meta.file_type().is_socket() {
                found.insert(
                    entry.path(),
                    Identity {
                        inode: meta.ino(),
                        modified: meta.mtime(),
                        modified_nsec: meta.mtime_nsec(),
                    },
                );
            }
        }
    }
    found
}
