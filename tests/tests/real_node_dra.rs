//! Dynamic resource allocation on a real node: the Kubernetes e2e suite's DRA test driver from the pinned
//! `k8s.io/kubernetes` module (`test/e2e/dra/test-driver`, built by `hack/build-dra-test-driver.sh`) runs as the
//! node's DRA driver — its kubelet plugin registers through the agent's `plugins_registry`, publishes the node's
//! ResourceSlice and writes CDI specs into the directory containerd 2.x reads them from. The real scheduler
//! allocates a device to a pod's claim; the agent prepares the claim before the sandbox, hands the CDI device to
//! containerd for the container that names the claim, reports the claim's device for that container in the
//! pod-resources API, and releases the claim when the pod is deleted. A binary
//! of its own, with its own node, so its driver never meets the other real-node tests. Needs root (or
//! `NODE_AGENT_SKIP_REAL_NODE=1` to skip).

/// The containerd the node runs on: 2.x, which injects CDI devices without further configuration.
const CONTAINERD: &str = "2";

#[allow(dead_code)]
#[path = "real_node/harness.rs"]
mod harness;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::wait_for;
use harness::{NODE, RealNode};
use k8s_openapi::api::core::v1::{Event, Pod};
use k8s_openapi::api::resource::v1::{DeviceClass, ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use runtime_api::{Runtime, cri};

/// The test driver's name (its default).
const DRIVER: &str = "test-driver.cdi.k8s.io";

/// The test driver (`hack/build-dra-test-driver.sh` builds it on first use and caches it).
async fn driver_binary() -> anyhow::Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/build-dra-test-driver.sh");
    let built = tokio::task::spawn_blocking(move || std::process::Command::new("bash").arg(script).output())
        .await??;
    anyhow::ensure!(
        built.status.success(),
        "building the DRA test driver: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    Ok(PathBuf::from(String::from_utf8(built.stdout)?.trim()))
}

/// The answer of the pod-resources client built on the published Go client (`tests/podresources-client`,
/// built by `hack/build-podresources-client.sh`) run with `args` against the node's socket.
async fn go_pod_resources(node: &RealNode, args: &[&str]) -> anyhow::Result<serde_json::Value> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/build-podresources-client.sh");
    let built = tokio::task::spawn_blocking(move || std::process::Command::new("bash").arg(script).output())
        .await??;
    anyhow::ensure!(
        built.status.success(),
        "building the pod-resources client: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    let bin = PathBuf::from(String::from_utf8(built.stdout)?.trim());
    let out = tokio::process::Command::new(bin)
        .arg(node_agent::pod_resources::socket_path(&node.agent_root))
        .args(args)
        .output()
        .await?;
    anyhow::ensure!(
        out.status.success(),
        "podresources-client {args:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

/// The node's CDI spec directory (containerd reads it; the driver writes it).
fn cdi_dir(node: &RealNode) -> PathBuf {
    node.containerd_dir.join("cdi")
}

/// Starts the driver's kubelet plugin for the node, with `devices` devices, as the cluster's admin.
async fn start_driver(node: &RealNode, devices: u32) -> anyhow::Result<(testenv::process::Proc, PathBuf)> {
    let bin = driver_binary().await?;
    let dir = node
        .agent_root
        .parent()
        .context("the node's directory")?
        .join("dra-driver");
    std::fs::create_dir_all(&dir)?;
    // the driver's socket goes in <datadir>/<driver name>/, as under the kubelet's plugins directory
    let data = node.agent_root.join("plugins");
    std::fs::create_dir_all(data.join(DRIVER))?;
    let log = dir.join("driver.log");
    let args: Vec<String> = vec![
        "kubelet-plugin".into(),
        format!("--kubeconfig={}", node.cp.admin_kubeconfig().display()),
        format!("--drivername={DRIVER}"),
        format!("--node-name={NODE}"),
        format!("--num-devices={devices}"),
        format!(
            "--plugin-registration-path={}",
            node.agent_root.join("plugins_registry").display()
        ),
        format!("--datadir={}", data.display()),
        format!("--cdi-dir={}", cdi_dir(node).display()),
        "-v=5".into(),
    ];
    let proc = testenv::process::Proc::start("dra-test-driver", &bin, &args, &log)?;
    Ok((proc, log))
}

/// The CDI spec files the driver wrote for claim `uid`.
fn cdi_files(node: &RealNode, uid: &str) -> Vec<String> {
    std::fs::read_dir(cdi_dir(node))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(uid))
        .collect()
}

/// The environment of container `name` of `pod`, as the process inside sees it (CRI ExecSync `env`).
async fn container_env(node: &RealNode, pod: &Pod, name: &str) -> anyhow::Result<Vec<String>> {
    let id = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.name == name))
        .and_then(|c| c.container_id.clone())
        .with_context(|| format!("containerID of {name}"))?;
    let id = id
        .strip_prefix("containerd://")
        .context("containerd's ID")?
        .to_owned();
    let out = node
        .cri()
        .await?
        .exec_sync(cri::ExecSyncRequest {
            container_id: id,
            cmd: vec!["env".into()],
            timeout: 10,
        })
        .await?;
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect())
}

