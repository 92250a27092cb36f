//! What a fake runtime costs: memory per idle runtime, per pod sandbox and per running container (RSS growth
//! over many of them, with the labels and annotations the kubelet really sets), and how many container events
//! one core pushes to subscribers.
//!
//! Run in release: `cargo run --release -p cri-fake --example footprint [-- RUNTIMES PODS_PER_RUNTIME]`
//! (defaults 10000 runtimes × 10 pods = 100,000 sandboxes and 100,000 running containers).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use cri_fake::{FakeConfig, FakeRuntime};
use futures::StreamExt;
use runtime_api::{Runtime, cri};
use tokio::time::Instant;

/// Resident set size of this process, in bytes (Linux).
fn rss() -> anyhow::Result<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").context("reading /proc/self/statm")?;
    let pages: u64 = statm.split_whitespace().nth(1).context("statm format")?.parse()?;
    Ok(pages * 4096)
}

fn map(pairs: &[(&str, String)]) -> HashMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect()
}

/// A sandbox config shaped like the kubelet's.
fn pod_config(node: usize, pod: usize) -> cri::PodSandboxConfig {
    let name = format!("load-{node}-{pod}");
    let uid = format!("{node:08x}-{pod:04x}-4000-8000-{:012x}", node * 1000 + pod);
    cri::PodSandboxConfig {
        metadata: Some(cri::PodSandboxMetadata {
            name: name.clone(),
            uid: uid.clone(),
            namespace: "load".into(),
            attempt: 0,
        }),
        hostname: name.clone(),
        log_directory: format!("/var/log/pods/load_{name}_{uid}"),
        labels: map(&[
            ("io.kubernetes.pod.name", name.clone()),
            ("io.kubernetes.pod.namespace", "load".into()),
            ("io.kubernetes.pod.uid", uid),
            ("app", "load".into()),
        ]),
        annotations: map(&[
            (
                "kubernetes.io/config.seen",
                "2026-01-01T00:00:00.000000000Z".into(),
            ),
            ("kubernetes.io/config.source", "api".into()),
        ]),
        ..Default::default()
    }
}

