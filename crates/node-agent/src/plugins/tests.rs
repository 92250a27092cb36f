//! The watcher against plugins serving the registration API on real unix sockets in a temporary directory:
//! what each plugin is told, and what the handler sees. Each test drives [`PluginWatcher::reconcile`] itself.

use std::sync::{Arc, Mutex};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tokio_util::sync::CancellationToken;

use super::v1::registration_server::{Registration, RegistrationServer};
use super::v1::{InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse};
use super::*;

/// A plugin: answers `GetInfo` with `info` and keeps the statuses it is told.
#[derive(Clone)]
struct TestPlugin {
    info: PluginInfo,
    told: Arc<Mutex<Vec<RegistrationStatus>>>,
}

#[tonic::async_trait]
impl Registration for TestPlugin {
    async fn get_info(
        &self,
        _: tonic::Request<InfoRequest>,
    ) -> Result<tonic::Response<PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: tonic::Request<RegistrationStatus>,
    ) -> Result<tonic::Response<RegistrationStatusResponse>, tonic::Status> {
        self.told.lock().unwrap().push(request.into_inner());
        Ok(tonic::Response::new(RegistrationStatusResponse {}))
    }
}

impl TestPlugin {
    fn new(kind: &str, name: &str, endpoint: &str) -> Self {
        Self {
            info: PluginInfo {
                r#type: kind.into(),
                name: name.into(),
                endpoint: endpoint.into(),
                supported_versions: vec!["1.0.0".into()],
            },
            told: Arc::default(),
        }
    }

    /// Serves on `socket` until `token` fires.
    fn serve(&self, socket: &Path, token: &CancellationToken) {
        let listener = UnixListener::bind(socket).unwrap();
        let server = tonic::transport::Server::builder()
            .add_service(RegistrationServer::new(self.clone()))
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), token.clone().cancelled_owned());
        tokio::spawn(server);
    }

    fn told(&self) -> Vec<(bool, String)> {
        self.told
            .lock()
            .unwrap()
            .iter()
            .map(|s| (s.plugin_registered, s.error.clone()))
            .collect()
    }
}

/// A handler that records its calls and refuses what it is told to.
#[derive(Default)]
struct Recorder {
    calls: Mutex<Vec<String>>,
    refuse_validation: Option<String>,
    refuse_registration: Option<String>,
}

#[async_trait]
impl PluginHandler for Recorder {
    async fn validate(&self, plugin: &Plugin) -> Result<(), String> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("validate {}", plugin.name));
        self.refuse_validation.clone().map_or(Ok(()), Err)
    }
    async fn register(&self, plugin: &Plugin) -> Result<(), String> {
        self.calls.lock().unwrap().push(format!(
            "register {} at {}",
            plugin.name,
            plugin.endpoint.display()
        ));
        self.refuse_registration.clone().map_or(Ok(()), Err)
    }
    async fn deregister(&self, plugin: &Plugin) {
        self.calls
            .lock()
            .unwrap()
            .push(format!("deregister {}", plugin.name));
    }
}

impl Recorder {
    fn calls(&self) -> Vec<String> {
        std::mem::take(&mut *self.calls.lock().unwrap())
    }
}

#[tokio::test]
async fn a_plugin_is_registered_told_and_deregistered_when_its_socket_goes() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let registry = registry_dir(dir.path());
    let handler = Arc::new(Recorder::default());
    let mut watcher = PluginWatcher::new(&registry).handler(CSI_PLUGIN, handler.clone());
    watcher.create_dir()?;
    let mode = std::fs::metadata(&registry)?.permissions();
    assert_eq!(std::os::unix::fs::PermissionsExt::mode(&mode) & 0o777, 0o750);
    watcher.reconcile().await;
    assert!(handler.calls().is_empty(), "an empty directory registers nothing");

    let plugin = TestPlugin::new(CSI_PLUGIN, "csi.example.com", "/run/csi/example.sock");
    let token = CancellationToken::new();
    let socket = registry.join("csi.example.com-reg.sock");
    plugin.serve(&socket, &token);
    // a hidden socket is not a plugin's
    TestPlugin::new(CSI_PLUGIN, "hidden", "").serve(&registry.join(".hidden.sock"), &token);
    watcher.reconcile().await;
    assert_eq!(
        handler.calls(),
        [
            "validate csi.example.com",
            "register csi.example.com at /run/csi/example.sock"
        ]
    );
    assert_eq!(plugin.told(), [(true, String::new())]);
    let registered: Vec<_> = watcher.registered().map(|p| p.name.as_str()).collect();
    assert_eq!(registered, ["csi.example.com"]);

    watcher.reconcile().await;
    assert!(handler.calls().is_empty(), "a registered plugin is left alone");

    std::fs::remove_file(&socket)?;
    watcher.reconcile().await;
    assert_eq!(handler.calls(), ["deregister csi.example.com"]);
    assert_eq!(watcher.registered().count(), 0);
    token.cancel();
    Ok(())
}

