//! CSI storage on the hollow fleet against the real control plane, loaded through the real storage path: a
//! StatefulSet's volumeClaimTemplate makes claims of a `WaitForFirstConsumer` StorageClass; the real scheduler
//! binds each pod to a hollow node (volume binding, the nodes' `CSINode` objects); the real external-provisioner
//! creates each volume through the e2e suite's mock CSI driver; the attach/detach controller makes each volume's
//! `VolumeAttachment` once the node reports it in use, and the real external-attacher attaches it through the
//! mock driver's `ControllerPublishVolume`; the node's agent sees it attached and runs the pod. Deleting the pods
//! releases the volumes: no longer in use, detached, their `VolumeAttachment`s gone.
//!
//! The mock driver's controller knows one node ID (its name), so the profile gives every hollow node that ID.
//!
//! A driver whose node side fails at first (the profile's scripted `stageFailures`) shows each pod what a
//! kubelet shows: `FailedMount` events in the kubelet's words, the set-up retried with back-off, the pod Running
//! once a retry succeeds.
//!
//! The small fleets run in the default test run; `storage_at_scale` (ignored; `cargo test -p hollow --test csi --
//! --ignored --nocapture`) runs 1,000 nodes and 2,000 pods with claims, plain pods beside them for the memory a
//! claim adds (figures in docs/benchmarks.md).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::{init_logging, list_paged, wait_for, wait_for_progress};
use hollow::client_pool::{ClientPool, PoolLimits, PoolSize};
use hollow::fleet::{Fleet, FleetSpec};
use hollow::profiles;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{Namespace, Node, PersistentVolumeClaim, Pod, ServiceAccount};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass, VolumeAttachment};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use node_agent::Metrics;
use node_agent::pods::PodMetrics;
use serde_json::json;
use testenv::process::{Proc, log_tail};
use tokio_util::sync::CancellationToken;

/// Runs `hack/<script>` (which builds a binary on first use and caches it); the binary's path.
async fn built(script: &str) -> anyhow::Result<PathBuf> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../hack")
        .join(script);
    let out =
        tokio::task::spawn_blocking(move || std::process::Command::new("bash").arg(path).output()).await??;
    anyhow::ensure!(
        out.status.success(),
        "{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

/// The mock driver's controller with the real provisioner and attacher beside it.
struct Storage {
    procs: Vec<Proc>,
    logs: Vec<PathBuf>,
    _dir: tempfile::TempDir,
}

impl Storage {
    async fn start(cp: &testenv::ControlPlane, driver: &str) -> anyhow::Result<Self> {
        let (mock, provisioner, attacher) = (
            built("build-csi-mock-driver.sh").await?,
            built("build-external-provisioner.sh").await?,
            built("build-external-attacher.sh").await?,
        );
        let dir = tempfile::tempdir()?;
        let socket = dir.path().join("csi.sock");
        let kubeconfig = format!("--kubeconfig={}", cp.admin_kubeconfig().display());
        let address = format!("--csi-address={}", socket.display());
        let mut procs = Vec::new();
        let mut logs = Vec::new();
        let log = dir.path().join("driver.log");
        procs.push(Proc::start(
            "csi-mock-driver",
            &mock,
            &[
                "--name".into(),
                driver.into(),
                "--csi-endpoint".into(),
                socket.display().to_string(),
            ],
            &log,
        )?);
        logs.push(log);
        wait_for("the mock driver's socket", Duration::from_secs(30), || async {
            Ok(socket.exists().then_some(()))
        })
        .await?;
        for (name, program) in [("csi-provisioner", &provisioner), ("csi-attacher", &attacher)] {
            let log = dir.path().join(format!("{name}.log"));
            let args = [
                address.clone(),
                kubeconfig.clone(),
                "--leader-election=false".into(),
                "--timeout=30s".into(),
                "--worker-threads=50".into(),
                "--kube-api-qps=200".into(),
                "--kube-api-burst=400".into(),
                "--v=2".into(),
            ];
            procs.push(Proc::start(name, program, &args, &log)?);
            logs.push(log);
        }
        Ok(Self {
            procs,
            logs,
            _dir: dir,
        })
    }

    fn tails(&self) -> String {
        self.logs
            .iter()
            .map(|l| format!("{}:\n{}", l.display(), log_tail(l, 15)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    async fn stop(self) -> anyhow::Result<()> {
        for p in self.procs {
            p.stop(Duration::from_secs(10)).await?;
        }
        Ok(())
    }
}

fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

async fn running(pods: &Api<Pod>, label: &str, want: usize) -> anyhow::Result<(usize, Option<Vec<Pod>>)> {
    let list = list_paged(pods, &ListParams::default().labels(label)).await?;
    let running: Vec<Pod> = list
        .into_iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
        .collect();
    let n = running.len();
    Ok((n, (n == want).then_some(running)))
}

async fn create_namespace(admin: &kube::Client, ns: &str) -> anyhow::Result<()> {
    Api::<Namespace>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}}))?,
        )
        .await?;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    wait_for("the default service account", Duration::from_secs(30), || async {
        Ok(accounts.get_opt("default").await?.map(|_| ()))
    })
    .await
}

