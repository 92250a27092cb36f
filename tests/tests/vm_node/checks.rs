//! What the VM node binaries check in the guest, for either cgroup driver ([`NodeSetup::systemd`]): pods of the
//! three QoS classes in the kubelet's cgroups with the kubelet's limits and OOM scores, the pods' cgroup limited
//! to the node's allocatable, a container past its memory limit OOM-killed, the node's figures from the v2 files.

use std::time::Duration;

use anyhow::Context;
use e2e::wait_for;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;

use crate::harness::{NODE, POD_PIDS_LIMIT, RESERVED_CPU, RESERVED_MEMORY, VmNode};

/// A one-container pod of busybox running `script` with `resources`.
pub fn pod(name: &str, script: &str, resources: serde_json::Value) -> anyhow::Result<Pod> {
    Ok(serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": "Never",
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", script],
                "resources": resources,
            }],
        },
    }))?)
}

/// The pod once Running: its UID and its container's runtime ID.
pub async fn running(node: &VmNode, pods: &Api<Pod>, name: &str) -> anyhow::Result<(String, String)> {
    let p = wait_for(
        &format!("pod {name} Running"),
        Duration::from_secs(180),
        || async {
            let p = pods.get(name).await?;
            let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
            Ok((phase == Some("Running")).then_some(p))
        },
    )
    .await;
    let p = match p {
        Ok(p) => p,
        Err(e) => return Err(e.context(format!("agent log:\n{}", node.agent_log_tail().await))),
    };
    let uid = p.metadata.uid.clone().context("uid")?;
    let id = p
        .status
        .and_then(|s| s.container_statuses)
        .and_then(|c| c.into_iter().next())
        .and_then(|c| c.container_id)
        .context("containerID")?;
    let id = id
        .strip_prefix("containerd://")
        .context("containerd's ID")?
        .to_owned();
    Ok((uid, id))
}

/// `file` of the guest's cgroup `cgroup` (relative to `/sys/fs/cgroup`), trimmed.
pub async fn cgroup_file(node: &VmNode, cgroup: &str, file: &str) -> anyhow::Result<String> {
    Ok(node
        .vm
        .read(&format!("/sys/fs/cgroup/{cgroup}/{file}"))
        .await?
        .trim()
        .to_owned())
}

/// The guest's memory as the agent counts its capacity (`MemTotal`), bytes.
pub async fn memory_capacity(node: &VmNode) -> anyhow::Result<u64> {
    let meminfo = node.vm.read("/proc/meminfo").await?;
    let kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .context("MemTotal in the guest's /proc/meminfo")?;
    Ok(kb * 1024)
}

/// Where the kubelet puts the node's cgroups, by driver.
pub struct Layout {
    systemd: bool,
}

impl Layout {
    pub fn of(node: &VmNode) -> Self {
        Self {
            systemd: node.setup.systemd,
        }
    }

    /// The pods' cgroup.
    pub fn kubepods(&self) -> &'static str {
        if self.systemd {
            "kubepods.slice"
        } else {
            "kubepods"
        }
    }

    /// A QoS class's cgroup (`""`: Guaranteed, directly in the pods' cgroup).
    pub fn class(&self, class: &str) -> String {
        match (class, self.systemd) {
            ("", _) => self.kubepods().to_owned(),
            (c, true) => format!("kubepods.slice/kubepods-{c}.slice"),
            (c, false) => format!("kubepods/{c}"),
        }
    }

    /// A pod's cgroup: `kubepods/burstable/pod<uid>`, or `kubepods-burstable-pod<uid>.slice` with the UID's `-`
    /// written `_` under its class's slice.
    pub fn pod(&self, class: &str, uid: &str) -> String {
        let parent = self.class(class);
        if !self.systemd {
            return format!("{parent}/pod{uid}");
        }
        let prefix = if class.is_empty() {
            "kubepods".to_owned()
        } else {
            format!("kubepods-{class}")
        };
        format!("{parent}/{prefix}-pod{}.slice", uid.replace('-', "_"))
    }

    /// A container's cgroup in its pod's, as runc names it for the driver.
    pub fn container(&self, pod: &str, id: &str) -> String {
        if self.systemd {
            format!("{pod}/cri-containerd-{id}.scope")
        } else {
            format!("{pod}/{id}")
        }
    }
}

