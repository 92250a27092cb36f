//! The file source: `staticPodPath` — a directory of manifests (hidden files and subdirectories skipped) or
//! one manifest file — read at start, every `fileCheckFrequency`, and whenever inotify reports a change in
//! the directory. Each read yields the full set of the path's pods; a file that cannot be used is logged and
//! reported once (until its error changes) naming the file and the field, and contributes no pod — the
//! other files' pods are unaffected.

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::pods::static_pods::manifest::{self, Origin};
use crate::pods::static_pods::{Problems, StaticUpdate};

/// Files larger than this are refused (the kubelet's limit).
const MAX_MANIFEST_BYTES: u64 = 10 << 20;

/// The manifests at `path` now: pods, and per unusable file the reason.
pub(crate) async fn read_path(path: &Path, node: &str) -> (Vec<Pod>, Vec<(PathBuf, String)>) {
    let mut pods = Vec::new();
    let mut bad = Vec::new();
    let files: Vec<PathBuf> = match tokio::fs::metadata(path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::debug!(path = %path.display(), "static pod path does not exist");
            return (pods, bad);
        }
        Err(e) => {
            bad.push((path.to_path_buf(), e.to_string()));
            return (pods, bad);
        }
        Ok(m) if m.is_dir() => match list_dir(path).await {
            Ok(f) => f,
            Err(e) => {
                bad.push((path.to_path_buf(), e.to_string()));
                return (pods, bad);
            }
        },
        Ok(_) => vec![path.to_path_buf()],
    };
    for file in files {
        match read_file(&file, node).await {
            Ok(pod) => pods.push(pod),
            Err(e) => bad.push((file, e)),
        }
    }
    (pods, bad)
}

async fn list_dir(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    let mut entries = tokio::fs::read_dir(dir).await?;
    while let Some(entry) = entries.next_entry().await? {
        if entry.file_name().to_string_lossy().starts_with('.') {
            continue;
        }
        if entry
            .file_type()
            .await
            .is_ok_and(|t| t.is_file() || t.is_symlink())
        {
            out.push(entry.path());
        }
    }
    out.sort();
    Ok(out)
}

async fn read_file(file: &Path, node: &str) -> Result<Pod, String> {
    let meta = tokio::fs::metadata(file).await.map_err(|e| e.to_string())?;
    if meta.len() > MAX_MANIFEST_BYTES {
        return Err(format!("larger than {MAX_MANIFEST_BYTES} bytes"));
    }
    let text = tokio::fs::read_to_string(file).await.map_err(|e| e.to_string())?;
    let mut pods = manifest::decode(&text, false).map_err(|e| e.to_string())?;
    let pod = pods.pop().ok_or("no pod")?;
    let path = file.display().to_string();
    manifest::prepare(pod, Origin::File(&path), node).map_err(|e| e.to_string())
}

/// An inotify instance as a tokio-pollable descriptor.
struct Watch(Inotify);

impl AsRawFd for Watch {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// Watches the directory of `path` (the path itself when it is a directory); `None` when inotify or the
/// watch cannot be set up (the periodic re-read still runs).
fn watch(path: &Path) -> Option<AsyncFd<Watch>> {
    let dir = if path.is_dir() { path } else { path.parent()? };
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).ok()?;
    let flags = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF;
    inotify.add_watch(dir, flags).ok()?;
    // `Watch` owns the descriptor for as long as the `AsyncFd` lives, which is all `AsyncFd::register` asks
    // of its callers; that replacement is `unsafe` (forbidden in this workspace), the safe constructor only
    // deprecated.
    #[allow(deprecated)]
    AsyncFd::new(Watch(inotify)).ok()
}

/// Waits for the next inotify event (drains what is queued). Returns at once when the watch broke (it is
/// dropped, to be set up again); never returns without a watch.
async fn changed(watch: &mut Option<AsyncFd<Watch>>) {
    let broken = match watch.as_ref() {
        None => return std::future::pending().await,
        Some(fd) => next_event(fd).await.is_err(),
    };
    if broken {
        *watch = None;
    }
}

async fn next_event(fd: &AsyncFd<Watch>) -> Result<(), ()> {
    loop {
        let mut guard = fd.readable().await.map_err(|_| ())?;
        match guard.get_inner().0.read_events() {
            Ok(events) if !events.is_empty() => return Ok(()),
            Ok(_) | Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
            Err(_) => return Err(()),
        }
    }
}

/// Reads `path` now, every `period` and on inotify events, sending each set to `tx`, until `cancel` fires.
pub(crate) async fn run(
    path: PathBuf,
    node: String,
    period: Duration,
    tx: mpsc::Sender<StaticUpdate>,
    problems: Problems,
    cancel: CancellationToken,
) {
    let source = format!("file:{}", path.display());
    let mut inotify = watch(&path);
    if inotify.is_none() {
        tracing::info!(path = %path.display(), "no inotify watch on the static pod path; re-read every {period:?}");
    }
    let mut reported: HashMap<PathBuf, String> = HashMap::new();
    loop {
        let (pods, bad) = read_path(&path, &node).await;
        let mut now_bad = HashMap::new();
        for (file, error) in bad {
            if reported.get(&file) != Some(&error) {
                problems.report(&file.display().to_string(), &error);
            }
            now_bad.insert(file, error);
        }
        reported = now_bad;
        let update = StaticUpdate {
            source: source.clone(),
            pods: Some(pods),
        };
        if tx.send(update).await.is_err() {
            return;
        }
        let tick = tokio::time::sleep(crate::backoff::jittered(period, 0.1));
        tokio::select! {
            _ = cancel.cancelled() => return,
            () = tick => {}
            () = changed(&mut inotify) => {
                // let a burst of writes (editor save, copy) settle before reading
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        if inotify.is_none() {
            inotify = watch(&path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: NAME\nspec:\n  containers:\n  - name: c\n    image: i\n";

    #[tokio::test]
    async fn a_directory_gives_its_good_files_and_names_the_bad_ones() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        std::fs::write(
            dir.path().join("b.json"),
            serde_json::to_string(
                &serde_yaml::from_str::<serde_json::Value>(&POD.replace("NAME", "b")).unwrap(),
            )
            .unwrap(),
        )
        .unwrap();
        std::fs::write(dir.path().join(".hidden.yaml"), POD.replace("NAME", "hidden")).unwrap();
        std::fs::write(
            dir.path().join("bad.yaml"),
            POD.replace("NAME", "bad").replace("    image: i\n", ""),
        )
        .unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        let (pods, bad) = read_path(dir.path(), "n1").await;
        let names: Vec<_> = pods.iter().map(|p| p.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, vec!["a-n1", "b-n1"]);
        assert_eq!(bad.len(), 1);
        assert!(bad[0].0.ends_with("bad.yaml"));
        assert!(bad[0].1.contains("spec.containers[0].image"), "{}", bad[0].1);
        // one file, and a path that does not exist
        let (pods, bad) = read_path(&dir.path().join("a.yaml"), "n1").await;
        assert_eq!((pods.len(), bad.len()), (1, 0));
        let (pods, bad) = read_path(&dir.path().join("missing"), "n1").await;
        assert_eq!((pods.len(), bad.len()), (0, 0));
    }

    #[tokio::test]
    async fn inotify_reports_a_new_file_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = watch(dir.path());
        assert!(w.is_some(), "inotify watch set up");
        std::fs::write(dir.path().join("a.yaml"), POD.replace("NAME", "a")).unwrap();
        tokio::time::timeout(Duration::from_secs(5), changed(&mut w))
            .await
            .expect("an inotify event within 5 s");
    }
}
