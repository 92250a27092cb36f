//! cri-real's own behaviour against a server it does not control: deadlines, a server going away, messages
//! that carry the server's error codes unchanged.

use std::sync::Arc;
use std::time::Duration;

use cri_fake::{FakeConfig, FakeRuntime, Profile};
use cri_real::{RemoteConfig, RemoteRuntime};
use runtime_api::{Code, Runtime, cri};
use tokio_util::sync::CancellationToken;

struct Served {
    socket: std::path::PathBuf,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), cri_fake::ServeError>>,
}

fn serve(name: &str, profile: &[(&str, &str)]) -> anyhow::Result<Served> {
    let socket = std::env::temp_dir().join(format!("cri-real-{name}-{}.sock", std::process::id()));
    let listener = cri_fake::bind(&socket)?;
    let runtime = FakeRuntime::new(FakeConfig {
        profile: Arc::new(Profile::from_pairs(profile.iter().copied())?),
        ..FakeConfig::default()
    });
    let stop = CancellationToken::new();
    let task = tokio::spawn(cri_fake::serve_on(
        listener,
        Arc::new(runtime),
        stop.clone().cancelled_owned(),
    ));
    Ok(Served { socket, stop, task })
}

fn pod() -> cri::RunPodSandboxRequest {
    cri::RunPodSandboxRequest {
        config: Some(cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: "p".into(),
                uid: "u".into(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_slow_call_ends_at_its_deadline() -> anyhow::Result<()> {
    let served = serve("deadline", &[("sandbox-latency", "30s")])?;
    let config = RemoteConfig {
        request_timeout: Duration::from_millis(200),
        ..RemoteConfig::default()
    };
    let client = RemoteRuntime::connect_with(&served.socket.display().to_string(), config).await?;
    let started = tokio::time::Instant::now();
    let err = client.run_pod_sandbox(pod()).await.unwrap_err();
    assert_eq!(err.code, Code::DeadlineExceeded, "{err}");
    // answered by the 200 ms deadline, not by the server's 30 s: the bound is a guard against hanging (25× the
    // deadline), the code above is what shows the deadline ended the call
    assert!(started.elapsed() < Duration::from_secs(5));
    served.stop.cancel();
    served.task.await??;
    std::fs::remove_file(&served.socket)?;
    Ok(())
}

#[tokio::test]
async fn server_codes_pass_through_and_a_vanished_server_is_unavailable() -> anyhow::Result<()> {
    let served = serve("gone", &[])?;
    let client = RemoteRuntime::connect(&format!("unix://{}", served.socket.display())).await?;
    let v = client
        .version(cri::VersionRequest { version: "v1".into() })
        .await?;
    assert_eq!(
        (v.runtime_name.as_str(), v.runtime_api_version.as_str()),
        ("cri-fake", "v1")
    );
    let err = client
        .container_status(cri::ContainerStatusRequest {
            container_id: "nope".into(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::NotFound);
    assert!(err.message.contains("nope"), "{err}");

    served.stop.cancel();
    served.task.await??;
    let err = client.version(cri::VersionRequest::default()).await.unwrap_err();
    assert_eq!(err.code, Code::Unavailable, "{err}");
    std::fs::remove_file(&served.socket)?;
    Ok(())
}
