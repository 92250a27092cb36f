//! A private containerd for real-mode tests and benchmarks: started by the project's
//! `tests/containerd/setup.sh` (its own config, root, socket and bridge below one directory) and torn down by a
//! reaper process when the caller's process exits, however it exits.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

/// The variable that skips the real-mode tests (`1`); without it they run, and fail when they cannot.
pub const SKIP_REAL_NODE: &str = "NODE_AGENT_SKIP_REAL_NODE";

/// Whether the real-mode tests of `binary` are to be skipped (`NODE_AGENT_SKIP_REAL_NODE=1`); the first call
/// that says so prints `[<binary>] skipped: ...` — to the process's stderr itself, past the test harness's
/// capture, so the skip shows in the output of a passing run.
pub fn skip_real_node(binary: &str) -> bool {
    static SAID: std::sync::Once = std::sync::Once::new();
    let skip = std::env::var(SKIP_REAL_NODE).as_deref() == Ok("1");
    if skip {
        SAID.call_once(|| {
            use std::io::Write;
            // nothing to do if stderr is gone
            let _ = writeln!(std::io::stderr(), "[{binary}] skipped: {SKIP_REAL_NODE}=1");
        });
    }
    skip
}

/// The project's containerd scripts (`tests/containerd`).
pub fn scripts() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("containerd")
}

/// Runs `tests/containerd/setup.sh` (blocking): a containerd with its state in `containerd_dir`, its pods on
/// `bridge`, no CNI network until a CRI client hands it a pod CIDR (`NA_CRI_POD_CIDR_FROM_NODE=1`, as a
/// kubelet does from its Node's `spec.podCIDR`); `containerd` is `1.6` (Debian's) or `2` (built from the Go
/// module proxy). The socket is `containerd_dir/containerd.sock`.
pub fn setup(containerd_dir: &Path, bridge: &str, subnet: &str, containerd: &str) -> anyhow::Result<()> {
    let status = Command::new("bash")
        .arg(scripts().join("setup.sh"))
        .env("NA_CRI_DIR", containerd_dir)
        .env("NA_CRI_BRIDGE", bridge)
        .env("NA_CRI_SUBNET", subnet)
        .env("NA_CRI_POD_CIDR_FROM_NODE", "1")
        .env("NA_CRI_CONTAINERD", containerd)
        .stdout(Stdio::null())
        .status()
        .context("running tests/containerd/setup.sh")?;
    if !status.success() {
        bail!(
            "tests/containerd/setup.sh failed ({status}); logs in {} (kept with NA_CRI_KEEP=1)",
            containerd_dir.join("logs").display()
        );
    }
    Ok(())
}

