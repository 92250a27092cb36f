//! Security contexts on the real node, as the container sees them: the user, group and supplemental groups it
//! runs as, a read-only root filesystem, dropped capabilities and no privilege escalation, a namespaced sysctl
//! set for the sandbox; and `runAsNonRoot` with `runAsUser: 0` refused with the kubelet's reason. `fsGroup`
//! owns the emptyDir and secret volumes (group, setgid directories, a 0400 secret key readable by the group), and
//! `runAsNonRoot` without `runAsUser` is checked against the image's user: a root image and a named user are
//! refused with the kubelet's messages, a numeric non-root user runs. The service account token belongs to the
//! pods' one `runAsUser` (0600, 0640 with `fsGroup`), so a non-root container reads it. AppArmor profiles are
//! refused on a host without AppArmor; `hostUsers: false` and `supplementalGroupsPolicy: Strict` act where the
//! runtime supports them (containerd 2.x) and are refused with the kubelet's words where it does not (1.6).

use std::time::Duration;

use anyhow::Context;
use e2e::{init_logging, wait_for};
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::Api;
use kube::api::{LogParams, PostParams};

use super::harness::RealNode;
use super::images::import_with_user;

const NS: &str = "rn-security";

/// The lines `key=value` of a container's report.
fn report(logs: &str, key: &str) -> String {
    logs.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}=")))
        .unwrap_or("<missing>")
        .to_owned()
}

/// The container's waiting state once its reason is `CreateContainerConfigError`: the message.
async fn config_error(pods: &Api<Pod>, name: &str) -> anyhow::Result<String> {
    wait_for(&format!("{name} refused"), Duration::from_secs(60), || async {
        let p = pods.get(name).await?;
        let waiting = p
            .status
            .and_then(|s| s.container_statuses)
            .and_then(|c| c.into_iter().next())
            .and_then(|c| c.state)
            .and_then(|s| s.waiting);
        Ok(waiting
            .filter(|w| w.reason.as_deref() == Some("CreateContainerConfigError"))
            .and_then(|w| w.message))
    })
    .await
}

#[tokio::test]
async fn the_container_runs_as_its_security_context_says() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let script = r#"
echo "uid=$(id -u) gid=$(id -g) groups=$(id -G)"
echo "rootfs=$(touch /probe 2>/dev/null && echo writable || echo read-only)"
echo "capeff=$(awk '$1=="CapEff:"{print $2}' /proc/self/status)"
echo "nonewprivs=$(awk '$1=="NoNewPrivs:"{print $2}' /proc/self/status)"
echo "sysctl=$(cat /proc/sys/net/ipv4/ip_unprivileged_port_start)"
while :; do sleep 1; done
"#;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "locked"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {
                "runAsUser": 1000, "runAsGroup": 3000, "fsGroup": 2000, "supplementalGroups": [4000],
                "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "0"}],
            },
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", script],
                "securityContext": {
                    "readOnlyRootFilesystem": true,
                    "allowPrivilegeEscalation": false,
                    "capabilities": {"drop": ["ALL"]},
                },
            }],
        },
    }))?;
    node.create_pod(&pods, &pod).await?;
    let logs = wait_for("the container's report", Duration::from_secs(90), || async {
        let logs = pods
            .logs("locked", &LogParams::default())
            .await
            .unwrap_or_default();
        Ok(logs.contains("sysctl=").then_some(logs))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let line = |key: &str| {
        logs.lines()
            .find_map(|l| l.strip_prefix(&format!("{key}=")))
            .unwrap_or("<missing>")
            .to_owned()
    };
    assert_eq!(line("uid"), "1000 gid=3000 groups=3000 2000 4000", "{logs}");
    assert_eq!(line("rootfs"), "read-only");
    assert_eq!(line("capeff"), "0000000000000000", "every capability dropped");
    assert_eq!(line("nonewprivs"), "1");
    assert_eq!(
        line("sysctl"),
        "0",
        "the pod's sysctl is set in its network namespace"
    );

    // runAsNonRoot with runAsUser 0: never created, the kubelet's reason on the container
    let root: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "as-root"},
        "spec": {
            "automountServiceAccountToken": false,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 0},
            "containers": [{"name": "main", "image": "localhost/busybox:local", "command": ["sleep", "3600"]}],
        },
    }))?;
    node.create_pod(&pods, &root).await?;
    let message = config_error(&pods, "as-root").await?;
    assert!(message.contains("runAsUser breaks non-root policy"), "{message}");
    Ok(())
}

