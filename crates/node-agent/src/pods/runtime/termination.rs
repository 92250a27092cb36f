//! The termination message of a container on a real node: the file a container may write at its
//! `terminationMessagePath` (default `/dev/termination-log`) before it exits, and the log tail that stands in
//! for it under `terminationMessagePolicy: FallbackToLogsOnError`.
//!
//! Before each container instance is created, [`mount`] creates an empty, world-writable file
//! `<root-dir>/pods/<uid>/containers/<container>/<8 random hex digits>` and bind-mounts it at the path. When the
//! runtime reports the instance exited, [`read`] takes the last [`MAX_FILE_BYTES`] of that file (found again
//! through the status's mounts, so a restarted agent finds it too); when it is empty, the policy is
//! `FallbackToLogsOnError` and the container failed, the last [`MAX_LOG_LINES`] lines of its log, at most
//! [`MAX_LOG_BYTES`], read once [`LOG_SETTLE`] has passed since the exit. The message follows the runtime's own
//! (`<runtime message>: <termination message>`).
//!
//! A hollow node has no files: its containers report the runtime's message only. The files go with the pod's
//! directory when the pod is removed.

use std::path::{Path, PathBuf};

use runtime_api::cri;

use crate::pods::model::spec::FALLBACK_TO_LOGS;
use crate::pods::model::spec::{ContainerSpec, DesiredPod};
use crate::pods::runtime::labels;

/// The most of the message file that is read (its end).
pub const MAX_FILE_BYTES: u64 = 4096;
/// The most log lines the fallback takes.
pub const MAX_LOG_LINES: usize = 80;
/// The most log bytes the fallback takes (the end of those lines).
pub const MAX_LOG_BYTES: usize = 2048;
/// How much of the log file's end is read to find the lines of the fallback.
const LOG_WINDOW: u64 = 256 * 1024;
/// The most bytes a pod's terminated messages take together in its status; each container gets its share.
pub const MAX_POD_BYTES: usize = 12 * 1024;

/// The directory of container `name`'s message files.
fn container_dir(pods_dir: &Path, uid: &str, name: &str) -> PathBuf {
    pods_dir.join(uid).join("containers").join(name)
}

/// Creates the message file of a new instance of `c` and returns its mount; `None` on a hollow node, without a
/// path, or when the file cannot be made (logged: the container runs without one, as under the kubelet).
pub(crate) async fn mount(
    pods_dir: Option<&Path>,
    pod: &DesiredPod,
    c: &ContainerSpec,
) -> Option<cri::Mount> {
    let pods_dir = pods_dir?;
    if c.termination_message_path.is_empty() {
        return None;
    }
    let dir = container_dir(pods_dir, &pod.uid, &c.name);
    let file = dir.join(format!("{:08x}", rand::random::<u32>()));
    let made = {
        let file = file.clone();
        tokio::task::spawn_blocking(move || create(&dir, &file)).await
    };
    match made {
        Ok(Ok(())) => Some(cri::Mount {
            container_path: c.termination_message_path.clone(),
            host_path: file.display().to_string(),
            ..Default::default()
        }),
        Ok(Err(error)) => {
            tracing::warn!(file = %file.display(), %error, "cannot create the termination message file");
            None
        }
        Err(error) => {
            tracing::warn!(%error, "termination message file task failed");
            None
        }
    }
}

fn create(dir: &Path, file: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o750)
        .create(dir)?;
    std::fs::File::create(file)?;
    // whatever the umask: any user of the container may write it
    std::fs::set_permissions(file, std::fs::Permissions::from_mode(0o666))
}

