//! Scripted behaviours (exits, crash loops, OOM kills, latencies, exec, probes, stats, logs) under paused time.

use std::sync::Arc;
use std::time::Duration;

use runtime_api::{Code, Runtime, cri};
use tokio::time::{Instant, advance};

use super::*;
use crate::{ProbeTarget, Profile};

const S: i64 = 1_000_000_000;

#[tokio::test(start_paused = true)]
async fn exit_after_then_code_and_reason() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let fails = run_scripted(&rt, &pod, "fails", &[("exit-after", "30s"), ("exit-code", "3")]).await;
    let ok = run_scripted(&rt, &pod, "ok", &[("exit-after", "10s")]).await;
    advance(Duration::from_secs(9)).await;
    assert_eq!(
        state(&status(&rt, &ok).await),
        cri::ContainerState::ContainerRunning
    );
    advance(Duration::from_secs(1)).await;
    let s = status(&rt, &ok).await;
    assert_eq!(
        (state(&s), s.exit_code, s.reason.as_str()),
        (cri::ContainerState::ContainerExited, 0, "Completed")
    );
    assert_eq!(
        s.finished_at - s.started_at,
        10 * S,
        "exact, from the start timestamp"
    );
    advance(Duration::from_secs(25)).await;
    let s = status(&rt, &fails).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (3, "Error"));
    assert_eq!(s.finished_at - s.started_at, 30 * S);
}

#[tokio::test(start_paused = true)]
async fn crash_loop_heals_after_exit_attempts() {
    let rt = fake();
    let pod = run_pod(
        &rt,
        "p",
        &[
            ("cri-fake.node-agent.io/exit-after.app", "5s"),
            ("cri-fake.node-agent.io/exit-code.app", "1"),
            ("cri-fake.node-agent.io/exit-attempts.app", "2"),
        ],
    )
    .await;
    let mut ids = Vec::new();
    for attempt in 0..3 {
        let id = create(&rt, &pod, "app", attempt, &[]).await.unwrap();
        start(&rt, &id).await.unwrap();
        ids.push(id);
        advance(Duration::from_secs(6)).await;
    }
    let exits: Vec<(i32, i32)> = {
        let mut v = Vec::new();
        for id in &ids {
            let s = status(&rt, id).await;
            v.push((s.state, s.exit_code));
        }
        v
    };
    let exited = cri::ContainerState::ContainerExited as i32;
    assert_eq!(
        exits,
        [
            (exited, 1),
            (exited, 1),
            (cri::ContainerState::ContainerRunning as i32, 0)
        ]
    );
    // a sidecar in the same pod is not named by the annotations
    let sidecar = create(&rt, &pod, "sidecar", 0, &[]).await.unwrap();
    start(&rt, &sidecar).await.unwrap();
    advance(Duration::from_secs(60)).await;
    assert_eq!(
        state(&status(&rt, &sidecar).await),
        cri::ContainerState::ContainerRunning
    );
}

#[tokio::test(start_paused = true)]
async fn oom_killed_at_t() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[("cri-fake.node-agent.io/oom-after", "1m")]).await;
    let id = run_container(&rt, &pod, "hog", &[]).await;
    advance(Duration::from_secs(61)).await;
    let s = status(&rt, &id).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (137, "OOMKilled"));
    assert_eq!(s.finished_at - s.started_at, 60 * S);
}

#[tokio::test(start_paused = true)]
async fn the_earlier_of_exit_and_oom_wins() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let id = run_scripted(
        &rt,
        &pod,
        "c",
        &[("exit-after", "20s"), ("exit-code", "2"), ("oom-after", "5s")],
    )
    .await;
    advance(Duration::from_secs(30)).await;
    assert_eq!(status(&rt, &id).await.reason, "OOMKilled");
}