/// `oom_score_adj` of the first process in the guest's cgroup `cgroup`.
async fn oom_score_adj(node: &VmNode, cgroup: &str) -> anyhow::Result<i64> {
    let procs = cgroup_file(node, cgroup, "cgroup.procs").await?;
    let pid = procs.lines().next().context("a process in the cgroup")?;
    Ok(node
        .vm
        .read(&format!("/proc/{pid}/oom_score_adj"))
        .await?
        .trim()
        .parse()?)
}

/// Pods of the three QoS classes run in the kubelet's cgroups with the kubelet's limits, the node's
/// `podPidsLimit` and the kubelet's OOM scores; the node's figures come from the v2 files.
pub async fn qos_pods_run_in_their_cgroups(node: &VmNode, pods: &Api<Pod>, tag: &str) -> anyhow::Result<()> {
    let fs = node
        .vm
        .run("stat -fc %T /sys/fs/cgroup", Duration::from_secs(30))
        .await?;
    assert_eq!(
        fs.trim(),
        "cgroup2fs",
        "the guest's cgroups are the unified hierarchy"
    );
    let layout = Layout::of(node);
    let sleep = "while :; do sleep 1; done";
    let classes = [
        (
            "guaranteed",
            serde_json::json!({"limits": {"cpu": "500m", "memory": "64Mi"}}),
        ),
        (
            "burstable",
            serde_json::json!({"requests": {"cpu": "250m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}),
        ),
        ("besteffort", serde_json::json!({})),
    ];
    for (name, resources) in &classes {
        node.create_pod(pods, &pod(name, sleep, resources.clone())?)
            .await?;
    }
    let mut seen = Vec::new();
    for (name, _) in &classes {
        seen.push(running(node, pods, name).await?);
    }
    let [(g_uid, g_id), (b_uid, b_id), (be_uid, be_id)] = <[_; 3]>::try_from(seen).expect("three pods");

    // the QoS tree with its controllers enabled level by level
    let subtree = cgroup_file(node, layout.kubepods(), "cgroup.subtree_control").await?;
    for controller in ["cpu", "memory", "pids"] {
        assert!(
            subtree.split_whitespace().any(|c| c == controller),
            "{} enables {controller} for its children: {subtree:?}",
            layout.kubepods()
        );
    }
    assert_eq!(
        cgroup_file(node, &layout.class("besteffort"), "cpu.weight").await?,
        "1"
    );
    // the burstable class weighs its pods' cpu requests: 250m is 256 shares, weight 10
    assert_eq!(
        cgroup_file(node, &layout.class("burstable"), "cpu.weight").await?,
        "10"
    );

    let guaranteed = layout.pod("", &g_uid);
    let burstable = layout.pod("burstable", &b_uid);
    let besteffort = layout.pod("besteffort", &be_uid);
    let mut report = Vec::new();
    for (cgroup, weight, max, memory) in [
        (&guaranteed, "20", "50000 100000", "67108864"),
        (&burstable, "10", "max 100000", "67108864"),
        (&besteffort, "1", "max 100000", "max"),
    ] {
        let got = (
            cgroup_file(node, cgroup, "cpu.weight").await?,
            cgroup_file(node, cgroup, "cpu.max").await?,
            cgroup_file(node, cgroup, "memory.max").await?,
            cgroup_file(node, cgroup, "pids.max").await?,
        );
        report.push(format!(
            "{cgroup}: cpu.weight {} cpu.max {} memory.max {} pids.max {}",
            got.0, got.1, got.2, got.3
        ));
        let expected = (
            weight.into(),
            max.into(),
            memory.into(),
            POD_PIDS_LIMIT.to_string(),
        );
        assert_eq!(got, expected, "{cgroup}");
    }
    println!("[{tag}] {}", report.join(&format!("\n[{tag}] ")));

    // each container in its pod's cgroup, holding its processes, with the kubelet's OOM score for its class:
    // Burstable 1000 - 1000 * request / capacity (32 MiB of the guest's memory)
    let capacity = memory_capacity(node).await?;
    let burstable_score = 1000 - (1000 * (32u64 << 20) / capacity) as i64;
    let mut scores = Vec::new();
    for (cgroup, id, score) in [
        (&guaranteed, &g_id, -997),
        (&burstable, &b_id, burstable_score),
        (&besteffort, &be_id, 1000),
    ] {
        let container = layout.container(cgroup, id);
        let got = oom_score_adj(node, &container).await?;
        scores.push(format!("{container}: oom_score_adj {got}"));
        assert_eq!(got, score, "{container}'s processes' oom_score_adj");
    }
    println!("[{tag}] {}", scores.join(&format!("\n[{tag}] ")));
    let container = layout.container(&guaranteed, &g_id);
    assert_eq!(
        cgroup_file(node, &container, "memory.max").await?,
        "67108864",
        "the container's own limit"
    );
    assert_eq!(
        cgroup_file(node, &container, "memory.oom.group").await?,
        "1",
        "an OOM kill takes all of the container's processes, as the kubelet asks on v2"
    );

    // the figures the node serves, read from the v2 files by the runtime (cgroupfs driver) or by the agent from
    // the pod's slice and its containers' scopes (systemd driver: containerd finds no sandbox cgroup there)
    let port = Api::<Node>::all(node.cp.admin_client().await?)
        .get(NODE)
        .await?
        .status
        .and_then(|s| s.daemon_endpoints)
        .and_then(|d| d.kubelet_endpoint)
        .map(|e| e.port)
        .context("the node's kubelet port")?;
    let summary: serde_json::Value = wait_for(
        "a summary with the guaranteed pod",
        Duration::from_secs(90),
        || async {
            let (status, body) = e2e::kubelet_api::get(node.cp, port, "/stats/summary").await?;
            anyhow::ensure!(status == 200, "/stats/summary: {status} {body}");
            let s: serde_json::Value = serde_json::from_str(&body)?;
            let has = s["pods"].as_array().into_iter().flatten().any(|p| {
                p["podRef"]["uid"] == g_uid.as_str()
                    && p["containers"][0]["memory"]["workingSetBytes"]
                        .as_u64()
                        .unwrap_or(0)
                        > 0
                    && p["containers"][0]["cpu"]["usageCoreNanoSeconds"]
                        .as_u64()
                        .unwrap_or(0)
                        > 0
            });
            Ok(has.then_some(s))
        },
    )
    .await?;
    let pod = summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["podRef"]["uid"] == g_uid.as_str())
        .context("the guaranteed pod in the summary")?;
    println!(
        "[{tag}] guaranteed pod: working set {} bytes, cpu {} core-ns; container {}: working set {} bytes, cpu {} \
         core-ns",
        pod["memory"]["workingSetBytes"],
        pod["cpu"]["usageCoreNanoSeconds"],
        pod["containers"][0]["name"],
        pod["containers"][0]["memory"]["workingSetBytes"],
        pod["containers"][0]["cpu"]["usageCoreNanoSeconds"],
    );
    assert!(
        pod["memory"]["workingSetBytes"].as_u64().unwrap_or(0) > 0,
        "the pod's own working set: {pod}"
    );
    let (status, metrics) = e2e::kubelet_api::get(node.cp, port, "/metrics/resource").await?;
    anyhow::ensure!(status == 200, "/metrics/resource: {status} {metrics}");
    let series = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")) && l.contains("pod=\"guaranteed\""))
            .map(str::to_owned)
    };
    for name in [
        "container_memory_working_set_bytes",
        "container_cpu_usage_seconds_total",
        "pod_memory_working_set_bytes",
    ] {
        let line = series(name).with_context(|| format!("{name} of the guaranteed pod in:\n{metrics}"))?;
        println!("[{tag}] {line}");
        let value: f64 = line
            .split_whitespace()
            .nth(1)
            .and_then(|v| v.parse().ok())
            .with_context(|| format!("the value of {line}"))?;
        assert!(value > 0.0, "{line}");
    }
    let node_ws = summary["node"]["memory"]["workingSetBytes"].as_u64().unwrap_or(0);
    let total = summary["node"]["memory"]["availableBytes"].as_u64().unwrap_or(0) + node_ws;
    println!("[{tag}] node memory working set {node_ws} of {total} bytes");
    assert!(
        node_ws > 0 && node_ws < total,
        "node working set {node_ws} within {total}"
    );
    Ok(())
}