#[tokio::test]
async fn a_pod_with_a_resource_claim_runs_with_its_cdi_device_and_the_claim_is_released_after()
-> anyhow::Result<()> {
    e2e::init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let admin = node.cp.admin_client().await?;
    let t0 = Instant::now();
    let (driver, driver_log) = start_driver(node, 2).await?;
    let fail = |e: anyhow::Error| {
        e.context(format!(
            "driver log:\n{}\nagent log:\n{}",
            testenv::process::log_tail(&driver_log, 30),
            node.agent_log_tail()
        ))
    };

    // the driver publishes the node's devices: a ResourceSlice of two, owned by the node
    let slices: Api<ResourceSlice> = Api::all(admin.clone());
    let slice = wait_for("the driver's ResourceSlice", Duration::from_secs(60), || async {
        Ok(slices
            .list(&ListParams::default())
            .await?
            .items
            .into_iter()
            .find(|s| s.spec.driver == DRIVER && s.spec.node_name.as_deref() == Some(NODE)))
    })
    .await
    .map_err(fail)?;
    assert_eq!(slice.spec.devices.as_ref().map(Vec::len), Some(2));
    // and registers with the agent, which then knows its name
    wait_for(
        "the agent to register the driver",
        Duration::from_secs(30),
        || async {
            Ok(std::fs::read_to_string(&node.agent_log)
                .unwrap_or_default()
                .contains("DRA driver registered")
                .then_some(()))
        },
    )
    .await
    .map_err(fail)?;
    println!("driver up and registered in {:?}", t0.elapsed());

    let ns = "dra";
    let pods = node.namespace(ns).await?;
    let classes: Api<DeviceClass> = Api::all(admin.clone());
    let class: DeviceClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "node-agent-test"},
        "spec": {"selectors": [{"cel": {"expression": format!("device.driver == \"{DRIVER}\"")}}]},
    }))?;
    match classes.create(&PostParams::default(), &class).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let templates: Api<ResourceClaimTemplate> = Api::namespaced(admin.clone(), ns);
    let template: ResourceClaimTemplate = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "one-device"},
        "spec": {"spec": {"devices": {
            "requests": [{"name": "my-device", "exactly": {"deviceClassName": "node-agent-test"}}],
            "config": [{"opaque": {"driver": DRIVER, "parameters": {"a": "b"}}}],
        }}},
    }))?;
    templates.create(&PostParams::default(), &template).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "with-claim"},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [
                {"name": "with-resource", "image": "localhost/busybox:local", "command": ["sleep", "3600"],
                 "resources": {"claims": [{"name": "resource"}]}},
                {"name": "without-resource", "image": "localhost/busybox:local", "command": ["sleep", "3600"]},
            ],
            "resourceClaims": [{"name": "resource", "resourceClaimTemplateName": "one-device"}],
        },
    }))?;
    let t1 = Instant::now();
    node.create_pod(&pods, &pod).await?;
    let running = wait_for("the pod Running", Duration::from_secs(120), || async {
        let p = pods.get("with-claim").await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.clone());
        Ok((phase.as_deref() == Some("Running")).then_some(p))
    })
    .await
    .map_err(fail)?;
    println!("pod with a claim Running in {:?}", t1.elapsed());

    // the claim the controller generated for the pod, allocated by the scheduler, reserved for the pod
    let claim_name = running
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_ref())
        .and_then(|c| c.first())
        .and_then(|c| c.resource_claim_name.clone())
        .context("the pod's generated claim")?;
    let claims: Api<ResourceClaim> = Api::namespaced(admin.clone(), ns);
    let claim = claims.get(&claim_name).await?;
    let claim_uid = claim.metadata.uid.clone().unwrap_or_default();
    let reserved: Vec<String> = claim
        .status
        .as_ref()
        .and_then(|s| s.reserved_for.clone())
        .unwrap_or_default()
        .into_iter()
        .map(|r| r.name)
        .collect();
    assert_eq!(reserved, ["with-claim"]);
    assert_eq!(
        cdi_files(node, &claim_uid).len(),
        1,
        "the driver's CDI spec for the claim"
    );

    // the container naming the claim has the env the driver's CDI spec injects; the other has none of it
    let with = container_env(node, &running, "with-resource").await?;
    let claim_var = format!(
        "claim_{}_my_device=true",
        claim_name.replace(|c: char| !c.is_ascii_alphanumeric(), "_")
    );
    assert!(with.iter().any(|l| l == "user_a=b"), "{with:?}");
    assert!(with.contains(&claim_var), "{claim_var} in {with:?}");
    let without = container_env(node, &running, "without-resource").await?;
    assert!(
        !without
            .iter()
            .any(|l| l.starts_with("user_") || l.starts_with("claim_")),
        "{without:?}"
    );

    // the pod-resources API lists the claim with its device for the container that uses it, as the kubelet
    // reports it, to this project's client and to one built on the published Go client alike
    let allocated = claim
        .status
        .as_ref()
        .and_then(|s| s.allocation.as_ref())
        .and_then(|a| a.devices.as_ref())
        .and_then(|d| d.results.as_ref())
        .and_then(|r| r.first())
        .context("the claim's allocated device")?;
    let mut client =
        node_agent::pod_resources::connect(node_agent::pod_resources::socket_path(&node.agent_root)).await?;
    let listed = client
        .get(node_agent::pod_resources::v1::GetPodResourcesRequest {
            pod_name: "with-claim".into(),
            pod_namespace: ns.into(),
        })
        .await?
        .into_inner()
        .pod_resources
        .context("the pod's resources")?;
    let dynamic: Vec<_> = listed
        .containers
        .iter()
        .map(|c| (c.name.as_str(), c.dynamic_resources.clone()))
        .collect();
    assert_eq!(dynamic.len(), 2, "{listed:?}");
    assert_eq!(dynamic[1], ("without-resource", Vec::new()));
    let (name, [resource]) = (dynamic[0].0, dynamic[0].1.as_slice()) else {
        panic!("one claim for with-resource: {listed:?}");
    };
    assert_eq!(name, "with-resource");
    assert_eq!(
        (resource.claim_name.as_str(), resource.claim_namespace.as_str()),
        (claim_name.as_str(), ns)
    );
    let [device] = resource.claim_resources.as_slice() else {
        panic!("one device: {resource:?}");
    };
    assert_eq!(
        (
            device.driver_name.as_str(),
            device.pool_name.as_str(),
            device.device_name.as_str()
        ),
        (
            allocated.driver.as_str(),
            allocated.pool.as_str(),
            allocated.device.as_str()
        )
    );
    assert_eq!(device.cdi_devices.len(), 1, "{device:?}");
    assert!(device.cdi_devices[0].name.starts_with(DRIVER), "{device:?}");
    let listed_by_go = go_pod_resources(node, &["list"]).await?;
    let go_dynamic = listed_by_go["pod_resources"]
        .as_array()
        .and_then(|pods| pods.iter().find(|p| p["name"] == "with-claim"))
        .map(|p| p["containers"][0]["dynamic_resources"].clone())
        .context("the pod in the Go client's list")?;
    assert_eq!(go_dynamic[0]["claim_name"], claim_name.as_str(), "{listed_by_go}");
    assert_eq!(
        go_dynamic[0]["claim_resources"][0]["device_name"],
        allocated.device.as_str()
    );
    assert_eq!(
        go_dynamic[0]["claim_resources"][0]["cdi_devices"][0]["name"],
        device.cdi_devices[0].name.as_str()
    );

    // the agent's checkpoint holds the prepared claim (a restarted agent still knows its devices)
    let checkpoint = std::fs::read_to_string(node.agent_root.join("dra_manager_state"))?;
    assert!(checkpoint.contains(&claim_uid), "{checkpoint}");

    // no event says preparing failed
    let events: Api<Event> = Api::namespaced(admin.clone(), ns);
    let failed: Vec<String> = events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedPrepareDynamicResources"))
        .filter_map(|e| e.message)
        .collect();
    assert!(failed.is_empty(), "{failed:?}");

    // deleting the pod releases the claim: the driver removes its CDI spec, the agent forgets the claim
    pods.delete("with-claim", &DeleteParams::default()).await?;
    wait_for("the pod gone", Duration::from_secs(60), || async {
        Ok(pods.get_opt("with-claim").await?.is_none().then_some(()))
    })
    .await
    .map_err(fail)?;
    assert!(
        cdi_files(node, &claim_uid).is_empty(),
        "the CDI spec removed by NodeUnprepareResources"
    );
    let checkpoint = std::fs::read_to_string(node.agent_root.join("dra_manager_state"))?;
    assert!(!checkpoint.contains(&claim_uid), "{checkpoint}");
    drop(driver);
    Ok(())
}