/// A container config shaped like the kubelet's.
fn container_config(sandbox: &cri::PodSandboxConfig) -> cri::ContainerConfig {
    let meta = sandbox.metadata.clone().unwrap_or_default();
    cri::ContainerConfig {
        metadata: Some(cri::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        image: Some(cri::ImageSpec {
            image: "registry.k8s.io/pause:3.10".into(),
            ..Default::default()
        }),
        labels: map(&[
            ("io.kubernetes.container.name", "app".into()),
            ("io.kubernetes.pod.name", meta.name),
            ("io.kubernetes.pod.namespace", meta.namespace),
            ("io.kubernetes.pod.uid", meta.uid),
        ]),
        annotations: map(&[
            ("io.kubernetes.container.hash", "6c1b5e0f".into()),
            ("io.kubernetes.container.restartCount", "0".into()),
            (
                "io.kubernetes.container.terminationMessagePath",
                "/dev/termination-log".into(),
            ),
            ("io.kubernetes.container.terminationMessagePolicy", "File".into()),
            ("io.kubernetes.pod.terminationGracePeriod", "30".into()),
        ]),
        log_path: "app/0.log".into(),
        linux: Some(cri::LinuxContainerConfig {
            resources: Some(cri::LinuxContainerResources {
                cpu_period: 100_000,
                cpu_shares: 2,
                memory_limit_in_bytes: 0,
                oom_score_adj: 1000,
                ..Default::default()
            }),
            security_context: None,
        }),
        ..Default::default()
    }
}

fn per(bytes_before: u64, bytes_after: u64, count: usize) -> f64 {
    bytes_after.saturating_sub(bytes_before) as f64 / count as f64
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let runtimes: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10_000);
    let pods: usize = args.next().map(|a| a.parse()).transpose()?.unwrap_or(10);
    println!("cri-fake footprint: {runtimes} runtimes × {pods} pods (one running container each)");

    let profile = std::sync::Arc::new(cri_fake::Profile::default());
    let base = rss()?;
    let fleet: Vec<FakeRuntime> = (0..runtimes)
        .map(|i| {
            FakeRuntime::new(FakeConfig {
                pod_cidr: Some(format!("10.{}.{}.0/24", 64 + i / 256, i % 256)),
                profile: profile.clone(),
                seed: Some(i as u64),
                ..Default::default()
            })
        })
        .collect();
    let idle = rss()?;
    println!(
        "idle runtime:            {:>7.0} bytes each",
        per(base, idle, runtimes)
    );

    for rt in &fleet {
        rt.pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: "registry.k8s.io/pause:3.10".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await?;
    }
    let imaged = rss()?;
    println!(
        "image record:            {:>7.0} bytes each",
        per(idle, imaged, runtimes)
    );

    for (n, rt) in fleet.iter().enumerate() {
        for p in 0..pods {
            rt.run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(pod_config(n, p)),
                ..Default::default()
            })
            .await?;
        }
    }
    let with_pods = rss()?;
    println!(
        "ready pod sandbox:       {:>7.0} bytes each",
        per(imaged, with_pods, runtimes * pods)
    );
    for (n, rt) in fleet.iter().enumerate() {
        // the ids, asked from the runtime so the benchmark holds no copies of its own
        let items = rt
            .list_pod_sandbox(cri::ListPodSandboxRequest::default())
            .await?
            .items;
        for p in 0..pods {
            let config = pod_config(n, p);
            let name = config
                .metadata
                .as_ref()
                .map(|m| m.name.as_str())
                .unwrap_or_default();
            let Some(item) = items
                .iter()
                .find(|i| i.metadata.as_ref().is_some_and(|m| m.name == name))
            else {
                anyhow::bail!("sandbox {name} missing");
            };
            let container = rt
                .create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: item.id.clone(),
                    config: Some(container_config(&config)),
                    sandbox_config: None,
                })
                .await?
                .container_id;
            rt.start_container(cri::StartContainerRequest {
                container_id: container,
            })
            .await?;
        }
    }
    let running = rss()?;
    println!(
        "running container:       {:>7.0} bytes each",
        per(with_pods, running, runtimes * pods)
    );
    let total = running.saturating_sub(base);
    println!(
        "total: {:.1} MiB for {runtimes} runtimes, {} sandboxes, {} containers ({:.0} bytes per runtime with its pods)",
        total as f64 / (1 << 20) as f64,
        runtimes * pods,
        runtimes * pods,
        total as f64 / runtimes as f64
    );
    drop(fleet);

    // events/s: one runtime, one subscriber, create → start → stop → remove cycles (4 events each, every event
    // carrying the sandbox status and its container statuses), all on this one thread.
    let rt = FakeRuntime::new(FakeConfig {
        images: vec!["registry.k8s.io/pause:3.10".into()],
        ..Default::default()
    });
    let mut events = rt.get_container_events(cri::GetEventsRequest {}).await?;
    let config = pod_config(0, 0);
    let pod = rt
        .run_pod_sandbox(cri::RunPodSandboxRequest {
            config: Some(config.clone()),
            ..Default::default()
        })
        .await?
        .pod_sandbox_id;
    let cycles = 100_000;
    let consumer = tokio::spawn(async move {
        let mut seen = 0u64;
        while let Some(event) = events.next().await {
            if event.is_err() {
                break;
            }
            seen += 1;
            if seen == 2 + 4 * cycles {
                break;
            }
        }
        seen
    });
    let started = Instant::now();
    for attempt in 0..cycles {
        let mut c = container_config(&config);
        if let Some(meta) = c.metadata.as_mut() {
            meta.attempt = attempt as u32;
        }
        let id = rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.clone(),
                config: Some(c),
                sandbox_config: None,
            })
            .await?
            .container_id;
        rt.start_container(cri::StartContainerRequest {
            container_id: id.clone(),
        })
        .await?;
        rt.stop_container(cri::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await?;
        rt.remove_container(cri::RemoveContainerRequest { container_id: id })
            .await?;
        if attempt % 1024 == 0 {
            tokio::task::yield_now().await;
        }
    }
    let seen = consumer.await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "events (RPC-driven):     {:>7.0} events/s on one core ({seen} events incl. the CRI calls causing them, {secs:.2} s)",
        seen as f64 / secs
    );

    // events/s pushed by the runtimes' timers: scripted exits of many containers falling due together.
    let fleet_size = 1_000;
    let per_runtime = 100;
    let profile = std::sync::Arc::new(cri_fake::Profile::from_pairs([("exit-after", "2s")])?);
    let mut streams = Vec::new();
    let mut fleet = Vec::new();
    for i in 0..fleet_size {
        let rt = FakeRuntime::new(FakeConfig {
            profile: profile.clone(),
            images: vec!["registry.k8s.io/pause:3.10".into()],
            seed: Some(i as u64),
            ..Default::default()
        });
        for p in 0..per_runtime {
            let config = pod_config(i, p);
            let pod = rt
                .run_pod_sandbox(cri::RunPodSandboxRequest {
                    config: Some(config.clone()),
                    ..Default::default()
                })
                .await?
                .pod_sandbox_id;
            let id = rt
                .create_container(cri::CreateContainerRequest {
                    pod_sandbox_id: pod,
                    config: Some(container_config(&config)),
                    sandbox_config: None,
                })
                .await?
                .container_id;
            rt.start_container(cri::StartContainerRequest { container_id: id })
                .await?;
        }
        streams.push(rt.get_container_events(cri::GetEventsRequest {}).await?);
        fleet.push(rt);
    }
    let due = fleet_size * per_runtime;
    let counter = tokio::spawn(async move {
        let mut all = futures::stream::select_all(streams);
        let mut first = None;
        let mut seen = 0;
        while let Some(event) = all.next().await {
            if event.is_err() {
                break;
            }
            first.get_or_insert_with(Instant::now);
            seen += 1;
            if seen == due {
                break;
            }
        }
        (seen, first.map(|f| f.elapsed()).unwrap_or(Duration::ZERO))
    });
    let (seen, took) = counter.await?;
    println!(
        "events (timer-driven):   {:>7.0} events/s on one core ({seen} scripted exits across {fleet_size} runtimes, {:.3} s)",
        seen as f64 / took.as_secs_f64().max(1e-9),
        took.as_secs_f64()
    );
    drop(fleet);
    Ok(())
}