/// The pods' cgroup is limited to the node's allocatable: capacity less the reservations (memory; cpu as its
/// weight), and the agent runs with the kubelet's own OOM score.
pub async fn pods_cgroup_is_limited_to_allocatable(node: &VmNode, tag: &str) -> anyhow::Result<()> {
    let layout = Layout::of(node);
    let capacity = memory_capacity(node).await?;
    let memory = cgroup_file(node, layout.kubepods(), "memory.max").await?;
    let weight = cgroup_file(node, layout.kubepods(), "cpu.weight").await?;
    let cpus: u64 = node
        .vm
        .run("nproc", Duration::from_secs(30))
        .await?
        .trim()
        .parse()?;
    println!(
        "[{tag}] {}: memory.max {memory} (capacity {capacity}), cpu.weight {weight} ({cpus} cpus)",
        layout.kubepods()
    );
    assert_eq!(
        memory,
        (capacity - RESERVED_MEMORY).to_string(),
        "memory.max of {}",
        layout.kubepods()
    );
    // the allocatable cpu as shares (1024 a core), then as a weight on the kubelet's scale
    let shares = (cpus * 1000 - RESERVED_CPU) * 1024 / 1000;
    let expected = 1 + (shares - 2) * 9999 / (262_144 - 2);
    assert_eq!(
        weight,
        expected.to_string(),
        "cpu.weight of {}",
        layout.kubepods()
    );
    let own = node
        .vm
        .run(
            "cat /proc/$(systemctl show -p MainPID --value node-agent)/oom_score_adj",
            Duration::from_secs(30),
        )
        .await?;
    assert_eq!(own.trim(), "-999", "the agent's own oom_score_adj (oomScoreAdj)");
    Ok(())
}

