//! Static pods against a real control plane: an agent on the fake runtime with a `staticPodPath` directory and
//! a `staticPodURL` (served by the test, with a required header). Mirror pods appear with the kubelet's
//! annotations and owner, show the static pod's status, come back when deleted and go when the manifest
//! goes; a bad manifest is reported by file and field while the others run; with the API server stopped the
//! static pods keep running (a new one even starts) and are mirrored once it is back.
//!
//! The control plane is this test's own: the test stops and restarts its API server.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use cri_fake::{FakeConfig, FakeRuntime};
use e2e::{init_logging, node_is_ready, wait_for};
use k8s_openapi::api::core::v1::{Event, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams};
use node_agent::{Agent, AgentConfig, KubeletConfig, MachineInfo};
use runtime_api::{Runtime, cri};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const NODE: &str = "static-1";
const SOURCE: &str = "kubernetes.io/config.source";
const HASH: &str = "kubernetes.io/config.hash";
const MIRROR: &str = "kubernetes.io/config.mirror";
const SEEN: &str = "kubernetes.io/config.seen";

fn manifest(name: &str, image: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels:\n    tier: node\nspec:\n  containers:\n  - name: main\n    image: {image}\n"
    )
}

/// Serves `body` on 127.0.0.1 to requests carrying `X-Token: s3cret` (403 otherwise); counts good requests.
async fn serve(body: String) -> anyhow::Result<(String, Arc<AtomicUsize>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/pods.yaml", listener.local_addr()?);
    let served = Arc::new(AtomicUsize::new(0));
    let count = served.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut buf = vec![0u8; 8192];
            let n = conn.read(&mut buf).await.unwrap_or(0);
            let req = String::from_utf8_lossy(&buf[..n]).to_lowercase();
            let reply = if req.contains("x-token: s3cret") {
                count.fetch_add(1, Ordering::Relaxed);
                format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                    body.len()
                )
            } else {
                "HTTP/1.1 403 Forbidden\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_owned()
            };
            let _ = conn.write_all(reply.as_bytes()).await;
        }
    });
    Ok((url, served))
}

/// Names of the sandboxes the runtime runs (ready), sorted.
async fn running(rt: &FakeRuntime) -> anyhow::Result<Vec<String>> {
    let list = rt.list_pod_sandbox(cri::ListPodSandboxRequest::default()).await?;
    let mut v: Vec<String> = list
        .items
        .into_iter()
        .filter(|s| s.state == cri::PodSandboxState::SandboxReady as i32)
        .filter_map(|s| s.metadata.map(|m| m.name))
        .collect();
    v.sort();
    Ok(v)
}

/// The running container of the sandbox named `pod`.
async fn container_of(rt: &FakeRuntime, pod: &str) -> anyhow::Result<Option<String>> {
    let list = rt.list_containers(cri::ListContainersRequest::default()).await?;
    Ok(list
        .containers
        .into_iter()
        .find(|c| {
            c.state == cri::ContainerState::ContainerRunning as i32
                && c.labels.get("io.kubernetes.pod.name").map(String::as_str) == Some(pod)
        })
        .map(|c| c.id))
}

/// Waits for the mirror pod `name` in `default` to be Running (status written by the agent); returns it.
async fn running_mirror(pods: &Api<Pod>, name: &str, timeout: Duration) -> anyhow::Result<Pod> {
    wait_for(&format!("mirror pod {name} Running"), timeout, || async {
        Ok(pods.get_opt(name).await?.filter(|p| {
            p.metadata.deletion_timestamp.is_none()
                && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        }))
    })
    .await
}

fn annotations(p: &Pod) -> BTreeMap<String, String> {
    p.metadata.annotations.clone().unwrap_or_default()
}

fn write(dir: &Path, file: &str, text: &str) -> anyhow::Result<()> {
    // write then rename, as configuration tools do: the agent never reads half a file
    let tmp = dir.join(format!(".{file}.tmp"));
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, dir.join(file))?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn static_pods_from_a_directory_and_a_url_are_run_and_mirrored() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::ControlPlane::start(testenv::Options::default()).await?;
    let result = Box::pin(scenario(&cp)).await;
    cp.stop().await?;
    result
}

