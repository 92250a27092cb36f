//! Tests of the QoS and pod cgroups on fake hierarchies (plain directories).

use super::settings::{MAX_SHARES, MIN_QUOTA_US, quota};
use super::*;
use crate::pods::model::resources::QosClass;
use crate::pods::model::spec::DesiredPod;
use serde_json::json;

fn desired(spec: serde_json::Value) -> Arc<DesiredPod> {
    let pod = serde_json::from_value(json!({"metadata": {"name": "p", "uid": "u1"}, "spec": spec})).unwrap();
    DesiredPod::from_pod(&pod).unwrap()
}

const MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

#[test]
fn v1_hierarchies_come_from_mountinfo() {
    let h = v1_hierarchies(MOUNTINFO);
    let names: Vec<(&str, Vec<&str>)> = h
        .iter()
        .map(|h| {
            (
                h.dir.to_str().unwrap(),
                h.controllers.iter().map(String::as_str).collect(),
            )
        })
        .collect();
    assert_eq!(
        names,
        [
            ("/sys/fs/cgroup/cpu,cpuacct", vec!["cpu", "cpuacct"]),
            ("/sys/fs/cgroup/memory", vec!["memory"]),
            ("/sys/fs/cgroup/pids", vec!["pids"]),
            ("/sys/fs/cgroup/systemd", vec!["name=systemd"]),
        ]
    );
    assert!(v1_hierarchies("41 31 0:38 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n").is_empty());
}

#[test]
fn pod_settings_follow_the_qos_class() {
    let g = desired(json!({"containers": [
        {"name": "a", "image": "i", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}
    ]}));
    assert_eq!(
        pod_settings(&g, 0),
        [
            ("cpu.shares", "512".to_owned()),
            ("cpu.cfs_period_us", "100000".to_owned()),
            ("cpu.cfs_quota_us", "50000".to_owned()),
            ("memory.limit_in_bytes", (64u64 << 20).to_string()),
        ]
    );
    let b = desired(json!({"containers": [
        {"name": "a", "image": "i", "resources": {"requests": {"cpu": "100m"}, "limits": {"memory": "32Mi"}}},
        {"name": "b", "image": "i", "resources": {"limits": {"memory": "32Mi"}}}
    ]}));
    assert_eq!(
        pod_settings(&b, 1024),
        [
            ("cpu.shares", "102".to_owned()),
            ("memory.limit_in_bytes", (64u64 << 20).to_string()),
            ("pids.max", "1024".to_owned()),
        ],
        "no cpu quota: not every container has a cpu limit"
    );
    let be = desired(json!({"containers": [{"name": "a", "image": "i"}]}));
    assert_eq!(pod_settings(&be, -1), [("cpu.shares", "2".to_owned())]);
    // pod-level resources: the pod's own limits bound its cgroup, containers without limits included
    let pod_level = desired(json!({
        "resources": {"requests": {"cpu": "200m", "memory": "64Mi"}, "limits": {"cpu": "1", "memory": "128Mi"}},
        "overhead": {"cpu": "50m", "memory": "8Mi"},
        "containers": [{"name": "a", "image": "i"},
                       {"name": "b", "image": "i", "resources": {"requests": {"cpu": "100m"}}}]}));
    assert_eq!(pod_level.qos, QosClass::Burstable);
    assert_eq!(
        pod_settings(&pod_level, 0),
        [
            ("cpu.shares", "256".to_owned()),
            ("cpu.cfs_period_us", "100000".to_owned()),
            ("cpu.cfs_quota_us", "105000".to_owned()),
            ("memory.limit_in_bytes", (136u64 << 20).to_string()),
        ],
        "the pod's request and limits, each with the overhead"
    );
    let memory_only = desired(json!({
        "resources": {"limits": {"memory": "128Mi"}, "requests": {"memory": "128Mi"}},
        "containers": [{"name": "a", "image": "i", "resources": {"limits": {"cpu": "300m"}}}]}));
    assert_eq!(
        pod_settings(&memory_only, 0),
        [
            ("cpu.shares", "307".to_owned()),
            ("cpu.cfs_period_us", "100000".to_owned()),
            ("cpu.cfs_quota_us", "30000".to_owned()),
            ("memory.limit_in_bytes", (128u64 << 20).to_string()),
        ],
        "a limit the pod does not set is the containers' where they all declare it"
    );
    assert_eq!(shares(1), 2);
    assert_eq!(shares(10_000_000), MAX_SHARES);
    assert_eq!(quota(5), MIN_QUOTA_US);
}

