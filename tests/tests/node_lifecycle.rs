//! Node lifecycle against the real control plane, with node credentials under the Node authorizer and
//! NodeRestriction: registration with every field, the lease, the status loop, the controller-manager's view of
//! a dead agent, restart, runtime faults, idle write volume, graceful stop and configuration errors; in
//! [`recovery`], what the agent does about changes others make: a Node left by a previous run, a lease
//! conflict, a deleted Node, repeated events.
//!
//! Agents run in-process (library + the in-memory fake runtime, network probes answered by its script) except
//! where the process matters: killing it (SIGKILL), stopping it (SIGTERM) and a bad configuration file (exit
//! code) run the `node-agent` binary, in [`process`]. The control plane of this test binary (in [`support`],
//! with the shared helpers) runs the controller-manager with a 20 s node-monitor grace period and the API
//! server with an audit log of every request made by a node identity, so write volume is measured by the API
//! server itself as well as by the agent's own counters.

#[path = "node_lifecycle/certificates.rs"]
mod certificates;
#[path = "node_lifecycle/process.rs"]
mod process;
#[path = "node_lifecycle/recovery.rs"]
mod recovery;
#[path = "node_lifecycle/support.rs"]
mod support;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use e2e::init_logging;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use node_agent::{KubeletConfig, MachineInfo, Metrics};
use tokio::time::Instant;

use support::{
    agent_event_reasons, audit_counts, condition, control_plane, event_reasons, poll, ready_status,
    start_in_process, start_with, wait_node,
};

