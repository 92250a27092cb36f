//! The CRI conformance test: one walk-through (`support/walkthrough.rs`), three runtimes, one reference.
//!
//! The reference is what a real containerd answers, driven through cri-real's gRPC client. Against it are
//! compared (a) cri-fake in process and (b) cri-fake served on a unix socket and driven through the same gRPC
//! client — each on its own, so a bug the two fake paths share cannot hide behind their agreement. Where
//! containerd departs from the CRI spec ([`DEPARTURES`]) the fakes answer as the spec says; every such line is
//! named in the output as a departure, never passed over. The test starts and tears down its own containerd,
//! which needs root, unless `NODE_AGENT_CONTAINERD_SOCKET` names a running one (`tests/containerd/setup.sh`
//! prints it); when it can do neither it fails, saying why. `NODE_AGENT_SKIP_REAL_NODE=1` skips the comparison.

mod support;

use std::sync::Arc;

use cri_fake::{FakeConfig, FakeRuntime};
use support::containerd::Containerd;
use support::walkthrough::{Transcript, WalkEnv, walkthrough};

const IMAGE: &str = "localhost/busybox:local";

/// A walk-through environment; the pods' log directories go below a directory unique to this run.
fn env(run_id: &str) -> WalkEnv {
    WalkEnv {
        image: IMAGE.into(),
        run_id: run_id.into(),
        log_root: std::env::temp_dir().join(format!("na-cri-walk-{}-{run_id}", std::process::id())),
        pod_cidr: (std::net::Ipv4Addr::new(10, 88, 0, 0), 16),
    }
}

fn fake() -> FakeRuntime {
    FakeRuntime::new(FakeConfig {
        pod_cidr: Some("10.88.0.0/16".into()),
        images: vec![IMAGE.into(), "localhost/pause:local".into()],
        ..FakeConfig::default()
    })
}

async fn walk(rt: &dyn runtime_api::Runtime, env: WalkEnv) -> Transcript {
    let transcript = walkthrough(rt, &env).await;
    let _ = std::fs::remove_dir_all(&env.log_root);
    transcript
}

async fn in_process() -> Transcript {
    walk(&fake(), env("inproc")).await
}

/// Where containerd departs from the CRI api.proto, and what the spec (and so the fakes) answer instead:
/// `(step prefix, containerd's answer, the spec's answer, why)`.
const DEPARTURES: &[(&str, &str, &str, &str)] = &[
    (
        "StopPodSandbox(",
        "error NotFound",
        "ok",
        "StopPodSandbox is idempotent (\"if there are any resources ... already stopped or removed, the call \
         must succeed\"); containerd 1.6 answers NotFound for an id it does not know",
    ),
    (
        "StopContainer(",
        "error NotFound",
        "ok",
        "StopContainer is idempotent (\"if the container has already been stopped, the call must succeed\"); \
         containerd 1.6 answers NotFound for an id it does not know",
    ),
];

/// Whether `got` stands where containerd answered `reference` because containerd departs from the spec there:
/// the departure's reason.
fn departure(reference: &str, got: &str) -> Option<&'static str> {
    DEPARTURES.iter().find_map(|(step, theirs, spec, why)| {
        let head = reference.strip_suffix(&format!(": {theirs}"))?;
        (head.starts_with(step) && got == format!("{head}: {spec}")).then_some(*why)
    })
}

/// Compares `got` (a fake's transcript) with containerd's line by line. Lines where containerd departs from
/// the spec and the fake answers as the spec says are accepted and printed as departures; any other difference
/// fails, with the whole side-by-side report.
fn compare_with_containerd(reference: &Transcript, got: &Transcript, what: &str) {
    let width = reference.len().max(got.len());
    let (mut report, mut departures, mut differences) = (String::new(), Vec::new(), 0);
    for i in 0..width {
        let (r, g) = (
            reference.get(i).map_or("<none>", String::as_str),
            got.get(i).map_or("<none>", String::as_str),
        );
        let mark = if r == g {
            "  "
        } else if let Some(why) = departure(r, g) {
            departures.push(format!("{g} where containerd: {r} — {why}"));
            "~~"
        } else {
            differences += 1;
            "!!"
        };
        report.push_str(&format!("{mark} containerd: {r}\n{mark} {what}: {g}\n"));
    }
    println!(
        "[conformance] {what}: {} lines as containerd's, {} where containerd departs from the CRI spec:",
        width - departures.len() - differences,
        departures.len()
    );
    for d in &departures {
        println!("[conformance]   departure: {d}");
    }
    assert!(
        differences == 0,
        "{what} differs from containerd in {differences} lines (!!; ~~ = containerd departs from the spec):\n{report}"
    );
}