#[tokio::test(start_paused = true)]
async fn latencies_take_tokio_time() {
    let profile = Profile::from_pairs([
        ("sandbox-latency", "2s"),
        ("create-latency", "300ms"),
        ("start-latency", "700ms"),
        ("pull-duration", "5s"),
    ])
    .unwrap();
    let rt = FakeRuntime::new(FakeConfig {
        profile: Arc::new(profile),
        images: vec![IMAGE.into()],
        ..Default::default()
    });
    let t = Instant::now();
    let pod = run_pod(&rt, "p", &[]).await;
    assert_eq!(t.elapsed(), Duration::from_secs(2));
    let t = Instant::now();
    let id = create(&rt, &pod, "c", 0, &[]).await.unwrap();
    assert_eq!(t.elapsed(), Duration::from_millis(300));
    let t = Instant::now();
    start(&rt, &id).await.unwrap();
    assert_eq!(t.elapsed(), Duration::from_millis(700));
    let t = Instant::now();
    rt.pull_image(cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: "nginx".into(),
            ..Default::default()
        }),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(t.elapsed(), Duration::from_secs(5));
    // a pod annotation overrides the profile for its own pulls
    let t = Instant::now();
    rt.pull_image(cri::PullImageRequest {
        image: Some(cri::ImageSpec {
            image: "redis".into(),
            ..Default::default()
        }),
        sandbox_config: Some(pod_config("q", &[("cri-fake.node-agent.io/pull-duration", "1s")])),
        ..Default::default()
    })
    .await
    .unwrap();
    assert_eq!(t.elapsed(), Duration::from_secs(1));
}

#[tokio::test(start_paused = true)]
async fn distributions_are_seeded() {
    async fn draws(seed: u64) -> Vec<Duration> {
        let profile = Profile::from_pairs([("pull-duration", "uniform(1s,10s)")]).unwrap();
        let rt = FakeRuntime::new(FakeConfig {
            profile: Arc::new(profile),
            seed: Some(seed),
            ..Default::default()
        });
        let mut out = Vec::new();
        for i in 0..5 {
            let t = Instant::now();
            rt.pull_image(cri::PullImageRequest {
                image: Some(cri::ImageSpec {
                    image: format!("img{i}"),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await
            .unwrap();
            out.push(t.elapsed());
        }
        out
    }
    let a = draws(5).await;
    assert_eq!(a, draws(5).await);
    assert_ne!(a, draws(6).await);
    assert!(
        a.iter()
            .all(|d| (Duration::from_secs(1)..=Duration::from_secs(10)).contains(d))
    );
}

#[tokio::test(start_paused = true)]
async fn pull_failure() {
    let rt = fake();
    let err = rt
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: "private/app:1".into(),
                ..Default::default()
            }),
            sandbox_config: Some(pod_config(
                "p",
                &[("cri-fake.node-agent.io/pull-error", "unauthorized")],
            )),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code, Code::Unknown);
    assert!(err.message.contains("unauthorized"), "{err}");
    let missing = rt
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: "private/app:1".into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await
        .unwrap();
    assert!(missing.image.is_none());
}

#[tokio::test(start_paused = true)]
async fn start_error_leaves_the_container_exited() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let owned = script(&[("start-error", "exec: \"/app\": no such file")]);
    let id = create(&rt, &pod, "c", 0, &[(owned[0].0.as_str(), owned[0].1.as_str())])
        .await
        .unwrap();
    let err = start(&rt, &id).await.unwrap_err();
    assert_eq!(err.code, Code::Unknown);
    let s = status(&rt, &id).await;
    assert_eq!(
        (state(&s), s.exit_code, s.reason.as_str()),
        (cri::ContainerState::ContainerExited, 128, "StartError")
    );
    assert!(s.message.contains("no such file"));
}

#[tokio::test(start_paused = true)]
async fn graceful_stop_within_and_beyond_the_grace_period() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let quick = run_scripted(
        &rt,
        &pod,
        "quick",
        &[("stop-duration", "3s"), ("stop-exit-code", "143")],
    )
    .await;
    let t = Instant::now();
    rt.stop_container(cri::StopContainerRequest {
        container_id: quick.clone(),
        timeout: 30,
    })
    .await
    .unwrap();
    assert_eq!(t.elapsed(), Duration::from_secs(3));
    let s = status(&rt, &quick).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (143, "Error"));

    let slow = run_scripted(&rt, &pod, "slow", &[("stop-duration", "1h")]).await;
    let t = Instant::now();
    rt.stop_container(cri::StopContainerRequest {
        container_id: slow.clone(),
        timeout: 10,
    })
    .await
    .unwrap();
    assert_eq!(
        t.elapsed(),
        Duration::from_secs(10),
        "killed when the grace period ends"
    );
    let s = status(&rt, &slow).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (137, "Error"));

    // a container that exits by itself during the grace period keeps its own exit
    let exits = run_scripted(
        &rt,
        &pod,
        "exits",
        &[("stop-duration", "1h"), ("exit-after", "2s"), ("exit-code", "4")],
    )
    .await;
    let t = Instant::now();
    rt.stop_container(cri::StopContainerRequest {
        container_id: exits.clone(),
        timeout: 10,
    })
    .await
    .unwrap();
    assert_eq!(t.elapsed(), Duration::from_secs(2));
    assert_eq!(status(&rt, &exits).await.exit_code, 4);
}