/// A started agent's Node is Ready from its registration (not a status period later), with every field a
/// kubelet fills; the lease and events exist.
#[tokio::test]
async fn node_is_registered_ready_with_every_field() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = "nl-ready";

    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = Arc::new(Metrics::register(&mut registry));
    let t0 = Instant::now();
    let a = start_with(cp, name, KubeletConfig::default(), metrics).await?;
    // a guard against hanging only: Ready is expected well within a second
    let node = wait_node(&nodes, name, "Ready=True", Duration::from_secs(60), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await?;
    let ready_after = t0.elapsed();
    println!("[node_lifecycle] {name}: Ready {ready_after:?} after agent start");
    // the agent waits for the runtime's first answer before it registers: the Node is created Ready, its Ready
    // condition no younger than the object (both whole seconds, the condition's stamped before the create)
    let created = node
        .metadata
        .creation_timestamp
        .clone()
        .context("creationTimestamp")?;
    let ready = condition(&node, "Ready").context("Ready")?;
    let since = ready
        .last_transition_time
        .clone()
        .context("Ready's lastTransitionTime")?;
    assert!(
        since.0 <= created.0,
        "Ready since {since:?}, after the Node was created at {created:?}: not Ready at registration"
    );

    let labels = node.metadata.labels.clone().unwrap_or_default();
    assert_eq!(
        labels.get("kubernetes.io/hostname").map(String::as_str),
        Some(name)
    );
    assert_eq!(labels.get("kubernetes.io/os").map(String::as_str), Some("linux"));
    assert_eq!(
        labels.get("kubernetes.io/arch").map(String::as_str),
        Some(node_agent::machine::go_arch())
    );
    assert_eq!(
        labels.get("beta.kubernetes.io/os").map(String::as_str),
        Some("linux")
    );
    let annotations = node.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations
            .get("volumes.kubernetes.io/controller-managed-attach-detach")
            .map(String::as_str),
        Some("true")
    );

    let st = node.status.clone().context("status")?;
    let addrs: Vec<(String, String)> = st
        .addresses
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(
        addrs,
        vec![
            ("InternalIP".into(), "127.0.0.1".into()),
            ("Hostname".into(), name.into())
        ]
    );
    let info = st.node_info.clone().context("nodeInfo")?;
    println!(
        "[node_lifecycle] {name}: labels {labels:?}\n[node_lifecycle] {name}: addresses {addrs:?}\n\
         [node_lifecycle] {name}: nodeInfo {info:?}\n[node_lifecycle] {name}: capacity {:?}\n\
         [node_lifecycle] {name}: allocatable {:?}",
        st.capacity
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.0)).collect::<Vec<_>>()),
        st.allocatable
            .as_ref()
            .map(|m| m.iter().map(|(k, v)| format!("{k}={}", v.0)).collect::<Vec<_>>()),
    );
    let machine = MachineInfo::synthetic(name);
    assert_eq!(info.machine_id, *machine.machine_id);
    assert_eq!(info.system_uuid, *machine.system_uuid);
    assert!(!info.boot_id.is_empty() && !info.kernel_version.is_empty() && !info.os_image.is_empty());
    assert!(
        info.container_runtime_version.starts_with("cri-fake://"),
        "{}",
        info.container_runtime_version
    );
    assert_eq!(info.kubelet_version, node_agent::config::KUBELET_VERSION);
    assert_eq!(
        (info.operating_system.as_str(), info.architecture.as_str()),
        ("linux", node_agent::machine::go_arch())
    );
    let q = |m: &Option<BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>>,
             k: &str| {
        m.as_ref()
            .and_then(|m| m.get(k))
            .map(|q| q.0.clone())
            .unwrap_or_default()
    };
    assert_eq!(q(&st.capacity, "cpu"), "4");
    assert_eq!(q(&st.capacity, "memory"), "16Gi");
    assert_eq!(q(&st.capacity, "pods"), "110");
    assert_eq!(q(&st.capacity, "ephemeral-storage"), "100Gi");
    assert_eq!(
        q(&st.allocatable, "memory"),
        "16284Mi",
        "16Gi - evictionHard memory.available 100Mi"
    );
    // 100Gi - 10 % (float32 percentage, as the kubelet computes it); the API server re-canonicalizes the string
    let eph: node_agent::quantity::Quantity = q(&st.allocatable, "ephemeral-storage").parse()?;
    assert_eq!(eph.value(), 96_636_764_000);
    assert_eq!(q(&st.allocatable, "cpu"), "4");
    assert_eq!(
        st.daemon_endpoints
            .as_ref()
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .map(|e| e.port),
        Some(10250)
    );
    let images: Vec<String> = st
        .images
        .clone()
        .unwrap_or_default()
        .into_iter()
        .flat_map(|i| i.names.unwrap_or_default())
        .collect();
    assert!(
        images.iter().any(|i| i == "registry.k8s.io/pause:3.10"),
        "{images:?}"
    );
    for (ty, reason) in [
        ("MemoryPressure", "KubeletHasSufficientMemory"),
        ("DiskPressure", "KubeletHasNoDiskPressure"),
        ("PIDPressure", "KubeletHasSufficientPID"),
        ("Ready", "KubeletReady"),
    ] {
        let c = condition(&node, ty).with_context(|| format!("{ty} condition"))?;
        assert_eq!(c.reason.as_deref(), Some(reason), "{ty}");
    }

    // The controller-manager assigns the pod CIDR; the agent hands it to the runtime.
    let node = wait_node(&nodes, name, "spec.podCIDR", Duration::from_secs(15), |n| {
        n.spec.as_ref().and_then(|s| s.pod_cidr.as_ref()).is_some()
    })
    .await?;
    let cidr = node
        .spec
        .as_ref()
        .and_then(|s| s.pod_cidr.clone())
        .unwrap_or_default();
    poll("the runtime to get the pod CIDR", Duration::from_secs(15), || {
        let got = a.runtime.pod_cidr().unwrap_or_default();
        let cidr = cidr.clone();
        async move { Ok((got == cidr).then_some(())) }
    })
    .await?;
    println!(
        "[node_lifecycle] {name}: podCIDR {cidr} assigned by the controller-manager and handed to the runtime"
    );
    // ... and published to the agent's other managers (pod admission reads the Node from here)
    let snapshot = a.agent.context().node.borrow().clone().context("node snapshot")?;
    assert_eq!(snapshot.pod_cidrs, vec![cidr.clone()]);
    assert_eq!(
        snapshot.addresses[0],
        ("InternalIP".to_string(), "127.0.0.1".to_string())
    );

    // the lease is written beside the status, not before it: a Ready node may be a moment ahead of its lease
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let lease = poll("the node's lease", Duration::from_secs(10), || {
        let leases = leases.clone();
        async move { Ok(leases.get_opt(name).await?) }
    })
    .await?;
    let spec = lease.spec.context("lease spec")?;
    assert_eq!(spec.holder_identity.as_deref(), Some(name));
    assert_eq!(spec.lease_duration_seconds, Some(40));
    assert!(spec.renew_time.is_some());
    let owner = lease.metadata.owner_references.unwrap_or_default();
    assert_eq!(owner.len(), 1);
    assert_eq!(
        (owner[0].kind.as_str(), owner[0].uid.as_str()),
        ("Node", node.metadata.uid.as_deref().unwrap_or(""))
    );

    let want = [
        "Starting",
        "NodeHasSufficientMemory",
        "NodeHasNoDiskPressure",
        "NodeHasSufficientPID",
    ];
    let reasons = poll("node events", Duration::from_secs(10), || async {
        let r = event_reasons(&admin, name).await?;
        Ok(want.iter().all(|w| r.iter().any(|x| x == w)).then_some(r))
    })
    .await?;
    println!("[node_lifecycle] {name}: events {reasons:?}");
    assert_eq!(a.metrics.request_count("create", "nodes", 201), 1);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)?;
    for phase in ["", "_pre_registration", "_registration", "_post_registration"] {
        let line = format!("kubelet_node_startup{phase}_duration_seconds_count 1");
        assert!(text.contains(&line), "{line} missing from\n{text}");
    }
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(())
}

