//! Shared helpers for the integration tests in `tests/tests/`: logging, polling, the `node-agent` and `hollow`
//! binaries and those `hack/` scripts build, the Helm chart installed and rendered ([`chart`]), and the scripted probe transport of agents on the fake runtime; a private
//! containerd ([`containerd`]) for real-mode tests and benchmarks, and requests to its kubelet API ([`kubelet_api`]); a Debian guest under QEMU ([`vm`]) for the tests
//! that need a host unlike this one; the samples and slopes of the soak benchmarks ([`soak`]).

pub mod chart;
pub mod containerd;
pub mod kubelet_api;
pub mod relay;
pub mod soak;
pub mod vm;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

/// Installs a test-friendly tracing subscriber once (honours `RUST_LOG`).
pub fn init_logging() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "warn,kube_client::client::builder=off".into()),
        )
        .with_test_writer()
        .try_init();
}

/// Polls `check` until it yields `Some`, or fails after `timeout` naming `what`. Polls start 200 ms apart and
/// stretch to 2 s, so long waits (thousands of pods) do not load the API server with lists.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<Option<T>>>,
{
    // no count of progress: the stall is the whole wait
    wait_for_progress(what, timeout, timeout, || {
        let next = check();
        async move { Ok((0, next.await?)) }
    })
    .await
}

/// Polls `check` like [`wait_for`] until it yields `Some`, for as long as it makes progress: `check` also says
/// how many of the awaited things are done, and the wait fails (naming `what`) when that count has not grown
/// for `stall`, or after `limit` in all. For starts that go one node at a time, whose length follows the
/// machine's load, where only a start that stops moving is a failure.
pub async fn wait_for_progress<T, F, Fut>(
    what: &str,
    stall: Duration,
    limit: Duration,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = anyhow::Result<(usize, Option<T>)>>,
{
    let started = tokio::time::Instant::now();
    let mut best = 0;
    let mut last_progress = started;
    let mut pause = Duration::from_millis(200);
    loop {
        let (done, result) = check().await?;
        if let Some(v) = result {
            return Ok(v);
        }
        let now = tokio::time::Instant::now();
        if done > best {
            best = done;
            last_progress = now;
        }
        if now.duration_since(started) >= limit {
            anyhow::bail!("timed out after {limit:?} waiting for {what}");
        }
        if now.duration_since(last_progress) >= stall {
            anyhow::bail!(
                "no progress for {stall:?} waiting for {what} ({best} done after {:?})",
                now - started
            );
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 3 / 2).min(Duration::from_secs(2));
    }
}

/// Waits until `api` lists nothing (say, a namespace's pods after their deletion), or fails after `timeout`
/// naming `what`.
pub async fn wait_until_empty<K>(api: &kube::Api<K>, what: &str, timeout: Duration) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    wait_for(what, timeout, || async {
        Ok(api
            .list(&kube::api::ListParams::default())
            .await?
            .items
            .is_empty()
            .then_some(()))
    })
    .await
}

/// Every object `api` lists with `params`, read 500 at a time: one list of thousands of pods can outlast the
/// API server's request timeout on a loaded machine (it then cuts the body mid-stream), a page cannot.
pub async fn list_paged<K>(api: &kube::Api<K>, params: &kube::api::ListParams) -> anyhow::Result<Vec<K>>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let mut items = Vec::new();
    let mut page = params.clone().limit(500);
    loop {
        let list = api.list(&page).await?;
        items.extend(list.items);
        match list.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => page = page.continue_token(&token),
            None => return Ok(items),
        }
    }
}