#[tokio::test]
async fn fs_group_owns_the_pods_volumes() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let secrets: Api<Secret> = Api::namespaced(node.cp.admin_client().await?, NS);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "fsgroup-creds"},
        "stringData": {"token": "s3cret"},
    }))?;
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => return Err(e.into()),
    }
    let script = r#"
echo "groups=$(id -G)"
echo "scratch=$(stat -c '%g %a' /scratch)"
touch /scratch/made && echo "made=$(stat -c '%g' /scratch/made)"
echo "secret=$(stat -L -c '%g %a' /creds/token)"
echo "read=$(cat /creds/token)"
while :; do sleep 1; done
"#;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "fsgroup"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "securityContext": {"runAsUser": 1000, "fsGroup": 2000},
            "containers": [{
                "name": "main",
                "image": "localhost/busybox:local",
                "command": ["sh", "-c", script],
                "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"},
                                 {"name": "creds", "mountPath": "/creds"}],
            }],
            "volumes": [
                {"name": "scratch", "emptyDir": {}},
                // only the owner (root) may read the key, but for the group fsGroup gives
                {"name": "creds", "secret": {"secretName": "fsgroup-creds", "defaultMode": 0o400}},
            ],
        },
    }))?;
    node.create_pod(&pods, &pod).await?;
    let logs = wait_for("the container's report", Duration::from_secs(90), || async {
        let logs = pods
            .logs("fsgroup", &LogParams::default())
            .await
            .unwrap_or_default();
        Ok(logs.contains("read=").then_some(logs))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!("[real_node] fsGroup report:\n{logs}");
    assert!(
        report(&logs, "groups").split(' ').any(|g| g == "2000"),
        "fsGroup is a supplemental group: {logs}"
    );
    assert_eq!(report(&logs, "scratch"), "2000 2777", "emptyDir: group, setgid");
    assert_eq!(report(&logs, "made"), "2000", "a new file inherits the group");
    assert_eq!(report(&logs, "secret"), "2000 440", "the key is group readable");
    assert_eq!(
        report(&logs, "read"),
        "s3cret",
        "user 1000 reads it through the group"
    );
    Ok(())
}

/// The service account token of the API server's `kube-api-access-*` volume (defaultMode 0644): a pod whose
/// containers all run as user 1000 gets it as that user's, 0600 (0640 and group 2000 with `fsGroup`), and reads
/// it; a pod whose containers run as different users gets it root's, 0644 — as the kubelet writes it.
#[tokio::test]
async fn tokens_belong_to_the_pods_run_as_user() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let script = r#"
t=/var/run/secrets/kubernetes.io/serviceaccount/token
echo "token=$(id -u) $(stat -L -c '%u %g %a' $t) $(wc -c <$t 2>/dev/null || echo unreadable)"
while :; do sleep 1; done
"#;
    let container = |name: &str, user: Option<i64>| {
        let mut c = serde_json::json!({"name": name, "image": "localhost/busybox:local", "command": ["sh", "-c", script]});
        if let Some(u) = user {
            c["securityContext"] = serde_json::json!({"runAsUser": u});
        }
        c
    };
    let cases = [
        (
            "token-user",
            serde_json::json!({"runAsUser": 1000}),
            vec![container("main", None)],
        ),
        (
            "token-group",
            serde_json::json!({"runAsUser": 1000, "fsGroup": 2000}),
            vec![container("main", None)],
        ),
        (
            "token-mixed",
            serde_json::json!({"runAsUser": 1000}),
            vec![container("main", None), container("other", Some(2000))],
        ),
    ];
    for (name, security, containers) in &cases {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"terminationGracePeriodSeconds": 1, "securityContext": security, "containers": containers},
        }))?;
        node.create_pod(&pods, &pod).await?;
    }
    let mut seen = Vec::new();
    for (name, _, _) in &cases {
        let logs = wait_for(&format!("{name}'s report"), Duration::from_secs(90), || async {
            let params = LogParams {
                container: Some("main".into()),
                ..Default::default()
            };
            let logs = pods.logs(name, &params).await.unwrap_or_default();
            Ok(logs.contains("token=").then_some(logs))
        })
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
        let line = report(&logs, "token");
        println!("[real_node] {name}: uid, token owner, group, mode, bytes read = {line}");
        seen.push(line);
    }
    let (user, rest) = seen[0].split_once(' ').unwrap_or_default();
    assert_eq!(user, "1000");
    let fields: Vec<&str> = rest.split(' ').collect();
    assert_eq!(
        fields[..3],
        ["1000", "0", "600"],
        "{rest}: the token is user 1000's, 0600"
    );
    assert!(
        fields[3].parse::<usize>().is_ok_and(|n| n > 100),
        "user 1000 reads its token: {rest}"
    );
    let fields: Vec<&str> = seen[1].split(' ').skip(1).collect();
    assert_eq!(fields[..3], ["1000", "2000", "640"], "with fsGroup: {}", seen[1]);
    assert!(fields[3].parse::<usize>().is_ok_and(|n| n > 100), "{}", seen[1]);
    let fields: Vec<&str> = seen[2].split(' ').skip(1).collect();
    assert_eq!(
        fields[..3],
        ["0", "0", "644"],
        "two users: root's, defaultMode: {}",
        seen[2]
    );
    Ok(())
}

