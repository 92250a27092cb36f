//! The Helm chart in `charts/hollow` as the tests and benchmarks use it: helm commands against a control plane,
//! rendering to objects, the ports a fleet on the host network would take, and installing a fleet for real: this
//! build's `hollow` packed as the development image and pushed, `helm install`, its pods and nodes waited for,
//! and what the release's pods say when an install fails.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::ListParams;

use crate::{node_is_ready, wait_for};

/// The taint every hollow node of the chart carries by default (`hollowNodeTaint`).
pub const TAINT: &str = "hollow.node-agent.io/node";

/// The chart's directory.
pub fn chart_dir() -> PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../charts/hollow")
}

/// `helm` (built by `hack/build-helm.sh`), talking to `cp` when given (its admin kubeconfig).
pub fn helm(cp: Option<&testenv::ControlPlane>) -> anyhow::Result<Command> {
    let mut cmd = Command::new(testenv::assets::helm()?);
    if let Some(cp) = cp {
        cmd.arg("--kubeconfig").arg(cp.admin_kubeconfig());
    }
    Ok(cmd)
}

/// Runs `cmd`; its stdout, or an error with everything it printed.
pub fn run(cmd: &mut Command) -> anyhow::Result<String> {
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

/// `helm template <release> charts/hollow <args>` as objects.
pub fn render(release: &str, args: &[&str]) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = run(helm(None)?
        .args(["template", release])
        .arg(chart_dir())
        .args(args))?;
    let mut docs = Vec::new();
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let value: serde_json::Value = serde::Deserialize::deserialize(doc).context("rendered YAML")?;
        if !value.is_null() {
            docs.push(value);
        }
    }
    Ok(docs)
}

/// The rendered object of this kind (the first).
pub fn find<'a>(docs: &'a [serde_json::Value], kind: &str) -> anyhow::Result<&'a serde_json::Value> {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .with_context(|| format!("no {kind} rendered"))
}

/// A port `p` such that `p..p + count` are all free on 127.0.0.1 now.
pub fn free_ports(count: u16) -> anyhow::Result<u16> {
    for _ in 0..50 {
        let first = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        if first.checked_add(count).is_none() {
            continue;
        }
        let all_free = (first..first + count).all(|p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok());
        if all_free {
            return Ok(first);
        }
    }
    bail!("no {count} consecutive free ports on 127.0.0.1")
}

/// The fleet image as `hack/build-image.sh` pushed it: repository, tag, reference and manifest digest.
pub struct Image {
    /// `127.0.0.1:PORT/node-agent/hollow`.
    pub repository: String,
    /// The tag pushed (`<version>-dev`).
    pub tag: String,
    /// `<repository>:<tag>`.
    pub reference: String,
    /// The manifest's digest, `sha256:…`.
    pub digest: String,
}

/// Packs this build's `hollow` binary (or `HOLLOW_BIN`) as the development image (`hack/build-image.sh
/// --binaries`: seconds, no release build) and pushes it to the registry at `addr`.
pub fn push_image(addr: &str, out: &Path) -> anyhow::Result<Image> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/build-image.sh");
    let bin = crate::hollow_binary()?;
    let t0 = Instant::now();
    let out = run(Command::new("bash")
        .arg(&script)
        .arg("--binaries")
        .arg(bin.parent().context("the hollow binary's directory")?)
        .arg("--out")
        .arg(out)
        .args(["--push", &format!("{addr}/node-agent"), "hollow"]))?;
    let line = out.lines().last().context("build-image.sh printed nothing")?;
    let fields: Vec<&str> = line.split_whitespace().collect();
    let [name, reference, digest] = fields[..] else {
        bail!("build-image.sh: unexpected output {line:?}");
    };
    anyhow::ensure!(name == "hollow" && digest.starts_with("sha256:"), "{line:?}");
    let repository = format!("{addr}/node-agent/hollow");
    let tag = reference
        .strip_prefix(&format!("{repository}:"))
        .with_context(|| format!("{reference} is not in {repository}"))?;
    println!(
        "[chart] image {reference} {digest} packed and pushed in {:?}",
        t0.elapsed()
    );
    Ok(Image {
        tag: tag.to_owned(),
        repository,
        reference: reference.to_owned(),
        digest: digest.to_owned(),
    })
}

