//! The Helm chart for the hollow fleet against the real API server: it lints and renders in every mode, the API
//! server accepts what it renders (server-side dry run), each mode grants only the RBAC it needs, `helm install`
//! with a value the schema refuses fails with the schema's message, and the chart's defaults — its rendered
//! ConfigMap and the StatefulSet's arguments and environment — start a real fleet whose nodes carry the fleet
//! label and the hollow-node taint. (The chart installed on a real node, pulling the fleet image from a registry:
//! `real_node_chart.rs`.)

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context;
use e2e::chart::{chart_dir, find, free_ports, helm, render, run};
use e2e::{init_logging, node_is_ready, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, ListParams};

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

fn template(values: &str) -> anyhow::Result<String> {
    let mut cmd = helm(None)?;
    cmd.args(["template", "fleet"])
        .arg(chart_dir())
        .args(["--namespace", "default"]);
    if !values.is_empty() {
        cmd.args(["--set", values]);
    }
    run(&mut cmd)
}

fn kinds(docs: &[serde_json::Value]) -> Vec<String> {
    docs.iter()
        .map(|d| d["kind"].as_str().unwrap_or_default().to_owned())
        .collect()
}

#[tokio::test]
async fn chart_renders_and_the_api_server_accepts_it() -> anyhow::Result<()> {
    init_logging();
    let chart = chart_dir();
    run(helm(None)?.arg("lint").arg("--strict").arg(&chart))?;

    let rendered = template(
        "replicas=3,fleet.nodesPerProcess=1000,fleet.watchMode=shared,fleet.deleteNodesOnExit=true",
    )?;
    for expected in [
        "kind: StatefulSet",
        "replicas: 3",
        "--nodes=1000",
        "--watch-mode=shared",
        "--delete-nodes-on-exit",
        "--node-ip=$(POD_IP)",
        "kind: ClusterRole",
        "kind: PodDisruptionBudget",
        // the pre-delete hook that stops the fleet before its RBAC goes
        "helm.sh/hook: pre-delete",
        "- stop-fleet",
        // resources sized from nodesPerProcess: 100m + 1000/10 m, 64Mi + 1000 × 256Ki, 128Mi + 1000 × 1Mi
        "cpu: 200m",
        "memory: 314Mi",
        "memory: 1128Mi",
        // the fleet keeps off hollow nodes
        "key: hollow.node-agent.io/profile",
        "operator: DoesNotExist",
        // and its nodes carry the fleet's label and taint
        "hollow.node-agent.io/fleet: fleet",
        "key: hollow.node-agent.io/node",
    ] {
        assert!(rendered.contains(expected), "rendered chart lacks {expected:?}");
    }
    // shared credentials: what kubelets need, but no Secret beyond rbac.podSecrets
    let docs = render("fleet", &["--set", "fleet.deleteNodesOnExit=true"])?;
    let role = find(&docs, "ClusterRole")?;
    let resources: Vec<&str> = role["rules"]
        .as_array()
        .context("rules")?
        .iter()
        .flat_map(|r| r["resources"].as_array().into_iter().flatten())
        .filter_map(|r| r.as_str())
        .collect();
    assert!(!resources.contains(&"secrets"), "{resources:?}");
    assert!(resources.contains(&"serviceaccounts/token"), "{resources:?}");
    let with_secrets = render("fleet", &["--set", "rbac.podSecrets=true"])?;
    let secrets_rule = find(&with_secrets, "ClusterRole")?["rules"]
        .as_array()
        .context("rules")?
        .iter()
        .find(|r| r["resources"][0] == "secrets")
        .context("rbac.podSecrets grants secrets")?;
    // get for the pods' Secret volumes and env, list and watch for the per-object watches of the `Watch`
    // change-detection strategy
    assert_eq!(secrets_rule["verbs"], serde_json::json!(["get", "list", "watch"]));

    let cp = testenv::shared().await?;
    let applied = dry_run(cp, "default", &rendered)?;
    for kind in [
        "serviceaccount/fleet-hollow",
        "clusterrole.rbac.authorization.k8s.io/fleet-hollow",
        "statefulset.apps/fleet-hollow",
        "configmap/fleet-hollow",
        "service/fleet-hollow",
        "poddisruptionbudget.policy/fleet-hollow",
    ] {
        assert!(
            applied.contains(kind),
            "server dry-run did not accept {kind}: {applied}"
        );
    }

    // per-node credentials: the CA Secret is mounted and the flags point at it; no ClusterRole unless the fleet
    // deletes its nodes (the Node authorizer grants the nodes what they need)
    let per_node = "fleet.nodeCredentials=per-node,fleet.nodeCaSecret=cluster-client-ca";
    run(helm(None)?
        .args(["lint", "--strict"])
        .arg(&chart)
        .args(["--set", per_node]))?;
    let rendered = template(per_node)?;
    for expected in [
        "--node-credentials=per-node",
        "--node-ca-cert=/etc/hollow-node-ca/ca.crt",
        "--node-ca-key=/etc/hollow-node-ca/ca.key",
        "secretName: cluster-client-ca",
        "mountPath: /etc/hollow-node-ca",
    ] {
        assert!(rendered.contains(expected), "per-node render lacks {expected:?}");
    }
    assert!(!rendered.contains("kind: ClusterRole"), "{rendered}");
    let deleting = render(
        "fleet",
        &["--set", &format!("{per_node},fleet.deleteNodesOnExit=true")],
    )?;
    assert_eq!(
        find(&deleting, "ClusterRole")?["rules"],
        serde_json::json!([{"apiGroups": [""], "resources": ["nodes"], "verbs": ["delete"]}])
    );
    let shared = template("")?;
    assert!(
        !shared.contains("node-ca"),
        "the CA is mounted only with per-node credentials"
    );
    assert!(dry_run(cp, "per-node", &rendered)?.contains("statefulset.apps/fleet-hollow"));

    // external target: the kubeconfig Secret is the fleet's identity; nothing in the fleet's cluster
    let external = render(
        "fleet",
        &["--set", "target.mode=external,target.kubeconfigSecret=target-kc"],
    )?;
    let mut external_kinds = kinds(&external);
    external_kinds.sort();
    assert_eq!(
        external_kinds,
        [
            "ConfigMap",
            "PodDisruptionBudget",
            "Service",
            "ServiceAccount",
            "StatefulSet"
        ]
    );
    let pod = &find(&external, "StatefulSet")?["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    let args = pod["containers"][0]["args"].to_string();
    assert!(
        args.contains("--kubeconfig=/etc/hollow-target/kubeconfig"),
        "{args}"
    );
    assert!(!args.contains("--server"), "{args}");
    assert_eq!(pod["volumes"][1]["secret"]["secretName"], "target-kc");

    // host network with an explicit API server: per-process ports, an in-container readiness check, no ports
    // declared (they would be host ports, equal for every replica)
    let host = render(
        "fleet",
        &["--set", "hostNetwork=true,apiServer.url=https://127.0.0.1:6443"],
    )?;
    let pod = &find(&host, "StatefulSet")?["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    let container = &pod["containers"][0];
    assert!(
        container["args"]
            .to_string()
            .contains("--server=https://127.0.0.1:6443")
    );
    assert_eq!(
        container["readinessProbe"]["exec"]["command"],
        serde_json::json!(["/usr/local/bin/hollow", "healthz"])
    );
    assert!(container.get("ports").is_none(), "{container}");
    assert!(
        container["env"]
            .to_string()
            .contains("apps.kubernetes.io/pod-index")
    );
    let stream: Vec<String> = host.iter().map(serde_yaml::to_string).collect::<Result<_, _>>()?;
    assert!(dry_run(cp, "host", &stream.join("---\n"))?.contains("statefulset.apps/fleet-hollow"));

    // the ServiceMonitor renders only on the pod network
    let monitored = render("fleet", &["--set", "serviceMonitor.enabled=true"])?;
    assert_eq!(
        find(&monitored, "ServiceMonitor")?["spec"]["endpoints"][0]["port"],
        "metrics"
    );

    for (values, message) in [
        ("fleet.nodeCredentials=per-node", "fleet.nodeCaSecret is required"),
        (
            "fleet.nodeCredentials=per-node,fleet.nodeCaSecret=x,fleet.watchMode=shared",
            "needs fleet.watchMode per-node",
        ),
        ("target.mode=external", "target.kubeconfigSecret is required"),
        (
            "serviceMonitor.enabled=true,hostNetwork=true",
            "serviceMonitor needs hostNetwork false",
        ),
    ] {
        let refused = template(values).expect_err("refused");
        assert!(format!("{refused:#}").contains(message), "{refused:#}");
    }
    Ok(())
}

#[tokio::test]
async fn helm_install_refuses_values_the_schema_forbids() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    for (values, message) in [
        (
            "fleet.watchMode=sideways",
            "at '/fleet/watchMode': value must be one of 'per-node', 'shared'",
        ),
        (
            "fleet.nodesPerProcess=0",
            "at '/fleet/nodesPerProcess': minimum: got 0, want 1",
        ),
        // the keys the chart once shipped, which the fake runtime does not know
        (
            "runtimeProfile.imagePullMillis=100",
            "at '/runtimeProfile': additional properties 'imagePullMillis' not allowed",
        ),
    ] {
        let refused = run(helm(Some(cp))?
            .args(["install", "refused"])
            .arg(chart_dir())
            .args(["--namespace", "default", "--set", values]))
        .expect_err("helm install refuses it");
        let text = format!("{refused:#}");
        assert!(
            text.contains("values don't meet the specifications of the schema"),
            "{text}"
        );
        assert!(text.contains(message), "{values}: {text}");
    }
    // nothing was installed
    let releases = run(helm(Some(cp))?.args(["list", "--all", "--namespace", "default", "-q"]))?;
    assert!(!releases.contains("refused"), "{releases}");
    Ok(())
}

#[tokio::test]
async fn the_charts_defaults_start_a_fleet() -> anyhow::Result<()> {
    init_logging();
    let cp = testenv::shared().await?;
    let docs = render("defaults", &["--namespace", "default"])?;
    let config = find(&docs, "ConfigMap")?;
    let dir = tempfile_dir()?;
    for file in ["profiles.yaml", "runtime.yaml"] {
        let text = config["data"][file]
            .as_str()
            .with_context(|| format!("ConfigMap data {file}"))?;
        std::fs::write(dir.join(file), text)?;
    }
    let container = &find(&docs, "StatefulSet")?["spec"]["template"]["spec"]["containers"][0];
    let pod_name = "defaults-hollow-0";
    let expand = |s: &str| {
        s.replace("$(POD_NAME)", pod_name)
            .replace("$(POD_IP)", "127.0.0.1")
            .replace("/etc/hollow/", &format!("{}/", dir.display()))
    };
    let mut args: Vec<String> = container["args"]
        .as_array()
        .context("args")?
        .iter()
        .map(|a| expand(a.as_str().unwrap_or_default()))
        .collect();
    args.push(format!("--kubeconfig={}", cp.admin_kubeconfig().display()));
    let mut env: BTreeMap<String, String> = container["env"]
        .as_array()
        .context("env")?
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?.to_owned(), expand(e["value"].as_str()?))))
        .collect();
    assert_eq!(
        env.get("HOLLOW_METRICS_ADDRESS").map(String::as_str),
        Some("127.0.0.1:9090")
    );
    // the default port may be taken on this machine
    env.insert(
        "HOLLOW_METRICS_ADDRESS".into(),
        format!("127.0.0.1:{}", free_ports(1)?),
    );
    let nodes_wanted: usize = args
        .iter()
        .find_map(|a| a.strip_prefix("--nodes="))
        .context("--nodes")?
        .parse()?;
    assert_eq!(nodes_wanted, 100, "the chart's default nodesPerProcess");

    let log = dir.join("hollow.log");
    let mut cmd = std::process::Command::new(e2e::hollow_binary()?);
    cmd.args(&args)
        .envs(&env)
        .stdout(std::fs::File::create(&log)?)
        .stderr(std::fs::File::create(dir.join("hollow.err"))?);
    let fleet = std::cell::RefCell::new(Guard(
        cmd.spawn()
            .context("starting hollow with the chart's arguments")?,
    ));
    let nodes: Api<Node> = Api::all(cp.admin_client().await?);
    let selector = ListParams::default().labels("hollow.node-agent.io/fleet=defaults");
    let ready = wait_for(
        "the chart's default fleet Ready",
        Duration::from_secs(120),
        || async {
            let exited = fleet.borrow_mut().0.try_wait()?;
            if let Some(status) = exited {
                anyhow::bail!(
                    "hollow exited ({status}) with the chart's defaults:\n{}",
                    testenv::process::log_tail(&dir.join("hollow.err"), 20)
                );
            }
            let list = nodes.list(&selector).await?.items;
            let ready = list.iter().filter(|n| node_is_ready(n)).count();
            Ok((ready == nodes_wanted).then_some(list))
        },
    )
    .await?;
    for node in &ready {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        assert!(name.starts_with("defaults-hollow-0-n"), "{name}");
        let taints = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.clone())
            .unwrap_or_default();
        assert!(
            taints.iter().any(|t| t.key == "hollow.node-agent.io/node"
                && t.value.as_deref() == Some("true")
                && t.effect == "NoSchedule"),
            "{name}: {taints:?}"
        );
    }
    // a clean stop (SIGTERM, as the kubelet stops the container)
    let mut fleet = fleet.into_inner();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(fleet.0.id())?),
        nix::sys::signal::Signal::SIGTERM,
    )?;
    let status = tokio::task::spawn_blocking(move || fleet.0.wait()).await??;
    assert!(status.success(), "hollow stopped with {status}");
    nodes
        .delete_collection(&DeleteParams::default(), &selector)
        .await?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// A fresh directory under the temp dir.