/// A container past its memory limit is OOM-killed and reported so; its pod (restartPolicy Never) Failed.
pub async fn a_container_past_its_limit_is_oom_killed(
    node: &VmNode,
    pods: &Api<Pod>,
    tag: &str,
) -> anyhow::Result<()> {
    // busybox dd fills a 64 MiB buffer: twice the limit; it is the container's main process
    node.create_pod(
        pods,
        &pod(
            "hog",
            "sleep 1; exec dd if=/dev/zero of=/dev/null bs=64M count=1",
            serde_json::json!({"limits": {"cpu": "100m", "memory": "32Mi"}}),
        )?,
    )
    .await?;
    let terminated = wait_for("the hog terminated", Duration::from_secs(180), || async {
        let p = pods.get("hog").await?;
        Ok(p.status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.state?.terminated))
    })
    .await;
    let terminated = match terminated {
        Ok(t) => t,
        Err(e) => {
            // where the pod stopped: unscheduled, not admitted, or running past its limit
            let status = match pods.get("hog").await {
                Ok(p) => serde_json::to_string(&p.status).unwrap_or_default(),
                Err(e) => e.to_string(),
            };
            return Err(e.context(format!(
                "the hog's status: {status}\nagent log:\n{}",
                node.agent_log_tail().await
            )));
        }
    };
    println!(
        "[{tag}] hog: exit {} reason {:?}",
        terminated.exit_code, terminated.reason
    );
    assert_eq!(terminated.reason.as_deref(), Some("OOMKilled"));
    assert_eq!(terminated.exit_code, 137);
    let phase = wait_for("the hog Failed", Duration::from_secs(60), || async {
        let phase = pods.get("hog").await?.status.and_then(|s| s.phase);
        Ok((phase.as_deref() == Some("Failed")).then_some(()))
    })
    .await;
    phase.context("a pod whose only container was OOM-killed, restartPolicy Never")?;
    Ok(())
}