async fn exec(
    rt: &FakeRuntime,
    id: &str,
    cmd: &[&str],
    timeout: i64,
) -> runtime_api::Result<cri::ExecSyncResponse> {
    rt.exec_sync(cri::ExecSyncRequest {
        container_id: id.into(),
        cmd: cmd.iter().map(|s| (*s).into()).collect(),
        timeout,
    })
    .await
}

#[tokio::test(start_paused = true)]
async fn exec_results_over_time() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let rules = r#"[
        {"cmd": "*", "exitCode": 1, "stderr": "not yet\n"},
        {"cmd": ["cat", "/tmp/ready"], "after": "20s", "stdout": "ready\n"},
        {"cmd": "slow", "duration": "5s", "stdout": "done"}
    ]"#;
    let id = run_scripted(&rt, &pod, "c", &[("exec", rules)]).await;
    let r = exec(&rt, &id, &["cat", "/tmp/ready"], 1).await.unwrap();
    assert_eq!((r.exit_code, r.stderr.as_slice()), (1, b"not yet\n".as_slice()));
    advance(Duration::from_secs(20)).await;
    let r = exec(&rt, &id, &["cat", "/tmp/ready"], 1).await.unwrap();
    assert_eq!((r.exit_code, r.stdout.as_slice()), (0, b"ready\n".as_slice()));
    assert_eq!(
        exec(&rt, &id, &["other"], 1).await.unwrap().exit_code,
        1,
        "the catch-all rule"
    );
    let t = Instant::now();
    assert_eq!(exec(&rt, &id, &["slow"], 10).await.unwrap().stdout, b"done");
    assert_eq!(t.elapsed(), Duration::from_secs(5));
    let t = Instant::now();
    assert_eq!(
        exec(&rt, &id, &["slow"], 2).await.unwrap_err().code,
        Code::DeadlineExceeded
    );
    assert_eq!(t.elapsed(), Duration::from_secs(2));

    // unscripted: the builtins
    let plain = run_container(&rt, &pod, "plain", &[]).await;
    assert_eq!(
        exec(&rt, &plain, &["echo", "hi", "there"], 1)
            .await
            .unwrap()
            .stdout,
        b"hi there\n"
    );
    assert_eq!(exec(&rt, &plain, &["/bin/false"], 1).await.unwrap().exit_code, 1);
    assert_eq!(exec(&rt, &plain, &["anything"], 1).await.unwrap().exit_code, 0);
    let created = create(&rt, &pod, "created", 0, &[]).await.unwrap();
    assert_eq!(
        exec(&rt, &created, &["true"], 1).await.unwrap_err().code,
        Code::Unknown
    );
}