#[tokio::test]
async fn run_as_non_root_checks_the_images_user() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    import_with_user(node, "localhost/busybox:uid1000", "1000")?;
    import_with_user(node, "localhost/busybox:named", "nobody")?;
    let pods = node.namespace(NS).await?;
    let non_root = |name: &str, image: &str| -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsNonRoot": true},
                "containers": [{"name": "main", "image": image,
                                "command": ["sh", "-c", "echo uid=$(id -u); while :; do sleep 1; done"]}],
            },
        }))?)
    };
    let root = node
        .create_pod(&pods, &non_root("root-image", "localhost/busybox:local")?)
        .await?;
    let named = node
        .create_pod(&pods, &non_root("named-image", "localhost/busybox:named")?)
        .await?;
    node.create_pod(&pods, &non_root("uid-image", "localhost/busybox:uid1000")?)
        .await?;
    let whose = |p: &Pod, name: &str| {
        let uid = p.metadata.uid.as_deref().unwrap_or_default();
        format!("(pod: \"{name}_{NS}({uid})\", container: main)")
    };
    let message = config_error(&pods, "root-image")
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    assert_eq!(
        message,
        format!(
            "container has runAsNonRoot and image will run as root {}",
            whose(&root, "root-image")
        )
    );
    let message = config_error(&pods, "named-image").await?;
    assert_eq!(
        message,
        format!(
            "container has runAsNonRoot and image has non-numeric user (nobody), cannot verify user is non-root {}",
            whose(&named, "named-image")
        )
    );
    let logs = wait_for("uid-image runs", Duration::from_secs(60), || async {
        let logs = pods
            .logs("uid-image", &LogParams::default())
            .await
            .unwrap_or_default();
        Ok(logs.contains("uid=").then_some(logs))
    })
    .await?;
    assert_eq!(report(&logs, "uid"), "1000", "{logs}");
    Ok(())
}

/// The warning event of `reason` on pod `name`, once there: its message.
async fn event(node: &RealNode, name: &str, reason: &str) -> anyhow::Result<String> {
    use k8s_openapi::api::core::v1::Event;
    use kube::api::ListParams;
    let events: Api<Event> = Api::namespaced(node.cp.admin_client().await?, NS);
    wait_for(
        &format!("{name}: a {reason} event"),
        Duration::from_secs(60),
        || async {
            let list = events
                .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
                .await?;
            Ok(list
                .items
                .into_iter()
                .find(|e| e.reason.as_deref() == Some(reason))
                .and_then(|e| e.message))
        },
    )
    .await
}

/// The pod once its phase is `Failed`.
async fn failed(pods: &Api<Pod>, name: &str) -> anyhow::Result<Pod> {
    wait_for(&format!("{name} Failed"), Duration::from_secs(60), || async {
        let p = pods.get(name).await?;
        let phase = p.status.as_ref().and_then(|s| s.phase.as_deref());
        Ok((phase == Some("Failed")).then_some(p))
    })
    .await
}