/// `fleet`: the label of the nodes the pods may run on (each test's own fleet).
fn stateful_set(
    name: &str,
    replicas: usize,
    class: Option<&str>,
    fleet: &str,
) -> anyhow::Result<StatefulSet> {
    let mut spec = json!({
        "replicas": replicas,
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": {"app": name}},
        "serviceName": name,
        "template": {
            "metadata": {"labels": {"app": name}},
            "spec": {
                "nodeSelector": {"fleet": fleet},
                "terminationGracePeriodSeconds": 0,
                "containers": [{"name": "app", "image": "registry.test/db:1"}],
            },
        },
    });
    if let Some(class) = class {
        spec["template"]["spec"]["containers"][0]["volumeMounts"] =
            json!([{"name": "data", "mountPath": "/data"}]);
        spec["volumeClaimTemplates"] = json!([{
            "metadata": {"name": "data"},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": class,
                     "resources": {"requests": {"storage": "1Gi"}}},
        }]);
    }
    Ok(serde_json::from_value(
        json!({"metadata": {"name": name}, "spec": spec}),
    )?)
}

/// Starts `nodes` hollow nodes with the CSI driver (`script`: more keys of the profile's `csi:` section), runs
/// `plain` pods without volumes and `pods` pods with a claim each, checks attachment and release; returns after
/// tearing down.
async fn storage_load(
    nodes: usize,
    plain: usize,
    pods: usize,
    driver: &str,
    ns: &str,
    script: &str,
) -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let admin = cp.admin_client().await?;
    let config = cp.admin_config().await?;
    let storage = Storage::start(cp, driver).await?;
    let pool = ClientPool::new(&config, PoolSize::for_fleet(nodes, true, PoolLimits::default()))?;
    let token = CancellationToken::new();
    let yaml = format!(
        "profiles:\n  - name: storage\n    weight: 1\n    labels: {{fleet: {ns}}}\n    \
         csi: {{driver: {driver}, nodeId: {driver}, maxVolumes: 16{script}}}\n"
    );
    let spec = FleetSpec::new(nodes, format!("{ns}-{{index}}"), profiles::parse(&yaml, "test")?)?;
    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        token.clone(),
    )
    .await?;
    let t0 = Instant::now();

    // every node publishes the driver in its CSINode object and its node ID on the Node
    let csi_nodes: Api<CSINode> = Api::all(admin.clone());
    let prefix = format!("{ns}-");
    wait_for_progress(
        "every node's CSINode listing the driver",
        Duration::from_secs(120),
        Duration::from_secs(1800),
        || async {
            let listed = list_paged(&csi_nodes, &ListParams::default())
                .await?
                .into_iter()
                .filter(|n| n.metadata.name.as_deref().is_some_and(|n| n.starts_with(&prefix)))
                .filter(|n| {
                    n.spec.drivers.iter().any(|d| {
                        d.name == driver
                            && d.node_id == driver
                            && d.allocatable.as_ref().and_then(|a| a.count) == Some(16)
                    })
                })
                .count();
            Ok((listed, (listed == nodes).then_some(())))
        },
    )
    .await?;
    println!(
        "[hollow csi] {nodes} nodes registered with the driver in CSINode in {:?}",
        t0.elapsed()
    );

    Api::<CSIDriver>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": driver},
                "spec": {"attachRequired": true, "podInfoOnMount": false}}))?,
        )
        .await?;
    let class = format!("{ns}-class");
    Api::<StorageClass>::all(admin.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": class}, "provisioner": driver,
                "reclaimPolicy": "Delete", "volumeBindingMode": "WaitForFirstConsumer"}))?,
        )
        .await?;
    create_namespace(&admin, ns).await?;
    let sets: Api<StatefulSet> = Api::namespaced(admin.clone(), ns);
    let pod_api: Api<Pod> = Api::namespaced(admin.clone(), ns);

    let rss0 = rss_bytes();
    if plain > 0 {
        let t = Instant::now();
        sets.create(&PostParams::default(), &stateful_set("plain", plain, None, ns)?)
            .await?;
        wait_for_progress(
            "the plain pods Running",
            Duration::from_secs(300),
            Duration::from_secs(3600),
            || running(&pod_api, "app=plain", plain),
        )
        .await?;
        println!("[hollow csi] {plain} plain pods Running in {:?}", t.elapsed());
    }
    let rss1 = rss_bytes();

    let t1 = Instant::now();
    sets.create(
        &PostParams::default(),
        &stateful_set("db", pods, Some(&class), ns)?,
    )
    .await?;
    let ran = wait_for_progress(
        "every pod with a claim Running",
        Duration::from_secs(300),
        Duration::from_secs(3600),
        || running(&pod_api, "app=db", pods),
    )
    .await
    .with_context(|| storage.tails())?;
    let took = t1.elapsed();
    let rss2 = rss_bytes();
    println!(
        "[hollow csi] {pods} pods with claims (provisioned, attached) Running in {took:?}: {:.1} pods/s",
        pods as f64 / took.as_secs_f64()
    );
    if plain > 0 {
        let per = |bytes: u64, n: usize| bytes as f64 / n as f64 / 1024.0;
        println!(
            "[hollow csi] process RSS per plain pod {:.1} KiB, per pod with a claim {:.1} KiB",
            per(rss1.saturating_sub(rss0), plain),
            per(rss2.saturating_sub(rss1), pods)
        );
    }

    // each pod's volume is attached to its node: a VolumeAttachment the real attacher marked attached, and the
    // node reporting it in use and attached
    let attachments: Api<VolumeAttachment> = Api::all(admin.clone());
    let vas: BTreeMap<String, VolumeAttachment> = list_paged(&attachments, &ListParams::default())
        .await?
        .into_iter()
        .filter(|va| va.spec.attacher == driver)
        .filter_map(|va| Some((va.spec.source.persistent_volume_name.clone()?, va)))
        .collect();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let node_api: Api<Node> = Api::all(admin.clone());
    let mut by_node: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for pod in &ran {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let node = pod
            .spec
            .as_ref()
            .and_then(|s| s.node_name.clone())
            .unwrap_or_default();
        let claim = claims.get(&format!("data-{name}")).await?;
        let pv = claim.spec.and_then(|s| s.volume_name).context("claim bound")?;
        let va = vas
            .get(&pv)
            .with_context(|| format!("a VolumeAttachment for {pv}"))?;
        assert_eq!(va.spec.node_name, node, "{pv} attached to the pod's node");
        assert!(va.status.as_ref().is_some_and(|s| s.attached), "{pv} attached");
        by_node.entry(node).or_default().push(pv);
    }
    let sample: Vec<_> = by_node.iter().take(20).collect();
    for (node, pvs) in sample {
        let n = node_api.get(node).await?;
        let status = n.status.unwrap_or_default();
        let in_use = status.volumes_in_use.unwrap_or_default();
        let attached: BTreeSet<String> = status
            .volumes_attached
            .unwrap_or_default()
            .into_iter()
            .map(|a| a.name)
            .collect();
        for pv in pvs {
            let pv_obj = Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(admin.clone())
                .get(pv)
                .await?;
            let handle = pv_obj
                .spec
                .and_then(|s| s.csi)
                .map(|c| c.volume_handle)
                .context("a CSI volume")?;
            let unique = format!("kubernetes.io/csi/{driver}^{handle}");
            assert!(
                in_use.contains(&unique),
                "{node} reports {unique} in use: {in_use:?}"
            );
            assert!(
                attached.contains(&unique),
                "{node} has {unique} attached: {attached:?}"
            );
        }
    }
    println!(
        "[hollow csi] {} VolumeAttachments attached on {} nodes",
        vas.len(),
        by_node.len()
    );

    // the pods go: their volumes are no longer in use, the controller detaches them
    let t2 = Instant::now();
    sets.delete("db", &DeleteParams::foreground()).await?;
    wait_for_progress(
        "every VolumeAttachment gone",
        Duration::from_secs(300),
        Duration::from_secs(3600),
        || async {
            let left = list_paged(&attachments, &ListParams::default())
                .await?
                .into_iter()
                .filter(|va| va.spec.attacher == driver)
                .count();
            Ok((pods.saturating_sub(left), (left == 0).then_some(())))
        },
    )
    .await
    .with_context(|| storage.tails())?;
    println!(
        "[hollow csi] every volume detached {:?} after the pods' deletion",
        t2.elapsed()
    );
    let still: Vec<String> = list_paged(&node_api, &ListParams::default())
        .await?
        .into_iter()
        .filter(|n| n.metadata.name.as_deref().is_some_and(|n| n.starts_with(&prefix)))
        .filter(|n| {
            n.status
                .as_ref()
                .and_then(|s| s.volumes_in_use.as_ref())
                .is_some_and(|v| !v.is_empty())
        })
        .filter_map(|n| n.metadata.name)
        .collect();
    assert!(
        still.is_empty(),
        "nodes still reporting volumes in use: {still:?}"
    );

    token.cancel();
    fleet.stop(Duration::from_secs(10)).await;
    storage.stop().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statefulset_volumes_are_provisioned_attached_and_detached_on_hollow_nodes() -> anyhow::Result<()> {
    storage_load(10, 0, 20, "csi-mock.hollow-csi.test", "hollow-csi", "").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_driver_node_side_is_failed_mount_then_running_after_a_retry() -> anyhow::Result<()> {
    const NS: &str = "failing-csi";
    const PODS: usize = 4;
    // every volume's first two stagings fail, each publishing takes 200 ms
    storage_load(
        10,
        0,
        PODS,
        "csi-mock.failing-csi.test",
        NS,
        ", stageFailures: 2, publishLatency: 200ms",
    )
    .await?;
    // every pod ran (storage_load waited for it) after FailedMount events naming the driver's answer
    let cp = testenv::shared().await?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(cp.admin_client().await?, NS);
    let failed = wait_for(
        "a FailedMount event for every pod",
        Duration::from_secs(60),
        || async {
            let mut by_pod: BTreeMap<String, Vec<String>> = BTreeMap::new();
            for e in list_paged(&events, &ListParams::default()).await? {
                if e.reason.as_deref() == Some("FailedMount")
                    && let Some(pod) = e.involved_object.name
                {
                    by_pod.entry(pod).or_default().push(e.message.unwrap_or_default());
                }
            }
            Ok((by_pod.len() == PODS).then_some(by_pod))
        },
    )
    .await?;
    for (pod, messages) in failed {
        assert!(
            messages.iter().any(|m| m.starts_with(
                "MountVolume.SetUp failed for volume \"data\" : kubernetes.io/csi: MountDevice failed: rpc error: \
                 code = Internal desc = NodeStageVolume of volume "
            ) && m.ends_with(": scripted failure 1 of 2")),
            "{pod}: {messages:?}"
        );
    }
    Ok(())
}

/// The fleet at the scale of a cluster: 1,000 nodes, 2,000 pods with claims (and 2,000 plain pods first, for the
/// memory a claim adds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "storage at scale: minutes of a 1,000-node fleet; run by hand"]
async fn storage_at_scale() -> anyhow::Result<()> {
    storage_load(
        1000,
        2000,
        2000,
        "csi-mock.hollow-csi-scale.test",
        "hollow-csi-scale",
        "",
    )
    .await
}