/// The message of exited container `s`: the runtime's own, followed by what the container left in its message
/// file (or, per its policy, its log tail).
pub(crate) async fn read(s: &cri::ContainerStatus) -> String {
    let path = s
        .annotations
        .get(labels::TERMINATION_MESSAGE_PATH)
        .map(String::as_str)
        .unwrap_or_default();
    let fallback = s
        .annotations
        .get(labels::TERMINATION_MESSAGE_POLICY)
        .is_some_and(|p| p == FALLBACK_TO_LOGS)
        && s.exit_code != 0
        && s.reason != "ContainerCannotRun";
    let file = (!path.is_empty())
        .then(|| s.mounts.iter().find(|m| m.container_path == path))
        .flatten()
        .map(|m| PathBuf::from(&m.host_path));
    let (mut text, check_logs) = match file {
        None => (String::new(), fallback),
        Some(file) => match read_tail(&file, MAX_FILE_BYTES).await {
            Ok((data, _)) => {
                let empty = data.is_empty();
                (String::from_utf8_lossy(&data).into_owned(), fallback && empty)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (String::new(), fallback),
            Err(e) => (
                format!("Error on reading termination log {}: {e}", file.display()),
                false,
            ),
        },
    };
    if check_logs && !s.log_path.is_empty() {
        settle_logs(s.finished_at).await;
        text = match read_tail(Path::new(&s.log_path), LOG_WINDOW).await {
            Ok((raw, cut)) => log_tail(&raw, cut),
            Err(e) => format!("Error on reading termination message from logs: {e}"),
        };
    }
    match (s.message.is_empty(), text.is_empty()) {
        (_, true) => s.message.clone(),
        (true, false) => text,
        (false, false) => format!("{}: {text}", s.message),
    }
}

/// How long after a container's exit its last log lines may still be on their way to the log file: the runtime
/// copies the container's output to the file on its own, and may report the exit before the copy is done.
const LOG_SETTLE: std::time::Duration = std::time::Duration::from_millis(500);

/// Waits until [`LOG_SETTLE`] has passed since `finished_at` (nanoseconds since the epoch; at once when it has,
/// or when the time is unknown).
async fn settle_logs(finished_at: i64) {
    let Ok(finished) = u64::try_from(finished_at) else {
        return;
    };
    let settled = std::time::UNIX_EPOCH + std::time::Duration::from_nanos(finished) + LOG_SETTLE;
    if let Ok(left) = settled.duration_since(std::time::SystemTime::now()) {
        tokio::time::sleep(left.min(LOG_SETTLE)).await;
    }
}

/// The last `max` bytes of `file`, and whether that is not all of it.
async fn read_tail(file: &Path, max: u64) -> std::io::Result<(Vec<u8>, bool)> {
    use tokio::io::{AsyncReadExt, AsyncSeekExt};
    let mut f = tokio::fs::File::open(file).await?;
    let len = f.metadata().await?.len();
    f.seek(std::io::SeekFrom::Start(len.saturating_sub(max))).await?;
    let mut out = Vec::with_capacity(usize::try_from(len.min(max)).unwrap_or(0));
    f.read_to_end(&mut out).await?;
    Ok((out, len > max))
}

/// The fallback message from the end of a CRI log: the texts of its last [`MAX_LOG_LINES`] lines, cut to their
/// last [`MAX_LOG_BYTES`]. When `cut` (`raw` is the end of a longer file) its first, partial line is dropped.
fn log_tail(raw: &[u8], cut: bool) -> String {
    let mut raw = raw;
    if cut && let Some(nl) = raw.iter().position(|b| *b == b'\n') {
        raw = &raw[nl + 1..];
    }
    let (entries, _) = crate::cri_log::parse(raw);
    let skip = entries.len().saturating_sub(MAX_LOG_LINES);
    let mut text: Vec<u8> = entries.into_iter().skip(skip).flat_map(|e| e.text).collect();
    if text.len() > MAX_LOG_BYTES {
        text.drain(..text.len() - MAX_LOG_BYTES);
    }
    String::from_utf8_lossy(&text).into_owned()
}

/// Cuts `message` to at most `max` bytes, at a character boundary (the status limit per container).
pub fn truncate(message: &mut String, max: usize) {
    if message.len() > max {
        let mut at = max;
        while !message.is_char_boundary(at) {
            at -= 1;
        }
        message.truncate(at);
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn status(dir: &Path, policy: &str, exit_code: i32, message: &str) -> cri::ContainerStatus {
        cri::ContainerStatus {
            exit_code,
            message: message.into(),
            annotations: HashMap::from([
                (
                    labels::TERMINATION_MESSAGE_PATH.to_owned(),
                    "/dev/termination-log".to_owned(),
                ),
                (labels::TERMINATION_MESSAGE_POLICY.to_owned(), policy.to_owned()),
            ]),
            mounts: vec![cri::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: dir.join("msg").display().to_string(),
                ..Default::default()
            }],
            log_path: dir.join("0.log").display().to_string(),
            ..Default::default()
        }
    }

    fn log_lines(n: usize) -> String {
        (0..n)
            .map(|i| format!("2026-01-01T00:00:00.000000000Z stdout F line {i}\n"))
            .collect()
    }

    #[tokio::test]
    async fn the_file_wins_and_only_its_end_is_read() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("0.log"), log_lines(3)).unwrap();
        std::fs::write(dir.path().join("msg"), "all done").unwrap();
        assert_eq!(
            read(&status(dir.path(), FALLBACK_TO_LOGS, 1, "")).await,
            "all done"
        );
        assert_eq!(
            read(&status(dir.path(), "File", 137, "OOM")).await,
            "OOM: all done",
            "after the runtime's message"
        );
        let long = format!("{}end", "x".repeat(5000));
        std::fs::write(dir.path().join("msg"), &long).unwrap();
        let got = read(&status(dir.path(), "File", 0, "")).await;
        assert_eq!(got.len(), 4096);
        assert!(got.ends_with("xend"));
    }

    #[tokio::test]
    async fn an_empty_file_falls_back_to_the_log_tail_only_on_failure() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("msg"), "").unwrap();
        std::fs::write(dir.path().join("0.log"), log_lines(100)).unwrap();
        let tail = read(&status(dir.path(), FALLBACK_TO_LOGS, 2, "")).await;
        assert!(tail.starts_with("line 20\n"), "the last 80 lines: {tail:?}");
        assert!(tail.ends_with("line 99\n"));
        assert_eq!(
            read(&status(dir.path(), FALLBACK_TO_LOGS, 0, "")).await,
            "",
            "succeeded"
        );
        assert_eq!(read(&status(dir.path(), "File", 2, "")).await, "", "policy File");

        let long: String = (0..10)
            .map(|i| format!("2026-01-01T00:00:00Z stderr F {i}{}\n", "y".repeat(500)))
            .collect();
        std::fs::write(dir.path().join("0.log"), long).unwrap();
        let tail = read(&status(dir.path(), FALLBACK_TO_LOGS, 2, "")).await;
        assert_eq!(tail.len(), MAX_LOG_BYTES);
        assert!(tail.ends_with("yy\n"));
    }

    #[test]
    fn a_window_that_starts_mid_line_drops_that_line() {
        let log = b"e F cut\n2026-01-01T00:00:00Z stdout P wh\n2026-01-01T00:00:00Z stdout F ole\n";
        assert_eq!(log_tail(log, true), "whole\n");
    }

    #[test]
    fn truncation_keeps_whole_characters() {
        let mut m = "ab\u{e9}".to_owned();
        truncate(&mut m, 3);
        assert_eq!(m, "ab");
    }

    #[tokio::test]
    async fn the_file_is_created_writable_under_the_pod_directory() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let p = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u1"},
            "spec": {"containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap();
        let pod = DesiredPod::from_pod(&p).unwrap();
        let m = mount(Some(dir.path()), &pod, &pod.containers[0]).await.unwrap();
        assert_eq!(m.container_path, "/dev/termination-log");
        let host = PathBuf::from(&m.host_path);
        assert_eq!(host.parent().unwrap(), dir.path().join("u1/containers/c"));
        let mode = std::fs::metadata(&host).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o666);
        assert!(mount(None, &pod, &pod.containers[0]).await.is_none(), "hollow");
    }
}
