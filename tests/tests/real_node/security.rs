//! Security contexts on the real node, as the container sees them: the user, group and supplemental groups it
//! runs as, a read-only root filesystem, dropped capabilities and no privilege escalation, a namespaced sysctl
//! set for the sandbox; and `runAsNonRoot` with `runAsUser: 0` refused with the kubelet's reason. `fsGroup`
//! owns the emptyDir and secret volumes (group, setgid directories, a 0400 secret key readable by the group), and
//! `runAsNonRoot` without `runAsUser` is checked against the image's user: a root image and a named user are
//! refused with the kubelet's messages, a numeric non-root user runs. The service account token belongs to the
//! pods' one `runAsUser` (0600, 0640 with `fsGroup`), so a non-root container reads it.

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
