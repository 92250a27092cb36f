//! The pod-resources API of the real node, as a node-local consumer (a device-monitoring agent) sees it: a
//! gRPC client on `<root-dir>/pod-resources/kubelet.sock` lists the pods running on containerd through the
//! agent — with the containers containerd runs for them (sidecars and app containers; not the finished init
//! container) — but not a pod that has finished; `Get` answers for one pod and refuses unknown and finished
//! ones as the kubelet does; `GetAllocatableResources` answers what a kubelet with the CPU and memory manager
//! policy `none` and no device plugins answers: nothing. The same answers reach a client built from the
//! upstream definition (`tests/podresources-client`, Go, on the published `k8s.io/kubelet` client): the wire
//! format is the kubelet's.

use std::collections::BTreeSet;
use std::os::unix::fs::FileTypeExt;
use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::DeleteParams;
use node_agent::pod_resources::{self, v1};
use runtime_api::{Runtime, cri};

use super::harness::RealNode;

const NS: &str = "rn-podres";

/// A busybox container that runs until SIGTERM.
fn long_running(name: &str) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "image": "localhost/busybox:local",
        "command": ["sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1 & wait $!; done"],
    })
}

/// `container` with `key` set to `value`.
fn with(mut container: serde_json::Value, key: &str, value: serde_json::Value) -> serde_json::Value {
    container[key] = value;
    container
}

async fn wait_phase(node: &RealNode, pods: &Api<Pod>, name: &str, phase: &str) -> anyhow::Result<()> {
    wait_for(
        &format!("pod {name} {phase}"),
        Duration::from_secs(90),
        || async {
            let p = pods.get(name).await?;
            Ok((p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase)).then_some(()))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))
}

/// The names of the containers containerd runs for pod `uid`.
async fn running_in_containerd(node: &RealNode, uid: &str) -> anyhow::Result<BTreeSet<String>> {
    let containers = node
        .cri()
        .await?
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: [("io.kubernetes.pod.uid".to_owned(), uid.to_owned())].into(),
                ..Default::default()
            }),
        })
        .await?
        .containers;
    Ok(containers
        .iter()
        .filter(|c| c.state == cri::ContainerState::ContainerRunning as i32)
        .filter_map(|c| c.metadata.as_ref().map(|m| m.name.clone()))
        .collect())
}

/// This test's pods in a `List` answer: name -> container names in the order listed.
fn ours(list: &v1::ListPodResourcesResponse) -> Vec<(String, Vec<String>)> {
    list.pod_resources
        .iter()
        .filter(|p| p.namespace == NS)
        .map(|p| {
            (
                p.name.clone(),
                p.containers.iter().map(|c| c.name.clone()).collect(),
            )
        })
        .collect()
}

