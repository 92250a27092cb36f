//! Processes left in a pod's cgroup when it is removed. The runtime normally leaves none, but a container whose
//! start was abandoned half-way (the client that asked for it killed, say) can leave its `runc init` behind in
//! the container's cgroup below the pod's, which then stays busy for good. As the kubelet before it destroys a
//! pod's cgroup, every process found in the cgroup or below it is sent SIGKILL, and the removal tried again
//! while the killed processes are being reaped.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// How often, and how far apart, a busy cgroup's removal is tried again after its processes were killed.
const RETRIES: u32 = 20;
const RETRY_AFTER: Duration = Duration::from_millis(100);

/// `remove` (the removal of the cgroup directory `dir` and those below it); if it fails because a cgroup still
/// holds processes, kills them and tries again until they are gone. Blocking.
pub(super) fn remove_killing_leftovers<E>(
    dir: &Path,
    remove: impl Fn(&Path) -> Result<(), E>,
    busy: impl Fn(&E) -> bool,
) -> Result<(), E> {
    let mut result = remove(dir);
    for _ in 0..RETRIES {
        match &result {
            Err(e) if busy(e) => {}
            _ => return result,
        }
        let killed = kill_all_below(dir);
        tracing::info!(cgroup = %dir.display(), killed, "killed the processes left in a pod's cgroup");
        std::thread::sleep(RETRY_AFTER);
        result = remove(dir);
    }
    result
}

/// Sends SIGKILL to every process in the cgroup `dir` and the cgroups below it; answers how many it signalled.
fn kill_all_below(dir: &Path) -> usize {
    let mut killed = 0;
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            if kill(Pid::from_raw(pid), Signal::SIGKILL).is_ok() {
                killed += 1;
            }
        }
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                killed += kill_all_below(&entry.path());
            }
        }
    }
    killed
}
