//! Whole-agent tests against the in-process fake API server and the test runtime, on paused time.

use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::*;
use crate::config::KubeletConfig;
use crate::machine::MachineInfo;
use crate::testing::TestRuntime;
use crate::testing::fake_api::FakeApi;

fn config(kubelet: KubeletConfig) -> AgentConfig {
    AgentConfig::new(
        "n1",
        "127.0.0.1".parse().unwrap(),
        Arc::new(kubelet),
        MachineInfo::synthetic("n1"),
    )
}

fn start(api: &FakeApi, rt: &Arc<TestRuntime>, cfg: AgentConfig) -> (RunningAgent, Arc<Metrics>) {
    let metrics = Arc::new(Metrics::unregistered());
    let agent = Agent::builder(cfg, api.client(), rt.clone())
        .metrics(metrics.clone())
        .build()
        .unwrap()
        .start();
    (agent, metrics)
}

fn condition<'a>(node: &'a Value, ty: &str) -> &'a Value {
    node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == ty))
        .unwrap_or(&Value::Null)
}

async fn settle() {
    // Let spawned tasks run their ready work without moving the clock much.
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
    tokio::time::sleep(Duration::from_millis(1)).await;
}

#[tokio::test(start_paused = true)]
async fn registers_a_ready_node_with_every_field_and_a_lease() {
    let api = FakeApi::new();
    let rt = Arc::new(TestRuntime::new());
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let agent = Agent::builder(config(KubeletConfig::default()), api.client(), rt.clone())
        .metrics(metrics.clone())
        .build()
        .unwrap()
        .start();
    tokio::time::sleep(Duration::from_secs(1)).await;

    let node = api.node("n1").expect("node registered");
    assert_eq!(condition(&node, "Ready")["status"], "True");
    assert_eq!(condition(&node, "Ready")["reason"], "KubeletReady");
    for ty in ["MemoryPressure", "DiskPressure", "PIDPressure"] {
        assert_eq!(condition(&node, ty)["status"], "False", "{ty}");
    }
    let labels = &node["metadata"]["labels"];
    assert_eq!(labels["kubernetes.io/hostname"], "n1");
    assert_eq!(labels["kubernetes.io/os"], "linux");
    assert!(labels["kubernetes.io/arch"].is_string());
    let st = &node["status"];
    assert_eq!(st["nodeInfo"]["containerRuntimeVersion"], "fake-runtime://0.1.0");
    assert_eq!(st["nodeInfo"]["kubeletVersion"], crate::config::KUBELET_VERSION);
    assert_eq!(st["daemonEndpoints"]["kubeletEndpoint"]["Port"], 10250);
    assert_eq!(
        st["addresses"][0],
        json!({"type": "InternalIP", "address": "127.0.0.1"})
    );
    assert_eq!(st["addresses"][1], json!({"type": "Hostname", "address": "n1"}));
    assert_eq!(st["capacity"]["cpu"], "4");
    assert_eq!(st["capacity"]["memory"], "16Gi");
    assert_eq!(st["allocatable"]["memory"], "16284Mi");
    assert_eq!(st["capacity"]["pods"], "110");

    let lease = api.lock().leases.get("n1").cloned().expect("lease created");
    assert_eq!(lease["spec"]["holderIdentity"], "n1");
    assert_eq!(lease["spec"]["leaseDurationSeconds"], 40);
    assert_eq!(lease["metadata"]["ownerReferences"][0]["kind"], "Node");
    assert_eq!(
        lease["metadata"]["ownerReferences"][0]["uid"],
        node["metadata"]["uid"]
    );

    let reasons = api.event_reasons();
    for r in [
        "Starting",
        "NodeHasSufficientMemory",
        "NodeHasNoDiskPressure",
        "NodeHasSufficientPID",
    ] {
        assert!(reasons.iter().any(|x| x == r), "{r} missing from {reasons:?}");
    }
    assert_eq!(metrics.request_count("create", "nodes", 201), 1);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("kubelet_node_startup_duration_seconds_count 1"),
        "{text}"
    );
    assert!(
        text.contains("kubelet_node_startup_registration_duration_seconds_count 1"),
        "{text}"
    );
    assert!(agent.context().registered.borrow().is_some());
    assert_eq!(agent.context().allocatable.borrow()["pods"].to_string(), "110");
    agent.stop(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn idle_agent_writes_only_lease_renewals_until_the_report_interval() {
    let api = FakeApi::new();
    let rt = Arc::new(TestRuntime::new());
    let (agent, metrics) = start(&api, &rt, config(KubeletConfig::default()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (puts0, patches0, events0) = (
        api.count("PUT", "/leases/"),
        api.count("PATCH", "/status"),
        api.count("POST", "/events"),
    );
    assert_eq!(patches0, 0, "the created node was already complete");

    tokio::time::sleep(Duration::from_secs(120)).await;
    let puts = api.count("PUT", "/leases/") - puts0;
    let patches = api.count("PATCH", "/status") - patches0;
    let events = api.count("POST", "/events") - events0;
    // renew every 10 s + up to 4 % jitter
    assert!((11..=12).contains(&puts), "{puts} lease renewals in 2 minutes");
    assert_eq!(patches, 0, "no status change, no status write");
    assert_eq!(events, 0);
    assert_eq!(
        metrics.request_count("update", "leases", 200) as usize,
        api.count("PUT", "/leases/")
    );

    // The report interval (5 min after registration) forces one write, heartbeat only; the first tick at or
    // after 300 s comes within one jittered period.
    tokio::time::sleep(Duration::from_secs(200)).await;
    assert_eq!(
        api.count("PATCH", "/status"),
        1,
        "exactly one report at the 5 minute mark"
    );
    let node = api.node("n1").unwrap();
    assert_eq!(condition(&node, "Ready")["status"], "True");
    agent.stop(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn runtime_down_makes_the_node_not_ready_with_the_reason_and_back() {
    let api = FakeApi::new();
    let rt = Arc::new(TestRuntime::new());
    let (agent, _) = start(&api, &rt, config(KubeletConfig::default()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(condition(&api.node("n1").unwrap(), "Ready")["status"], "True");

    rt.set_runtime_ready(false);
    tokio::time::sleep(Duration::from_secs(6)).await;
    let node = api.node("n1").unwrap();
    let ready = condition(&node, "Ready");
    assert_eq!(ready["status"], "False");
    assert_eq!(ready["reason"], "KubeletNotReady");
    assert_eq!(
        ready["message"],
        "container runtime not ready: RuntimeReady=false reason:RuntimeDown message:test says so"
    );

    rt.set_runtime_ready(true);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(condition(&api.node("n1").unwrap(), "Ready")["status"], "True");
    settle().await;
    let reasons = api.event_reasons();
    assert!(reasons.contains(&"NodeNotReady".to_string()), "{reasons:?}");
    assert!(reasons.contains(&"NodeReady".to_string()), "{reasons:?}");
    agent.stop(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn unreachable_runtime_counts_as_down_after_thirty_seconds() {
    let api = FakeApi::new();
    let rt = Arc::new(TestRuntime::new());
    let (agent, _) = start(&api, &rt, config(KubeletConfig::default()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    rt.set_unreachable(true);
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        condition(&api.node("n1").unwrap(), "Ready")["status"],
        "True",
        "still within 30 s"
    );
    tokio::time::sleep(Duration::from_secs(22)).await;
    let node = api.node("n1").unwrap();
    assert_eq!(condition(&node, "Ready")["status"], "False");
    assert_eq!(condition(&node, "Ready")["message"], "container runtime is down");
    agent.stop(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn registration_retries_with_backoff() {
    let api = FakeApi::new();
    api.lock().fail_path = Some("/api/v1/nodes".into());
    let rt = Arc::new(TestRuntime::new());
    let (agent, _) = start(&api, &rt, config(KubeletConfig::default()));
    // first attempt after the first runtime answer; then 100, 200, 400, 800 ms (+<=10 %)
    tokio::time::sleep(Duration::from_millis(1700)).await;
    let attempts = api.count("POST", "/api/v1/nodes");
    assert_eq!(attempts, 5, "attempts within 1.7 s");
    api.lock().fail_path = None;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(api.node("n1").is_some());
    assert_eq!(api.count("POST", "/api/v1/nodes"), 6);
    agent.stop(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn restart_reconciles_the_existing_node() {
    let api = FakeApi::new();
    // What the controller-manager leaves behind after the previous run went silent, cordoned by our shutdown.
    let unknown = |ty: &str| {
        json!({"type": ty, "status": "Unknown", "reason": "NodeStatusUnknown", "message": "Kubelet stopped posting node status.",
               "lastHeartbeatTime": "2024-01-01T00:00:00Z", "lastTransitionTime": "2024-01-01T00:00:00Z"})
    };
    api.lock().nodes.insert(
        "n1".into(),
        json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "old-uid", "resourceVersion": "1",
                         "labels": {"kubernetes.io/hostname": "stale", "custom": "x"},
                         "annotations": {"node-agent/cordoned-on-shutdown": "true"}},
            "spec": {"unschedulable": true, "podCIDR": "10.128.3.0/24", "podCIDRs": ["10.128.3.0/24"],
                     "taints": [{"key": "node.kubernetes.io/unreachable", "effect": "NoSchedule"}]},
            "status": {"nodeInfo": {"bootID": "old-boot", "machineID": "", "systemUUID": "", "kernelVersion": "",
                                    "osImage": "", "containerRuntimeVersion": "", "kubeletVersion": "",
                                    "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"},
                       "conditions": [unknown("MemoryPressure"), unknown("DiskPressure"), unknown("PIDPressure"), unknown("Ready")]}
        }),
    );
    let rt = Arc::new(TestRuntime::new());
    let (agent, _) = start(&api, &rt, config(KubeletConfig::default()));
    tokio::time::sleep(Duration::from_secs(2)).await;
    settle().await;

    let node = api.node("n1").unwrap();
    assert_eq!(node["metadata"]["uid"], "old-uid", "same object, no duplicate");
    assert_eq!(node["metadata"]["labels"]["kubernetes.io/hostname"], "n1");
    assert_eq!(node["metadata"]["labels"]["custom"], "x");
    assert_eq!(
        node["spec"]["unschedulable"], false,
        "our own shutdown cordon undone"
    );
    assert!(
        node["metadata"]["annotations"]
            .get("node-agent/cordoned-on-shutdown")
            .is_none()
    );
    assert_eq!(condition(&node, "Ready")["status"], "True");
    assert_ne!(
        condition(&node, "Ready")["lastTransitionTime"],
        "2024-01-01T00:00:00Z"
    );
    assert!(node["status"]["nodeInfo"]["bootID"] != "old-boot");
    assert_eq!(
        node["status"]["capacity"]["pods"], "110",
        "every status part re-sent"
    );
    assert_eq!(
        rt.pod_cidrs(),
        vec!["10.128.3.0/24".to_string()],
        "pod CIDR handed to the runtime"
    );
    let reasons = api.event_reasons();
    for r in ["Rebooted", "NodeReady", "NodeHasSufficientMemory"] {
        assert!(reasons.iter().any(|x| x == r), "{r} missing from {reasons:?}");
    }
    agent.stop(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn lease_renewal_failures_are_retried_with_backoff_and_conflicts_reread() {
    let api = FakeApi::new();
    let rt = Arc::new(TestRuntime::new());
    let (agent, _) = start(&api, &rt, config(KubeletConfig::default()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(api.lock().leases.contains_key("n1"));

    // Someone else bumps the lease: the next renewal conflicts, the agent re-reads and renews.
    {
        let mut st = api.lock();
        let mut l = st.leases.get("n1").cloned().unwrap();
        l["metadata"]["resourceVersion"] = json!("999999");
        st.leases.insert("n1".into(), l);
    }
    let conflicts_before = api.count("GET", "/leases/n1");
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert!(
        api.count("GET", "/leases/n1") > conflicts_before,
        "re-read after conflict"
    );

    // Renewals fail for a while: retried at 200 ms doubling (capped 7 s), never a panic.
    api.lock().fail_path = Some("/leases/".into());
    let before = api.count("PUT", "/leases/") + api.count("GET", "/leases/");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let tries = api.count("PUT", "/leases/") + api.count("GET", "/leases/") - before;
    // 0.2+0.4+0.8+1.6+3.2+6.4+7+7 = 26.6 s -> 8-9 tries (jitter), plus the pending one
    assert!((7..=11).contains(&tries), "{tries} tries in 30 s");
    api.lock().fail_path = None;
    let patches_before = api.count("PATCH", "/status");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let lease = api.lock().leases.get("n1").cloned().unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "n1");
    assert!(
        api.count("PATCH", "/status") > patches_before,
        "status re-reported after the lease recovered"
    );
    agent.stop(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_deleted_node_is_registered_again() {
    let api = FakeApi::new();
    let rt = Arc::new(TestRuntime::new());
    let kubelet = KubeletConfig {
        node_status_report_frequency: Duration::from_secs(10),
        ..KubeletConfig::default()
    };
    let (agent, _) = start(&api, &rt, config(kubelet));
    tokio::time::sleep(Duration::from_secs(1)).await;
    let uid = api.node("n1").unwrap()["metadata"]["uid"].clone();
    api.lock().nodes.clear();
    // next report (<= 10.4 s) finds it gone and registers again; the lease follows at its next renewal
    tokio::time::sleep(Duration::from_secs(25)).await;
    let node = api.node("n1").expect("re-registered");
    assert_ne!(node["metadata"]["uid"], uid);
    let lease = api.lock().leases.get("n1").cloned().unwrap();
    assert_eq!(
        lease["metadata"]["ownerReferences"][0]["uid"], node["metadata"]["uid"],
        "lease follows the new node"
    );
    agent.stop(Duration::from_secs(5)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn graceful_stop_can_cordon_and_repeated_events_are_counted() {
    let api = FakeApi::new();
    let rt = Arc::new(TestRuntime::new());
    let mut cfg = config(KubeletConfig::default());
    cfg.mark_unschedulable_on_shutdown = true;
    let (agent, _) = start(&api, &rt, cfg);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let node_ref = agent.context().node_reference();
    agent.context().events.warning(&node_ref, "Test", "same message");
    agent.context().events.warning(&node_ref, "Test", "same message");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let tests: Vec<Value> = api
        .lock()
        .events
        .iter()
        .filter(|e| e["reason"] == "Test")
        .cloned()
        .collect();
    assert_eq!(tests.len(), 1, "second identical event patched the first");
    assert_eq!(tests[0]["count"], 2);
    assert_eq!(tests[0]["source"]["component"], "kubelet");
    assert_eq!(tests[0]["involvedObject"]["kind"], "Node");

    agent.stop(Duration::from_secs(5)).await.unwrap();
    let node = api.node("n1").unwrap();
    assert_eq!(node["spec"]["unschedulable"], true);
    assert_eq!(
        node["metadata"]["annotations"]["node-agent/cordoned-on-shutdown"],
        "true"
    );
}

#[tokio::test(start_paused = true)]
async fn a_late_pod_cidr_and_new_images_are_picked_up() {
    let api = FakeApi::new();
    let rt = Arc::new(TestRuntime::new());
    let (agent, _) = start(&api, &rt, config(KubeletConfig::default()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(api.node("n1").is_some());
    // The controller-manager assigns the CIDR a moment after registration.
    {
        let mut st = api.lock();
        let n = st.nodes.get_mut("n1").unwrap();
        n["spec"]["podCIDR"] = json!("10.0.5.0/24");
        n["spec"]["podCIDRs"] = json!(["10.0.5.0/24"]);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(rt.pod_cidrs(), vec!["10.0.5.0/24".to_string()]);
    let snap = agent.context().node.borrow().clone().expect("snapshot published");
    assert_eq!(snap.pod_cidrs, vec!["10.0.5.0/24".to_string()]);
    assert_eq!(
        snap.addresses[0],
        ("InternalIP".to_string(), "127.0.0.1".to_string())
    );
    let reads = api.count("GET", "/api/v1/nodes/n1");
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        api.count("GET", "/api/v1/nodes/n1"),
        reads,
        "no more reads once the CIDR is known"
    );

    rt.set_images(vec![runtime_api::cri::Image {
        id: "sha256:abc".into(),
        repo_tags: vec!["registry.k8s.io/pause:3.10".into()],
        size: 300_000,
        ..Default::default()
    }]);
    let patches = api.count("PATCH", "/status");
    tokio::time::sleep(Duration::from_secs(41)).await;
    assert_eq!(
        api.count("PATCH", "/status"),
        patches + 1,
        "one write for the changed image list"
    );
    let node = api.node("n1").unwrap();
    assert_eq!(
        node["status"]["images"][0]["names"][0],
        "registry.k8s.io/pause:3.10"
    );
    assert_eq!(node["status"]["images"][0]["sizeBytes"], 300_000);
    agent.stop(Duration::from_secs(5)).await.unwrap();
}
