//! Container log rotation on the real node: a container writing 50 MiB of output, about 1 MiB a second, keeps
//! at most `containerLogMaxFiles` × `containerLogMaxSize` of log on disk (this binary's node: 2Mi × 10, checked
//! every 3 s by 2 workers, see [`super::gc::options`]), older rotated files gzipped and the oldest removed, while
//! `kubectl logs` and the kubelet API still return the newest lines — containerd reopened the log after each
//! rotation and the container writes on into the new file — and `kubectl logs -f`, started while it writes,
//! follows it through the rotations without losing a line.
//!
//! The bound holds as it does for the kubelet: a log is measured once per interval, so it can outgrow the size by
//! what the container writes in one interval; this container writes far less in one interval than the bound
//! leaves free.

use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use e2e::{init_logging, wait_for};
use kube::api::DeleteParams;

use super::gc::{Registry, options};
use super::harness::RealNode;

const NS: &str = "rn-logs";
/// The node's `containerLogMaxSize` and `containerLogMaxFiles`.
pub const MAX_SIZE: u64 = 2 << 20;
pub const MAX_FILES: usize = 10;
/// How many chunks `WRITER` prints, each a little over a mebibyte of numbered lines.
const CHUNKS: u32 = 50;

/// 50 chunks of numbered lines, one a second, then a tick a second.
const WRITER: &str = r#"c=0
while [ $c -lt 50 ]; do
  awk -v c=$c 'BEGIN { p = sprintf("%0200d", 0); for (i = 0; i < 4767; i++) printf "chunk %02d line %04d %s\n", c, i, p }'
  c=$((c+1)); sleep 1
done
echo "wrote 50 chunks"
n=0; while true; do n=$((n+1)); echo tick-$n; sleep 1; done"#;

/// The files in `dir`: their count and the disk space they take (allocated blocks, as `du` counts).
fn usage(dir: &Path) -> anyhow::Result<(usize, u64, usize)> {
    let (mut count, mut bytes, mut compressed) = (0, 0, 0);
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let entry = entry?;
        // a file removed between the listing and the stat is no longer on disk
        let Ok(meta) = entry.metadata() else { continue };
        count += 1;
        bytes += meta.blocks() * 512;
        if entry.file_name().to_string_lossy().ends_with(".gz") {
            compressed += 1;
        }
    }
    Ok((count, bytes, compressed))
}

/// What `kubectl logs -f` of the writer showed of its chunks.
struct Followed {
    /// Lines of chunks seen.
    seen: u64,
    /// The first (chunk, line) seen.
    first: Option<(u32, u32)>,
    /// Lines missing or out of order: a line other than the one after the previous.
    gaps: u64,
}

/// `kubectl logs -f` of the writer, read until its last chunk.
fn follow(mut child: std::process::Child) -> anyhow::Result<Followed> {
    use std::io::BufRead;
    let stdout = child.stdout.take().context("kubectl logs -f stdout")?;
    let (mut seen, mut first, mut gaps, mut last) = (0u64, None, 0u64, None::<(u32, u32)>);
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line?;
        if line.starts_with("wrote 50 chunks") {
            break;
        }
        let mut words = line.split(' ');
        let (Some("chunk"), Some(c), Some("line"), Some(l)) =
            (words.next(), words.next(), words.next(), words.next())
        else {
            continue;
        };
        let at: (u32, u32) = (c.parse()?, l.parse()?);
        let expected = last.map(|(c, l)| if l == 4766 { (c + 1, 0) } else { (c, l + 1) });
        if expected.is_some_and(|e| e != at) {
            gaps += 1;
        }
        first.get_or_insert(at);
        last = Some(at);
        seen += 1;
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(Followed { seen, first, gaps })
}

/// The tick a log's last line names, if it is one.
fn tick(text: &str) -> Option<u32> {
    text.lines().last()?.trim().strip_prefix("tick-")?.parse().ok()
}