/// An AppArmor profile other than `Unconfined` needs a host that enforces AppArmor: where the host has none (this
/// machine's kernel), the pod is rejected with the kubelet's reason and message, and an event says so.
#[tokio::test]
async fn apparmor_profiles_need_a_host_that_enforces_them() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "confined"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "containers": [{
                "name": "main", "image": "localhost/busybox:local", "command": ["sleep", "3600"],
                "securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}},
            }],
        },
    }))?;
    node.create_pod(&pods, &pod).await?;
    let enforced = std::fs::read_to_string("/sys/module/apparmor/parameters/enabled")
        .is_ok_and(|v| v.starts_with('Y'))
        && std::path::Path::new("/sys/kernel/security/apparmor").exists();
    if enforced {
        wait_for("confined Running", Duration::from_secs(60), || async {
            let p = pods.get("confined").await?;
            Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
        })
        .await?;
        return Ok(());
    }
    let p = failed(&pods, "confined").await?;
    let status = p.status.unwrap_or_default();
    assert_eq!(status.reason.as_deref(), Some("AppArmor"));
    assert_eq!(
        status.message.as_deref(),
        Some("Pod was rejected: Cannot enforce AppArmor: AppArmor is not enabled on the host")
    );
    let message = event(node, "confined", "AppArmor").await?;
    assert_eq!(
        message,
        "Cannot enforce AppArmor: AppArmor is not enabled on the host"
    );
    Ok(())
}

