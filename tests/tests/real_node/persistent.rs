//! Persistent storage and mounts on the real node: a pod whose claim is not bound waits in `ContainerCreating`
//! with the kubelet's `FailedMount` event and runs once the control plane's PersistentVolume controller binds the
//! claim to a hostPath volume (its root, a `subPath` and a `readOnly` mount reach the container); a StatefulSet's
//! claims are provisioned by a real dynamic provisioner (Rancher's local-path-provisioner, run against the test
//! control plane, its helper pods run by this node) and a replaced pod reads what its predecessor wrote; a
//! privileged container's mount under a `Bidirectional` volume mount is seen by a second container
//! (`HostToContainer`), which also mounts a `subPathExpr` named after its pod.

use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, Event, PersistentVolume, PersistentVolumeClaim, Pod, ServiceAccount,
};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::Api;
use kube::api::{DeleteParams, ListParams, LogParams, PostParams};

use super::harness::{NODE, RealNode};

const NS: &str = "rn-persistent";

async fn failed_mounts(node: &RealNode, pod: &str) -> anyhow::Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(node.cp.admin_client().await?, NS);
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={pod}")))
        .await?;
    Ok(list
        .items
        .into_iter()
        .filter(|e| e.reason.as_deref() == Some("FailedMount"))
        .map(|e| e.message.unwrap_or_default())
        .collect())
}

#[tokio::test]
async fn a_pod_waits_for_its_claim_and_runs_on_the_bound_host_path_volume() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let client = node.cp.admin_client().await?;
    let pp = PostParams::default();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let volumes: Api<PersistentVolume> = Api::all(client.clone());
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "data", "namespace": NS},
        "spec": {"storageClassName": "", "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Mi"}}},
    }))?;
    claims.create(&pp, &claim).await?;

    let script = r#"
echo "root=$(cat /data/seed)"
echo "sub=$(cat /sub/inner-seed)"
echo written > /data/by-pod
echo "readonly=$(touch /ro/x 2>/dev/null && echo no || echo yes)"
echo "ro_sees=$(cat /ro/by-pod)"
sleep 3600
"#;
    // nodeName set: the scheduler (which would wait for the claim itself) is not asked
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "claimed"},
        "spec": {
            "nodeName": NODE,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", script],
                "volumeMounts": [
                    {"name": "store", "mountPath": "/data"},
                    {"name": "store", "mountPath": "/sub", "subPath": "inner"},
                    {"name": "store", "mountPath": "/ro", "readOnly": true},
                ],
            }],
            "volumes": [{"name": "store", "persistentVolumeClaim": {"claimName": "data"}}],
        },
    }))?;
    node.create_pod(&pods, &pod).await?;
    let message = wait_for(
        "a FailedMount event for the unbound claim",
        Duration::from_secs(60),
        // a claim read in the moment after the binding, before the API server's node authorizer has linked the
        // pod to its claim, is refused; the kubelet reports that and retries as node-agent does
        || async {
            Ok(failed_mounts(node, "claimed")
                .await?
                .into_iter()
                .find(|m| !m.contains("no relationship found between node")))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    assert_eq!(
        message,
        format!(
            "Unable to attach or mount volumes: unmounted volumes=[store], unattached volumes=[], failed to \
             process volumes=[store]: error processing PVC {NS}/data: PVC is not bound"
        )
    );
    // the event and the status are written separately: wait for the status that goes with the event
    let (phase, reason) = wait_for(
        "the claimed pod's status written while it waits",
        Duration::from_secs(30),
        || async {
            let status = pods.get("claimed").await?.status.context("status")?;
            let reason = status
                .container_statuses
                .iter()
                .flatten()
                .find_map(|c| c.state.as_ref()?.waiting.as_ref()?.reason.clone());
            Ok(reason.is_some().then_some((status.phase, reason)))
        },
    )
    .await?;
    assert_eq!(phase.as_deref(), Some("Pending"));
    assert_eq!(
        reason.as_deref(),
        Some("ContainerCreating"),
        "the kubelet's waiting reason"
    );

    let dir = std::env::temp_dir().join(format!("na-rn-pv-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("inner"))?;
    std::fs::write(dir.join("seed"), "from-the-node")?;
    std::fs::write(dir.join("inner/inner-seed"), "nested")?;
    // pre-bound to the claim: the PersistentVolume controller binds both at once
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "rn-persistent-host"},
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "persistentVolumeReclaimPolicy": "Retain",
            "claimRef": {"namespace": NS, "name": "data"},
            "hostPath": {"path": dir.display().to_string(), "type": "Directory"},
        },
    }))?;
    let _ = volumes
        .delete("rn-persistent-host", &DeleteParams::default())
        .await;
    let bound_at = Instant::now();
    volumes.create(&pp, &pv).await?;
    wait_for("the claim bound", Duration::from_secs(60), || async {
        let c = claims.get("data").await?;
        Ok((c.status.and_then(|s| s.phase).as_deref() == Some("Bound")).then_some(()))
    })
    .await?;
    let bound = bound_at.elapsed();
    wait_for("pod claimed Running", Duration::from_secs(60), || async {
        let p = pods.get("claimed").await?;
        Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node] claim bound {bound:?} after the PV was created, pod Running {:?} after",
        bound_at.elapsed()
    );
    let logs = wait_for("the container's report", Duration::from_secs(30), || async {
        let logs = pods.logs("claimed", &LogParams::default()).await?;
        Ok(logs.contains("ro_sees=").then_some(logs))
    })
    .await?;
    assert!(logs.contains("root=from-the-node\n"), "{logs}");
    assert!(logs.contains("sub=nested\n"), "the subPath mount: {logs}");
    assert!(logs.contains("readonly=yes\n"), "the readOnly mount: {logs}");
    assert!(
        logs.contains("ro_sees=written\n"),
        "one volume under both: {logs}"
    );
    assert_eq!(std::fs::read_to_string(dir.join("by-pod"))?, "written\n");

    pods.delete("claimed", &DeleteParams::default()).await?;
    wait_for("pod claimed gone", Duration::from_secs(60), || async {
        Ok(pods.get_opt("claimed").await?.is_none().then_some(()))
    })
    .await?;
    assert!(
        dir.join("by-pod").exists(),
        "a persistent volume's data outlives the pod"
    );
    claims.delete("data", &DeleteParams::default()).await?;
    volumes
        .delete("rn-persistent-host", &DeleteParams::default())
        .await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// The local-path-provisioner's namespace, ConfigMap and service account (its helper pods run as it).