/// cri-fake served on a unix socket in `dir`: the gRPC client, and what stops the server.
async fn serve_fake(
    dir: &std::path::Path,
) -> anyhow::Result<(
    cri_real::RemoteRuntime,
    tokio_util::sync::CancellationToken,
    tokio::task::JoinHandle<anyhow::Result<()>>,
)> {
    std::fs::create_dir_all(dir)?;
    let socket = dir.join("cri.sock");
    let listener = cri_fake::bind(&socket)?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn({
        let stop = shutdown.clone().cancelled_owned();
        async move { Ok(cri_fake::serve_on(listener, Arc::new(fake()), stop).await?) }
    });
    let client = cri_real::RemoteRuntime::connect(&format!("unix://{}", socket.display())).await?;
    Ok((client, shutdown, server))
}

#[test]
fn departures_are_recognised_only_where_listed() {
    let why = departure(
        "StopContainer(removed): error NotFound",
        "StopContainer(removed): ok",
    );
    assert!(why.is_some_and(|w| w.contains("idempotent")));
    assert_eq!(
        departure("RemoveContainer(x): error NotFound", "RemoveContainer(x): ok"),
        None,
        "not a listed departure"
    );
    assert_eq!(
        departure(
            "StopContainer(x): error NotFound",
            "StopContainer(x): error Unknown"
        ),
        None,
        "the fake must answer what the spec says"
    );
}

#[tokio::test]
async fn fake_in_process_walkthrough_is_complete() {
    let transcript = in_process().await;
    assert!(
        transcript
            .iter()
            .any(|l| l.starts_with("ListPodSandbox(all, at the end)")),
        "{transcript:#?}"
    );
    assert!(
        transcript.iter().all(|l| !l.contains("OUTSIDE")),
        "{transcript:#?}"
    );
}

/// What only the fake offers, over its socket too: container events stream, and an exec in an unknown
/// container is NotFound.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fake_over_a_unix_socket_streams_events() -> anyhow::Result<()> {
    use futures::StreamExt;
    use runtime_api::{Runtime, cri};

    let dir = std::env::temp_dir().join(format!("cri-fake-events-{}", std::process::id()));
    let (client, shutdown, server) = serve_fake(&dir).await?;
    let mut events = client.get_container_events(cri::GetEventsRequest {}).await?;
    let pod = client
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(cri::PodSandboxConfig {
                metadata: Some(cri::PodSandboxMetadata {
                    name: "ev".into(),
                    uid: "ev".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
    let first = events.next().await.expect("an event")?;
    assert_eq!(first.container_id, pod.pod_sandbox_id);
    assert_eq!(
        first.container_event_type,
        cri::ContainerEventType::ContainerCreatedEvent as i32
    );
    let err = client
        .exec_sync(cri::ExecSyncRequest::default())
        .await
        .unwrap_err();
    assert_eq!(err.code, runtime_api::Code::NotFound);

    drop(events);
    shutdown.cancel();
    server.await??;
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_fakes_answer_like_containerd() -> anyhow::Result<()> {
    let Some(containerd) = Containerd::from_env()? else {
        return Ok(());
    };
    let endpoint = format!("unix://{}", containerd.socket.display());
    let client = cri_real::RemoteRuntime::connect(&endpoint).await?;
    let real_env = WalkEnv {
        pod_cidr: containerd.subnet,
        ..env(&format!("c{}", std::process::id()))
    };
    let reference = walk(&client, real_env).await;
    anyhow::ensure!(
        reference
            .iter()
            .any(|l| l.starts_with("ListPodSandbox(all, at the end)")),
        "containerd's walk-through did not finish: {reference:#?}"
    );

    compare_with_containerd(&reference, &in_process().await, "fake in process");

    let dir = std::env::temp_dir().join(format!("cri-fake-conformance-{}", std::process::id()));
    let (fake_client, shutdown, server) = serve_fake(&dir).await?;
    let over_socket = walk(&fake_client, env("socket")).await;
    shutdown.cancel();
    server.await??;
    std::fs::remove_dir_all(&dir)?;
    compare_with_containerd(&reference, &over_socket, "fake over gRPC");

    // containerd 1.6 has no GetContainerEvents (cri-real passes the code through); 2.x streams them
    use runtime_api::{Runtime, cri};
    let version = client
        .version(cri::VersionRequest::default())
        .await?
        .runtime_version;
    let major: u32 = version
        .trim_start_matches('v')
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .ok_or_else(|| anyhow::anyhow!("containerd's version {version:?}"))?;
    match client.get_container_events(cri::GetEventsRequest {}).await {
        Err(err) => {
            assert!(major < 2, "containerd {version} streams no events: {err}");
            assert_eq!(err.code, runtime_api::Code::Unimplemented, "{err}");
        }
        Ok(_) => assert!(major >= 2, "containerd {version} streams events"),
    }
    drop(containerd);
    Ok(())
}
