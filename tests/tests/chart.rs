//! The Helm chart for the hollow fleet: it lints, renders, and everything it renders is accepted by the real
//! API server (server-side dry run), with the fleet flags the `hollow` binary takes; per-node credentials mount
//! the CA Secret and refuse to render without one.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, bail};
use e2e::init_logging;

/// `kubectl apply --dry-run=server` of rendered manifests; what kubectl printed.
fn dry_run(cp: &testenv::ControlPlane, tag: &str, rendered: &str) -> anyhow::Result<String> {
    let manifest = std::env::temp_dir().join(format!("hollow-chart-{tag}-{}.yaml", std::process::id()));
    std::fs::write(&manifest, rendered)?;
    let applied = run(cp
        .kubectl()
        .args(["apply", "--dry-run=server", "-f"])
        .arg(&manifest));
    let _ = std::fs::remove_file(&manifest);
    applied
}

fn run(cmd: &mut Command) -> anyhow::Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!(
            "{cmd:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::test]
async fn chart_renders_and_the_api_server_accepts_it() -> anyhow::Result<()> {
    init_logging();
    let helm = testenv::assets::helm()?;
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/hollow");
    run(Command::new(&helm).arg("lint").arg("--strict").arg(&chart))?;

    let rendered = run(Command::new(&helm).args(["template", "fleet"]).arg(&chart).args([
        "--namespace",
        "default",
        "--set",
        "replicas=3,fleet.nodesPerProcess=250,fleet.watchMode=shared,fleet.deleteNodesOnExit=true",
    ]))?;
    for expected in [
        "kind: StatefulSet",
        "replicas: 3",
        "--nodes=250",
        "--watch-mode=shared",
        "--delete-nodes-on-exit",
        "--node-ip=$(POD_IP)",
        "kind: ClusterRole",
    ] {
        assert!(rendered.contains(expected), "rendered chart lacks {expected:?}");
    }

    let cp = testenv::shared().await?;
    let applied = dry_run(cp, "default", &rendered)?;
    for kind in [
        "serviceaccount/fleet-hollow",
        "clusterrole.rbac.authorization.k8s.io/fleet-hollow",
        "statefulset.apps/fleet-hollow",
        "configmap/fleet-hollow",
        "service/fleet-hollow",
    ] {
        assert!(
            applied.contains(kind),
            "server dry-run did not accept {kind}: {applied}"
        );
    }

    // per-node credentials: the CA Secret is mounted and the flags point at it; only then
    let per_node = "fleet.nodeCredentials=per-node,fleet.nodeCaSecret=cluster-client-ca";
    run(Command::new(&helm)
        .args(["lint", "--strict"])
        .arg(&chart)
        .args(["--set", per_node]))?;
    let rendered = run(Command::new(&helm).args(["template", "fleet"]).arg(&chart).args([
        "--namespace",
        "default",
        "--set",
        per_node,
    ]))?;
    for expected in [
        "--node-credentials=per-node",
        "--node-ca-cert=/etc/hollow-node-ca/ca.crt",
        "--node-ca-key=/etc/hollow-node-ca/ca.key",
        "secretName: cluster-client-ca",
        "mountPath: /etc/hollow-node-ca",
    ] {
        assert!(rendered.contains(expected), "per-node render lacks {expected:?}");
    }
    let shared = run(Command::new(&helm)
        .args(["template", "fleet"])
        .arg(&chart)
        .args(["--namespace", "default"]))?;
    assert!(
        !shared.contains("node-ca"),
        "the CA is mounted only with per-node credentials"
    );
    assert!(dry_run(cp, "per-node", &rendered)?.contains("statefulset.apps/fleet-hollow"));
    for (values, message) in [
        ("fleet.nodeCredentials=per-node", "fleet.nodeCaSecret is required"),
        (
            "fleet.nodeCredentials=per-node,fleet.nodeCaSecret=x,fleet.watchMode=shared",
            "needs fleet.watchMode per-node",
        ),
    ] {
        let refused = run(Command::new(&helm)
            .args(["template", "fleet"])
            .arg(&chart)
            .args(["--set", values]))
        .expect_err("refused");
        assert!(format!("{refused:#}").contains(message), "{refused:#}");
    }
    Ok(())
}