const LPP_NS: &str = "local-path-storage";

/// Kills the provisioner when the test ends, however it ends.
struct Provisioner(std::process::Child);

impl Drop for Provisioner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts local-path-provisioner against the node's control plane, provisioning below `dir` on every node
/// (`WaitForFirstConsumer`: the scheduler picks the node, the provisioner's helper pod makes the directory
/// there), under StorageClass `local-path`.
async fn start_provisioner(node: &RealNode, dir: &std::path::Path) -> anyhow::Result<Provisioner> {
    let binary = testenv::assets::local_path_provisioner()?;
    let client = node.cp.admin_client().await?;
    node.namespace(LPP_NS).await?;
    let pp = PostParams::default();
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "local-path-provisioner", "namespace": LPP_NS},
    }))?;
    let _ = Api::<ServiceAccount>::namespaced(client.clone(), LPP_NS)
        .create(&pp, &sa)
        .await;
    let config = serde_json::json!({
        "nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES", "paths": [dir.display().to_string()]}],
    })
    .to_string();
    let helper = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: helper-pod\nspec:\n  containers:\n  \
                  - name: helper-pod\n    image: localhost/busybox:local\n    imagePullPolicy: IfNotPresent\n";
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "local-path-config", "namespace": LPP_NS},
        "data": {
            "config.json": config,
            "setup": "#!/bin/sh\nset -eu\nmkdir -m 0777 -p \"$VOL_DIR\"\n",
            "teardown": "#!/bin/sh\nset -eu\nrm -rf \"$VOL_DIR\"\n",
            "helperPod.yaml": helper,
        },
    }))?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), LPP_NS);
    let _ = configmaps
        .delete("local-path-config", &DeleteParams::default())
        .await;
    configmaps.create(&pp, &cm).await?;
    let sc: StorageClass = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "local-path"},
        "provisioner": "rancher.io/local-path",
        "volumeBindingMode": "WaitForFirstConsumer",
        "reclaimPolicy": "Delete",
    }))?;
    let _ = Api::<StorageClass>::all(client.clone()).create(&pp, &sc).await;
    let config_file = dir.with_extension("json");
    std::fs::write(&config_file, &config)?;
    let log = std::fs::File::create(dir.with_extension("log"))?;
    let child = std::process::Command::new(&binary)
        .args(["--debug", "start", "--kubeconfig"])
        .arg(node.cp.admin_kubeconfig())
        .arg("--config")
        .arg(&config_file)
        .args([
            "--namespace",
            LPP_NS,
            "--configmap-name",
            "local-path-config",
            "--service-account-name",
            "local-path-provisioner",
            "--helper-image",
            "localhost/busybox:local",
        ])
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()
        .with_context(|| format!("starting {}", binary.display()))?;
    Ok(Provisioner(child))
}

