//! Per-node credentials against the real control plane (Node authorizer + NodeRestriction): each hollow node
//! authenticates as `system:node:<name>` with a certificate minted from the cluster CA, its pods run, it may
//! change its own Node and no other, and it may not see every pod (so the shared watch is refused). The binary
//! refuses the flag combinations that cannot work, before connecting anywhere.

use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use e2e::{init_logging, node_is_ready, wait_for};
use hollow::client_pool::{ClientPool, PoolSize};
use hollow::credentials::NodeCa;
use hollow::fleet::{Fleet, FleetSpec};
use hollow::profiles;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use node_agent::Metrics;
use node_agent::pods::PodMetrics;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const NODES: usize = 5;
/// Nodes that bootstrap their credentials through CSRs, all at once.
const BOOTSTRAP_NODES: usize = 200;

fn spec(prefix: &str, nodes: usize) -> anyhow::Result<FleetSpec> {
    Ok(FleetSpec {
        register_qps: 200.0,
        ..FleetSpec::new(nodes, format!("{prefix}-{{index}}"), profiles::default_profiles())?
    })
}

/// The API status code of a failed request (0 when it did not fail with one).
fn code<T>(res: &Result<T, kube::Error>) -> u16 {
    match res {
        Err(kube::Error::Api(s)) => s.code,
        _ => 0,
    }
}

fn message<T>(res: &Result<T, kube::Error>) -> String {
    match res {
        Ok(_) => "ok".into(),
        Err(e) => e.to_string(),
    }
}

/// Waits until every node in `names` is Ready (one list a round).
async fn all_ready(nodes: &Api<Node>, names: &[String]) -> anyhow::Result<()> {
    let wanted: std::collections::HashSet<&str> = names.iter().map(String::as_str).collect();
    wait_for("every node Ready", Duration::from_secs(120), || async {
        let ready = nodes
            .list(&ListParams::default())
            .await?
            .items
            .iter()
            .filter(|n| n.metadata.name.as_deref().is_some_and(|m| wanted.contains(m)) && node_is_ready(n))
            .count();
        Ok((ready == names.len()).then_some(()))
    })
    .await
}

/// Who agent `i`'s client is to the API server.
async fn whoami(
    pool: &ClientPool,
    i: usize,
) -> anyhow::Result<k8s_openapi::api::authentication::v1::UserInfo> {
    let review = Api::<SelfSubjectReview>::all(pool.for_agent(i).kube())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    Ok(review.status.and_then(|s| s.user_info).unwrap_or_default())
}

