//! A private containerd for real-mode tests and benchmarks: started by the project's
//! `tests/containerd/setup.sh` (its own config, root, socket and bridge below one directory) and torn down by a
//! reaper process when the caller's process exits, however it exits.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context, bail};

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

/// Starts the process that tears everything below `dir` down when the calling process exits (however it
/// exits), or when it is stopped ([`testenv::process::Proc::stop`]: SIGTERM): a shell that the kernel sends
/// SIGTERM when its parent goes (`setpriv --pdeathsig`) and that then runs `dir/on-exit.sh` if the caller wrote
/// one (undo what its node agents changed outside `dir`), unmounts whatever is still mounted below `dir` (tmpfs
/// volumes of pods not deleted, an agent's root directory bind mount), runs `tests/containerd/teardown.sh` for
/// the containerd in `dir/containerd` (containers killed, containerd and its shims stopped by PID, mounts,
/// bridge and state directory removed), and then removes the `cgroups` (paths below every mounted hierarchy,
/// deepest first). After a clean teardown `dir` goes too, unless `NA_CRI_KEEP=1`.
pub fn start_reaper(dir: &Path, bridge: &str, cgroups: &[String]) -> anyhow::Result<testenv::process::Proc> {
    let script = r#"trap 'kill $! 2>/dev/null
[ -f "$1/on-exit.sh" ] && bash "$1/on-exit.sh" >>"$1/teardown.log" 2>&1
grep -F " $1/" /proc/mounts | cut -d" " -f2 | sort -r | xargs -r -n1 umount -l
NA_CRI_DIR="$1/containerd" NA_CRI_BRIDGE="$2" bash "$3" >>"$1/teardown.log" 2>&1
ok=$?
shift 3
for cg in "$@"; do
  for d in /sys/fs/cgroup/*/"$cg"; do [ -d "$d" ] && find "$d" -depth -type d -exec rmdir {} + 2>>"$DIR/teardown.log"; done
done
[ $ok = 0 ] && [ "${NA_CRI_KEEP:-0}" != 1 ] && rm -rf "$DIR"
exit' TERM
DIR=$1
while :; do sleep 3600 & wait $!; done"#;
    let mut args: Vec<String> = vec![
        "--pdeathsig".into(),
        "TERM".into(),
        "--".into(),
        "bash".into(),
        "-c".into(),
        script.into(),
        "real-node-reaper".into(),
        dir.display().to_string(),
        bridge.into(),
        scripts().join("teardown.sh").display().to_string(),
    ];
    args.extend(cgroups.iter().cloned());
    testenv::process::Proc::start(
        "real-node-reaper",
        Path::new("setpriv"),
        &args,
        &dir.join("reaper.log"),
    )
}