fn hierarchies(root: &Path) -> Vec<Hierarchy> {
    ["cpu", "memory", "cpuset"]
        .iter()
        .map(|c| {
            let dir = root.join(c);
            std::fs::create_dir_all(&dir).unwrap();
            Hierarchy {
                dir,
                controllers: vec![(*c).to_owned()],
            }
        })
        .collect()
}

#[tokio::test]
async fn qos_and_pod_cgroups_are_created_with_their_limits_and_removed() {
    let root = tempfile::tempdir().unwrap();
    let hierarchies = hierarchies(root.path());
    std::fs::write(root.path().join("cpuset/cpuset.cpus"), "0-1\n").unwrap();
    std::fs::write(root.path().join("cpuset/cpuset.mems"), "0\n").unwrap();
    let cg = QosCgroups::start_on(hierarchies, "/", 0, &[]).unwrap();
    let mut resources = runtime_api::cri::LinuxContainerResources::default();
    cg.container_resources(&mut resources);
    assert!(resources.unified.is_empty(), "nothing unified on v1");
    let read = |p: &str| std::fs::read_to_string(root.path().join(p)).unwrap_or_default();
    assert_eq!(read("cpu/kubepods/besteffort/cpu.shares"), "2");
    assert_eq!(read("cpu/kubepods/burstable/cpu.shares"), "2");
    assert_eq!(
        read("cpuset/kubepods/burstable/cpuset.cpus"),
        "0-1",
        "cpuset filled down"
    );

    let b = desired(json!({"containers": [
        {"name": "a", "image": "i", "resources": {"requests": {"cpu": "250m"}, "limits": {"memory": "32Mi"}}}
    ]}));
    assert_eq!(cg.pod_path(b.qos, &b.uid), "/kubepods/burstable/podu1");
    cg.ensure(&b).await.unwrap();
    assert_eq!(read("cpu/kubepods/burstable/podu1/cpu.shares"), "256");
    assert_eq!(
        read("memory/kubepods/burstable/podu1/memory.limit_in_bytes"),
        (32u64 << 20).to_string()
    );
    assert_eq!(
        read("cpu/kubepods/burstable/cpu.shares"),
        "256",
        "the burstable sum"
    );
    assert_eq!(read("cpuset/kubepods/burstable/podu1/cpuset.mems"), "0");

    cg.remove(&b).await;
    assert!(!root.path().join("cpu/kubepods/burstable/podu1").exists());
    assert!(!root.path().join("memory/kubepods/burstable/podu1").exists());
    assert_eq!(read("cpu/kubepods/burstable/cpu.shares"), "2");
}

/// A Guaranteed pod asking for 4 MiB of 2 MiB pages (with memory, as the API requires).
fn hugepages_pod() -> Arc<DesiredPod> {
    desired(json!({"containers": [
        {"name": "a", "image": "i", "resources": {
            "limits": {"cpu": "100m", "memory": "64Mi", "hugepages-2Mi": "4Mi"}}}
    ]}))
}

#[test]
fn huge_page_sizes_are_named_as_the_kernel_names_them() {
    assert_eq!(page_size_name(2 << 20), "2MB");
    assert_eq!(page_size_name(1 << 30), "1GB");
    assert_eq!(page_size_name(64 << 10), "64KB");
    assert_eq!(page_size_name(32 << 20), "32MB");
    assert_eq!(
        hugetlb_settings(&[2 << 20, 1 << 30], &BTreeMap::from([(2 << 20, 4 << 20)]), 0),
        [("2MB".to_owned(), 4 << 20), ("1GB".to_owned(), 0)],
        "every size the machine has: the pod's, else 0"
    );
}