async fn scenario(cp: &testenv::ControlPlane) -> anyhow::Result<()> {
    let admin = cp.admin_client().await?;
    let dir: PathBuf = std::env::temp_dir().join(format!("static-pods-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    write(&dir, "web.yaml", &manifest("web", "nginx:1.27"))?;
    let (url, served) = serve(manifest("cache", "redis:7")).await?;

    let kubelet = KubeletConfig {
        static_pod_path: Some(dir.clone()),
        // changes in the directory are seen through inotify, long before the periodic re-read
        file_check_frequency: Duration::from_secs(120),
        static_pod_url: Some(url.clone()),
        static_pod_url_header: [("X-Token".to_owned(), vec!["s3cret".to_owned()])].into(),
        http_check_frequency: Duration::from_secs(2),
        ..KubeletConfig::default()
    };
    let config = AgentConfig::new(
        NODE,
        "127.0.0.1".parse()?,
        Arc::new(kubelet),
        MachineInfo::synthetic(NODE),
    );
    let runtime = FakeRuntime::new(FakeConfig::default());
    let agent = Agent::builder(config, cp.node_client(NODE).await?, Arc::new(runtime.clone()))
        .pods(e2e::fake_pod_options(runtime.clone()))
        .build()?
        .start();

    let nodes: Api<Node> = Api::all(admin.clone());
    let node = wait_for("node Ready", Duration::from_secs(60), || async {
        Ok(nodes.get_opt(NODE).await?.filter(node_is_ready))
    })
    .await?;
    let node_uid = node.metadata.uid.clone().unwrap_or_default();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");

    // 1. both static pods run and are mirrored, with the kubelet's annotations and the Node as owner
    let web = running_mirror(&pods, "web-static-1", Duration::from_secs(60)).await?;
    let cache = running_mirror(&pods, "cache-static-1", Duration::from_secs(60)).await?;
    for (p, source) in [(&web, "file"), (&cache, "http")] {
        let a = annotations(p);
        assert_eq!(a.get(SOURCE).map(String::as_str), Some(source), "{a:?}");
        assert_eq!(a.get(MIRROR), a.get(HASH), "{a:?}");
        assert_eq!(a.get(HASH).map(String::len), Some(32), "{a:?}");
        assert!(a.contains_key(SEEN), "{a:?}");
        assert_ne!(
            p.metadata.uid.as_ref(),
            a.get(HASH),
            "the mirror has a UID of its own"
        );
        let owner = &p.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!((owner.kind.as_str(), owner.name.as_str()), ("Node", NODE));
        assert_eq!(owner.uid, node_uid);
        assert_eq!(owner.controller, Some(true));
        assert_eq!(p.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(NODE));
    }
    assert!(
        served.load(Ordering::Relaxed) >= 1,
        "the URL was fetched with the header"
    );
    assert_eq!(running(&runtime).await?, vec!["cache-static-1", "web-static-1"]);
    let web_container = container_of(&runtime, "web-static-1").await?.expect("web runs");

    // 2. deleting the mirror pod (as a user would, with the default grace) brings a new one; the static
    //    pod itself is untouched
    let old_uid = web.metadata.uid.clone();
    pods.delete("web-static-1", &DeleteParams::default()).await?;
    let again = wait_for("a new mirror pod for web", Duration::from_secs(60), || async {
        Ok(pods
            .get_opt("web-static-1")
            .await?
            .filter(|p| p.metadata.uid != old_uid && p.metadata.deletion_timestamp.is_none()))
    })
    .await?;
    assert_eq!(annotations(&again).get(MIRROR), annotations(&web).get(MIRROR));
    running_mirror(&pods, "web-static-1", Duration::from_secs(30)).await?;
    assert_eq!(
        container_of(&runtime, "web-static-1").await?.as_ref(),
        Some(&web_container),
        "the static pod kept its container"
    );

    // 3. a bad manifest: an event naming the file and the field; the others keep running
    write(
        &dir,
        "bad.yaml",
        &manifest("bad", "busybox").replace(
            "    image: busybox\n",
            "    image: busybox\n    ports:\n    - containerPort: eighty\n",
        ),
    )?;
    let events: Api<Event> = Api::all(admin.clone());
    let message = wait_for("a FailedStaticPod event", Duration::from_secs(30), || async {
        Ok(events
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedStaticPod"))
            .and_then(|e| e.message))
    })
    .await?;
    assert!(message.contains("bad.yaml"), "{message}");
    assert!(
        message.contains("spec.containers[0].ports[0].containerPort"),
        "{message}"
    );
    assert_eq!(running(&runtime).await?, vec!["cache-static-1", "web-static-1"]);

    // 4. removing the file removes the static pod and its mirror (seen through inotify: the periodic
    //    re-read is 2 minutes away)
    std::fs::remove_file(dir.join("web.yaml"))?;
    wait_for("the web mirror pod gone", Duration::from_secs(30), || async {
        Ok(pods.get_opt("web-static-1").await?.is_none().then_some(()))
    })
    .await?;
    wait_for("web stopped in the runtime", Duration::from_secs(30), || async {
        Ok((running(&runtime).await? == vec!["cache-static-1"]).then_some(()))
    })
    .await?;

    // 5. the API server goes away: static pods keep running, a new one starts; back, it is mirrored
    cp.stop_apiserver().await?;
    write(&dir, "late.yaml", &manifest("late", "busybox:1.36"))?;
    wait_for(
        "late running without an API server",
        Duration::from_secs(30),
        || container_of(&runtime, "late-static-1"),
    )
    .await?;
    // the agent goes on without the API server: it reads its URL twice more (2 s apart), and the static pods
    // run all along
    let reads = served.load(Ordering::Relaxed);
    wait_for(
        "two more reads of the static pod URL while the API server is away",
        Duration::from_secs(60),
        || async {
            let now = running(&runtime).await?;
            anyhow::ensure!(
                now == ["cache-static-1", "late-static-1"],
                "static pods running without the API server: {now:?}"
            );
            Ok((served.load(Ordering::Relaxed) >= reads + 2).then_some(()))
        },
    )
    .await?;
    cp.start_apiserver().await?;
    let late = running_mirror(&pods, "late-static-1", Duration::from_secs(90)).await?;
    assert_eq!(annotations(&late).get(SOURCE).map(String::as_str), Some("file"));
    running_mirror(&pods, "cache-static-1", Duration::from_secs(30)).await?;

    agent.stop(Duration::from_secs(10)).await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
