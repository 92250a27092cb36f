//! A real containerd for the conformance test: either one the caller started (`NODE_AGENT_CONTAINERD_SOCKET`,
//! e.g. from `tests/containerd/setup.sh`), or one this process starts (as root) with the project's setup script
//! in a private directory (own state directory and bridge) and tears down, by PID, when dropped. A containerd
//! that cannot start is an error; only `NODE_AGENT_SKIP_REAL_NODE=1` skips. `NA_CRI_SUBNET` names the pod subnet
//! in both cases (default 10.88.0.0/16).

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

/// A containerd serving CRI v1 on `socket`.
pub struct Containerd {
    /// The CRI socket.
    pub socket: PathBuf,
    /// The pod subnet of its bridge network.
    pub subnet: (Ipv4Addr, u8),
    /// State directory and bridge, when this process started containerd (and must tear it down).
    managed: Option<(PathBuf, String)>,
}

/// The variable that skips the real-mode tests (`1`), as in the `e2e` package.
const SKIP_REAL_NODE: &str = "NODE_AGENT_SKIP_REAL_NODE";

/// Whether to skip (`NODE_AGENT_SKIP_REAL_NODE=1`); says so once, on the process's stderr itself, past the test
/// harness's capture.
fn skip_real_node() -> bool {
    static SAID: std::sync::Once = std::sync::Once::new();
    let skip = std::env::var(SKIP_REAL_NODE).as_deref() == Ok("1");
    if skip {
        SAID.call_once(|| {
            use std::io::Write;
            // nothing to do if stderr is gone
            let _ = writeln!(
                std::io::stderr(),
                "[{}] skipped: {SKIP_REAL_NODE}=1",
                env!("CARGO_CRATE_NAME")
            );
        });
    }
    skip
}

fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/containerd")
}

fn subnet() -> anyhow::Result<(String, (Ipv4Addr, u8))> {
    let text = std::env::var("NA_CRI_SUBNET").unwrap_or_else(|_| "10.88.0.0/16".into());
    let (addr, bits) = text
        .split_once('/')
        .with_context(|| format!("NA_CRI_SUBNET={text:?}: expected a.b.c.d/n"))?;
    Ok((
        text.clone(),
        (
            addr.parse().context("NA_CRI_SUBNET address")?,
            bits.parse().context("NA_CRI_SUBNET prefix")?,
        ),
    ))
}

impl Containerd {
    /// The containerd the environment names, else one started here; `None` (the test is skipped, printed
    /// once) only with `NODE_AGENT_SKIP_REAL_NODE=1`.
    pub fn from_env() -> anyhow::Result<Option<Self>> {
        if skip_real_node() {
            return Ok(None);
        }
        let (subnet_text, subnet) = subnet()?;
        if let Some(socket) = std::env::var_os("NODE_AGENT_CONTAINERD_SOCKET").filter(|s| !s.is_empty()) {
            return Ok(Some(Self {
                socket: socket.into(),
                subnet,
                managed: None,
            }));
        }
        if std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self")?) != 0 {
            bail!(
                "comparing the fakes with containerd needs root to start one (or NODE_AGENT_CONTAINERD_SOCKET \
                 naming a running one, see tests/containerd/setup.sh); set {SKIP_REAL_NODE}=1 to skip"
            );
        }
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("na-cri-{pid}"));
        let bridge = format!("nacri{:x}", pid % 0xfffff);
        // from here on, Drop tears down whatever setup.sh managed to start
        let this = Self {
            socket: dir.join("containerd.sock"),
            subnet,
            managed: Some((dir.clone(), bridge.clone())),
        };
        let status = Command::new("bash")
            .arg(scripts().join("setup.sh"))
            .env("NA_CRI_DIR", &dir)
            .env("NA_CRI_BRIDGE", &bridge)
            .env("NA_CRI_SUBNET", &subnet_text)
            .stdout(std::process::Stdio::null())
            .status()
            .context("running tests/containerd/setup.sh")?;
        if !status.success() {
            bail!(
                "tests/containerd/setup.sh failed ({status}); logs in {} (set {SKIP_REAL_NODE}=1 to skip the \
                 comparison with containerd)",
                dir.display()
            );
        }
        Ok(Some(this))
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        if let Some((dir, bridge)) = &self.managed {
            let status = Command::new("bash")
                .arg(scripts().join("teardown.sh"))
                .env("NA_CRI_DIR", dir)
                .env("NA_CRI_BRIDGE", bridge)
                .status();
            if !status.as_ref().is_ok_and(|s| s.success()) {
                eprintln!(
                    "tests/containerd/teardown.sh failed for {}: {status:?}",
                    dir.display()
                );
            }
        }
    }
}