/// `hostUsers: false`: where the runtime's default handler reports user namespace support, the pod runs in a user
/// namespace of its own — root inside is a host id range of 65536 ids of its own, recorded in the pod's
/// directory. Where it does not (containerd 1.6; containerd 2.x over a runc without idmapped mounts, such as
/// Debian 12's 1.1), the sandbox is not created and an event gives the kubelet's message; the pod waits.
#[tokio::test]
async fn host_users_false_runs_in_a_user_namespace_of_its_own() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "userns"},
        "spec": {
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 1,
            "hostUsers": false,
            "containers": [{
                "name": "main", "image": "localhost/busybox:local",
                "command": ["sh", "-c", "echo \"uid_map=$(cat /proc/self/uid_map | tr -s ' ' | sed 's/^ //')\"; \
                             echo \"whoami=$(id -u)\"; while :; do sleep 1; done"],
            }],
        },
    }))?;
    let created = node.create_pod(&pods, &pod).await?;
    let status = runtime_api::Runtime::status(&node.cri().await?, Default::default()).await?;
    let supported = status
        .runtime_handlers
        .iter()
        .find(|h| h.name.is_empty())
        .and_then(|h| h.features.as_ref())
        .is_some_and(|f| f.user_namespaces);
    println!(
        "[real_node] containerd {}: user namespaces {}",
        crate::CONTAINERD,
        if supported { "supported" } else { "not supported" }
    );
    if !supported {
        let message = event(node, "userns", "FailedCreatePodSandBox").await?;
        assert_eq!(
            message,
            "Failed to create pod sandbox: can't set `spec.hostUsers: false`, runtime does not support user \
             namespaces"
        );
        let p = pods.get("userns").await?;
        assert_eq!(
            p.status.and_then(|s| s.phase).as_deref(),
            Some("Pending"),
            "the pod waits, as on the kubelet"
        );
        return Ok(());
    }
    let logs = wait_for("the container's report", Duration::from_secs(90), || async {
        let logs = pods
            .logs("userns", &LogParams::default())
            .await
            .unwrap_or_default();
        Ok(logs.contains("whoami=").then_some(logs))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    println!("[real_node] hostUsers: false report:\n{logs}");
    let uid = created.metadata.uid.context("uid")?;
    let file = std::fs::read_to_string(node.agent_root.join("pods").join(&uid).join("userns"))?;
    let recorded: serde_json::Value = serde_json::from_str(&file)?;
    let host_id = recorded["uidMappings"][0]["hostId"].as_u64().context("hostId")?;
    assert!(host_id >= 65536 && host_id % 65536 == 0, "{file}");
    assert_eq!(
        report(&logs, "uid_map"),
        format!("0 {host_id} 65536"),
        "root inside is host id {host_id}, not the host's root"
    );
    assert_eq!(report(&logs, "whoami"), "0");
    Ok(())
}

/// Builds `reference`: the busybox image with a group `extra` (50000) that lists `nobody` as a member, so a
/// container running as 65534 gets it from the image unless the policy is `Strict`.
fn import_with_group(node: &RealNode, reference: &str) -> anyhow::Result<()> {
    let images = node.containerd_dir.join("images");
    let rootfs = images.join("busybox-groups-rootfs");
    if !rootfs.exists() {
        let out = std::process::Command::new("cp")
            .arg("-a")
            .arg(images.join("busybox-rootfs"))
            .arg(&rootfs)
            .output()?;
        anyhow::ensure!(
            out.status.success(),
            "cp: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let group = rootfs.join("etc/group");
        let mut text = std::fs::read_to_string(&group)?;
        text.push_str("extra:x:50000:nobody\n");
        std::fs::write(&group, text)?;
    }
    let tar = images.join("busybox-groups.tar");
    let out = std::process::Command::new("python3")
        .arg(e2e::containerd::scripts().join("oci_image.py"))
        .args(["--rootfs", &rootfs.display().to_string(), "--ref", reference])
        .args(["--cmd", r#"["sh"]"#, "--out", &tar.display().to_string()])
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "oci_image.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new("ctr")
        .args([
            "--address",
            &node.socket.display().to_string(),
            "-n",
            "k8s.io",
            "images",
            "import",
        ])
        .arg(&tar)
        .output()?;
    anyhow::ensure!(
        out.status.success(),
        "ctr import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(())
}

/// `supplementalGroupsPolicy: Strict`: where the Node reports the feature (containerd 2.x), the groups the image's
/// `/etc/group` gives the user are left out (with `Merge` they are added), and each container's status reports
/// the identity it started with; where it does not (containerd 1.6), the pod is rejected with the kubelet's
/// reason.
#[tokio::test]
async fn strict_supplemental_groups_leave_out_the_images_groups() -> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get().await? else {
        return Ok(());
    };
    let pods = node.namespace(NS).await?;
    import_with_group(node, "localhost/busybox-groups:local")?;
    let pod = |name: &str, policy: &str| -> anyhow::Result<Pod> {
        Ok(serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {
                "automountServiceAccountToken": false,
                "terminationGracePeriodSeconds": 1,
                "securityContext": {"runAsUser": 65534, "runAsGroup": 65534, "supplementalGroups": [4000],
                                    "supplementalGroupsPolicy": policy},
                "containers": [{
                    "name": "main", "image": "localhost/busybox-groups:local",
                    "command": ["sh", "-c", "echo \"groups=$(id -G)\"; while :; do sleep 1; done"],
                }],
            },
        }))?)
    };
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(node.cp.admin_client().await?);
    let supported = nodes
        .get(super::harness::NODE)
        .await?
        .status
        .and_then(|s| s.features)
        .and_then(|f| f.supplemental_groups_policy)
        .unwrap_or(false);
    assert_eq!(
        supported,
        crate::CONTAINERD == "2",
        "containerd 2.x supports the policy, 1.6 does not"
    );
    node.create_pod(&pods, &pod("strict", "Strict")?).await?;
    if !supported {
        let p = failed(&pods, "strict").await?;
        let status = p.status.unwrap_or_default();
        assert_eq!(
            status.reason.as_deref(),
            Some("SupplementalGroupsPolicyNotSupported")
        );
        assert_eq!(
            status.message.as_deref(),
            Some("Pod was rejected: SupplementalGroupsPolicy=Strict is not supported in this node")
        );
        return Ok(());
    }
    node.create_pod(&pods, &pod("merge", "Merge")?).await?;
    let mut seen = Vec::new();
    for name in ["strict", "merge"] {
        let logs = wait_for(
            &format!("{name}: the container's report"),
            Duration::from_secs(90),
            || async {
                let logs = pods.logs(name, &LogParams::default()).await.unwrap_or_default();
                Ok(logs.contains("groups=").then_some(logs))
            },
        )
        .await
        .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
        let user = wait_for(
            &format!("{name}: the user status"),
            Duration::from_secs(30),
            || async {
                let p = pods.get(name).await?;
                Ok(p.status
                    .and_then(|s| s.container_statuses)
                    .and_then(|c| c.into_iter().next())
                    .and_then(|c| c.user)
                    .and_then(|u| u.linux))
            },
        )
        .await?;
        seen.push((report(&logs, "groups"), user));
    }
    println!("[real_node] supplemental groups (Strict, Merge): {seen:?}");
    let (strict, merge) = (&seen[0], &seen[1]);
    assert_eq!(
        strict.0, "65534 4000",
        "Strict: the image's group 50000 is left out"
    );
    assert_eq!(
        merge.0, "65534 4000 50000",
        "Merge: the image's group 50000 is added"
    );
    assert_eq!((strict.1.uid, strict.1.gid), (65534, 65534));
    let groups = |u: &k8s_openapi::api::core::v1::LinuxContainerUser| {
        u.supplemental_groups.clone().unwrap_or_default()
    };
    assert!(
        groups(&strict.1).contains(&4000) && !groups(&strict.1).contains(&50000),
        "{:?}",
        strict.1
    );
    assert!(groups(&merge.1).contains(&50000), "{:?}", merge.1);
    Ok(())
}