fn tempfile_dir() -> anyhow::Result<std::path::PathBuf> {
    let dir = std::env::temp_dir().join(format!("hollow-chart-defaults-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// A child process killed when dropped (a failed test leaves no fleet behind).
struct Guard(std::process::Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `git` in `dir`; its trimmed stdout.
fn git(dir: &std::path::Path, args: &[&str]) -> anyhow::Result<String> {
    Ok(
        run(std::process::Command::new("git").current_dir(dir).args(args))?
            .trim()
            .to_owned(),
    )
}

/// Makes the hollow image from two fresh clones of this commit at different paths, into different layouts, and
/// compares the digests; reads the image layout: an index naming one manifest, a non-root user, the entrypoint,
/// the OCI labels.
///
/// By default each clone packs this build's `hollow` binary as the development image (`--binaries`, seconds):
/// this shows the packing is reproducible — same binary and commit, same digest, wherever the script runs — not
/// that two compilations give the same binary. `NODE_AGENT_IMAGE_RELEASE=1` makes each clone build the release
/// image instead, the second with a binary cache and cargo target directory of its own: two cold release builds
/// from two paths (over ten minutes each on two cores), run by hand, not in CI.
#[tokio::test]
async fn the_image_is_the_same_from_two_builds_of_one_commit() -> anyhow::Result<()> {
    init_logging();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let commit = git(&root, &["rev-parse", "HEAD"])?;
    let base = std::env::temp_dir().join(format!("hollow-image-repro-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let release = std::env::var("NODE_AGENT_IMAGE_RELEASE").as_deref() == Ok("1");
    let binaries = if release {
        None
    } else {
        let bin = e2e::hollow_binary()?;
        Some(
            bin.parent()
                .context("the hollow binary's directory")?
                .to_path_buf(),
        )
    };
    let mut digests = Vec::new();
    for (i, checkout) in ["first", "second/checkout"].into_iter().enumerate() {
        let dir = base.join(checkout);
        std::fs::create_dir_all(dir.parent().context("parent")?)?;
        run(std::process::Command::new("git")
            .args(["clone", "-q", "--no-checkout"])
            .arg(&root)
            .arg(&dir))?;
        git(&dir, &["checkout", "-q", "--detach", &commit])?;
        let out = base.join(format!("layout-{i}"));
        let mut cmd = std::process::Command::new("bash");
        cmd.arg(dir.join("hack/build-image.sh")).arg("--out").arg(&out);
        match &binaries {
            Some(bins) => {
                cmd.arg("--binaries").arg(bins);
            }
            None if i == 1 => {
                cmd.env("NODE_AGENT_CACHE", base.join("cache"))
                    .env("NODE_AGENT_IMAGE_TARGET", base.join("target"));
            }
            None => {}
        }
        cmd.arg("hollow");
        let t0 = std::time::Instant::now();
        let line = run(&mut cmd)?;
        println!(
            "[chart] {} image {i} from {}: {} in {:?}",
            if release { "release" } else { "development" },
            dir.display(),
            line.trim(),
            t0.elapsed()
        );
        let digest = line.split_whitespace().nth(2).context("digest")?.to_owned();
        digests.push((digest, out));
    }
    assert_eq!(digests[0].0, digests[1].0, "two builds of {commit}");

    // the layout: index -> manifest -> config
    let layout = digests[0].1.join("hollow");
    let blob = |digest: &str| -> anyhow::Result<serde_json::Value> {
        let hex = digest.strip_prefix("sha256:").context("sha256")?;
        Ok(serde_json::from_slice(&std::fs::read(
            layout.join("blobs/sha256").join(hex),
        )?)?)
    };
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(layout.join("index.json"))?)?;
    assert_eq!(index["manifests"].as_array().map(Vec::len), Some(1));
    assert_eq!(index["manifests"][0]["digest"], digests[0].0.as_str());
    let manifest = blob(&digests[0].0)?;
    let config = blob(manifest["config"]["digest"].as_str().context("config digest")?)?;
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/hollow"])
    );
    let labels = &config["config"]["Labels"];
    assert_eq!(labels["org.opencontainers.image.revision"], commit.as_str());
    assert_eq!(labels["org.opencontainers.image.title"], "hollow");
    // created: the commit's time, not the build's
    let committed = run(std::process::Command::new("git")
        .current_dir(&root)
        .env("TZ", "UTC")
        .args([
            "log",
            "-1",
            "--date=format-local:%Y-%m-%dT%H:%M:%SZ",
            "--format=%cd",
            &commit,
        ]))?;
    assert_eq!(config["created"], committed.trim());
    assert_eq!(manifest["layers"].as_array().map(Vec::len), Some(1));
    let _ = std::fs::remove_dir_all(&base);
    Ok(())
}
