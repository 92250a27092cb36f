//! A real containerd for the conformance test: either one the caller started (`NODE_AGENT_CONTAINERD_SOCKET`,
//! e.g. from `tests/containerd/setup.sh`), or — with `NODE_AGENT_CONTAINERD_SETUP=1` — one this process starts
//! with the project's setup script in a private directory (own state directory and bridge) and tears down, by
//! PID, when dropped. `NA_CRI_SUBNET` names the pod subnet in both cases (default 10.88.0.0/16).

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
    /// The containerd the environment offers, or `None` (the test is skipped) when it offers none.
    pub fn from_env() -> anyhow::Result<Option<Self>> {
        let (subnet_text, subnet) = subnet()?;
        if let Some(socket) = std::env::var_os("NODE_AGENT_CONTAINERD_SOCKET").filter(|s| !s.is_empty()) {
            return Ok(Some(Self {
                socket: socket.into(),
                subnet,
                managed: None,
            }));
        }
        if std::env::var("NODE_AGENT_CONTAINERD_SETUP").as_deref() != Ok("1") {
            return Ok(None);
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
                "tests/containerd/setup.sh failed ({status}); logs in {}",
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
