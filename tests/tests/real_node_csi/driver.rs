//! The mock CSI driver under test: started on a socket of its own and registered with the agent, and the CSI
//! calls it logs (one line a call, with its request and outcome).

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use e2e::wait_for;

use crate::harness::RealNode;

/// A running mock driver and its log.
pub struct Driver {
    pub proc: testenv::process::Proc,
    pub log: PathBuf,
}

impl Driver {
    /// Starts the driver `name` on a socket of its own, registering in `node`'s `plugins_registry`.
    pub async fn start(node: &RealNode, name: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let bin = e2e::hack_binary("build-csi-mock-driver.sh", "the CSI mock driver").await?;
        let dir = node
            .agent_root
            .parent()
            .context("the node's directory")?
            .join(format!("csi-{name}"));
        std::fs::create_dir_all(&dir)?;
        let log = dir.join("driver.log");
        let _ = std::fs::remove_file(&log);
        let mut args = vec![
            "--name".to_owned(),
            name.to_owned(),
            "--csi-endpoint".to_owned(),
            dir.join("csi.sock").display().to_string(),
            "--registration-dir".to_owned(),
            node.agent_root.join("plugins_registry").display().to_string(),
        ];
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let proc = testenv::process::Proc::start(name, &bin, &args, &log)?;
        Ok(Self { proc, log })
    }

    /// Starts a controller sidecar of the driver (`program`, built by `hack/<script>`) on the driver's socket,
    /// talking to `node`'s API server as admin, its log beside the driver's.
    pub async fn sidecar(
        &self,
        node: &RealNode,
        program: &str,
        script: &str,
        what: &str,
        verbosity: u8,
    ) -> anyhow::Result<testenv::process::Proc> {
        testenv::process::Proc::start(
            program,
            &e2e::hack_binary(script, what).await?,
            &[
                format!("--csi-address={}", self.log.with_file_name("csi.sock").display()),
                format!("--kubeconfig={}", node.cp.admin_kubeconfig().display()),
                "--leader-election=false".to_owned(),
                "--timeout=30s".to_owned(),
                format!("--v={verbosity}"),
            ],
            &self.log.with_file_name(format!("{program}.log")),
        )
    }

    /// Waits until the driver's log has a line starting with `prefix`; returns that line.
    pub async fn logged(&self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        wait_for(&format!("the driver to log {prefix:?}"), timeout, || async {
            Ok(std::fs::read_to_string(&self.log)
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with(prefix))
                .map(str::to_owned))
        })
        .await
        .with_context(|| format!("driver log:\n{}", testenv::process::log_tail(&self.log, 20)))
    }

    /// [`Driver::start`], then waits until the driver has registered with the agent.
    pub async fn registered(node: &RealNode, name: &str, extra: &[&str]) -> anyhow::Result<Self> {
        let driver = Self::start(node, name, extra).await?;
        driver.logged("registration: ok", Duration::from_secs(30)).await?;
        Ok(driver)
    }

    /// Waits until the driver's log has a call of the Node service's `method`; returns the first.
    pub async fn called(&self, method: &str, timeout: Duration) -> anyhow::Result<String> {
        wait_for(&format!("a {method} call"), timeout, || async {
            Ok(calls(self, method).first().cloned())
        })
        .await
    }
}

/// The driver's CSI calls of `method` (its log lines "csi: /csi.v1.Node/<method> <request> -> <outcome>").
pub fn calls(driver: &Driver, method: &str) -> Vec<String> {
    service_calls(driver, "Node", method)
}

/// The driver's CSI calls of `service`'s `method` (the log lines "csi: /csi.v1.<service>/<method> ...").
fn service_calls(driver: &Driver, service: &str, method: &str) -> Vec<String> {
    let needle = format!("csi: /csi.v1.{service}/{method} ");
    std::fs::read_to_string(&driver.log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.strip_prefix(&needle).map(str::to_owned))
        .collect()
}

/// The driver's CSI calls of the Controller service's `method`.
pub fn controller_calls(driver: &Driver, method: &str) -> Vec<String> {
    service_calls(driver, "Controller", method)
}

/// The request of the driver's last `method` call (its log line's JSON), with its outcome.
pub fn last_request(driver: &Driver, method: &str) -> anyhow::Result<(serde_json::Value, String)> {
    let line = calls(driver, method)
        .pop()
        .with_context(|| format!("no {method} call"))?;
    let (body, outcome) = line.rsplit_once(" -> ").context("an outcome")?;
    Ok((serde_json::from_str(body)?, outcome.to_owned()))
}