/// A pod asking for 4 MiB of 2 MiB huge pages runs with its cgroup's hugetlb limit at that and 0 for every other
/// page size the guest has, its container's likewise (the runtime's limits, from the CRI), the QoS classes
/// unbounded and the pods' cgroup at the node's huge pages; its `HugePages` emptyDir is a hugetlbfs of 2 MiB
/// pages; a pod with such a volume and no huge pages request is told why it cannot mount it.
// the binaries whose guest reserves no huge pages never call it
#[allow(dead_code)]
pub async fn a_huge_pages_pod_is_limited_to_its_pages(
    node: &VmNode,
    ns: &str,
    tag: &str,
) -> anyhow::Result<()> {
    let t0 = std::time::Instant::now();
    let layout = Layout::of(node);
    let pods = &node.namespace(ns).await?;
    let volume = |mut p: Pod| -> anyhow::Result<Pod> {
        let spec = p.spec.as_mut().context("spec")?;
        spec.volumes = Some(serde_json::from_value(serde_json::json!([
            {"name": "huge", "emptyDir": {"medium": "HugePages"}}
        ]))?);
        spec.containers[0].volume_mounts = Some(serde_json::from_value(serde_json::json!([
            {"name": "huge", "mountPath": "/huge"}
        ]))?);
        Ok(p)
    };
    let huge = volume(pod(
        "huge",
        "grep ' /huge ' /proc/mounts; while :; do sleep 1; done",
        serde_json::json!({"limits": {"cpu": "100m", "memory": "32Mi", "hugepages-2Mi": "4Mi"}}),
    )?)?;
    let none = volume(pod("huge-none", "sleep 1", serde_json::json!({}))?)?;
    node.create_pod(pods, &huge).await?;
    node.create_pod(pods, &none).await?;
    let (uid, id) = running(node, pods, "huge").await?;

    let sizes = node
        .vm
        .run("ls /sys/kernel/mm/hugepages", Duration::from_secs(30))
        .await?;
    let sizes: Vec<String> = sizes
        .split_whitespace()
        .filter_map(|s| {
            s.strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse::<u64>()
                .ok()
        })
        .map(|kb| {
            if kb >= 1 << 20 {
                format!("{}GB", kb >> 20)
            } else {
                format!("{}MB", kb >> 10)
            }
        })
        .collect();
    anyhow::ensure!(
        sizes.iter().any(|s| s == "2MB"),
        "the guest has 2 MiB pages: {sizes:?}"
    );
    let pod_cgroup = layout.pod("", &uid);
    let container = layout.container(&pod_cgroup, &id);
    for size in &sizes {
        let file = format!("hugetlb.{size}.max");
        let want = if size == "2MB" {
            (4u64 << 20).to_string()
        } else {
            "0".to_owned()
        };
        let got = cgroup_file(node, &pod_cgroup, &file).await?;
        println!("[{tag}] {pod_cgroup}/{file} = {got}");
        assert_eq!(got, want, "{pod_cgroup}/{file}");
        assert_eq!(
            cgroup_file(node, &container, &file).await?,
            want,
            "{container}/{file}"
        );
        for class in ["burstable", "besteffort"] {
            assert_eq!(
                cgroup_file(node, &layout.class(class), &file).await?,
                (1u64 << 62).to_string(),
                "the {class} class is not bounded"
            );
        }
    }
    let pages: u64 = node.vm.read("/proc/sys/vm/nr_hugepages").await?.trim().parse()?;
    assert_eq!(
        cgroup_file(node, layout.kubepods(), "hugetlb.2MB.max").await?,
        (pages << 21).to_string(),
        "the pods' cgroup holds the node's 2 MiB pages"
    );

    let port = i32::from(node.kubelet_port);
    let mounts = wait_for("the huge pod's log", Duration::from_secs(60), || async {
        let (status, body) =
            e2e::kubelet_api::get(node.cp, port, &format!("/containerLogs/{ns}/huge/main")).await?;
        Ok((status == 200 && !body.is_empty()).then_some(body))
    })
    .await?;
    println!("[{tag}] huge: {}", mounts.trim());
    assert!(
        mounts.contains("hugetlbfs") && mounts.contains("pagesize=2M"),
        "/huge is a hugetlbfs of 2 MiB pages: {mounts}"
    );

    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(node.cp.admin_client().await?, ns);
    let message = wait_for("huge-none's FailedMount", Duration::from_secs(90), || async {
        let list = events
            .list(&kube::api::ListParams::default().fields("involvedObject.name=huge-none"))
            .await?;
        Ok(list
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("FailedMount"))
            .and_then(|e| e.message))
    })
    .await?;
    println!("[{tag}] huge-none: {message}");
    assert!(
        message.contains(
            "medium HugePages: hugePages storage requested, but there is no resource request for huge pages"
        ),
        "{message}"
    );
    for name in ["huge", "huge-none"] {
        pods.delete(name, &Default::default()).await?;
    }
    println!("[{tag}] huge pages checked in {:?}", t0.elapsed());
    Ok(())
}
