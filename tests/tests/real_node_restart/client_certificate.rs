//! A damaged client certificate at start with `--bootstrap-kubeconfig`. The node is first moved onto credentials
//! from TLS bootstrap (node-agent restarted with `--bootstrap-kubeconfig`, a `--kubeconfig` not yet written and
//! its own `--cert-dir`). Then, twice, node-agent is stopped, the file `kubelet-client-current.pem` points to is
//! damaged — cut in half, then (after the node recovered) its certificate's bytes overwritten inside an intact
//! PEM block — and node-agent is started again with the same flags. As the kubelet does, it warns naming the
//! file and bootstraps again: a new key, a CSR filed as the bootstrap token's user, approved by the
//! controller-manager and issued; and the node is back — the same Node object Ready, its lease renewed, the pod
//! that ran before untouched (the same container, no restart), a pod created afterwards running. The node's
//! original flags are restored at the end for the binary's other tests.

use std::collections::BTreeSet;
use std::io::{Read, Seek};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use e2e::{init_logging, wait_for};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;
use node_agent::certs::CertPair;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;
use testenv::bootstrap::BootstrapToken;

use super::harness::{NODE, RealNode};
use super::{container, node, pod, renew_time};

const NS: &str = "rn-client-cert";
const CLIENT_SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";

/// The names of the node-client CSRs filed as `user`.
async fn requests_by(csrs: &Api<CertificateSigningRequest>, user: &str) -> anyhow::Result<BTreeSet<String>> {
    Ok(csrs
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|c| c.spec.signer_name == CLIENT_SIGNER && c.spec.username.as_deref() == Some(user))
        .filter_map(|c| c.metadata.name)
        .collect())
}

/// Waits for a node-client CSR filed as `user`, not among `seen`, approved and issued; adds it to `seen`.
async fn new_issued_request(
    node: &RealNode,
    csrs: &Api<CertificateSigningRequest>,
    user: &str,
    seen: &mut BTreeSet<String>,
) -> anyhow::Result<CertificateSigningRequest> {
    let csr = wait_for(
        &format!("a new CSR by {user} issued"),
        Duration::from_secs(60),
        || async {
            for name in requests_by(csrs, user).await? {
                if seen.contains(&name) {
                    continue;
                }
                let csr = csrs.get(&name).await?;
                let issued = csr
                    .status
                    .as_ref()
                    .and_then(|s| s.certificate.as_ref())
                    .is_some_and(|c| !c.0.is_empty());
                if issued {
                    return Ok(Some(csr));
                }
            }
            Ok(None)
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    seen.insert(csr.metadata.name.clone().unwrap_or_default());
    let approved = csr
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == "Approved" && c.status == "True"))
        .and_then(|c| c.reason.clone());
    anyhow::ensure!(
        approved.as_deref() == Some("AutoApproved"),
        "{:?} not approved by the controller-manager: {approved:?}",
        csr.metadata.name
    );
    Ok(csr)
}

/// Whether `pair` holds the certificate `csr` was issued (compared as DER).
fn holds_issued(pair: &CertPair, csr: &CertificateSigningRequest) -> anyhow::Result<bool> {
    let issued = csr
        .status
        .as_ref()
        .and_then(|s| s.certificate.as_ref())
        .context("no certificate")?;
    let issued = CertificateDer::from_pem_slice(&issued.0)?;
    Ok(CertificateDer::from_pem_slice(pair.cert_pem.as_bytes())? == issued)
}

