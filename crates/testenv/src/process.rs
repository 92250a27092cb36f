//! Child processes that cannot outlive us.
//!
//! Every component is started through `setpriv --pdeathsig KILL`, so the kernel kills it when the thread that
//! spawned it dies. Test harnesses run each test on its own short-lived thread, so spawning happens on one
//! dedicated thread that lives as long as the process: when a test binary exits — even by a panic or a
//! signal — its control plane goes with it. [`Proc::stop`] stops a component by PID: SIGTERM, then SIGKILL
//! after a grace period. [`cpu_seconds`] and [`rss_bytes`] read a process's CPU time and resident memory (the
//! benchmarks' figures).

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use anyhow::Context;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

type SpawnRequest = (Command, mpsc::Sender<std::io::Result<Child>>);

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("testenv-spawner".into())
            .spawn(move || {
                for (mut cmd, reply) in rx {
                    let _ = reply.send(cmd.spawn());
                }
                // The channel never closes (the sender lives in a static), so this thread lives as long as
                // the process and its children are killed only when the process ends.
            })
            .map(|_| ())
            .unwrap_or_else(|e| panic!("cannot start the spawner thread: {e}"));
        Mutex::new(tx)
    })
}

/// A running component.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    log: PathBuf,
}

impl Proc {
    /// Starts `program args…` with stdout and stderr appended to `log`, killed when this process dies.
    pub fn start(name: &str, program: &Path, args: &[String], log: &Path) -> anyhow::Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| log.display().to_string())?;
        let err = out.try_clone()?;
        let mut cmd = Command::new("setpriv");
        cmd.args(["--pdeathsig", "KILL", "--"]).arg(program).args(args);
        cmd.stdin(Stdio::null()).stdout(out).stderr(err);
        let (tx, rx) = mpsc::channel();
        spawner()
            .lock()
            .map_err(|_| anyhow::anyhow!("spawner lock poisoned"))?
            .send((cmd, tx))
            .map_err(|_| anyhow::anyhow!("spawner thread is gone"))?;
        let child = rx
            .recv()
            .context("spawner thread did not answer")?
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        tracing::debug!(name, pid = child.id(), "started");
        Ok(Self {
            name: name.to_owned(),
            child,
            log: log.to_path_buf(),
        })
    }

    /// The component's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Errors (with the log's tail) if the process has already exited.
    pub fn check_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            anyhow::bail!(
                "{} exited ({status}); log tail:\n{}",
                self.name,
                log_tail(&self.log, 40)
            );
        }
        Ok(())
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; reaps the child.
    pub async fn stop(mut self, grace: Duration) -> anyhow::Result<()> {
        let pid = Pid::from_raw(i32::try_from(self.child.id())?);
        if self.child.try_wait()?.is_none() {
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = tokio::time::Instant::now() + grace;
            while self.child.try_wait()?.is_none() {
                if tokio::time::Instant::now() >= deadline {
                    let _ = kill(pid, Signal::SIGKILL);
                    self.child.wait()?;
                    break;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        tracing::debug!(name = %self.name, "stopped");
        Ok(())
    }
}

impl Drop for Proc {
    /// A component whose handle is dropped without [`Proc::stop`] (a start that failed half-way) is killed
    /// and reaped at once.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Whether a process with this PID exists (zombies included).
pub fn pid_alive(pid: u32) -> bool {
    i32::try_from(pid)
        .map(|p| kill(Pid::from_raw(p), None).is_ok())
        .unwrap_or(false)
}

/// The last `lines` lines of a log file (for error messages).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// utime+stime of a process, in seconds (from `/proc/<pid>/stat`, in clock ticks of 1/100 s).
pub fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let (user, system) = cpu_split(pid)?;
    Ok(user + system)
}

/// utime and stime of a process apart (its own code, and the kernel's work for it), in seconds.
pub fn cpu_split(pid: u32) -> anyhow::Result<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    let after = stat.rsplit_once(')').map(|(_, r)| r).context("stat format")?;
    let fields: Vec<&str> = after.split_whitespace().collect();
    // after the command name: state is field 3 (index 0); utime is field 14, stime 15
    let utime: f64 = fields.get(11).context("utime")?.parse()?;
    let stime: f64 = fields.get(12).context("stime")?.parse()?;
    Ok((utime / 100.0, stime / 100.0))
}

/// The machine's CPU time so far in clock ticks, all of it and the part stolen by the hypervisor (the first line
/// of `/proc/stat`): over a window, a large stolen share means the figures measured the machine's host too.
pub fn machine_ticks() -> anyhow::Result<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().context("/proc/stat is empty")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(str::parse)
        .collect::<Result<_, _>>()
        .context("/proc/stat's cpu line")?;
    // user nice system idle iowait irq softirq steal guest guest_nice: guest time is counted in user already
    let total = ticks.iter().take(8).sum();
    Ok((total, ticks.get(7).copied().unwrap_or(0)))
}

/// VmRSS of a process, in bytes.
pub fn rss_bytes(pid: u32) -> anyhow::Result<u64> {
    status_bytes(pid, "VmRSS")
}

/// The most resident memory process `pid` has had since it started (`VmHWM`), in bytes.
pub fn peak_rss_bytes(pid: u32) -> anyhow::Result<u64> {
    status_bytes(pid, "VmHWM")
}

/// The part of process `pid`'s resident memory that is file-backed (`RssFile`: mostly its binary's and
/// libraries' pages, which the kernel can drop and read again), in bytes.
pub fn file_rss_bytes(pid: u32) -> anyhow::Result<u64> {
    status_bytes(pid, "RssFile")
}

fn status_bytes(pid: u32, field: &str) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next())
        .with_context(|| field.to_owned())?
        .parse()?;
    Ok(kb * 1024)
}
