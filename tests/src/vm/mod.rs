//! A Debian guest under QEMU for the tests that need a host unlike this one (cgroup v2, systemd as PID 1): the
//! guest built by `hack/build-vm-image.sh` (cached, built on first use), booted with software emulation (TCG),
//! its disk a throw-away snapshot of the cached image. A host directory is shared with it read-only over 9p
//! (mounted at [`GUEST_SHARE`]), QEMU's user network gives it the host's loopback at [`HOST_FROM_GUEST`], and
//! host ports on 127.0.0.1 can be forwarded to it. Commands run in it through the guest agent
//! ([`guest_agent`]). QEMU is killed when the [`Vm`] is dropped, and with the process that started it.

pub mod guest_agent;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

pub use guest_agent::{GuestAgent, Output};

/// Where the guest mounts the shared directory.
pub const GUEST_SHARE: &str = "/mnt/host";
/// The host's loopback as the guest reaches it (QEMU's user network).
pub const HOST_FROM_GUEST: &str = "10.0.2.2";

/// How to boot the guest.
#[derive(Debug, Clone)]
pub struct VmOptions {
    /// The host directory the guest sees, read-only, at [`GUEST_SHARE`].
    pub share: PathBuf,
    /// Host ports on 127.0.0.1 forwarded to the same port in the guest.
    pub forwards: Vec<u16>,
    /// The guest's memory, MiB.
    pub memory_mib: u32,
    /// Virtual CPUs.
    pub cpus: u32,
    /// How long the guest may take to boot until its agent answers.
    pub boot_timeout: Duration,
}

impl VmOptions {
    /// A guest of 2 GiB and 2 CPUs sharing `share`.
    pub fn new(share: impl Into<PathBuf>) -> Self {
        Self {
            share: share.into(),
            forwards: Vec::new(),
            memory_mib: 2048,
            cpus: 2,
            boot_timeout: Duration::from_secs(300),
        }
    }
}

/// A running guest.
#[derive(Debug)]
pub struct Vm {
    agent: GuestAgent,
    /// Where QEMU's socket, serial console log and output are.
    dir: PathBuf,
    // dropped last: QEMU is killed when the handle goes
    _qemu: testenv::process::Proc,
}

/// The guest's image directory (`rootfs.img`, `vmlinuz`, `initrd.img`), built by `hack/build-vm-image.sh` if the
/// cache does not hold it yet (several minutes, once).
pub fn image() -> anyhow::Result<PathBuf> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../hack/build-vm-image.sh");
    let out = std::process::Command::new("bash")
        .arg(&script)
        .stderr(std::process::Stdio::inherit())
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    if !out.status.success() {
        bail!("{} failed ({})", script.display(), out.status);
    }
    Ok(PathBuf::from(String::from_utf8(out.stdout)?.trim()))
}

impl Vm {
    /// Builds the image if needed, boots the guest and waits until its agent answers. `dir` holds QEMU's socket
    /// and logs (`console.log`: the guest's serial console).
    pub async fn boot(options: &VmOptions, dir: &Path) -> anyhow::Result<Self> {
        let image = tokio::task::spawn_blocking(image).await??;
        std::fs::create_dir_all(dir)?;
        let socket = dir.join("qga.sock");
        let _ = std::fs::remove_file(&socket);
        let console = dir.join("console.log");
        let mut netdev = "user,id=n0".to_owned();
        for port in &options.forwards {
            netdev.push_str(&format!(",hostfwd=tcp:127.0.0.1:{port}-:{port}"));
        }
        let path = |p: &Path| p.display().to_string();
        let args: Vec<String> = vec![
            "-accel".into(),
            "tcg".into(),
            "-machine".into(),
            "q35".into(),
            "-cpu".into(),
            "max".into(),
            "-smp".into(),
            options.cpus.to_string(),
            "-m".into(),
            options.memory_mib.to_string(),
            "-nographic".into(),
            "-vga".into(),
            "none".into(),
            "-no-reboot".into(),
            "-kernel".into(),
            path(&image.join("vmlinuz")),
            "-initrd".into(),
            path(&image.join("initrd.img")),
            "-append".into(),
            "root=/dev/vda rw console=ttyS0 panic=-1".into(),
            "-drive".into(),
            format!(
                "file={},format=raw,if=virtio,snapshot=on",
                image.join("rootfs.img").display()
            ),
            "-netdev".into(),
            netdev,
            "-device".into(),
            "virtio-net-pci,netdev=n0".into(),
            "-virtfs".into(),
            format!(
                "local,path={},mount_tag=host,security_model=none,readonly=on",
                options.share.display()
            ),
            "-chardev".into(),
            format!("socket,path={},server=on,wait=off,id=qga0", socket.display()),
            "-device".into(),
            "virtio-serial".into(),
            "-device".into(),
            "virtserialport,chardev=qga0,name=org.qemu.guest_agent.0".into(),
            "-serial".into(),
            format!("file:{}", console.display()),
            "-monitor".into(),
            "none".into(),
        ];
        let qemu = which("qemu-system-x86_64")?;
        let t0 = Instant::now();
        let mut proc = testenv::process::Proc::start("qemu", &qemu, &args, &dir.join("qemu.log"))?;
        let agent = tokio::select! {
            agent = GuestAgent::connect(&socket, options.boot_timeout) => agent,
            exited = wait_exit(&mut proc) => Err(exited),
        }
        .with_context(|| {
            format!(
                "booting the guest; its console:\n{}",
                testenv::process::log_tail(&console, 30)
            )
        })?;
        tracing::info!(took = ?t0.elapsed(), "guest booted");
        Ok(Self {
            agent,
            dir: dir.to_owned(),
            _qemu: proc,
        })
    }

    /// The guest agent.
    pub fn agent(&self) -> &GuestAgent {
        &self.agent
    }

    /// The last lines of the guest's serial console.
    pub fn console_tail(&self, lines: usize) -> String {
        testenv::process::log_tail(&self.dir.join("console.log"), lines)
    }

    /// Runs `script` with `sh -c` in the guest (as root), at most `timeout`.
    pub async fn sh(&self, script: &str, timeout: Duration) -> anyhow::Result<Output> {
        self.agent.exec("/bin/sh", &["-c", script], timeout).await
    }

    /// Runs `script` like [`Vm::sh`] and fails, with its output, unless it exits 0; returns its stdout.
    pub async fn run(&self, script: &str, timeout: Duration) -> anyhow::Result<String> {
        let out = self.sh(script, timeout).await?;
        if out.code != Some(0) {
            bail!(
                "in the guest, `{script}` exited {:?}\nstdout:\n{}\nstderr:\n{}",
                out.code,
                out.stdout,
                out.stderr
            );
        }
        Ok(out.stdout)
    }

    /// The content of a file in the guest.
    pub async fn read(&self, path: &str) -> anyhow::Result<String> {
        self.run(&format!("cat '{path}'"), Duration::from_secs(30))
            .await
            .with_context(|| format!("reading {path} in the guest"))
    }
}

/// Errors once QEMU has exited (a guest that cannot boot, or a QEMU refusing its arguments).
async fn wait_exit(proc: &mut testenv::process::Proc) -> anyhow::Error {
    loop {
        if let Err(e) = proc.check_running() {
            return e;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The program's path on `PATH`.
fn which(program: &str) -> anyhow::Result<PathBuf> {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .with_context(|| format!("{program} not found (hack/build-vm-image.sh installs qemu-system-x86)"))
}