/// An idle agent's writes over two minutes, counted by the agent and by the API server's audit log.
#[tokio::test]
async fn idle_agent_writes_over_two_minutes() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let nodes: Api<Node> = Api::all(cp.admin_client().await?);
    let name = "nl-idle";
    let a = start_in_process(cp, name).await?;
    wait_node(&nodes, name, "Ready=True", Duration::from_secs(10), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await?;
    // start-up over: its events written (every one the agent created is in the API), the pod CIDR learned
    let startup = [
        "Starting",
        "NodeHasSufficientMemory",
        "NodeHasNoDiskPressure",
        "NodeHasSufficientPID",
    ];
    let admin = cp.admin_client().await?;
    let last = std::sync::Mutex::new(String::new());
    poll(
        "start-up events and the pod CIDR",
        Duration::from_secs(60),
        || async {
            let reasons = agent_event_reasons(&admin, name).await?;
            let created = a.metrics.request_count("create", "events", 201);
            let cidr = nodes.get(name).await?.spec.and_then(|s| s.pod_cidr);
            let settled = startup.iter().all(|w| reasons.iter().any(|r| r == w))
                && created == u64::try_from(reasons.len())?
                && cidr.is_some()
                && a.runtime.pod_cidr() == cidr;
            *last.lock().unwrap() = format!(
                "events {reasons:?}, {created} created by the agent, pod CIDR {cidr:?}, the runtime's {:?}",
                a.runtime.pod_cidr()
            );
            Ok(settled.then_some(()))
        },
    )
    .await
    .with_context(|| last.lock().unwrap().clone())?;

    let kinds: [(&str, &str, u16); 8] = [
        ("update", "leases", 200),
        ("create", "leases", 201),
        ("patch", "nodes/status", 200),
        ("patch", "nodes", 200),
        ("create", "nodes", 201),
        ("create", "events", 201),
        ("patch", "events", 200),
        ("get", "nodes", 200),
    ];
    let ours = |m: &Metrics| kinds.map(|(v, r, c)| m.request_count(v, r, c));
    let audited = audit_counts(&format!("system:node:{name}"));
    let before = ours(&a.metrics);
    // the idle time itself is what is measured: nothing to wait for, only time to let pass
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(120)).await;
    let after = ours(&a.metrics);
    let window = t0.elapsed();
    let audited_after = audit_counts(&format!("system:node:{name}"));

    println!(
        "[node_lifecycle] {name}: requests in {window:?} of idling, by the agent's counters / by the API server's audit log:"
    );
    let mut delta = BTreeMap::new();
    for (i, (verb, resource, _)) in kinds.iter().enumerate() {
        let d = after[i] - before[i];
        delta.insert((*verb, *resource), d);
        let audit = match (&audited, &audited_after) {
            (Some(b), Some(a)) => {
                let key = ((*verb).to_owned(), (*resource).to_owned());
                (a.get(&key).copied().unwrap_or(0) - b.get(&key).copied().unwrap_or(0)).to_string()
            }
            _ => "n/a".into(),
        };
        println!("[node_lifecycle]   {verb:>6} {resource:<13} agent={d:<3} audit={audit}");
    }
    if let (Some(b), Some(a)) = (&audited, &audited_after) {
        let writes = |m: &BTreeMap<(String, String), u64>| {
            m.iter()
                .filter(|((v, _), _)| v != "get" && v != "list" && v != "watch")
                .map(|(_, n)| n)
                .sum::<u64>()
        };
        println!(
            "[node_lifecycle]   total writes (audit): {}",
            writes(a) - writes(b)
        );
    }
    // renewals come 10 s (± 4 % jitter) after the previous one ended, later when the API server answers slowly:
    // never more than one per 9.6 s of the window as measured, and — on a loaded machine too — at least one per
    // 20 s (below that, half the lease's 40 s would go by between renewals)
    let lease_updates = delta[&("update", "leases")];
    let most = (window.as_secs_f64() / 9.6).floor() as u64 + 1;
    let least = (window.as_secs_f64() / 20.0).floor() as u64;
    assert!(
        (least..=most).contains(&lease_updates),
        "{lease_updates} lease renewals in {window:?}: expected {least}..={most}"
    );
    assert_eq!(
        delta[&("patch", "nodes/status")],
        0,
        "no status change, report interval 5 min: no status write"
    );
    assert_eq!(delta[&("create", "events")] + delta[&("patch", "events")], 0);
    assert_eq!(
        delta[&("create", "nodes")] + delta[&("patch", "nodes")] + delta[&("create", "leases")],
        0
    );
    if let (Some(b), Some(a)) = (&audited, &audited_after) {
        let key = ("update".to_owned(), "leases".to_owned());
        let audit_updates = a.get(&key).copied().unwrap_or(0) - b.get(&key).copied().unwrap_or(0);
        assert!(
            audit_updates.abs_diff(lease_updates) <= 1,
            "audit {audit_updates} vs agent {lease_updates}"
        );
    }
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(())
}