#[tokio::test]
async fn a_local_client_lists_the_running_pods_and_their_containers_over_the_socket() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let socket = pod_resources::socket_path(&node.agent_root);
    assert!(
        std::fs::symlink_metadata(&socket)?.file_type().is_socket(),
        "{} is a unix socket",
        socket.display()
    );
    let pods = node.namespace(NS).await?;
    let web: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "initContainers": [
                {"name": "setup", "image": "localhost/busybox:local", "command": ["true"]},
                with(long_running("proxy"), "restartPolicy", serde_json::json!("Always")),
            ],
            "containers": [long_running("app"), long_running("metrics")],
        },
    }))?;
    let solo: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "solo"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 5,
            "containers": [with(long_running("main"), "resources", serde_json::json!({
                "requests": {"cpu": "1", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "64Mi"},
            }))],
        },
    }))?;
    let done: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "done"},
        "spec": {
            "automountServiceAccountToken": false,
            "restartPolicy": "Never",
            "containers": [{"name": "once", "image": "localhost/busybox:local", "command": ["true"]}],
        },
    }))?;
    let web_uid = node.create_pod(&pods, &web).await?.metadata.uid.context("uid")?;
    let solo_uid = node.create_pod(&pods, &solo).await?.metadata.uid.context("uid")?;
    node.create_pod(&pods, &done).await?;
    wait_phase(node, &pods, "web", "Running").await?;
    wait_phase(node, &pods, "solo", "Running").await?;
    wait_phase(node, &pods, "done", "Succeeded").await?;

    let mut client = pod_resources::connect(&socket).await?;
    // the finished pod leaves the list once its worker has stopped it (right after its final status)
    let list = wait_for(
        "List without the finished pod",
        Duration::from_secs(20),
        || async {
            let list = client
                .clone()
                .list(v1::ListPodResourcesRequest {})
                .await?
                .into_inner();
            Ok(ours(&list).iter().all(|(name, _)| name != "done").then_some(list))
        },
    )
    .await?;
    println!(
        "[real_node] pod-resources List: {} pods on the node, ours {:?}",
        list.pod_resources.len(),
        ours(&list)
    );
    let strings = |v: &[&str]| v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();
    assert_eq!(
        ours(&list),
        [
            ("solo".to_owned(), strings(&["main"])),
            ("web".to_owned(), strings(&["proxy", "app", "metrics"])),
        ],
        "the running pods, sidecar first, without the finished init container or the finished pod"
    );
    // what is listed is what containerd runs for the pods
    for (uid, name) in [(&web_uid, "web"), (&solo_uid, "solo")] {
        let listed: BTreeSet<String> = list
            .pod_resources
            .iter()
            .find(|p| p.namespace == NS && p.name == name)
            .map(|p| p.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default();
        assert_eq!(listed, running_in_containerd(node, uid).await?, "pod {name}");
    }
    // no CPU manager, memory manager, device plugins or DRA: nothing is assigned — also not to the
    // Guaranteed pod with a whole CPU, which a static CPU policy would pin
    for pod in &list.pod_resources {
        for c in &pod.containers {
            assert!(
                c.devices.is_empty()
                    && c.cpu_ids.is_empty()
                    && c.memory.is_empty()
                    && c.dynamic_resources.is_empty(),
                "{}/{} container {}: {c:?}",
                pod.namespace,
                pod.name,
                c.name
            );
        }
    }

    let got = client
        .get(v1::GetPodResourcesRequest {
            pod_name: "web".into(),
            pod_namespace: NS.into(),
        })
        .await?
        .into_inner()
        .pod_resources
        .context("Get answers the pod")?;
    assert_eq!(
        Some(&got),
        list.pod_resources
            .iter()
            .find(|p| p.namespace == NS && p.name == "web")
    );
    for missing in ["nope", "done"] {
        let error = client
            .get(v1::GetPodResourcesRequest {
                pod_name: missing.into(),
                pod_namespace: NS.into(),
            })
            .await
            .expect_err("not a pod holding resources");
        assert_eq!(error.code(), tonic::Code::Unknown, "{error:?}");
        assert_eq!(
            error.message(),
            format!("pod {missing} in namespace {NS} not found")
        );
    }

    let allocatable = client
        .get_allocatable_resources(v1::AllocatableResourcesRequest {})
        .await?
        .into_inner();
    assert_eq!(
        (
            allocatable.devices.len(),
            allocatable.cpu_ids.len(),
            allocatable.memory.len()
        ),
        (0, 0, 0),
        "{allocatable:?}"
    );

    upstream_client_sees_the_same(&socket, &list).await?;

    // deleted: gone from the list once its containers have stopped
    pods.delete("solo", &DeleteParams::default()).await?;
    wait_for("solo gone from the API", Duration::from_secs(60), || async {
        Ok(pods.get_opt("solo").await?.is_none().then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let list = client.list(v1::ListPodResourcesRequest {}).await?.into_inner();
    assert_eq!(
        ours(&list).iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
        ["web"]
    );
    for name in ["web", "done"] {
        pods.delete(name, &DeleteParams::default()).await?;
    }
    Ok(())
}

/// Runs the Go client built on the published `k8s.io/kubelet` pod-resources client (built by
/// `hack/build-podresources-client.sh`) with `args` (`-dial-path` first: dialing the bare path, as the kubelet's own
/// client does): its JSON answer, or the gRPC error's `code` and `message`.
async fn upstream_client(socket: &std::path::Path, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let script =
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/build-podresources-client.sh");
    let (socket, args) = (
        socket.to_owned(),
        args.iter().map(|a| (*a).to_owned()).collect::<Vec<_>>(),
    );
    let out = tokio::task::spawn_blocking(move || -> anyhow::Result<std::process::Output> {
        let built = std::process::Command::new("bash").arg(&script).output()?;
        anyhow::ensure!(
            built.status.success(),
            "building the Go pod-resources client: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        let bin = String::from_utf8(built.stdout)?.trim().to_owned();
        let (flags, rest) = args.split_at(usize::from(args.first().is_some_and(|a| a == "-dial-path")));
        Ok(std::process::Command::new(bin)
            .args(flags)
            .arg(&socket)
            .args(rest)
            .output()?)
    })
    .await??;
    anyhow::ensure!(
        matches!(out.status.code(), Some(0 | 3)),
        "podresources-client {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The upstream (Go) client's answers match what node-agent's own client got.
async fn upstream_client_sees_the_same(
    socket: &std::path::Path,
    list: &v1::ListPodResourcesResponse,
) -> anyhow::Result<()> {
    let answer = upstream_client(socket, &["list"]).await?;
    let listed: Vec<(String, Vec<String>)> = answer["pod_resources"]
        .as_array()
        .context("pod_resources")?
        .iter()
        .filter(|p| p["namespace"] == NS)
        .map(|p| {
            let containers = p["containers"].as_array().map(Vec::as_slice).unwrap_or_default();
            (
                p["name"].as_str().unwrap_or_default().to_owned(),
                containers
                    .iter()
                    .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
                    .collect(),
            )
        })
        .collect();
    println!("[real_node] the Go client on k8s.io/kubelet lists ours as {listed:?}");
    assert_eq!(listed, ours(list), "the upstream client's List");

    // dialed as the kubelet's own client dials: the socket's path as the request's authority
    let web = upstream_client(socket, &["-dial-path", "get", NS, "web"]).await?;
    assert_eq!(web["pod_resources"]["name"], "web", "{web}");
    assert_eq!(web["pod_resources"]["namespace"], NS, "{web}");
    let names: Vec<&str> = web["pod_resources"]["containers"]
        .as_array()
        .context("containers")?
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert_eq!(names, ["proxy", "app", "metrics"]);
    assert_eq!(
        web["pod_resources"]["containers"][0]["cpu_ids"],
        serde_json::json!([]),
        "{web}"
    );

    let missing = upstream_client(socket, &["get", NS, "nope"]).await?;
    assert_eq!(
        missing,
        serde_json::json!({"code": "Unknown", "message": format!("pod nope in namespace {NS} not found")})
    );
    let allocatable = upstream_client(socket, &["allocatable"]).await?;
    assert_eq!(
        allocatable,
        serde_json::json!({"devices": [], "cpu_ids": [], "memory": []})
    );
    Ok(())
}
