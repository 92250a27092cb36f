//! CreateContainer, StartContainer, StopContainer, RemoveContainer, ListContainers, ContainerStatus, ExecSync,
//! ReopenContainerLog.

use std::sync::Arc;

use runtime_api::{Code, Result, RuntimeError, cri};

use super::{invalid, map_iter, unknown};
use crate::pairs::Meta;
use crate::runtime::{FakeRuntime, secs};
use crate::script::{self, Sources};
use crate::store::{CState, Container, KILLED, Planned, Reason, Subject};

/// The answer of a command no `exec` rule covers: `echo` prints its arguments, `false` fails, the rest succeed.
fn builtin_exec(cmd: &[String]) -> (i32, Vec<u8>) {
    let program = cmd
        .first()
        .map(|p| p.rsplit('/').next().unwrap_or(p))
        .unwrap_or("");
    match program {
        "echo" => (0, format!("{}\n", cmd[1..].join(" ")).into_bytes()),
        "false" => (1, Vec::new()),
        _ => (0, Vec::new()),
    }
}

pub(super) async fn create_container(
    rt: &FakeRuntime,
    req: cri::CreateContainerRequest,
) -> Result<cri::CreateContainerResponse> {
    rt.check_reachable()?;
    let config = req
        .config
        .ok_or_else(|| RuntimeError::invalid_argument("container config is required"))?;
    let meta = config
        .metadata
        .clone()
        .ok_or_else(|| RuntimeError::invalid_argument("container config must include metadata"))?;
    let image = config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();

    // checks that hold before and after the scripted create latency
    let check = |st: &crate::store::State| -> Result<u64> {
        let sandbox = st.sandbox_key(&req.pod_sandbox_id).map_err(|_| {
            RuntimeError::not_found(format!(
                "failed to find sandbox id {:?}: not found",
                req.pod_sandbox_id
            ))
        })?;
        if !st.sandboxes.get(&sandbox).is_some_and(|sb| sb.ready) {
            return Err(RuntimeError::not_found(
                "failed to get sandbox container task: no running task found: not found",
            ));
        }
        if st
            .containers
            .values()
            .any(|c| c.sandbox == sandbox && c.name() == meta.name && c.attempt == meta.attempt)
        {
            return Err(unknown(format!(
                "failed to reserve container name {:?} (attempt {}): name is reserved",
                meta.name, meta.attempt
            )));
        }
        Ok(sandbox)
    };
    let (script, latency) = {
        let (mut st, _) = rt.settled();
        let sandbox = check(&st)?;
        if st.images.find(&image).is_none() {
            return Err(RuntimeError::not_found(format!(
                "failed to resolve image {image:?}: not found"
            )));
        }
        let pod = st
            .sandboxes
            .get(&sandbox)
            .map(|sb| sb.annotations())
            .unwrap_or_default();
        let script = script::resolve(
            rt.inner.profile.script_arc(),
            Sources {
                pod: pod.iter(),
                container: Some(&meta.name),
                own: map_iter(&config.annotations),
            },
        )
        .map_err(invalid)?;
        let latency = script.create_latency.sample(&mut st.rng);
        (script, latency)
    };
    FakeRuntime::pause(latency).await;

    let (mut st, now) = rt.settled();
    let sandbox = check(&st)?;
    let Some((_, image)) = st.images.resolve(&image) else {
        return Err(RuntimeError::not_found(format!(
            "failed to resolve image {image:?}: not found"
        )));
    };
    let key = st.new_key();
    st.containers.insert(
        key,
        Box::new(Container {
            sandbox,
            meta: Meta::new([&meta.name, &config.log_path], config.labels, config.annotations),
            attempt: meta.attempt,
            image,
            state: CState::Created,
            created: now,
            started: 0,
            finished: 0,
            exit_code: 0,
            reason: Reason::None,
            message: None,
            planned: None,
            resources: config
                .linux
                .and_then(|l| l.resources)
                .map(|r| prost::Message::encode_to_vec(&r).into_boxed_slice()),
            script,
        }),
    );
    st.emit(
        Subject::Container(key),
        cri::ContainerEventType::ContainerCreatedEvent,
        now,
    );
    Ok(cri::CreateContainerResponse {
        container_id: st.codec.render(key),
    })
}