/// `helm install <release> charts/hollow --wait` into `namespace` (created) with `--set` of each of `values`,
/// waiting at most `timeout` (helm's duration, e.g. `4m`) for the fleet's pods; helm's output (the NOTES). A
/// failed install prints what the release's pods say ([`diagnose`]).
pub fn helm_install(
    cp: &testenv::ControlPlane,
    release: &str,
    namespace: &str,
    values: &[String],
    timeout: &str,
) -> anyhow::Result<String> {
    let mut cmd = helm(Some(cp))?;
    cmd.args(["install", release]).arg(chart_dir()).args([
        "--namespace",
        namespace,
        "--create-namespace",
        "--wait",
        "--timeout",
        timeout,
    ]);
    for v in values {
        cmd.args(["--set", v]);
    }
    let t0 = Instant::now();
    let out = run(&mut cmd).inspect_err(|_| diagnose(cp, namespace))?;
    println!("[chart] helm install {release}: {:?}", t0.elapsed());
    Ok(out)
}

/// Prints what the release's pods, their events and their logs say (a failed install or wait).
pub fn diagnose(cp: &testenv::ControlPlane, namespace: &str) {
    for args in [
        &["get", "pods,statefulsets,jobs", "-o", "wide"][..],
        &["describe", "pods"],
        &["get", "events", "--sort-by=.lastTimestamp"],
        &[
            "logs",
            "--all-containers",
            "--prefix",
            "--tail=30",
            "-l",
            "app.kubernetes.io/name=hollow",
        ],
    ] {
        let out = cp.kubectl().args(["-n", namespace]).args(args).output();
        match out {
            Ok(out) => println!(
                "[chart] kubectl {}:\n{}{}",
                args.join(" "),
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ),
            Err(e) => println!("[chart] kubectl {}: {e}", args.join(" ")),
        }
    }
}

/// The hollow nodes of release `release` (label `hollow.node-agent.io/fleet`) in the cluster `nodes` talks to;
/// with `cached`, as the API server's watch cache holds them (`resourceVersion=0`: no read through to etcd, for
/// polls of thousands of nodes).
pub async fn fleet_nodes(nodes: &Api<Node>, release: &str, cached: bool) -> anyhow::Result<Vec<Node>> {
    let mut params = ListParams::default().labels(&format!("hollow.node-agent.io/fleet={release}"));
    if cached {
        params = params.match_any();
    }
    Ok(nodes.list(&params).await?.items)
}

/// The names of `nodes`.
pub fn names(nodes: &[Node]) -> BTreeSet<String> {
    nodes.iter().filter_map(|n| n.metadata.name.clone()).collect()
}

/// Waits until exactly `expected` are the release's nodes and all are Ready, printing each change of the
/// registered and Ready counts.
pub async fn wait_nodes_ready(
    nodes: &Api<Node>,
    release: &str,
    expected: &BTreeSet<String>,
    timeout: Duration,
) -> anyhow::Result<Vec<Node>> {
    let seen = std::cell::Cell::new((0, 0));
    wait_for(
        &format!("{} hollow nodes of {release} Ready", expected.len()),
        timeout,
        || {
            let seen = &seen;
            async move {
                let list = fleet_nodes(nodes, release, false).await?;
                let ready = list.iter().filter(|n| node_is_ready(n)).count();
                if (list.len(), ready) != seen.get() {
                    seen.set((list.len(), ready));
                    println!(
                        "[chart] {release}: {} nodes registered, {ready} Ready",
                        list.len()
                    );
                }
                Ok((ready == expected.len() && names(&list) == *expected).then_some(list))
            }
        },
    )
    .await
}

/// The release's fleet pods (not its hook's).
pub async fn fleet_pods(pods: &Api<Pod>, release: &str) -> anyhow::Result<Vec<Pod>> {
    Ok(pods
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/name=hollow,app.kubernetes.io/instance={release}"
        )))
        .await?
        .items)
}

/// `GET path` on 127.0.0.1:`port` (plain HTTP/1.0, a fleet process's endpoint); the body.
pub fn http_get(port: u16, path: &str) -> anyhow::Result<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())?;
    let mut out = String::new();
    s.read_to_string(&mut out)?;
    Ok(out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or(out))
}