#[tokio::test]
async fn v1_hugetlb_limits_follow_the_pods_huge_pages() {
    let root = tempfile::tempdir().unwrap();
    let mut hierarchies = hierarchies(root.path());
    let dir = root.path().join("hugetlb");
    std::fs::create_dir_all(&dir).unwrap();
    hierarchies.push(Hierarchy {
        dir,
        controllers: vec!["hugetlb".to_owned()],
    });
    let cg = QosCgroups::start_on(hierarchies, "/", 0, &[2 << 20, 1 << 30]).unwrap();
    let read = |p: &str| std::fs::read_to_string(root.path().join(p)).unwrap_or_default();
    for class in ["burstable", "besteffort"] {
        for size in ["2MB", "1GB"] {
            assert_eq!(
                read(&format!("hugetlb/kubepods/{class}/hugetlb.{size}.limit_in_bytes")),
                HUGETLB_UNBOUNDED.to_string(),
                "the QoS cgroups are not bounded"
            );
        }
    }
    let g = hugepages_pod();
    cg.ensure(&g).await.unwrap();
    assert_eq!(
        read("hugetlb/kubepods/podu1/hugetlb.2MB.limit_in_bytes"),
        "4194304"
    );
    assert_eq!(
        read("hugetlb/kubepods/podu1/hugetlb.1GB.limit_in_bytes"),
        "0",
        "a size the pod does not ask for"
    );
    assert!(
        !root
            .path()
            .join("cpu/kubepods/podu1/hugetlb.2MB.limit_in_bytes")
            .exists(),
        "only in the hugetlb hierarchy"
    );
    cg.limit_kubepods(&NodeLimits::default(), &BTreeMap::from([(2 << 20, 8 << 20)]))
        .await
        .unwrap();
    assert_eq!(read("hugetlb/kubepods/hugetlb.2MB.limit_in_bytes"), "8388608");
    assert_eq!(read("hugetlb/kubepods/hugetlb.1GB.limit_in_bytes"), "0");
    cg.remove(&g).await;
    assert!(!root.path().join("hugetlb/kubepods/podu1").exists());
}

#[tokio::test]
async fn without_the_hugetlb_controller_no_hugetlb_file_is_written() {
    let root = tempfile::tempdir().unwrap();
    let cg = QosCgroups::start_on(hierarchies(root.path()), "/", 0, &[2 << 20]).unwrap();
    cg.ensure(&hugepages_pod()).await.unwrap();
    for h in ["cpu", "memory", "cpuset"] {
        let files: Vec<String> = std::fs::read_dir(root.path().join(h).join("kubepods/podu1"))
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(!files.iter().any(|f| f.starts_with("hugetlb.")), "{h}: {files:?}");
    }
}

#[test]
fn a_host_without_v1_or_a_relative_root_is_refused() {
    assert!(matches!(
        QosCgroups::start_on(Vec::new(), "/", 0, &[]),
        Err(CgroupError::NoHierarchy)
    ));
    let root = tempfile::tempdir().unwrap();
    let err = QosCgroups::start_on(hierarchies(root.path()), "kube", 0, &[]).unwrap_err();
    assert_eq!(err.to_string(), "cgroupRoot \"kube\" must be an absolute path");
}

#[test]
fn the_unified_hierarchy_of_a_hybrid_host_comes_from_mountinfo() {
    assert_eq!(
        unified_hierarchy(MOUNTINFO),
        Some(PathBuf::from("/sys/fs/cgroup/unified"))
    );
    assert_eq!(
        unified_hierarchy(&MOUNTINFO.replace("cgroup2 cgroup2", "tmpfs tmpfs")),
        None
    );
}

/// Pod cgroups of pods the node no longer has, whichever hierarchy holds them (one left only in the memory
/// hierarchy, one the runtime made in the v2 hierarchy too), are found and removed; the others stay.
#[tokio::test]
async fn orphaned_pod_cgroups_are_found_anywhere_and_removed() {
    let root = tempfile::tempdir().unwrap();
    let unified = root.path().join("unified");
    let cg = Arc::new(
        QosCgroups::build_on(
            hierarchies(root.path()),
            false,
            Some(unified.clone()),
            "/",
            0,
            &[],
        )
        .unwrap(),
    );
    let kept = desired(json!({"containers": [{"name": "a", "image": "i"}]}));
    cg.ensure(&kept).await.unwrap();
    let dir = |p: &str| root.path().join(p);
    std::fs::create_dir_all(dir("memory/kubepods/besteffort/podstray")).unwrap();
    std::fs::create_dir_all(dir("cpu/kubepods/burstable/podgone")).unwrap();
    std::fs::create_dir_all(dir("unified/kubepods/burstable/podgone/inner")).unwrap();
    std::fs::create_dir_all(dir("unified/kubepods/besteffort/podu1")).unwrap();
    assert_eq!(cg.pod_uids(), ["gone", "stray", "u1"]);
    cg.remove_orphan("stray").await.unwrap();
    cg.remove_orphan("gone").await.unwrap();
    assert_eq!(cg.pod_uids(), ["u1"]);
    assert!(!dir("unified/kubepods/burstable/podgone").exists());
    assert!(dir("cpu/kubepods/besteffort/podu1").is_dir());
    // a pod removed as usual leaves nothing in the v2 hierarchy either
    cg.remove(&kept).await;
    assert!(cg.pod_uids().is_empty());
    assert!(!dir("unified/kubepods/besteffort/podu1").exists());
}