/// Tears down what one real node left below `$1` (the directory; `$2` its bridge, `$3` teardown.sh, then the
/// cgroups): the caller's undo script (`on-exit.sh`), mounts below the directory, the containerd instance, the
/// cgroups, and at last the directory itself after a clean teardown unless `NA_CRI_KEEP=1`.
const REAP: &str = r#"reap() {
  [ -f "$1/on-exit.sh" ] && bash "$1/on-exit.sh" >>"$1/teardown.log" 2>&1
  grep -F " $1/" /proc/mounts | cut -d" " -f2 | sort -r | xargs -r -n1 umount -l
  NA_CRI_DIR="$1/containerd" NA_CRI_BRIDGE="$2" bash "$3" >>"$1/teardown.log" 2>&1
  local ok=$? dir=$1
  shift 3
  for cg in "$@"; do
    for d in /sys/fs/cgroup/*/"$cg"; do [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>>"$dir/teardown.log"; done
  done
  [ $ok = 0 ] && [ "${NA_CRI_KEEP:-0}" != 1 ] && rm -rf "$dir"
  return $ok
}
"#;

/// What [`start_reaper`] records in its directory for [`reap_leftovers`]: the owner's PID and start time, the
/// bridge, then the cgroups, a line each.
const REAPER_ARGS: &str = "reaper.args";

/// Starts the process that tears everything below `dir` down when the calling process exits (however it
/// exits), or when it is stopped ([`testenv::process::Proc::stop`]: SIGTERM): a shell that the kernel sends
/// SIGTERM when its parent goes (`setpriv --pdeathsig`) and that then runs `dir/on-exit.sh` if the caller wrote
/// one (undo what its node agents changed outside `dir`), unmounts whatever is still mounted below `dir` (tmpfs
/// volumes of pods not deleted, an agent's root directory bind mount), runs `tests/containerd/teardown.sh` for
/// the containerd in `dir/containerd` (containers killed, containerd and its shims stopped by PID, mounts,
/// bridge and state directory removed), and then removes the `cgroups` (paths below every mounted hierarchy,
/// deepest first). After a clean teardown `dir` goes too, unless `NA_CRI_KEEP=1`. What it needs is also written
/// to `dir`, so that a later run tears down a node whose process and reaper were both killed
/// ([`reap_leftovers`]).
pub fn start_reaper(dir: &Path, bridge: &str, cgroups: &[String]) -> anyhow::Result<testenv::process::Proc> {
    let me = std::process::id();
    let mut record = format!("{me} {}\n{bridge}\n", start_time(me).unwrap_or_default());
    for cg in cgroups {
        record.push_str(cg);
        record.push('\n');
    }
    std::fs::write(dir.join(REAPER_ARGS), record).context("recording the reaper's arguments")?;
    let script = format!(
        "{REAP}trap 'kill $! 2>/dev/null; reap \"$@\"; exit' TERM\nwhile :; do sleep 3600 & wait $!; done"
    );
    let mut args: Vec<String> = vec![
        "--pdeathsig".into(),
        "TERM".into(),
        "--".into(),
        "bash".into(),
        "-c".into(),
        script,
        "real-node-reaper".into(),
    ];
    args.extend(reap_args(dir, bridge, cgroups));
    testenv::process::Proc::start(
        "real-node-reaper",
        Path::new("setpriv"),
        &args,
        &dir.join("reaper.log"),
    )
}

fn reap_args(dir: &Path, bridge: &str, cgroups: &[String]) -> Vec<String> {
    let mut args = vec![
        dir.display().to_string(),
        bridge.to_owned(),
        scripts().join("teardown.sh").display().to_string(),
    ];
    args.extend(cgroups.iter().cloned());
    args
}

/// A process's start time (clock ticks after boot, `/proc/PID/stat` field 22): with the PID, it names the
/// process (a PID alone may have been reused).
fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // the command name (field 2) is in parentheses and may hold spaces: count from the last ')'
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Tears down the real nodes earlier runs left behind, in the system's temporary directory: a directory made by
/// [`start_reaper`] whose owner and reaper were both killed (e.g. the whole process group at once) keeps its
/// containerd, containers and bridge — and a bridge left with an address in a pod subnet takes the route of a
/// later node on that subnet (its pods then unreachable from the host: `No route to host`). A directory whose
/// owner still runs, or whose reaper is still at work, is left alone. Directories from before the arguments were
/// recorded are recognised by name (`na-real-node-PID`: bridge `narn` and the PID in hex, cgroup named as the
/// directory). Each one torn down is reported on standard error; one that could not be is reported and kept.
pub fn reap_leftovers() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let Some(left) = Leftover::of(&dir) else {
            continue;
        };
        if left.owner_runs() || reaper_runs(&dir) {
            continue;
        }
        let status = Command::new("bash")
            .args(["-c", &format!("{REAP}reap \"$@\"")])
            .arg("reap-leftover")
            .args(reap_args(&dir, &left.bridge, &left.cgroups))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        match status {
            Ok(s) if s.success() => eprintln!(
                "[containerd] tore down a real node an earlier run left: {}",
                dir.display()
            ),
            Ok(s) => eprintln!(
                "[containerd] could not tear down {} ({s}): see its teardown.log",
                dir.display()
            ),
            Err(e) => eprintln!("[containerd] could not tear down {}: {e}", dir.display()),
        }
    }
}

/// What a real node's directory says of its owner and of what to tear down.
struct Leftover {
    pid: u32,
    /// The owner's start time; 0 when not recorded (then any process of that PID counts as the owner).
    started: u64,
    bridge: String,
    cgroups: Vec<String>,
}

impl Leftover {
    fn of(dir: &Path) -> Option<Self> {
        if let Ok(record) = std::fs::read_to_string(dir.join(REAPER_ARGS)) {
            let mut lines = record.lines();
            let mut owner = lines.next()?.split_whitespace();
            let pid = owner.next()?.parse().ok()?;
            let started = owner.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            let bridge = lines.next()?.to_owned();
            let cgroups = lines.map(str::to_owned).collect();
            return Some(Self {
                pid,
                started,
                bridge,
                cgroups,
            });
        }
        let name = dir.file_name()?.to_str()?;
        let pid: u32 = name.strip_prefix("na-real-node-")?.parse().ok()?;
        dir.join("containerd").is_dir().then(|| Self {
            pid,
            started: 0,
            bridge: format!("narn{:x}", pid % 0xfffff),
            cgroups: vec![name.to_owned()],
        })
    }

    fn owner_runs(&self) -> bool {
        start_time(self.pid).is_some_and(|now| self.started == 0 || now == self.started)
    }
}

/// Whether a reaper started for `dir` still runs (its owner just exited: it is tearing the node down).
fn reaper_runs(dir: &Path) -> bool {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return false;
    };
    let dir = dir.display().to_string();
    procs.flatten().any(|p| {
        std::fs::read(p.path().join("cmdline")).is_ok_and(|cmdline| {
            let mut args = cmdline.split(|b| *b == 0);
            args.any(|a| a == b"real-node-reaper") && args.next() == Some(dir.as_bytes())
        })
    })
}
