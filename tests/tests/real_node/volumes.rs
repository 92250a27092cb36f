//! Volumes, environment and DNS on the real node, as the container sees them: every volume kind the agent provides
//! shows the right content inside the container, environment variables from ConfigMaps, Secrets, pod fields and
//! resources (with and without a divisor) are right, the resolver is the cluster's, the projected service account
//! token authenticates to the API server as the pod's service account, the kubelet-managed /etc/hosts names the pod
//! and its host aliases, a ConfigMap update reaches the running container, and deleting the pod removes its volumes
//! from the node (tmpfs unmounted).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::authentication::v1::TokenReview;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, LogParams, Patch, PatchParams, PostParams};

use super::harness::{CLUSTER_DNS, CLUSTER_DOMAIN, RealNode};

const NS: &str = "rn-volumes";

/// `key=value` lines of the container's report (the first value of each key).
fn report(logs: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for line in logs.lines() {
        if let Some((k, v)) = line.split_once('=') {
            out.entry(k.to_owned()).or_insert_with(|| v.to_owned());
        }
    }
    out
}

#[tokio::test]
async fn volumes_env_and_dns_reach_the_container_and_updates_follow() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let client = node.cp.admin_client().await?;
    let pp = PostParams::default();
    let cm: ConfigMap = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "settings", "namespace": NS},
        "data": {"greeting": "hello", "colour": "blue"},
    }))?;
    let configmaps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    configmaps.create(&pp, &cm).await?;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "creds", "namespace": NS},
        "stringData": {"password": "s3cret"},
    }))?;
    Api::<Secret>::namespaced(client.clone(), NS)
        .create(&pp, &secret)
        .await?;
    let host_dir = std::env::temp_dir().join(format!("na-rn-hostpath-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&host_dir);

    let script = r#"
echo "greeting=$(cat /etc/cfg/greeting.txt)"
echo "files=$(ls /etc/cfg | tr '\n' ' ')"
echo "password=$(cat /etc/sec/password)"
echo "secret_fs=$(awk '$2=="/etc/sec"{print $3}' /proc/mounts)"
echo "labels=$(cat /etc/podinfo/labels | tr '\n' ',')"
echo "podname=$(cat /etc/podinfo/name)"
echo "cpu_limit_m=$(cat /etc/podinfo/cpu)"
echo "default_divisor=$(cat /etc/podinfo/cpu_cores)|$(cat /etc/projected/mem)|$CPU_CORES"
echo "env=$GREETING|$PASSWORD|$CFG_colour|$MY_POD|$MEM_LIMIT_MI|$COMBINED|$ESCAPED"
echo "nameserver=$(awk '$1=="nameserver"{print $2}' /etc/resolv.conf | tr '\n' ' ')"
echo "search=$(awk '$1=="search"{$1="";print}' /etc/resolv.conf)"
echo "options=$(awk '$1=="options"{$1="";print}' /etc/resolv.conf)"
echo hi > /scratch/f && echo "scratch=$(cat /scratch/f)"
echo "mem_fs=$(awk '$2=="/mem"{print $3}' /proc/mounts)"
echo "ns=$(cat /var/run/secrets/kubernetes.io/serviceaccount/namespace)"
echo "token=$(cat /var/run/secrets/kubernetes.io/serviceaccount/token)"
echo "ca_lines=$(grep -c CERTIFICATE /var/run/secrets/kubernetes.io/serviceaccount/ca.crt)"
echo from-the-pod > /host/marker
echo "readonly=$(touch /etc/cfg/x 2>/dev/null && echo no || echo yes)"
echo "hosts_header=$(head -n 1 /etc/hosts)"
echo "hosts_pod=$(awk '$2=="vols"{print $1}' /etc/hosts)"
echo "hosts_alias=$(awk '$1=="10.1.2.3"{print $2","$3}' /etc/hosts)"
while :; do echo "now=$(cat /etc/cfg/greeting.txt)"; sleep 1; done
"#;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "vols", "labels": {"app": "vols", "tier": "test"}},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "hostAliases": [{"ip": "10.1.2.3", "hostnames": ["foo.local", "bar.local"]}],
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", script],
                "resources": {"limits": {"cpu": "500m", "memory": "64Mi"}},
                "envFrom": [{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}],
                "env": [
                    {"name": "GREETING", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                    {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "creds", "key": "password"}}},
                    {"name": "MY_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "MEM_LIMIT_MI", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory",
                                                                                "divisor": "1Mi"}}},
                    {"name": "CPU_CORES", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
                    {"name": "COMBINED", "value": "$(GREETING)-$(MY_POD)"},
                    {"name": "ESCAPED", "value": "$$(GREETING)"},
                ],
                "volumeMounts": [
                    {"name": "cfg", "mountPath": "/etc/cfg"},
                    {"name": "sec", "mountPath": "/etc/sec"},
                    {"name": "podinfo", "mountPath": "/etc/podinfo"},
                    {"name": "projected", "mountPath": "/etc/projected"},
                    {"name": "scratch", "mountPath": "/scratch"},
                    {"name": "mem", "mountPath": "/mem"},
                    {"name": "host", "mountPath": "/host"},
                ],
            }],
            "volumes": [
                {"name": "cfg", "configMap": {"name": "settings",
                                              "items": [{"key": "greeting", "path": "greeting.txt"}]}},
                {"name": "sec", "secret": {"secretName": "creds"}},
                {"name": "podinfo", "downwardAPI": {"items": [
                    {"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}},
                    {"path": "name", "fieldRef": {"fieldPath": "metadata.name"}},
                    {"path": "cpu", "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu",
                                                         "divisor": "1m"}},
                    {"path": "cpu_cores", "resourceFieldRef": {"containerName": "main", "resource": "limits.cpu"}},
                ]}},
                {"name": "projected", "projected": {"sources": [{"downwardAPI": {"items": [
                    {"path": "mem", "resourceFieldRef": {"containerName": "main", "resource": "limits.memory"}},
                ]}}]}},
                {"name": "scratch", "emptyDir": {}},
                {"name": "mem", "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}},
                {"name": "host", "hostPath": {"path": host_dir.display().to_string(),
                                              "type": "DirectoryOrCreate"}},
            ],
        },
    }))?;
    let t0 = Instant::now();
    let created = node.create_pod(&pods, &pod).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    wait_for("pod vols Running", Duration::from_secs(90), || async {
        let p = pods.get("vols").await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        Ok((phase == Some("Running")).then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node] pod vols with seven volumes Running {:?} after creation",
        t0.elapsed()
    );
    let logs = wait_for("the container's report", Duration::from_secs(30), || async {
        let logs = pods.logs("vols", &LogParams::default()).await?;
        Ok(logs.contains("now=").then_some(logs))
    })
    .await?;
    let r = report(&logs);
    let get = |k: &str| r.get(k).map(String::as_str).unwrap_or("<missing>");
    assert_eq!(get("greeting"), "hello", "{logs}");
    assert_eq!(
        get("files").trim(),
        "greeting.txt",
        "only the listed item: {logs}"
    );
    assert_eq!(get("password"), "s3cret");
    assert_eq!(get("secret_fs"), "tmpfs", "secrets live in memory");
    assert_eq!(
        get("labels"),
        "app=\"vols\",tier=\"test\"",
        "sorted, quoted, no final newline"
    );
    assert_eq!(get("podname"), "vols");
    assert_eq!(get("cpu_limit_m"), "500");
    // no divisor (the API server sends "0"): in units of 1, 500m rounded up to a core
    assert_eq!(get("default_divisor"), format!("1|{}|1", 64 << 20));
    assert_eq!(get("env"), "hello|s3cret|blue|vols|64|hello-vols|$(GREETING)");
    assert_eq!(get("nameserver").trim(), CLUSTER_DNS);
    assert_eq!(
        get("search").split_whitespace().take(3).collect::<Vec<_>>(),
        [
            format!("{NS}.svc.{CLUSTER_DOMAIN}"),
            format!("svc.{CLUSTER_DOMAIN}"),
            CLUSTER_DOMAIN.to_owned()
        ]
    );
    assert_eq!(get("options").trim(), "ndots:5");
    assert_eq!(get("scratch"), "hi");
    assert_eq!(get("mem_fs"), "tmpfs");
    assert_eq!(get("ns"), NS);
    assert!(get("ca_lines").parse::<u32>().unwrap_or(0) >= 2, "{logs}");
    assert_eq!(get("readonly"), "yes", "configMap mounts are read-only");
    let pod_ip = pods
        .get("vols")
        .await?
        .status
        .and_then(|s| s.pod_ip)
        .context("podIP")?;
    assert_eq!(get("hosts_header"), "# Kubernetes-managed hosts file.");
    assert_eq!(get("hosts_pod"), pod_ip, "the pod's own name resolves to its IP");
    assert_eq!(get("hosts_alias"), "foo.local,bar.local");
    assert_eq!(
        std::fs::read_to_string(host_dir.join("marker"))?,
        "from-the-pod\n",
        "the hostPath directory was created on the node and written through"
    );

    // the projected token is the pod's service account's, bound to the pod
    let review: TokenReview = serde_json::from_value(serde_json::json!({"spec": {"token": get("token")}}))?;
    let reviewed = Api::<TokenReview>::all(client.clone())
        .create(&pp, &review)
        .await?;
    let status = reviewed.status.context("token review status")?;
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.context("user")?;
    assert_eq!(
        user.username.as_deref(),
        Some(format!("system:serviceaccount:{NS}:default").as_str())
    );
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec!["vols".to_owned()]),
        "bound to the pod"
    );

    // a ConfigMap update reaches the running container
    let t1 = Instant::now();
    configmaps
        .patch(
            "settings",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"data": {"greeting": "updated"}})),
        )
        .await?;
    wait_for(
        "the update inside the container",
        Duration::from_secs(90),
        || async {
            let logs = pods
                .logs(
                    "vols",
                    &LogParams {
                        tail_lines: Some(3),
                        ..Default::default()
                    },
                )
                .await?;
            Ok(logs.contains("now=updated").then_some(()))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!(
        "[real_node] ConfigMap update visible in the running container after {:?}",
        t1.elapsed()
    );

    // deletion removes the pod's directory and unmounts its tmpfs volumes
    let pod_dir = node.agent_root.join("pods").join(&uid);
    assert!(pod_dir.join("volumes/kubernetes.io~secret/sec").is_dir());
    pods.delete("vols", &DeleteParams::default()).await?;
    wait_for("pod vols gone", Duration::from_secs(60), || async {
        Ok(pods.get_opt("vols").await?.is_none().then_some(()))
    })
    .await?;
    wait_for("the pod's directory removed", Duration::from_secs(30), || async {
        Ok((!pod_dir.exists()).then_some(()))
    })
    .await?;
    let mounts = std::fs::read_to_string("/proc/mounts")?;
    assert!(!mounts.contains(&uid), "a mount of the pod is left: {mounts}");
    assert!(
        host_dir.join("marker").exists(),
        "hostPath content is the node's, kept"
    );
    let _ = std::fs::remove_dir_all(&host_dir);
    Ok(())
}

/// A host-network pod's own IP is the node's, as the kubelet gives it: the runtime reports no sandbox IP for
/// it, yet `status.podIP` in its environment (what the Helm chart's fleet passes as `--node-ip`) and in its
/// status is the node's InternalIP.
#[tokio::test]
async fn a_host_network_pod_sees_the_nodes_ip_as_its_own() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hostnet"},
        "spec": {
            "hostNetwork": true,
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", "echo pod_ip=$POD_IP; echo host_ip=$HOST_IP; echo arg=$0; sleep 3600",
                            "$(POD_IP)"],
                "env": [
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "HOST_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
                ],
            }],
        },
    }))?;
    node.create_pod(&pods, &pod).await?;
    let logs = wait_for(
        "the host-network pod's report",
        Duration::from_secs(60),
        || async {
            let logs = pods.logs("hostnet", &LogParams::default()).await.ok();
            Ok(logs.filter(|l| l.contains("arg=")))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let r = report(&logs);
    assert_eq!(r.get("pod_ip").map(String::as_str), Some("127.0.0.1"), "{logs}");
    assert_eq!(r.get("host_ip").map(String::as_str), Some("127.0.0.1"), "{logs}");
    assert_eq!(
        r.get("arg").map(String::as_str),
        Some("127.0.0.1"),
        "$(POD_IP) in the command: {logs}"
    );
    // the container can print before the status write that carries its IP has reached the API server
    let reported = Instant::now();
    let pod_ip = wait_for(
        "the host-network pod's IP in its status",
        Duration::from_secs(30),
        || async {
            let status = pods.get("hostnet").await?.status.context("status")?;
            Ok(status.pod_ip)
        },
    )
    .await?;
    eprintln!(
        "status.podIP {pod_ip} seen {:?} after the container's report",
        reported.elapsed()
    );
    assert_eq!(pod_ip, "127.0.0.1");
    pods.delete("hostnet", &DeleteParams::default()).await?;
    Ok(())
}