#[test]
fn shares_become_the_kubelets_cpu_weight() {
    assert_eq!(weight(2), 1);
    assert_eq!(weight(1024), 39);
    assert_eq!(weight(102), 4);
    assert_eq!(weight(MAX_SHARES), 10_000);
    assert_eq!(weight(0), 1);
    assert_eq!(
        v2_setting("cpu.cfs_quota_us", "50000"),
        Some(("cpu.max", "50000 100000".to_owned()))
    );
    assert_eq!(v2_setting("cpu.cfs_period_us", "100000"), None);
    assert_eq!(
        v2_setting("memory.limit_in_bytes", "64"),
        Some(("memory.max", "64".to_owned()))
    );
}

#[test]
fn a_v2_host_is_told_by_its_only_cgroup_mount() {
    let v2 = "30 23 0:26 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
    assert_eq!(v2_only(v2), Some(PathBuf::from("/sys/fs/cgroup")));
    assert_eq!(v2_only(MOUNTINFO), None, "a hybrid host keeps to v1");
}

#[tokio::test]
async fn v2_cgroups_get_their_controllers_and_v2_files() {
    let root = tempfile::tempdir().unwrap();
    let mount = root.path();
    std::fs::write(
        mount.join("cgroup.controllers"),
        "cpuset cpu io memory hugetlb pids rdma misc\n",
    )
    .unwrap();
    let cg = QosCgroups::start_on_v2(mount, "/", 0, &[2 << 20, 1 << 30]).unwrap();
    assert!(cg.is_v2());
    let read = |p: &str| std::fs::read_to_string(mount.join(p)).unwrap_or_default();
    assert_eq!(
        read("cgroup.subtree_control"),
        "+cpuset +cpu +memory +hugetlb +pids"
    );
    assert_eq!(
        read("kubepods/cgroup.subtree_control"),
        "+cpuset +cpu +memory +hugetlb +pids"
    );
    assert_eq!(read("kubepods/besteffort/cpu.weight"), "1");
    assert_eq!(read("kubepods/burstable/cpu.weight"), "1");
    assert!(!mount.join("kubepods/burstable/cpu.shares").exists());

    let g = desired(json!({"containers": [
        {"name": "a", "image": "i", "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}}}
    ]}));
    cg.ensure(&g).await.unwrap();
    assert_eq!(read("kubepods/podu1/cpu.weight"), "20");
    assert_eq!(
        read("kubepods/burstable/hugetlb.2MB.max"),
        HUGETLB_UNBOUNDED.to_string()
    );
    assert_eq!(
        read("kubepods/besteffort/hugetlb.1GB.max"),
        HUGETLB_UNBOUNDED.to_string()
    );
    assert_eq!(
        read("kubepods/podu1/hugetlb.2MB.max"),
        "0",
        "no huge pages asked for"
    );
    assert_eq!(read("kubepods/podu1/hugetlb.1GB.max"), "0");
    assert_eq!(read("kubepods/podu1/cpu.max"), "50000 100000");
    assert_eq!(read("kubepods/podu1/memory.max"), (64u64 << 20).to_string());
    cg.remove(&g).await;
    assert!(!mount.join("kubepods/podu1").exists());

    let huge = hugepages_pod();
    std::fs::create_dir_all(mount.join("kubepods/podu1")).unwrap();
    // the kernel's reservation file beside the limit gets the same value
    std::fs::write(mount.join("kubepods/podu1/hugetlb.2MB.rsvd.max"), "max").unwrap();
    cg.resize(&huge).await.unwrap();
    assert_eq!(read("kubepods/podu1/hugetlb.2MB.max"), "4194304");
    assert_eq!(read("kubepods/podu1/hugetlb.2MB.rsvd.max"), "4194304");
    assert_eq!(read("kubepods/podu1/hugetlb.1GB.max"), "0");
    assert!(!mount.join("kubepods/podu1/hugetlb.1GB.rsvd.max").exists());

    let mut resources = runtime_api::cri::LinuxContainerResources::default();
    cg.container_resources(&mut resources);
    assert_eq!(
        resources.unified.get("memory.oom.group").map(String::as_str),
        Some("1")
    );
}