pub(super) async fn start_container(
    rt: &FakeRuntime,
    req: cri::StartContainerRequest,
) -> Result<cri::StartContainerResponse> {
    rt.check_reachable()?;
    let id = req.container_id;
    let check = |st: &crate::store::State| -> Result<u64> {
        let key = st.container_key(&id)?;
        let c = &st.containers[&key];
        if c.state != CState::Created {
            return Err(unknown(format!(
                "container {id:?} is in {} state",
                c.state.cri().as_str_name()
            )));
        }
        if !st.sandboxes.get(&c.sandbox).is_some_and(|sb| sb.ready) {
            return Err(unknown(format!(
                "sandbox container {:?} is not running",
                st.codec.render(c.sandbox)
            )));
        }
        Ok(key)
    };
    let latency = {
        let (mut st, _) = rt.settled();
        let key = check(&st)?;
        let latency = st.containers[&key].script.start_latency;
        latency.sample(&mut st.rng)
    };
    FakeRuntime::pause(latency).await;

    let (mut st, now) = rt.settled();
    let key = check(&st)?;
    let script = Arc::clone(&st.containers[&key].script);
    if let Some(message) = &script.start_error {
        if let Some(c) = st.containers.get_mut(&key) {
            c.state = CState::Exited;
            c.finished = now;
            c.exit_code = 128;
            c.reason = Reason::StartError;
            c.message = Some(message.clone());
        }
        st.emit(
            Subject::Container(key),
            cri::ContainerEventType::ContainerStoppedEvent,
            now,
        );
        return Err(unknown(format!("failed to create containerd task: {message}")));
    }
    let attempt = match st.containers.get_mut(&key) {
        Some(c) => {
            c.state = CState::Running;
            c.started = now;
            c.attempt
        }
        None => return Err(crate::store::container_not_found(&id)),
    };
    st.emit(
        Subject::Container(key),
        cri::ContainerEventType::ContainerStartedEvent,
        now,
    );
    let mut earliest = false;
    if script.exits_on_attempt(attempt) {
        if let Some(after) = script.exit_after {
            let at = now + after.sample(&mut st.rng);
            earliest |= st.plan(
                key,
                Planned {
                    at,
                    exit_code: script.exit_code,
                    oom: false,
                },
            );
        }
        if let Some(after) = script.oom_after {
            let at = now + after.sample(&mut st.rng);
            earliest |= st.plan(
                key,
                Planned {
                    at,
                    exit_code: KILLED,
                    oom: true,
                },
            );
        }
    }
    rt.arm(&mut st, earliest);
    Ok(cri::StartContainerResponse {})
}

pub(super) async fn stop_container(
    rt: &FakeRuntime,
    req: cri::StopContainerRequest,
) -> Result<cri::StopContainerResponse> {
    rt.check_reachable()?;
    let end = {
        let (mut st, now) = rt.settled();
        // idempotent as the CRI api.proto asks (containerd 1.6 answers NotFound for an unknown id; we do not)
        let Ok(key) = st.container_key(&req.container_id) else {
            return Ok(cri::StopContainerResponse {});
        };
        if st.containers[&key].state != CState::Running {
            return Ok(cri::StopContainerResponse {});
        }
        if req.timeout <= 0 {
            st.kill(key, now);
            return Ok(cri::StopContainerResponse {});
        }
        let script = Arc::clone(&st.containers[&key].script);
        let takes = script.stop_duration.sample(&mut st.rng);
        let grace = secs(req.timeout);
        let plan = if takes <= grace {
            Planned {
                at: now + takes,
                exit_code: script.stop_exit_code,
                oom: false,
            }
        } else {
            Planned {
                at: now + grace,
                exit_code: KILLED,
                oom: false,
            }
        };
        let earliest = st.plan(key, plan);
        rt.arm(&mut st, earliest);
        st.containers[&key].planned.map_or(now, |p| p.at)
    };
    tokio::time::sleep_until(rt.inner.clock.instant(end)).await;
    drop(rt.settled());
    Ok(cri::StopContainerResponse {})
}

pub(super) async fn remove_container(
    rt: &FakeRuntime,
    req: cri::RemoveContainerRequest,
) -> Result<cri::RemoveContainerResponse> {
    rt.check_reachable()?;
    let (mut st, now) = rt.settled();
    if let Ok(key) = st.container_key(&req.container_id) {
        st.remove_container(key, now);
    }
    Ok(cri::RemoveContainerResponse {})
}

pub(super) async fn list_containers(
    rt: &FakeRuntime,
    req: cri::ListContainersRequest,
) -> Result<cri::ListContainersResponse> {
    rt.check_reachable()?;
    let (st, _) = rt.settled();
    Ok(cri::ListContainersResponse {
        containers: st.list_containers(req.filter.as_ref()),
    })
}

