//! RunPodSandbox, StopPodSandbox, RemovePodSandbox, PodSandboxStatus, ListPodSandbox.

use runtime_api::{Result, RuntimeError, cri};

use super::{invalid, map_iter, unknown};
use crate::runtime::FakeRuntime;
use crate::script::{self, Script, ScriptError, Sources};
use crate::store::{Ips, Sandbox, Subject};

/// Check every behaviour annotation of a pod (including the `<key>.<container>` ones) so a typo fails the
/// sandbox with a clear message instead of surfacing later.
fn validate_pod_annotations<'a>(
    annotations: impl Iterator<Item = (&'a str, &'a str)>,
) -> Result<(), ScriptError> {
    let mut scratch = Script::default();
    for (key, value) in annotations {
        if let Some(key) = key.strip_prefix(script::ANNOTATION_PREFIX) {
            scratch.apply(key.split_once('.').map_or(key, |(k, _)| k), value)?;
        }
    }
    Ok(())
}

pub(super) async fn run_pod_sandbox(
    rt: &FakeRuntime,
    req: cri::RunPodSandboxRequest,
) -> Result<cri::RunPodSandboxResponse> {
    rt.check_reachable()?;
    let config = req
        .config
        .ok_or_else(|| RuntimeError::invalid_argument("sandbox config is required"))?;
    let meta = config
        .metadata
        .clone()
        .ok_or_else(|| RuntimeError::invalid_argument("sandbox config must include metadata"))?;
    validate_pod_annotations(map_iter(&config.annotations)).map_err(invalid)?;
    let pod_script = script::resolve(
        rt.inner.profile.script_arc(),
        Sources {
            pod: map_iter(&config.annotations),
            container: None,
            own: std::iter::empty(),
        },
    )
    .map_err(invalid)?;
    let same_name = |sb: &Sandbox| {
        sb.name() == meta.name
            && sb.namespace() == meta.namespace
            && sb.uid() == meta.uid
            && sb.attempt == meta.attempt
    };
    let reserved = || {
        unknown(format!(
            "failed to reserve sandbox name {:?}: name is reserved",
            meta.name
        ))
    };
    let latency = {
        let (mut st, _) = rt.settled();
        if st.sandboxes.values().any(&same_name) {
            return Err(reserved());
        }
        pod_script.sandbox_latency.sample(&mut st.rng)
    };
    FakeRuntime::pause(latency).await;

    let (mut st, now) = rt.settled();
    if st.sandboxes.values().any(same_name) {
        return Err(reserved());
    }
    let linux = config.linux.as_ref();
    let ns = linux
        .and_then(|l| l.security_context.as_ref())
        .and_then(|s| s.namespace_options.as_ref());
    let mode = |m: i32| u8::try_from(m).unwrap_or(0);
    let namespaces = ns.map_or([0, 0, 0], |n| [mode(n.network), mode(n.pid), mode(n.ipc)]);
    let host_network = i32::from(namespaces[0]) == cri::NamespaceMode::Node as i32;
    let ips = if host_network {
        Vec::new()
    } else {
        let network_ready = st.network_ready;
        let ipam = st
            .ipam
            .as_mut()
            .filter(|_| network_ready)
            .ok_or_else(|| unknown("failed to setup network for sandbox: cni plugin not initialized"))?;
        ipam.allocate().ok_or_else(|| {
            unknown(format!(
                "failed to setup network for sandbox: no IP addresses available in {}",
                ipam.cidrs()
            ))
        })?
    };
    let key = st.new_key();
    let (strings, log_dir_derived) = Sandbox::new_meta(
        [
            &meta.name,
            &meta.uid,
            &meta.namespace,
            &req.runtime_handler,
            &config.log_directory,
        ],
        config.labels,
        config.annotations,
    );
    st.sandboxes.insert(
        key,
        Box::new(Sandbox {
            meta: strings,
            log_dir_derived,
            attempt: meta.attempt,
            ready: true,
            created: now,
            ips: Ips::new(ips),
            namespaces,
        }),
    );
    st.emit(
        Subject::Sandbox(key),
        cri::ContainerEventType::ContainerCreatedEvent,
        now,
    );
    st.emit(
        Subject::Sandbox(key),
        cri::ContainerEventType::ContainerStartedEvent,
        now,
    );
    Ok(cri::RunPodSandboxResponse {
        pod_sandbox_id: st.codec.render(key),
    })
}

pub(super) async fn stop_pod_sandbox(
    rt: &FakeRuntime,
    req: cri::StopPodSandboxRequest,
) -> Result<cri::StopPodSandboxResponse> {
    rt.check_reachable()?;
    let (mut st, now) = rt.settled();
    // idempotent as the CRI api.proto asks (containerd 1.6 answers NotFound for an unknown id; we do not)
    if let Ok(key) = st.sandbox_key(&req.pod_sandbox_id) {
        st.stop_sandbox(key, now);
    }
    Ok(cri::StopPodSandboxResponse {})
}

pub(super) async fn remove_pod_sandbox(
    rt: &FakeRuntime,
    req: cri::RemovePodSandboxRequest,
) -> Result<cri::RemovePodSandboxResponse> {
    rt.check_reachable()?;
    let (mut st, now) = rt.settled();
    if let Ok(key) = st.sandbox_key(&req.pod_sandbox_id) {
        st.remove_sandbox(key, now);
    }
    Ok(cri::RemovePodSandboxResponse {})
}

pub(super) async fn pod_sandbox_status(
    rt: &FakeRuntime,
    req: cri::PodSandboxStatusRequest,
) -> Result<cri::PodSandboxStatusResponse> {
    rt.check_reachable()?;
    let (st, now) = rt.settled();
    let key = st.sandbox_key(&req.pod_sandbox_id)?;
    Ok(cri::PodSandboxStatusResponse {
        status: st.sandbox_status(key),
        info: Default::default(),
        containers_statuses: st
            .containers_of(key)
            .filter_map(|c| st.container_status(c))
            .collect(),
        timestamp: now,
    })
}

pub(super) async fn list_pod_sandbox(
    rt: &FakeRuntime,
    req: cri::ListPodSandboxRequest,
) -> Result<cri::ListPodSandboxResponse> {
    rt.check_reachable()?;
    let (st, _) = rt.settled();
    Ok(cri::ListPodSandboxResponse {
        items: st.list_sandboxes(req.filter.as_ref()),
    })
}