fn label(key: &str) -> Patch<serde_json::Value> {
    Patch::Merge(json!({"metadata": {"labels": {key: "yes"}}}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_node_credentials_make_every_hollow_node_its_own_kubelet() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let config = cp.admin_config().await?;
    let admin = cp.admin_client().await?;
    let pki = cp.dir().join("pki");
    let ca = NodeCa::from_files(&pki.join("ca.crt"), &pki.join("ca.key"))?;
    let spec = spec("cred", NODES)?;
    let names: Vec<String> = (0..NODES).map(|i| spec.node_name(i)).collect();
    let pool = ClientPool::per_node(&config, &names, &ca, hollow::client_pool::REQUESTS_IN_FLIGHT)?;
    assert!(pool.is_per_node());
    assert_eq!(
        pool.size(),
        PoolSize {
            request_connections: NODES,
            watch_connections: 0,
            in_flight: hollow::client_pool::REQUESTS_IN_FLIGHT
        },
        "one connection per node, its watch included"
    );

    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        CancellationToken::new(),
    )
    .await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    all_ready(&nodes, &names).await?;
    println!("{NODES} nodes Ready with per-node credentials");

    // who each node is, as the API server sees it
    for (i, name) in names.iter().enumerate() {
        let user = whoami(&pool, i).await?;
        let groups = user.groups.unwrap_or_default();
        println!(
            "node {i}: SelfSubjectReview says {} in {groups:?}",
            user.username.as_deref().unwrap_or("")
        );
        assert_eq!(
            user.username.as_deref(),
            Some(format!("system:node:{name}").as_str())
        );
        assert!(groups.iter().any(|g| g == "system:nodes"), "{groups:?}");
        assert!(!groups.iter().any(|g| g == "system:masters"), "{groups:?}");
    }

    // the node's pod watch and status updates work under the Node authorizer: a pod bound to node 2 runs
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "cred-pod"},
        "spec": {"nodeName": names[2], "containers": [{"name": "c", "image": "registry.test/cred:1"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    wait_for("the pod on node 2 Running", Duration::from_secs(60), || async {
        let phase = pods.get("cred-pod").await?.status.and_then(|s| s.phase);
        Ok((phase.as_deref() == Some("Running")).then_some(()))
    })
    .await?;
    println!("a pod bound to {} is Running", names[2]);

    // NodeRestriction: node 0 may label itself, not node 1, and not with the node-restriction prefix
    let as_node0: Api<Node> = Api::all(pool.for_agent(0).kube());
    let own = as_node0
        .patch(&names[0], &PatchParams::default(), &label("hollow.test/own"))
        .await;
    println!("node 0 labels itself: {}", message(&own));
    own?;
    let other = as_node0
        .patch(&names[1], &PatchParams::default(), &label("hollow.test/other"))
        .await;
    println!("node 0 labels node 1: {}", message(&other));
    assert_eq!(code(&other), 403, "{}", message(&other));
    let restricted = as_node0
        .patch(
            &names[0],
            &PatchParams::default(),
            &label("node-restriction.kubernetes.io/x"),
        )
        .await;
    println!(
        "node 0 sets a node-restriction label on itself: {}",
        message(&restricted)
    );
    assert_eq!(code(&restricted), 403, "{}", message(&restricted));
    let labels = nodes.get(&names[1]).await?.metadata.labels.unwrap_or_default();
    assert!(!labels.contains_key("hollow.test/other"), "node 1 unchanged");

    // the Node authorizer: a node sees the pods bound to it, not every pod (what the shared watch needs)
    let as_node0_pods: Api<Pod> = Api::all(pool.for_agent(0).kube());
    let all = as_node0_pods.list(&ListParams::default()).await;
    println!("node 0 lists every pod: {}", message(&all));
    assert_eq!(code(&all), 403, "{}", message(&all));
    let selector = format!("spec.nodeName={}", names[0]);
    let own_pods = as_node0_pods.list(&ListParams::default().fields(&selector)).await;
    println!("node 0 lists its own pods ({selector}): {}", message(&own_pods));
    own_pods?;

    fleet.stop(Duration::from_secs(10)).await;
    // --delete-nodes-on-exit: a node may not delete its own Node object; the pool's fleet client, with the
    // kubeconfig's identity, does it
    let self_delete = as_node0.delete(&names[0], &DeleteParams::default()).await;
    println!("node 0 deletes its own Node: {}", message(&self_delete));
    assert_eq!(code(&self_delete), 403, "{}", message(&self_delete));
    let fleet_client = pool.fleet_client();
    let review = Api::<SelfSubjectReview>::all(fleet_client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await?;
    let fleet_user = review.status.and_then(|s| s.user_info).and_then(|u| u.username);
    println!("the fleet client is {fleet_user:?}");
    assert_eq!(fleet_user.as_deref(), Some("admin"), "the kubeconfig's identity");
    for name in &names {
        Api::<Node>::all(fleet_client.clone())
            .delete(name, &DeleteParams::default())
            .await?;
    }
    for name in &names {
        assert!(nodes.get_opt(name).await?.is_none(), "{name} deleted");
    }
    println!("the fleet client deleted the {NODES} Node objects");
    pods.delete("cred-pod", &DeleteParams::default().grace_period(0))
        .await?;
    Ok(())
}

/// TLS bootstrap: every one of [`BOOTSTRAP_NODES`] hollow nodes files its own certificate signing request with a
/// bootstrap token; the real controller-manager approves (the bootstrap group holds the standard `nodeclient`
/// binding) and signs them all; each node then is `system:node:<name>` to the API server, Ready, and runs its
/// pods. No CA key is involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bootstrap_credentials_come_from_the_csr_api() -> anyhow::Result<()> {
    use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;

    init_logging();
    let cp = testenv::shared().await?;
    let config = cp.admin_config().await?;
    let admin = cp.admin_client().await?;
    let (id, secret) = ("hollow", "0123456789abcdef");
    let token: Secret = serde_json::from_value(json!({
        "metadata": {"name": format!("bootstrap-token-{id}"), "namespace": "kube-system"},
        "type": "bootstrap.kubernetes.io/token",
        "stringData": {"token-id": id, "token-secret": secret, "usage-bootstrap-authentication": "true"},
    }))?;
    let created = Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &token)
        .await;
    assert!(created.is_ok() || code(&created) == 409, "{}", message(&created));
    for (name, role) in [
        ("hollow-bootstrappers", "system:node-bootstrapper"),
        (
            "hollow-bootstrap-approve",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
        ),
    ] {
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": "system:bootstrappers"}],
        }))?;
        let created = Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &binding)
            .await;
        assert!(created.is_ok() || code(&created) == 409, "{}", message(&created));
    }
    let mut boot = config.clone();
    boot.auth_info = kube::config::AuthInfo {
        token: Some(format!("{id}.{secret}").into()),
        ..Default::default()
    };
    let boot = kube::Client::try_from(boot)?;
    // the token and the bindings just made must be in the API server's caches: a refused request ends a node's
    // bootstrap, as it ends the kubelet's
    testenv::access::wait_allowed(&boot, &testenv::access::node_bootstrap(), Duration::from_secs(30)).await?;

    let spec = spec("boot", BOOTSTRAP_NODES)?;
    let names: Vec<String> = (0..BOOTSTRAP_NODES).map(|i| spec.node_name(i)).collect();
    let started = std::time::Instant::now();
    let credentials = hollow::bootstrap::issue_all(&boot, &names).await?;
    println!(
        "{BOOTSTRAP_NODES} node certificates by TLS bootstrap in {:?}",
        started.elapsed()
    );
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone())
        .list(&ListParams::default())
        .await?
        .items;
    let ours: Vec<_> = csrs
        .iter()
        .filter(|c| c.spec.username.as_deref() == Some(&format!("system:bootstrap:{id}")))
        .collect();
    assert_eq!(ours.len(), BOOTSTRAP_NODES, "one request per node");
    for csr in &ours {
        let approved = csr
            .status
            .iter()
            .flat_map(|s| s.conditions.iter().flatten())
            .find(|c| c.type_ == "Approved");
        assert_eq!(
            approved.and_then(|c| c.reason.as_deref()),
            Some("AutoApproved"),
            "{csr:?}"
        );
        assert_eq!(
            csr.spec.signer_name,
            "kubernetes.io/kube-apiserver-client-kubelet"
        );
        let issued = csr.status.as_ref().and_then(|s| s.certificate.as_ref());
        assert!(
            issued.is_some_and(|c| !c.0.is_empty()),
            "a certificate issued: {csr:?}"
        );
    }

    let pool = ClientPool::per_node_with(&config, &credentials, hollow::client_pool::REQUESTS_IN_FLIGHT)?;
    let fleet = Fleet::start(
        &spec,
        &pool,
        Arc::new(Metrics::unregistered()),
        Arc::new(PodMetrics::new()),
        CancellationToken::new(),
    )
    .await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    all_ready(&nodes, &names).await?;
    let ready_after = started.elapsed();
    for (i, name) in names.iter().enumerate() {
        let user = whoami(&pool, i).await?;
        assert_eq!(
            user.username.as_deref(),
            Some(format!("system:node:{name}").as_str())
        );
    }
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "boot-pod"},
        "spec": {"nodeName": names[1], "containers": [{"name": "c", "image": "registry.test/boot:1"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    wait_for(
        "the pod on a bootstrapped node Running",
        Duration::from_secs(60),
        || async {
            let phase = pods.get("boot-pod").await?.status.and_then(|s| s.phase);
            Ok((phase.as_deref() == Some("Running")).then_some(()))
        },
    )
    .await?;
    println!(
        "{BOOTSTRAP_NODES} bootstrapped nodes Ready {ready_after:?} after the first CSR, each its own kubelet; a \
         pod on {} Running",
        names[1]
    );
    fleet.stop(Duration::from_secs(10)).await;
    for name in &names {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
    pods.delete("boot-pod", &DeleteParams::default().grace_period(0))
        .await?;
    Ok(())
}

/// Runs the binary with `args`; returns (success, stderr).
fn hollow(args: &[&str]) -> anyhow::Result<(bool, String)> {
    let out = Command::new(env!("CARGO_BIN_EXE_hollow"))
        .arg("run")
        .args(args)
        .env("RUST_LOG", "warn")
        .env_remove("KUBECONFIG")
        .env_remove("HOLLOW_NODE_CREDENTIALS")
        .env_remove("HOLLOW_NODE_CA_CERT")
        .env_remove("HOLLOW_NODE_CA_KEY")
        .env_remove("HOLLOW_BOOTSTRAP_KUBECONFIG")
        .output()?;
    Ok((
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    ))
}

#[test]
fn the_binary_refuses_what_per_node_credentials_cannot_do() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("hollow-cred-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let missing_cert = dir.join("missing-ca.crt").display().to_string();
    let missing_key = dir.join("missing-ca.key").display().to_string();
    let per_node = [
        "--node-credentials",
        "per-node",
        "--node-ca-cert",
        &missing_cert,
        "--node-ca-key",
        &missing_key,
        "--kubeconfig",
        "/nonexistent/kubeconfig",
        "--metrics-address",
        "127.0.0.1:0",
    ];
    let cases: [(Vec<&str>, &str); 5] = [
        (vec!["--node-credentials", "per-node"], "--node-ca-cert"),
        (vec!["--node-credentials", "bootstrap"], "--bootstrap-kubeconfig"),
        (
            vec![
                "--node-credentials",
                "bootstrap",
                "--bootstrap-kubeconfig",
                "/nonexistent/boot",
                "--watch-mode",
                "shared",
            ],
            "--watch-mode shared does not work with --node-credentials bootstrap",
        ),
        (
            [&per_node[..], &["--watch-mode", "shared"]].concat(),
            "--watch-mode shared does not work with --node-credentials per-node",
        ),
        (per_node.to_vec(), missing_cert.as_str()),
    ];
    for (args, expected) in cases {
        let (ok, stderr) = hollow(&args)?;
        println!("hollow run {}:\n{}", args.join(" "), stderr.trim());
        assert!(!ok, "refused");
        assert!(stderr.contains(expected), "{stderr:?} lacks {expected:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