pub(super) async fn container_status(
    rt: &FakeRuntime,
    req: cri::ContainerStatusRequest,
) -> Result<cri::ContainerStatusResponse> {
    rt.check_reachable()?;
    let (st, _) = rt.settled();
    let key = st.container_key(&req.container_id)?;
    Ok(cri::ContainerStatusResponse {
        status: st.container_status(key),
        info: Default::default(),
    })
}

pub(super) async fn exec_sync(rt: &FakeRuntime, req: cri::ExecSyncRequest) -> Result<cri::ExecSyncResponse> {
    rt.check_reachable()?;
    let (response, takes) = {
        let (mut st, now) = rt.settled();
        let key = st.container_key(&req.container_id).map_err(|_| {
            RuntimeError::not_found(format!(
                "failed to exec in container: failed to find container {:?} in store: not found",
                req.container_id
            ))
        })?;
        let c = &st.containers[&key];
        if c.state != CState::Running {
            return Err(unknown(format!(
                "failed to exec in container: container is in {} state",
                c.state.cri().as_str_name()
            )));
        }
        let elapsed = now - c.started;
        let joined = req.cmd.join(" ");
        let rule = c
            .script
            .exec
            .iter()
            .rev()
            .find(|r| r.after <= elapsed && r.cmd.as_deref().is_none_or(|cmd| cmd == joined))
            .cloned();
        match rule {
            Some(rule) => {
                let takes = rule.duration.sample(&mut st.rng);
                let response = cri::ExecSyncResponse {
                    stdout: rule.stdout.into_vec(),
                    stderr: rule.stderr.into_vec(),
                    exit_code: rule.exit_code,
                };
                (response, takes)
            }
            None => {
                let (exit_code, stdout) = builtin_exec(&req.cmd);
                (
                    cri::ExecSyncResponse {
                        stdout,
                        stderr: Vec::new(),
                        exit_code,
                    },
                    0,
                )
            }
        }
    };
    if req.timeout > 0 && takes > secs(req.timeout) {
        FakeRuntime::pause(secs(req.timeout)).await;
        return Err(RuntimeError::new(
            Code::DeadlineExceeded,
            format!("timeout {}s exceeded: context deadline exceeded", req.timeout),
        ));
    }
    FakeRuntime::pause(takes).await;
    Ok(response)
}

/// ReopenContainerLog: the fake writes no log file, so there is nothing to reopen; the answers are containerd's
/// (an unknown container is not found, one that is not running cannot reopen its log).
pub(super) async fn reopen_container_log(
    rt: &FakeRuntime,
    req: cri::ReopenContainerLogRequest,
) -> Result<cri::ReopenContainerLogResponse> {
    rt.check_reachable()?;
    let (st, _) = rt.settled();
    let key = st.container_key(&req.container_id).map_err(|_| {
        RuntimeError::not_found(format!(
            "an error occurred when try to find container {:?}: not found",
            req.container_id
        ))
    })?;
    if st.containers[&key].state != CState::Running {
        return Err(unknown("container is not running"));
    }
    Ok(cri::ReopenContainerLogResponse {})
}

/// UpdateContainerResources: the container's Linux resources are replaced by the request's, so its status
/// reports them from then on; the answers for an unknown or finished container are containerd's.
pub(super) async fn update_container_resources(
    rt: &FakeRuntime,
    req: cri::UpdateContainerResourcesRequest,
) -> Result<cri::UpdateContainerResourcesResponse> {
    rt.check_reachable()?;
    let (mut st, _) = rt.settled();
    let key = st.container_key(&req.container_id).map_err(|_| {
        RuntimeError::not_found(format!(
            "failed to find container {:?}: not found",
            req.container_id
        ))
    })?;
    let c = st
        .containers
        .get_mut(&key)
        .ok_or_else(|| RuntimeError::not_found(format!("container {:?} not found", req.container_id)))?;
    if !matches!(c.state, CState::Created | CState::Running) {
        return Err(unknown(format!(
            "failed to update resources: container {:?} is in {} state",
            req.container_id,
            c.state.cri().as_str_name()
        )));
    }
    if let Some(linux) = req.linux {
        c.resources = Some(prost::Message::encode_to_vec(&linux).into_boxed_slice());
    }
    Ok(cri::UpdateContainerResourcesResponse {})
}