#[tokio::test]
async fn a_container_writing_50_mib_keeps_at_most_max_files_times_max_size_and_its_newest_lines()
-> anyhow::Result<()> {
    init_logging();
    let Some(node) = RealNode::get_with(&options()).await? else {
        return Ok(());
    };
    let registry = Registry::start(node, "logs", &["logs"])?;
    let pods = node.namespace(NS).await?;
    let pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "writer"},
        "spec": {"automountServiceAccountToken": false, "terminationGracePeriodSeconds": 1,
                 "containers": [{"name": "main", "image": registry.image("logs"),
                                 "command": ["sh", "-c", WRITER]}]},
    }))?;
    let created = node.create_pod(&pods, &pod).await?;
    let uid = created.metadata.uid.clone().context("uid")?;
    let dir = node.pod_logs_dir.join(format!("{NS}_writer_{uid}")).join("main");
    let t0 = Instant::now();
    wait_for("the writer's log directory", Duration::from_secs(90), || async {
        Ok(dir.exists().then_some(()))
    })
    .await
    .with_context(|| format!("agent log:\n{}", node.agent_log_tail()))?;
    wait_for("the writer running", Duration::from_secs(60), || async {
        let p = pods.get("writer").await?;
        Ok((p.status.and_then(|s| s.phase).as_deref() == Some("Running")).then_some(()))
    })
    .await?;
    let follower = node
        .cp
        .kubectl()
        .args(["-n", NS, "logs", "-f", "writer", "-c", "main"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context("kubectl logs -f")?;
    let followed = tokio::task::spawn_blocking(move || follow(follower));

    // sample the log directory while the container writes, until its last chunk is out
    let logs = |args: &[&str]| -> anyhow::Result<String> {
        let out = node
            .cp
            .kubectl()
            .args(["-n", NS, "logs", "writer", "-c", "main"])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .context("kubectl logs")?;
        anyhow::ensure!(
            out.status.success(),
            "kubectl logs: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let (mut peak_bytes, mut peak_files, mut samples) = (0u64, 0usize, 0u32);
    let deadline = Instant::now() + Duration::from_secs(240);
    let mut last_sample = Instant::now();
    loop {
        let (files, bytes, _) = usage(&dir)?;
        peak_bytes = peak_bytes.max(bytes);
        peak_files = peak_files.max(files);
        samples += 1;
        if last_sample.elapsed() > Duration::from_secs(2) {
            last_sample = Instant::now();
            if tick(&logs(&["--tail=1"])?).is_some() {
                break;
            }
        }
        anyhow::ensure!(
            Instant::now() < deadline,
            "the writer did not finish in 240 s (peak {peak_bytes} bytes in {peak_files} files); agent log:\n{}",
            node.agent_log_tail()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let elapsed = t0.elapsed();
    let (files, bytes, compressed) = usage(&dir)?;
    let written = u64::from(CHUNKS) * 4767 * 220;
    println!(
        "[real_node_gc] writer: {written} bytes written in {elapsed:?}; log on disk at most {peak_bytes} bytes \
         in {peak_files} files ({samples} samples), now {bytes} bytes in {files} files ({compressed} gzipped)"
    );
    assert!(written >= 50 << 20);
    assert!(
        peak_bytes <= MAX_SIZE * MAX_FILES as u64,
        "{peak_bytes} bytes of log on disk, over {MAX_FILES} x {MAX_SIZE}"
    );
    assert!(peak_files <= MAX_FILES, "{peak_files} log files");
    // rotation ran often enough to fill the files allowed, older ones compressed and the oldest removed
    assert_eq!(
        peak_files, MAX_FILES,
        "the files never reached containerLogMaxFiles"
    );
    assert!(compressed >= 1, "no rotated log was compressed");

    // the newest lines, read by kubectl and straight from the kubelet API, and still coming after the rotations
    let first = tick(&logs(&["--tail=1"])?).context("a tick as the last line")?;
    let path = format!("/containerLogs/{NS}/writer/main?tailLines=1");
    let later = wait_for(
        "a later tick from the kubelet API",
        Duration::from_secs(30),
        || async {
            let (status, body) = node.kubelet_get(&path).await?;
            anyhow::ensure!(status == 200, "{status}: {body}");
            Ok(tick(&body).filter(|n| *n > first))
        },
    )
    .await?;
    println!(
        "[real_node_gc] writer: kubectl logs --tail=1 gave tick-{first}, the kubelet API then tick-{later}"
    );
    let Followed {
        seen,
        first: from,
        gaps,
    } = tokio::time::timeout(Duration::from_secs(30), followed)
        .await
        .context("kubectl logs -f did not reach the writer's last line")???;
    println!(
        "[real_node_gc] writer: kubectl logs -f saw {seen} lines from {from:?} on, {gaps} missing or out of order"
    );
    assert_eq!(gaps, 0, "kubectl logs -f lost lines across rotations");
    assert!(
        seen >= 40 * 4767,
        "kubectl logs -f saw {seen} lines from {from:?}: it did not follow the log through its rotations"
    );
    pods.delete("writer", &DeleteParams::default()).await?;
    Ok(())
}