/// The fake runtime reports RuntimeReady=false: Ready=False with the reason; back when it recovers. Same for
/// the network.
#[tokio::test]
async fn runtime_down_makes_the_node_not_ready_with_the_reason() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = "nl-runtime";
    let a = start_in_process(cp, name).await?;
    wait_node(&nodes, name, "Ready=True", Duration::from_secs(10), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await?;

    for (what, fault) in [("runtime", true), ("network", false)] {
        let set = |ok: bool| {
            if fault {
                a.runtime.set_runtime_ready(ok)
            } else {
                a.runtime.set_network_ready(ok)
            }
        };
        set(false);
        let t = Instant::now();
        let node = wait_node(&nodes, name, "Ready=False", Duration::from_secs(20), |n| {
            ready_status(n).as_deref() == Some("False")
        })
        .await?;
        let c = condition(&node, "Ready").context("Ready")?;
        println!(
            "[node_lifecycle] {name}: {what} down -> Ready=False after {:?}: reason {:?}, message {:?}",
            t.elapsed(),
            c.reason,
            c.message
        );
        assert_eq!(c.reason.as_deref(), Some("KubeletNotReady"));
        let msg = c.message.clone().unwrap_or_default();
        let expected = if fault {
            "container runtime not ready: RuntimeReady=false"
        } else {
            "container runtime network not ready: NetworkReady=false"
        };
        assert!(msg.starts_with(expected), "{msg}");

        set(true);
        let t = Instant::now();
        wait_node(&nodes, name, "Ready=True again", Duration::from_secs(20), |n| {
            ready_status(n).as_deref() == Some("True")
        })
        .await?;
        println!(
            "[node_lifecycle] {name}: {what} back -> Ready=True after {:?}",
            t.elapsed()
        );
    }
    let reasons = poll(
        "NodeNotReady and NodeReady events",
        Duration::from_secs(10),
        || async {
            let r = event_reasons(&admin, name).await?;
            Ok((r.iter().any(|x| x == "NodeNotReady") && r.iter().any(|x| x == "NodeReady")).then_some(r))
        },
    )
    .await?;
    println!("[node_lifecycle] {name}: events {reasons:?}");
    a.agent.stop(Duration::from_secs(10)).await?;
    Ok(())
}
