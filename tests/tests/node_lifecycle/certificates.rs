//! The node's certificates from the cluster's CSR API, against the real controller-manager's approver and
//! signer, with the `node-agent` binary:
//! TLS bootstrap with a bootstrap token (`--bootstrap-kubeconfig`): a CSR filed as `system:bootstrap:<id>`,
//! approved by the controller-manager because the bootstrap group may create node-client requests, signed by
//! its signer, stored under `--cert-dir`, and a kubeconfig written that the node then runs on;
//! `serverTLSBootstrap`: a `kubernetes.io/kubelet-serving` request for the node's name and address, which
//! (as on a real cluster) nobody approves automatically — before an administrator approves it `kubectl logs`
//! fails, after it works through the API server, which checks the node's serving certificate against the
//! cluster CA; `rotateCertificates`: certificates here live 3 minutes, so the client certificate is renewed
//! (a CSR filed by the node itself, approved as a self-renewal) while the node keeps running, and after the
//! first certificate has expired the node still heartbeats and starts a new pod.

use std::path::Path;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use e2e::init_logging;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{ListParams, LogParams, Patch, PatchParams, PostParams};
use node_agent::certs::CertPair;
use testenv::bootstrap::BootstrapToken;

use super::process::AgentProcess;
use super::support::{SIGNING_DURATION, audit_dir, control_plane, poll, ready_status, wait_node};

const TOKEN_ID: &str = "nlboot";
const TOKEN_SECRET: &str = "0123456789abcdef";
const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
const SERVING_SIGNER: &str = "kubernetes.io/kubelet-serving";

fn requests_of(
    list: &[CertificateSigningRequest],
    signer: &str,
    user: &str,
) -> Vec<CertificateSigningRequest> {
    list.iter()
        .filter(|c| c.spec.signer_name == signer && c.spec.username.as_deref() == Some(user))
        .cloned()
        .collect()
}

fn condition_reason(csr: &CertificateSigningRequest, ty: &str) -> Option<String> {
    csr.status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == ty && c.status == "True")
        .map(|c| c.reason.clone().unwrap_or_default())
}

fn issued(csr: &CertificateSigningRequest) -> bool {
    csr.status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .is_some_and(|c| !c.0.is_empty())
}

fn current_client_cert(dir: &Path) -> anyhow::Result<CertPair> {
    let path = dir.join("pki/kubelet-client-current.pem");
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    Ok(CertPair::parse(&text, &text, &path.display().to_string())?)
}