#[tokio::test]
async fn a_stateful_set_keeps_its_provisioned_data_across_a_pod_replacement() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let client = node.cp.admin_client().await?;
    let dir = node.agent_root.with_file_name("local-path");
    std::fs::create_dir_all(&dir)?;
    let _provisioner = start_provisioner(node, &dir).await?;
    let script = r#"
if [ -f /data/id ]; then echo "found=$(cat /data/id)"; else
  echo "$HOSTNAME-$(date +%s)" > /data/id; echo "wrote=$(cat /data/id)"; fi
sleep 3600
"#;
    let set: StatefulSet = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "web", "namespace": NS},
        "spec": {
            "replicas": 2,
            "serviceName": "web",
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "main",
                        "image": "localhost/busybox:local",
                        "command": ["sh", "-c", script],
                        "volumeMounts": [{"name": "data", "mountPath": "/data"}],
                    }],
                },
            },
            "volumeClaimTemplates": [{
                "metadata": {"name": "data"},
                "spec": {"storageClassName": "local-path", "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Mi"}}},
            }],
        },
    }))?;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), NS);
    let t0 = Instant::now();
    sets.create(&PostParams::default(), &set).await?;
    let provisioner_log = || std::fs::read_to_string(dir.with_extension("log")).unwrap_or_default();
    let mut wrote = Vec::new();
    for name in ["web-0", "web-1"] {
        let logs = wait_for(&format!("{name} reports"), Duration::from_secs(180), || async {
            let Some(p) = pods.get_opt(name).await? else {
                return Ok(None);
            };
            if p.status.and_then(|s| s.phase).as_deref() != Some("Running") {
                return Ok(None);
            }
            let logs = pods.logs(name, &LogParams::default()).await?;
            Ok(logs.contains("wrote=").then_some(logs))
        })
        .await
        .with_context(|| {
            format!(
                "agent log:\n{}\nprovisioner log:\n{}",
                node.agent_log_tail(),
                provisioner_log()
            )
        })?;
        wrote.push(logs.trim().trim_start_matches("wrote=").to_owned());
    }
    println!(
        "[real_node] StatefulSet web: 2 pods Running on provisioned volumes {:?} after creation",
        t0.elapsed()
    );
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), NS);
    let claim = claims.get("data-web-0").await?;
    let pv_name = claim
        .spec
        .and_then(|s| s.volume_name)
        .context("data-web-0 bound")?;
    let pv = Api::<PersistentVolume>::all(client.clone()).get(&pv_name).await?;
    let path = pv
        .spec
        .as_ref()
        .and_then(|s| s.host_path.as_ref().map(|h| h.path.clone()))
        .context("a hostPath PersistentVolume")?;
    assert!(path.starts_with(&dir.display().to_string()), "{path}");
    assert_eq!(
        std::fs::read_to_string(std::path::Path::new(&path).join("id"))?.trim(),
        wrote[0],
        "the data is in the provisioned directory on the node"
    );

    let old = pods.get("web-0").await?.metadata.uid;
    let t1 = Instant::now();
    pods.delete("web-0", &DeleteParams::default()).await?;
    let logs = wait_for("the replaced web-0 reports", Duration::from_secs(120), || async {
        let Some(p) = pods.get_opt("web-0").await? else {
            return Ok(None);
        };
        if p.metadata.uid == old || p.status.and_then(|s| s.phase).as_deref() != Some("Running") {
            return Ok(None);
        }
        let logs = pods.logs("web-0", &LogParams::default()).await?;
        Ok(logs.contains("found=").then_some(logs))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node] web-0 replaced and Running on its volume {:?} after the deletion",
        t1.elapsed()
    );
    assert_eq!(
        logs.trim(),
        format!("found={}", wrote[0]),
        "the replacement reads its predecessor's data"
    );

    sets.delete("web", &DeleteParams::default()).await?;
    for name in ["web-0", "web-1"] {
        wait_for(&format!("{name} gone"), Duration::from_secs(60), || async {
            Ok(pods.get_opt(name).await?.is_none().then_some(()))
        })
        .await?;
        claims
            .delete(&format!("data-{name}"), &DeleteParams::default())
            .await?;
    }
    // reclaim policy Delete: the provisioner's teardown helper pod removes the directory on the node
    wait_for(
        "the provisioned directory removed",
        Duration::from_secs(120),
        || async { Ok((!std::path::Path::new(&path).exists()).then_some(())) },
    )
    .await
    .with_context(|| format!("provisioner log:\n{}", provisioner_log()))?;
    Ok(())
}