#[tokio::test(start_paused = true)]
async fn probe_outcomes_over_time() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let rules = "http:8080/ready=fail, ok@20s; http:8080=ok, fail@1m; tcp:*=fail";
    let id = run_scripted(&rt, &pod, "c", &[("probe", rules)]).await;
    let ready = ProbeTarget::Http {
        port: 8080,
        path: "/ready",
    };
    let live = ProbeTarget::Http {
        port: 8080,
        path: "/healthz",
    };
    assert!(!rt.probe_result(&id, ready).unwrap());
    assert!(rt.probe_result(&id, live).unwrap());
    assert!(!rt.probe_result(&id, ProbeTarget::Tcp { port: 5432 }).unwrap());
    assert!(
        rt.probe_result(
            &id,
            ProbeTarget::Grpc {
                port: 9090,
                service: ""
            }
        )
        .unwrap(),
        "no rule: ok"
    );
    advance(Duration::from_secs(20)).await;
    assert!(rt.probe_result(&id, ready).unwrap());
    advance(Duration::from_secs(40)).await;
    assert!(
        !rt.probe_result(&id, live).unwrap(),
        "liveness fails after a minute"
    );
    rt.stop_container(cri::StopContainerRequest {
        container_id: id.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    assert!(
        !rt.probe_result(
            &id,
            ProbeTarget::Grpc {
                port: 9090,
                service: ""
            }
        )
        .unwrap(),
        "not running: fails"
    );
}

#[tokio::test(start_paused = true)]
async fn stats_follow_the_scripted_usage() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let id = run_scripted(
        &rt,
        &pod,
        "c",
        &[
            ("cpu", "500m, ~1500m@10s"),
            ("memory", "100Mi, ~200Mi@100s"),
            ("disk", "1Mi"),
        ],
    )
    .await;
    let mut config = container_config("limited", 0, &[]);
    config.linux = Some(cri::LinuxContainerConfig {
        resources: Some(cri::LinuxContainerResources {
            memory_limit_in_bytes: 64 << 20,
            ..Default::default()
        }),
        security_context: None,
    });
    let limited = rt
        .create_container(cri::CreateContainerRequest {
            pod_sandbox_id: pod.clone(),
            config: Some(config),
            sandbox_config: None,
        })
        .await
        .unwrap()
        .container_id;
    start(&rt, &limited).await.unwrap();
    advance(Duration::from_secs(10)).await;

    let stats = rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap()
        .stats
        .unwrap();
    let cpu = stats.cpu.unwrap();
    assert_eq!(cpu.usage_nano_cores.unwrap().value, 1_500_000_000);
    assert_eq!(
        cpu.usage_core_nano_seconds.unwrap().value,
        10_000_000_000,
        "mean 1 core over 10 s"
    );
    let mem = stats.memory.unwrap().working_set_bytes.unwrap().value;
    assert_eq!(mem, 110 << 20);
    assert_eq!(stats.writable_layer.unwrap().used_bytes.unwrap().value, 1 << 20);
    assert_eq!(
        stats.attributes.unwrap().labels,
        container_config("c", 0, &[]).labels
    );

    let limited_stats = rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: limited.clone(),
        })
        .await
        .unwrap()
        .stats
        .unwrap();
    assert_eq!(
        limited_stats.memory.unwrap().available_bytes.unwrap().value,
        (64 << 20) - (4 << 20)
    );

    let pod_stats = rt
        .pod_sandbox_stats(cri::PodSandboxStatsRequest {
            pod_sandbox_id: pod.clone(),
        })
        .await
        .unwrap();
    let linux = pod_stats.stats.unwrap().linux.unwrap();
    assert_eq!(
        linux.memory.unwrap().working_set_bytes.unwrap().value,
        (110 << 20) + (4 << 20)
    );
    assert_eq!(linux.containers.len(), 2);

    rt.stop_container(cri::StopContainerRequest {
        container_id: limited.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    let err = rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: limited,
        })
        .await
        .unwrap_err();
    assert_eq!(
        err.code,
        Code::Unknown,
        "like containerd: no metrics without a running task"
    );
    let listed = rt.list_container_stats(Default::default()).await.unwrap().stats;
    assert_eq!(listed.len(), 1, "only running containers");
    let by_pod = rt.list_pod_sandbox_stats(Default::default()).await.unwrap().stats;
    assert_eq!(by_pod.len(), 1);
    assert_eq!(by_pod[0].linux.as_ref().unwrap().containers.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn logs_are_stamped_with_the_start_time() {
    let rt = fake();
    let pod = run_pod(&rt, "p", &[]).await;
    let id = run_scripted(&rt, &pod, "c", &[("logs", "hello\nworld")]).await;
    let lines = rt.container_logs(&id).unwrap();
    assert_eq!(lines.len(), 2);
    assert!(lines[0].ends_with("Z stdout F hello"), "{}", lines[0]);
    assert!(lines[1].ends_with(" stdout F world"));
    let created = create(&rt, &pod, "d", 0, &[]).await.unwrap();
    assert!(rt.container_logs(&created).unwrap().is_empty());
}