#[tokio::test]
async fn a_replaced_socket_is_deregistered_and_registered_again() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let handler = Arc::new(Recorder::default());
    let mut watcher = PluginWatcher::new(dir.path()).handler(DEVICE_PLUGIN, handler.clone());
    // in a subdirectory, with no endpoint of its own: its registration socket is its endpoint
    std::fs::create_dir(dir.path().join("vendor"))?;
    let socket = dir.path().join("vendor/gpu.sock");
    let first = CancellationToken::new();
    TestPlugin::new(DEVICE_PLUGIN, "example.com/gpu", "").serve(&socket, &first);
    watcher.reconcile().await;
    assert_eq!(
        handler.calls(),
        [
            "validate example.com/gpu".to_owned(),
            format!("register example.com/gpu at {}", socket.display())
        ]
    );

    // the plugin restarts: its old server stops, a new one binds the path anew
    first.cancel();
    std::fs::remove_file(&socket)?;
    let second = CancellationToken::new();
    let again = TestPlugin::new(DEVICE_PLUGIN, "example.com/gpu", "");
    again.serve(&socket, &second);
    watcher.reconcile().await;
    assert_eq!(
        handler.calls(),
        [
            "deregister example.com/gpu".to_owned(),
            "validate example.com/gpu".to_owned(),
            format!("register example.com/gpu at {}", socket.display())
        ]
    );
    assert_eq!(again.told(), [(true, String::new())]);
    second.cancel();
    Ok(())
}

#[tokio::test]
async fn refused_plugins_are_told_why_and_tried_again_later() -> anyhow::Result<()> {
    let dir = tempfile::tempdir()?;
    let handler = Arc::new(Recorder {
        refuse_registration: Some("NodeGetInfo failed".into()),
        ..Default::default()
    });
    let picky = Arc::new(Recorder {
        refuse_validation: Some("version 0.3.0 is not supported".into()),
        ..Default::default()
    });
    let mut watcher = PluginWatcher::new(dir.path())
        .handler(CSI_PLUGIN, handler.clone())
        .handler(DRA_PLUGIN, picky.clone());
    let token = CancellationToken::new();
    let unknown = TestPlugin::new("FancyPlugin", "fancy", "");
    let unknown_socket = dir.path().join("fancy.sock");
    unknown.serve(&unknown_socket, &token);
    let failing = TestPlugin::new(CSI_PLUGIN, "flaky.csi", "/csi.sock");
    failing.serve(&dir.path().join("flaky.sock"), &token);
    let old = TestPlugin::new(DRA_PLUGIN, "old.dra", "/dra.sock");
    old.serve(&dir.path().join("old.sock"), &token);
    watcher.reconcile().await;

    assert_eq!(
        unknown.told(),
        [(
            false,
            format!(
                "no handler registered for plugin type: FancyPlugin at socket {}",
                unknown_socket.display()
            )
        )]
    );
    assert_eq!(
        failing.told(),
        [(
            false,
            "plugin registration failed with err: NodeGetInfo failed".into()
        )]
    );
    assert_eq!(
        old.told(),
        [(
            false,
            "plugin validation failed with err: version 0.3.0 is not supported".into()
        )]
    );
    assert_eq!(picky.calls(), ["validate old.dra"], "not registered when refused");
    assert_eq!(watcher.registered().count(), 0);
    handler.calls();

    // at once again: nothing is retried before its backoff ends
    watcher.reconcile().await;
    assert!(handler.calls().is_empty());
    assert_eq!(failing.told().len(), 1);
    token.cancel();
    Ok(())
}