#[tokio::test]
async fn a_bidirectional_mount_is_seen_from_a_second_container_and_sub_path_expr_names_the_pod()
-> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    // the maker mounts a tmpfs inside the shared volume (and takes it away again when stopped)
    let maker = r#"
mkdir -p /shared/inner && mount -t tmpfs tmpfs /shared/inner && echo hello > /shared/inner/f
trap 'umount /shared/inner; exit 0' TERM
sleep 3600 & wait
"#;
    let watcher = r#"
until [ -f /shared/inner/f ]; do sleep 0.2; done
echo "seen=$(cat /shared/inner/f)"
echo "fs=$(awk '$2=="/shared/inner"{print $3}' /proc/mounts)"
echo mine > /mine/by-watcher
echo done
sleep 3600
"#;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "propagation"},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [
                {
                    "name": "maker",
                    "image": "localhost/busybox:local",
                    "command": ["sh", "-c", maker],
                    "securityContext": {"privileged": true},
                    "volumeMounts": [{"name": "shared", "mountPath": "/shared",
                                      "mountPropagation": "Bidirectional"}],
                },
                {
                    "name": "watcher",
                    "image": "localhost/busybox:local",
                    "command": ["sh", "-c", watcher],
                    "env": [{"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
                    "volumeMounts": [
                        {"name": "shared", "mountPath": "/shared", "mountPropagation": "HostToContainer"},
                        {"name": "shared", "mountPath": "/mine", "subPathExpr": "pods/$(POD_NAME)"},
                    ],
                },
            ],
            "volumes": [{"name": "shared", "emptyDir": {}}],
        },
    }))?;
    let created = node.create_pod(&pods, &pod).await?;
    let uid = created.metadata.uid.context("uid")?;
    let logs = wait_for("the watcher's report", Duration::from_secs(90), || async {
        let Ok(logs) = pods
            .logs(
                "propagation",
                &LogParams {
                    container: Some("watcher".into()),
                    ..LogParams::default()
                },
            )
            .await
        else {
            return Ok(None);
        };
        Ok(logs.contains("done").then_some(logs))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    assert!(
        logs.contains("seen=hello\n"),
        "the maker's mount reached the watcher: {logs}"
    );
    assert!(logs.contains("fs=tmpfs\n"), "as a mount: {logs}");
    let volume = node
        .agent_root
        .join("pods")
        .join(&uid)
        .join("volumes/kubernetes.io~empty-dir/shared");
    assert_eq!(
        std::fs::read_to_string(volume.join("inner/f"))?,
        "hello\n",
        "the container's mount reached the node"
    );
    assert_eq!(
        std::fs::read_to_string(volume.join("pods/propagation/by-watcher"))?,
        "mine\n",
        "subPathExpr expanded from the container's environment"
    );
    pods.delete("propagation", &DeleteParams::default()).await?;
    wait_for("pod propagation gone", Duration::from_secs(60), || async {
        Ok(pods.get_opt("propagation").await?.is_none().then_some(()))
    })
    .await?;
    Ok(())
}