/// What a user would read in `kubectl describe pod` when a wait for a pod failed: phase, conditions, each
/// container's state and the pod's events (errors reading them are part of the text).
pub async fn pod_report(client: &kube::Client, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::core::v1::{Event, Pod};
    let mut out = format!("pod {namespace}/{name}:");
    match kube::Api::<Pod>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await
    {
        Ok(Some(pod)) => {
            let spec_node = pod
                .spec
                .as_ref()
                .and_then(|s| s.node_name.clone())
                .unwrap_or_default();
            let status = pod.status.unwrap_or_default();
            out += &format!(
                " node {spec_node:?}, phase {:?}",
                status.phase.unwrap_or_default()
            );
            for c in status.conditions.unwrap_or_default() {
                out += &format!(
                    "\n  condition {}={} {}",
                    c.type_,
                    c.status,
                    c.message.unwrap_or_default()
                );
            }
            for c in status.container_statuses.unwrap_or_default() {
                out += &format!("\n  container {}: {}", c.name, serde_json::json!(c.state));
            }
        }
        Ok(None) => out += " not found",
        Err(e) => out += &format!(" unreadable: {e}"),
    }
    let events = kube::Api::<Event>::namespaced(client.clone(), namespace)
        .list(&kube::api::ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await;
    match events {
        Ok(list) => {
            for e in list.items {
                out += &format!(
                    "\n  event {} {}: {}",
                    e.type_.unwrap_or_default(),
                    e.reason.unwrap_or_default(),
                    e.message.unwrap_or_default()
                );
            }
        }
        Err(e) => out += &format!("\n  events unreadable: {e}"),
    }
    out
}

/// Pod options for an agent on `fake`: network probes (and HTTP hooks) answered by the fake runtime's script
/// (`cri-fake.node-agent.io/probe`), never over the network — fake pods' addresses are not on this machine.
pub fn fake_pod_options(fake: cri_fake::FakeRuntime) -> node_agent::pods::PodOptions {
    use node_agent::pods::{NetTarget, PodOptions, ScriptedProbes};
    let probes = ScriptedProbes::new(move |container_id, target| {
        let target = match target {
            NetTarget::Http { port, path } => cri_fake::ProbeTarget::Http { port, path },
            NetTarget::Tcp { port } => cri_fake::ProbeTarget::Tcp { port },
            NetTarget::Grpc { port, service } => cri_fake::ProbeTarget::Grpc { port, service },
        };
        fake.probe_result(container_id, target).map_err(|e| e.to_string())
    });
    PodOptions::with_probes(std::sync::Arc::new(probes))
}

/// A node's Ready condition, if it has one.
pub fn ready_condition(
    node: &k8s_openapi::api::core::v1::Node,
) -> Option<&k8s_openapi::api::core::v1::NodeCondition> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")
}

/// Whether a node is Ready=True.
pub fn node_is_ready(node: &k8s_openapi::api::core::v1::Node) -> bool {
    ready_condition(node).is_some_and(|c| c.status == "True")
}

/// The Nodes named `<prefix>-…` (one fleet's nodes).
pub async fn nodes_with_prefix(
    api: &kube::Api<k8s_openapi::api::core::v1::Node>,
    prefix: &str,
) -> anyhow::Result<Vec<k8s_openapi::api::core::v1::Node>> {
    let wanted = format!("{prefix}-");
    Ok(api
        .list(&Default::default())
        .await?
        .items
        .into_iter()
        .filter(|n| {
            n.metadata
                .name
                .as_deref()
                .is_some_and(|name| name.starts_with(&wanted))
        })
        .collect())
}

/// The `node-agent` binary of this build (built on demand; cargo does not build other packages' binaries for a
/// test of this package), or the one `NODE_AGENT_BIN` names.
pub fn node_agent_binary() -> anyhow::Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| workspace_binary("node-agent", "NODE_AGENT_BIN"))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The `hollow` binary of this build (built on demand), or the one `HOLLOW_BIN` names.
pub fn hollow_binary() -> anyhow::Result<PathBuf> {
    static BIN: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BIN.get_or_init(|| workspace_binary("hollow", "HOLLOW_BIN"))
        .clone()
        .map_err(anyhow::Error::msg)
}

/// The binary a `hack/` script builds on first use, caches and prints the path of (`build-csi-mock-driver.sh`,
/// `build-sample-device-plugin.sh`, ...); `what` names it when the build fails.
pub async fn hack_binary(script: &str, what: &str) -> anyhow::Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack").join(script);
    let built = tokio::task::spawn_blocking(move || Command::new("bash").arg(script).output()).await??;
    anyhow::ensure!(
        built.status.success(),
        "building {what}: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    Ok(PathBuf::from(String::from_utf8(built.stdout)?.trim()))
}

/// `cargo build --bin <name>` in this test's profile, or the binary the environment variable `overridden_by`
/// names.
fn workspace_binary(name: &str, overridden_by: &str) -> Result<PathBuf, String> {
    if let Some(bin) = std::env::var_os(overridden_by) {
        return Ok(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .ok_or("no target dir")?
        .to_path_buf();
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    // the variables cargo set for this test (CARGO_MANIFEST_DIR, CARGO_PKG_NAME, ...) are ones build scripts
    // such as ring's watch (rerun-if-env-changed): passed on, they would make this build rebuild ring and
    // everything above it, and the next plain `cargo test` rebuild it back
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        let set_by_cargo = name == "OUT_DIR"
            || [
                "CARGO_MANIFEST_",
                "CARGO_PKG_",
                "CARGO_BIN_",
                "CARGO_CRATE_",
                "CARGO_PRIMARY_",
                "CARGO_TARGET_TMPDIR",
            ]
            .iter()
            .any(|p| name.starts_with(p));
        if set_by_cargo {
            cmd.env_remove(name.as_ref());
        }
    }
    cmd.current_dir(&workspace)
        // the workspace's feature set: the artefacts `cargo test --workspace` has just built
        .args(["build", "-q", "--workspace", "--bin", name]);
    if profile_dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let status = cmd.status().map_err(|e| format!("running cargo build: {e}"))?;
    if !status.success() {
        return Err(format!("cargo build --bin {name} failed: {status}"));
    }
    Ok(profile_dir.join(name))
}
