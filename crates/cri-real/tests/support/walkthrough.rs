//! The CRI walk-through every runtime must answer identically: a pod's life from RunPodSandbox to
//! RemovePodSandbox, list filters, and the error cases (unknown ids, a container started in a stopped or removed
//! sandbox). Written once against `&dyn Runtime`; the conformance tests run it on the in-process fake, on the fake
//! behind a unix socket, and on a real containerd, and compare the transcripts.
//!
//! The transcript records what a CRI client can rely on (states, exit codes, reasons, outputs, error codes,
//! which objects a filter returns) and leaves out what legitimately differs between runtimes (ids, timestamps'
//! values, runtime names, messages). Scripted behaviour for cri-fake travels in `cri-fake.node-agent.io/…`
//! annotations chosen so the fake does what busybox really does under containerd.

use runtime_api::{Runtime, cri};

use super::walk::{FAKE, SERVER_CMD, Walk};
pub use super::walk::{Transcript, WalkEnv};

/// Run the walk-through and return the transcript.
pub async fn walkthrough(rt: &dyn Runtime, env: &WalkEnv) -> Transcript {
    let mut w = Walk {
        rt,
        env,
        out: Vec::new(),
    };

    let res = rt.version(cri::VersionRequest { version: "v1".into() }).await;
    w.record("Version", &res, |v| format!("api={}", v.runtime_api_version));
    let res = rt.status(cri::StatusRequest { verbose: false }).await;
    w.record("Status", &res, |s| {
        let mut conds: Vec<String> = s
            .status
            .iter()
            .flat_map(|st| st.conditions.iter())
            .map(|c| format!("{}={}", c.r#type, c.status))
            .collect();
        conds.sort();
        conds.join(",")
    });

    // images: the test image is there, an unknown one is not
    let image = cri::ImageSpec {
        image: env.image.clone(),
        ..Default::default()
    };
    let res = rt
        .image_status(cri::ImageStatusRequest {
            image: Some(image.clone()),
            verbose: false,
        })
        .await;
    w.record("ImageStatus(present)", &res, |r| match &r.image {
        Some(i) => format!(
            "present tagged={} id_set={} size_set={}",
            i.repo_tags.contains(&env.image),
            !i.id.is_empty(),
            i.size > 0
        ),
        None => "absent".into(),
    });
    let res = rt
        .image_status(cri::ImageStatusRequest {
            image: Some(cri::ImageSpec {
                image: "localhost/walk-absent:none".into(),
                ..Default::default()
            }),
            verbose: false,
        })
        .await;
    w.record("ImageStatus(absent)", &res, |r| {
        if r.image.is_some() {
            "present".into()
        } else {
            "absent".into()
        }
    });
    let res = rt.list_images(cri::ListImagesRequest::default()).await;
    w.record("ListImages", &res, |r| {
        format!(
            "test_image_listed={}",
            r.images.iter().any(|i| i.repo_tags.contains(&env.image))
        )
    });

    // a pull that fails (no registry answers on localhost:1)
    let mut pull_pod = w.pod_config("pull");
    pull_pod.annotations.insert(
        format!("{FAKE}pull-error"),
        "dial tcp 127.0.0.1:1: connect: connection refused".into(),
    );
    let res = rt
        .pull_image(cri::PullImageRequest {
            image: Some(cri::ImageSpec {
                image: "localhost:1/walk/absent:1".into(),
                ..Default::default()
            }),
            auth: None,
            sandbox_config: Some(pull_pod),
        })
        .await;
    w.record("PullImage(unreachable registry)", &res, |_| String::new());

    // pod A: a long-running server, a job, a stubborn container, a late container
    let Some(pod_a) = w.run_pod("a").await else {
        return w.out;
    };
    w.sandbox_status("a", &pod_a).await;

    let server_cfg = w.container_config(
        "server",
        SERVER_CMD,
        &[(
            "exec",
            r#"[{"cmd": "sh -c echo out; echo err >&2; exit 3", "exitCode": 3, "stdout": "out\n", "stderr": "err\n"},
                {"cmd": "echo hello", "stdout": "hello\n"}]"#,
        )],
    );
    let Some(server) = w.create("server", &pod_a, server_cfg.clone()).await else {
        return w.out;
    };
    let status = w.container_status("server", &server).await;
    if let Some(s) = status {
        w.note(format!(
            "ContainerStatus(server) keeps: metadata={} labels={} annotations={}",
            s.metadata == server_cfg.metadata,
            s.labels == server_cfg.labels,
            s.annotations == server_cfg.annotations
        ));
    }
    w.exec("server, not started", &server, &["echo", "hello"]).await;
    w.start("server", &server).await;
    w.container_status("server", &server).await;
    w.start("server, again", &server).await;
    w.exec("server, echo", &server, &["echo", "hello"]).await;
    w.exec(
        "server, exit 3",
        &server,
        &["sh", "-c", "echo out; echo err >&2; exit 3"],
    )
    .await;

    let job_cfg = w.container_config(
        "job",
        "echo working; exit 3",
        &[("exit-after", "0s"), ("exit-code", "3")],
    );
    let Some(job) = w.create("job", &pod_a, job_cfg).await else {
        return w.out;
    };
    w.start("job", &job).await;
    w.wait_exited(&job).await;
    w.container_status("job", &job).await;
    w.start("job, after exit", &job).await;
    let res = rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: job.clone(),
        })
        .await;
    w.record("ContainerStats(job, exited)", &res, |r| {
        format!("stats={}", r.stats.is_some())
    });

    let done_cfg = w.container_config("done", "exit 0", &[("exit-after", "0s")]);
    let Some(done) = w.create("done", &pod_a, done_cfg).await else {
        return w.out;
    };
    w.start("done", &done).await;
    w.wait_exited(&done).await;
    w.container_status("done", &done).await;
    w.exec("done, exited", &done, &["echo", "hello"]).await;

    // ignores SIGTERM (PID 1 without a handler): killed when the grace period ends
    let stubborn_cfg = w.container_config("stubborn", "sleep 3600", &[("stop-duration", "1h")]);
    let Some(stubborn) = w.create("stubborn", &pod_a, stubborn_cfg).await else {
        return w.out;
    };
    w.start("stubborn", &stubborn).await;

    let a_id = pod_a.0.clone();
    let known = [
        ("server", server.as_str()),
        ("job", job.as_str()),
        ("done", done.as_str()),
        ("stubborn", stubborn.as_str()),
    ];
    w.list_containers("all", cri::ContainerFilter::default(), &known)
        .await;
    w.list_containers(
        "sandbox a",
        cri::ContainerFilter {
            pod_sandbox_id: a_id.clone(),
            ..Default::default()
        },
        &known,
    )
    .await;
    w.list_containers(
        "id=server",
        cri::ContainerFilter {
            id: server.clone(),
            ..Default::default()
        },
        &known,
    )
    .await;
    w.list_containers(
        "id=server prefix",
        cri::ContainerFilter {
            id: server[..12].to_owned(),
            ..Default::default()
        },
        &known,
    )
    .await;
    w.container_status("server, id prefix", &server[..12]).await;
    w.list_containers(
        "state=RUNNING",
        cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerRunning as i32,
            }),
            ..Default::default()
        },
        &known,
    )
    .await;
    w.list_containers(
        "state=EXITED",
        cri::ContainerFilter {
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerExited as i32,
            }),
            ..Default::default()
        },
        &known,
    )
    .await;
    w.list_containers(
        "label container=job",
        cri::ContainerFilter {
            label_selector: [("container".into(), "job".into())].into(),
            ..Default::default()
        },
        &known,
    )
    .await;
    w.list_containers(
        "label container=job + state=RUNNING",
        cri::ContainerFilter {
            label_selector: [("container".into(), "job".into())].into(),
            state: Some(cri::ContainerStateValue {
                state: cri::ContainerState::ContainerRunning as i32,
            }),
            ..Default::default()
        },
        &known,
    )
    .await;
    w.list_containers(
        "sandbox unknown",
        cri::ContainerFilter {
            pod_sandbox_id: "0123456789abcdef".into(),
            ..Default::default()
        },
        &known,
    )
    .await;

    w.stop("server", &server, 10).await;
    w.container_status("server", &server).await;
    w.stop("server, again", &server, 10).await;
    w.stop("stubborn", &stubborn, 1).await;
    w.container_status("stubborn", &stubborn).await;
    w.exec("server, stopped", &server, &["echo", "hello"]).await;
    w.remove("server", &server).await;
    w.container_status("server, removed", &server).await;
    w.remove("server, again", &server).await;
    w.start("server, removed", &server).await;

    let late_cfg = w.container_config("late", SERVER_CMD, &[]);
    let Some(late) = w.create("late", &pod_a, late_cfg.clone()).await else {
        return w.out;
    };

    // pod B: removed while its container runs
    let Some(pod_b) = w.run_pod("b").await else {
        return w.out;
    };
    let b_cfg = w.container_config("b-main", SERVER_CMD, &[]);
    let Some(b_main) = w.create("b-main", &pod_b, b_cfg).await else {
        return w.out;
    };
    w.start("b-main", &b_main).await;
    let pods = [("a", a_id.as_str()), ("b", pod_b.0.as_str())];
    w.list_sandboxes("all", cri::PodSandboxFilter::default(), &pods)
        .await;
    w.list_sandboxes(
        "id=a",
        cri::PodSandboxFilter {
            id: a_id.clone(),
            ..Default::default()
        },
        &pods,
    )
    .await;
    w.list_sandboxes(
        "label pod=b",
        cri::PodSandboxFilter {
            label_selector: [("pod".into(), "b".into())].into(),
            ..Default::default()
        },
        &pods,
    )
    .await;
    w.list_sandboxes(
        "label pod=c",
        cri::PodSandboxFilter {
            label_selector: [("pod".into(), "c".into())].into(),
            ..Default::default()
        },
        &pods,
    )
    .await;

    // stopping pod A: its containers die, its IP is released
    let res = rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: a_id.clone(),
        })
        .await;
    w.record("StopPodSandbox(a)", &res, |_| String::new());
    w.sandbox_status("a, stopped", &pod_a).await;
    w.list_sandboxes(
        "state=READY",
        cri::PodSandboxFilter {
            state: Some(cri::PodSandboxStateValue {
                state: cri::PodSandboxState::SandboxReady as i32,
            }),
            ..Default::default()
        },
        &pods,
    )
    .await;
    w.list_sandboxes(
        "state=NOTREADY",
        cri::PodSandboxFilter {
            state: Some(cri::PodSandboxStateValue {
                state: cri::PodSandboxState::SandboxNotready as i32,
            }),
            ..Default::default()
        },
        &pods,
    )
    .await;
    w.container_status("late, sandbox stopped", &late).await;
    w.start("late, sandbox stopped", &late).await;
    let late2_cfg = w.container_config("late2", SERVER_CMD, &[]);
    w.create("late2, sandbox stopped", &pod_a, late2_cfg).await;
    let res = rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: a_id.clone(),
        })
        .await;
    w.record("StopPodSandbox(a, again)", &res, |_| String::new());

    let res = rt
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: a_id.clone(),
        })
        .await;
    w.record("RemovePodSandbox(a)", &res, |_| String::new());
    w.sandbox_status("a, removed", &pod_a).await;
    w.container_status("late, sandbox removed", &late).await;
    w.start("late, sandbox removed", &late).await;
    w.create("late3, sandbox removed", &pod_a, late_cfg).await;
    let res = rt
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: a_id.clone(),
        })
        .await;
    w.record("RemovePodSandbox(a, again)", &res, |_| String::new());
    let res = rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: a_id.clone(),
        })
        .await;
    w.record("StopPodSandbox(a, removed)", &res, |_| String::new());

    let res = rt
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: pod_b.0.clone(),
        })
        .await;
    w.record("RemovePodSandbox(b, running)", &res, |_| String::new());
    w.container_status("b-main, sandbox removed", &b_main).await;

    // unknown ids
    let unknown = "f00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeedf00dfeed";
    w.container_status("unknown", unknown).await;
    w.start("unknown", unknown).await;
    w.stop("unknown", unknown, 0).await;
    w.remove("unknown", unknown).await;
    w.exec("unknown", unknown, &["echo", "hello"]).await;
    let res = rt
        .pod_sandbox_status(cri::PodSandboxStatusRequest {
            pod_sandbox_id: unknown.into(),
            verbose: false,
        })
        .await;
    w.record("PodSandboxStatus(unknown)", &res, |_| String::new());
    let res = rt
        .stop_pod_sandbox(cri::StopPodSandboxRequest {
            pod_sandbox_id: unknown.into(),
        })
        .await;
    w.record("StopPodSandbox(unknown)", &res, |_| String::new());
    let res = rt
        .remove_pod_sandbox(cri::RemovePodSandboxRequest {
            pod_sandbox_id: unknown.into(),
        })
        .await;
    w.record("RemovePodSandbox(unknown)", &res, |_| String::new());
    let res = rt
        .container_stats(cri::ContainerStatsRequest {
            container_id: unknown.into(),
        })
        .await;
    w.record("ContainerStats(unknown)", &res, |_| String::new());

    w.list_containers("all, at the end", cri::ContainerFilter::default(), &[])
        .await;
    w.list_sandboxes("all, at the end", cri::PodSandboxFilter::default(), &[])
        .await;
    w.out
}