/// Waits until the node is back after a start at `started`: its lease renewed since, Ready, the same Node.
async fn back(node: &RealNode, started: k8s_openapi::jiff::Timestamp, uid: &str) -> anyhow::Result<()> {
    let admin = node.cp.admin_client().await?;
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-node-lease");
    let nodes: Api<Node> = Api::all(admin);
    wait_for(
        "a lease renewal after the start",
        Duration::from_secs(60),
        || async { Ok(renew_time(&leases).await?.filter(|t| *t > started).map(|_| ())) },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let n = nodes.get(NODE).await?;
    anyhow::ensure!(e2e::node_is_ready(&n), "the node is not Ready: {:?}", n.status);
    anyhow::ensure!(
        n.metadata.uid.as_deref() == Some(uid),
        "another Node object: {:?}, was {uid}",
        n.metadata.uid
    );
    Ok(())
}

/// What is done to the certificate file.
#[derive(Debug, Clone, Copy)]
enum Damage {
    /// Cut in half, as an interrupted write leaves it.
    Truncated,
    /// Its certificate's middle bytes zeroed, the PEM framing intact: a valid base64 block that is no
    /// certificate.
    Garbled,
}

fn damage(file: &Path, how: Damage) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(file)?;
    let damaged = match how {
        Damage::Truncated => text[..text.len() / 2].to_owned(),
        Damage::Garbled => {
            let begin = text
                .find("-----BEGIN CERTIFICATE-----")
                .context("no certificate")?;
            let end = text
                .find("-----END CERTIFICATE-----")
                .context("no certificate end")?;
            let body: Vec<&str> = text[begin..end].lines().skip(1).collect();
            anyhow::ensure!(body.len() >= 3, "a certificate of {} lines", body.len());
            let (from, to) = (body.len() / 3, 2 * body.len() / 3);
            let garbled: Vec<String> = body
                .iter()
                .enumerate()
                .map(|(i, l)| {
                    if (from..to).contains(&i) {
                        "A".repeat(l.len())
                    } else {
                        (*l).to_owned()
                    }
                })
                .collect();
            format!(
                "{}-----BEGIN CERTIFICATE-----\n{}\n{}",
                &text[..begin],
                garbled.join("\n"),
                &text[end..]
            )
        }
    };
    anyhow::ensure!(damaged != text, "the damage changed nothing");
    std::fs::write(file, damaged)?;
    Ok(())
}

/// The agent's log written since byte `from`.
fn log_since(path: &Path, from: u64) -> anyhow::Result<String> {
    let mut file = std::fs::File::open(path)?;
    file.seek(std::io::SeekFrom::Start(from))?;
    let mut text = String::new();
    file.read_to_string(&mut text)?;
    Ok(text)
}