#[tokio::test]
async fn tls_bootstrap_serving_certificate_and_rotation_through_the_csr_api() -> anyhow::Result<()> {
    init_logging();
    let cp = control_plane().await?;
    let admin = cp.admin_client().await?;
    let token = BootstrapToken::new(TOKEN_ID, TOKEN_SECRET);
    token.create(&admin).await?;
    let name = "nl-certs";
    let dir = audit_dir().join(name);
    std::fs::create_dir_all(&dir)?;
    let boot = dir.join("bootstrap.kubeconfig");
    token.write_kubeconfig(&boot, cp)?;
    token.wait_allowed(&boot).await?;
    let config = dir.join("config.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\nserverTLSBootstrap: true\n\
             rotateCertificates: true\nauthentication:\n  x509:\n    clientCAFile: {}\n",
            cp.client_ca_file().display()
        ),
    )?;
    let kubeconfig = dir.join("kubelet.kubeconfig");
    let (cert_dir, boot_arg, config_arg) = (
        dir.join("pki").display().to_string(),
        boot.display().to_string(),
        config.display().to_string(),
    );
    let agent = AgentProcess::start_as(
        &kubeconfig,
        name,
        &[
            "--bootstrap-kubeconfig",
            &boot_arg,
            "--cert-dir",
            &cert_dir,
            "--config",
            &config_arg,
        ],
    )?;
    let nodes: Api<Node> = Api::all(admin.clone());
    if let Err(e) = wait_node(&nodes, name, "Ready=True", Duration::from_secs(60), |n| {
        ready_status(n).as_deref() == Some("True")
    })
    .await
    {
        bail!("{e}\nagent log:\n{}", agent.log_tail());
    }

    // bootstrap: one request by the bootstrap identity, approved by the controller-manager and issued
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let list = csrs.list(&ListParams::default()).await?.items;
    let bootstrap = requests_of(&list, CLIENT_SIGNER, &token.user());
    assert_eq!(bootstrap.len(), 1, "{bootstrap:?}");
    let first = &bootstrap[0];
    assert!(
        first
            .metadata
            .name
            .as_deref()
            .is_some_and(|n| n.starts_with("node-csr-")),
        "{:?}",
        first.metadata.name
    );
    assert_eq!(
        condition_reason(first, "Approved").as_deref(),
        Some("AutoApproved")
    );
    assert!(issued(first));
    let written = std::fs::read_to_string(&kubeconfig)?;
    assert!(written.contains("kubelet-client-current.pem"), "{written}");
    let cert = current_client_cert(&dir)?;
    println!(
        "[node_lifecycle] {name}: bootstrapped client certificate {} valid {:?}",
        cert.serial,
        cert.not_after.duration_since(cert.not_before)?
    );

    // the serving certificate: requested by the node itself, waiting for an administrator
    let serving = poll("a kubelet-serving request", Duration::from_secs(30), || async {
        let list = csrs.list(&ListParams::default()).await?.items;
        Ok(requests_of(&list, SERVING_SIGNER, &format!("system:node:{name}")).pop())
    })
    .await?;
    assert!(
        condition_reason(&serving, "Approved").is_none(),
        "nobody approves serving certificates"
    );
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nl-certs-logs", "annotations": {"cri-fake.node-agent.io/logs": "hello"}},
        "spec": {"nodeName": name, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    poll("nl-certs-logs Running", Duration::from_secs(30), || async {
        let pod = pods.get("nl-certs-logs").await?;
        Ok((pod.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await?;
    let before = pods.logs("nl-certs-logs", &LogParams::default()).await;
    println!("[node_lifecycle] {name}: kubectl logs before approval: {before:?}");
    assert!(before.is_err(), "no serving certificate yet: {before:?}");
    let serving_name = serving.metadata.name.clone().unwrap_or_default();
    csrs.patch_approval(
        &serving_name,
        &PatchParams::default(),
        &Patch::Merge(serde_json::json!({"status": {"conditions": [{
            "type": "Approved", "status": "True", "reason": "AdminApproved", "message": "approved by the test",
        }]}})),
    )
    .await?;
    let logs = poll("kubectl logs after approval", Duration::from_secs(30), || async {
        Ok(pods.logs("nl-certs-logs", &LogParams::default()).await.ok())
    })
    .await;
    match logs {
        Ok(text) => assert_eq!(text, "hello\n"),
        Err(e) => bail!("{e}\nagent log:\n{}", agent.log_tail()),
    }
    assert!(dir.join("pki/kubelet-server-current.pem").exists());

    // rotation: a renewal filed by the node itself, auto-approved, and the new certificate in use
    let renewal = poll("a client certificate renewal", SIGNING_DURATION, || async {
        let list = csrs.list(&ListParams::default()).await?.items;
        Ok(requests_of(&list, CLIENT_SIGNER, &format!("system:node:{name}"))
            .into_iter()
            .find(issued))
    })
    .await
    .with_context(|| agent.log_tail())?;
    assert_eq!(
        condition_reason(&renewal, "Approved").as_deref(),
        Some("AutoApproved")
    );
    let renewed = poll(
        "the renewed certificate stored",
        Duration::from_secs(10),
        || async {
            let now = current_client_cert(&dir)?;
            Ok((now.serial != cert.serial).then_some(now))
        },
    )
    .await?;
    println!(
        "[node_lifecycle] {name}: client certificate renewed {} -> {} ({:?} before the first expired)",
        cert.serial,
        renewed.serial,
        cert.not_after
            .duration_since(SystemTime::now())
            .unwrap_or_default()
    );

    // past the first certificate's end: the node still renews its lease and starts new pods. The wait is for the
    // clock itself (the certificate's notAfter), nothing the agent does marks it
    let past = cert
        .not_after
        .duration_since(SystemTime::now())
        .unwrap_or_default()
        + Duration::from_secs(2);
    tokio::time::sleep(past).await;
    let expired_at = k8s_openapi::jiff::Timestamp::try_from(cert.not_after)?;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    poll(
        "a lease renewal after the first certificate expired",
        Duration::from_secs(30),
        || async {
            let lease = leases.get(name).await?;
            let renew = lease.spec.and_then(|s| s.renew_time).map(|t| t.0);
            Ok(renew.filter(|t| *t > expired_at).map(|_| ()))
        },
    )
    .await
    .with_context(|| agent.log_tail())?;
    let late: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "nl-certs-late"},
        "spec": {"nodeName": name, "containers": [{"name": "app", "image": "registry.k8s.io/pause:3.10"}]},
    }))?;
    pods.create(&PostParams::default(), &late).await?;
    poll("nl-certs-late Running", Duration::from_secs(30), || async {
        let pod = pods.get("nl-certs-late").await?;
        Ok((pod.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await
    .with_context(|| agent.log_tail())?;
    let node = nodes.get(name).await?;
    assert_eq!(ready_status(&node).as_deref(), Some("True"));
    for pod in ["nl-certs-logs", "nl-certs-late"] {
        pods.delete(pod, &Default::default()).await?;
    }
    Ok(())
}