#[tokio::test]
async fn a_damaged_client_certificate_is_replaced_by_tls_bootstrap() -> anyhow::Result<()> {
    init_logging();
    let Some((node, _serial)) = node().await? else {
        return Ok(());
    };
    let admin = node.cp.admin_client().await?;
    let nodes: Api<Node> = Api::all(admin.clone());
    let csrs: Api<CertificateSigningRequest> = Api::all(admin.clone());
    let pods: Api<Pod> = node.namespace(NS).await?;
    node.create_pod(&pods, &pod("steady", "while :; do sleep 1; done")?)
        .await?;
    let steady = wait_for("steady Running", Duration::from_secs(60), || async {
        let p = pods.get("steady").await?;
        Ok(container(&p).filter(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_some()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    let uid = nodes.get(NODE).await?.metadata.uid.context("the Node's uid")?;

    // the node onto credentials from TLS bootstrap
    let token = BootstrapToken::new("rnboot", "fedcba9876543210");
    token.create(&admin).await?;
    let dir = node.agent_root.with_file_name("client-certificate");
    std::fs::create_dir_all(&dir)?;
    let boot = dir.join("bootstrap.kubeconfig");
    token.write_kubeconfig(&boot, node.cp)?;
    token.wait_allowed(&boot).await?;
    let kubeconfig = dir.join("kubelet.kubeconfig");
    let cert_dir = dir.join("pki");
    let original = node.agent_args();
    let mut args = original.clone();
    let at = args
        .iter()
        .position(|a| a == "--kubeconfig")
        .context("the node's --kubeconfig")?;
    args[at + 1] = kubeconfig.display().to_string();
    args.extend([
        "--bootstrap-kubeconfig".to_owned(),
        boot.display().to_string(),
        "--cert-dir".to_owned(),
        cert_dir.display().to_string(),
    ]);
    let mut seen = requests_by(&csrs, &token.user()).await?;
    node.stop_agent(Duration::from_secs(20)).await?;
    node.set_agent_args(args);
    let started = k8s_openapi::jiff::Timestamp::now();
    node.start_agent()?;
    let first = new_issued_request(node, &csrs, &token.user(), &mut seen).await?;
    back(node, started, &uid).await?;
    let current = cert_dir.join("kubelet-client-current.pem");
    let read_current = || -> anyhow::Result<CertPair> {
        let text = std::fs::read_to_string(&current).with_context(|| current.display().to_string())?;
        Ok(CertPair::parse(&text, &text, &current.display().to_string())?)
    };
    let stored = read_current()?;
    anyhow::ensure!(
        holds_issued(&stored, &first)?,
        "the stored certificate is not the issued one"
    );
    let mut serial = stored.serial;
    println!(
        "[real_node] bootstrapped: CSR {} by {}, certificate {serial}",
        first.metadata.name.as_deref().unwrap_or_default(),
        token.user()
    );

    for how in [Damage::Truncated, Damage::Garbled] {
        node.stop_agent(Duration::from_secs(20)).await?;
        // the file the symlink names: what the kubeconfig's client-certificate and client-key resolve to
        let file = std::fs::canonicalize(&current)?;
        damage(&file, how)?;
        let log_from = std::fs::metadata(&node.agent_log)?.len();
        let started = k8s_openapi::jiff::Timestamp::now();
        let t0 = Instant::now();
        node.start_agent()?;
        let csr = new_issued_request(node, &csrs, &token.user(), &mut seen).await?;
        let issued_after = t0.elapsed();
        back(node, started, &uid).await?;
        let back_after = t0.elapsed();

        let log = log_since(&node.agent_log, log_from)?;
        let Some(warning) = log
            .lines()
            .find(|l| l.contains("WARN") && l.contains("TLS bootstrap again"))
        else {
            bail!("{how:?}: no warning before the bootstrap; the agent's log:\n{log}");
        };
        let named = current.display().to_string();
        assert!(
            warning.contains(&named) && warning.contains(&kubeconfig.display().to_string()),
            "{how:?}: the warning names neither the file {named} nor the kubeconfig: {warning}"
        );
        let now = read_current()?;
        assert_ne!(now.serial, serial, "{how:?}: the same certificate");
        assert!(holds_issued(&now, &csr)?, "{how:?}: not the issued certificate");
        // (the new file may have the damaged one's name: certificates stored within one second share their
        // time stamp, and the newer replaces the older, as in the kubelet's store)
        let p = pods.get("steady").await?;
        let c = container(&p).context("steady's status")?;
        assert_eq!(
            c.container_id, steady.container_id,
            "{how:?}: steady's container replaced"
        );
        assert_eq!(c.restart_count, 0, "{how:?}: steady restarted");
        assert!(
            c.state.as_ref().and_then(|s| s.running.as_ref()).is_some(),
            "{how:?}: {c:?}"
        );
        println!(
            "[real_node] {how:?} certificate: CSR {} by {} issued {issued_after:?} and the node back {back_after:?} \
             after the start; certificate {serial} -> {}; warning: {}",
            csr.metadata.name.as_deref().unwrap_or_default(),
            token.user(),
            now.serial,
            warning.trim()
        );
        serial = now.serial;
    }

    node.create_pod(&pods, &pod("after", "while :; do sleep 1; done")?)
        .await?;
    wait_for(
        "a pod created afterwards Running",
        Duration::from_secs(60),
        || async {
            let p = pods.get("after").await?;
            Ok(container(&p)
                .filter(|c| c.state.as_ref().and_then(|s| s.running.as_ref()).is_some())
                .map(|_| ()))
        },
    )
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;

    // the node as the binary's other tests know it
    node.stop_agent(Duration::from_secs(20)).await?;
    node.set_agent_args(original);
    let started = k8s_openapi::jiff::Timestamp::now();
    node.start_agent()?;
    back(node, started, &uid).await?;
    for name in ["steady", "after"] {
        pods.delete(name, &Default::default()).await?;
    }
    Ok(())
}
