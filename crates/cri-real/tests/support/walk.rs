//! The recording side of the walk-through: the [`Walk`] that issues CRI calls, builds pod and container configs
//! and writes one transcript line per observation, keeping what a client can rely on and dropping what
//! legitimately differs between runtimes (ids, timestamp values, names, messages).

use std::collections::HashMap;
use std::time::Duration;

use runtime_api::{Runtime, RuntimeError, cri};

/// What the walk-through needs to know about the environment.
pub struct WalkEnv {
    /// An image present in the runtime (busybox with `sh`, `echo`, `sleep`).
    pub image: String,
    /// Distinguishes this run's pods from other runs' (names, uids, labels).
    pub run_id: String,
    /// Directory for the pods' container logs.
    pub log_root: std::path::PathBuf,
    /// The pod network: every pod IP must fall inside it (`10.88.0.0/16`).
    pub pod_cidr: (std::net::Ipv4Addr, u8),
}

pub(crate) const FAKE: &str = "cri-fake.node-agent.io/";
pub(crate) const SERVER_CMD: &str =
    "trap 'echo got TERM; exit 0' TERM; echo started; while true; do sleep 0.2; done";

/// The transcript: one line per observation.
pub type Transcript = Vec<String>;

pub(crate) struct Walk<'a> {
    pub(crate) rt: &'a dyn Runtime,
    pub(crate) env: &'a WalkEnv,
    pub(crate) out: Transcript,
}

pub(crate) fn err_code(err: &RuntimeError) -> String {
    format!("error {:?}", err.code)
}

impl Walk<'_> {
    pub(crate) fn note(&mut self, line: impl Into<String>) {
        let line = line.into();
        eprintln!("  {line}");
        self.out.push(line);
    }

    /// Record `step` as `ok` plus `show(answer)`, or as the error code.
    pub(crate) fn record<T>(
        &mut self,
        step: &str,
        res: &Result<T, RuntimeError>,
        show: impl FnOnce(&T) -> String,
    ) {
        let line = match res {
            Ok(v) => {
                let detail = show(v);
                if detail.is_empty() {
                    format!("{step}: ok")
                } else {
                    format!("{step}: ok {detail}")
                }
            }
            Err(e) => {
                eprintln!("    ({step}: {e})");
                format!("{step}: {}", err_code(e))
            }
        };
        self.note(line);
    }

    pub(crate) fn labels(&self, extra: &[(&str, &str)]) -> HashMap<String, String> {
        let mut labels: HashMap<String, String> = [("walk-run".to_owned(), self.env.run_id.clone())]
            .into_iter()
            .collect();
        labels.extend(extra.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())));
        labels
    }

    pub(crate) fn pod_config(&self, name: &str) -> cri::PodSandboxConfig {
        let uid = format!("{}-{name}", self.env.run_id);
        let log_directory = self.env.log_root.join(&uid);
        let _ = std::fs::create_dir_all(&log_directory);
        cri::PodSandboxConfig {
            metadata: Some(cri::PodSandboxMetadata {
                name: format!("{name}-{}", self.env.run_id),
                uid,
                namespace: "walk".into(),
                attempt: 0,
            }),
            hostname: name.into(),
            log_directory: log_directory.display().to_string(),
            labels: self.labels(&[("pod", name)]),
            annotations: [("walk/note".to_owned(), format!("pod {name}"))]
                .into_iter()
                .collect(),
            linux: Some(cri::LinuxPodSandboxConfig {
                cgroup_parent: format!("/na-cri-test/pod{}", self.env.run_id),
                security_context: Some(cri::LinuxSandboxSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Pod as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    pub(crate) fn container_config(
        &self,
        name: &str,
        script: &str,
        fake: &[(&str, &str)],
    ) -> cri::ContainerConfig {
        let mut annotations: HashMap<String, String> = [("walk/container".to_owned(), name.to_owned())]
            .into_iter()
            .collect();
        annotations.extend(fake.iter().map(|(k, v)| (format!("{FAKE}{k}"), (*v).to_owned())));
        cri::ContainerConfig {
            metadata: Some(cri::ContainerMetadata {
                name: name.into(),
                attempt: 0,
            }),
            image: Some(cri::ImageSpec {
                image: self.env.image.clone(),
                ..Default::default()
            }),
            command: vec!["sh".into(), "-c".into()],
            args: vec![script.into()],
            envs: vec![cri::KeyValue {
                key: "WALK".into(),
                value: "1".into(),
            }],
            labels: self.labels(&[("container", name)]),
            annotations,
            log_path: format!("{name}/0.log"),
            linux: Some(cri::LinuxContainerConfig {
                resources: Some(cri::LinuxContainerResources {
                    memory_limit_in_bytes: 64 << 20,
                    cpu_shares: 256,
                    ..Default::default()
                }),
                security_context: Some(cri::LinuxContainerSecurityContext {
                    namespace_options: Some(cri::NamespaceOption {
                        network: cri::NamespaceMode::Pod as i32,
                        pid: cri::NamespaceMode::Container as i32,
                        ipc: cri::NamespaceMode::Pod as i32,
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            }),
            ..Default::default()
        }
    }

    pub(crate) async fn run_pod(&mut self, name: &str) -> Option<(String, cri::PodSandboxConfig)> {
        let config = self.pod_config(name);
        let res = self
            .rt
            .run_pod_sandbox(cri::RunPodSandboxRequest {
                config: Some(config.clone()),
                ..Default::default()
            })
            .await;
        self.record(&format!("RunPodSandbox({name})"), &res, |_| String::new());
        res.ok().map(|r| (r.pod_sandbox_id, config))
    }

    pub(crate) async fn create(
        &mut self,
        label: &str,
        pod: &(String, cri::PodSandboxConfig),
        config: cri::ContainerConfig,
    ) -> Option<String> {
        let res = self
            .rt
            .create_container(cri::CreateContainerRequest {
                pod_sandbox_id: pod.0.clone(),
                config: Some(config),
                sandbox_config: Some(pod.1.clone()),
            })
            .await;
        self.record(&format!("CreateContainer({label})"), &res, |_| String::new());
        res.ok().map(|r| r.container_id)
    }

    pub(crate) async fn start(&mut self, label: &str, id: &str) {
        let res = self
            .rt
            .start_container(cri::StartContainerRequest {
                container_id: id.into(),
            })
            .await;
        self.record(&format!("StartContainer({label})"), &res, |_| String::new());
    }

    pub(crate) async fn stop(&mut self, label: &str, id: &str, timeout: i64) {
        let res = self
            .rt
            .stop_container(cri::StopContainerRequest {
                container_id: id.into(),
                timeout,
            })
            .await;
        self.record(&format!("StopContainer({label}, {timeout}s)"), &res, |_| {
            String::new()
        });
    }

    pub(crate) async fn remove(&mut self, label: &str, id: &str) {
        let res = self
            .rt
            .remove_container(cri::RemoveContainerRequest {
                container_id: id.into(),
            })
            .await;
        self.record(&format!("RemoveContainer({label})"), &res, |_| String::new());
    }

    pub(crate) async fn container_status(&mut self, label: &str, id: &str) -> Option<cri::ContainerStatus> {
        let res = self
            .rt
            .container_status(cri::ContainerStatusRequest {
                container_id: id.into(),
                verbose: false,
            })
            .await;
        let status = res.as_ref().ok().and_then(|r| r.status.clone());
        self.record(&format!("ContainerStatus({label})"), &res, |r| match &r.status {
            None => "no status".into(),
            Some(s) => describe_container(s, id),
        });
        status
    }

    pub(crate) async fn sandbox_status(&mut self, label: &str, pod: &(String, cri::PodSandboxConfig)) {
        let res = self
            .rt
            .pod_sandbox_status(cri::PodSandboxStatusRequest {
                pod_sandbox_id: pod.0.clone(),
                verbose: false,
            })
            .await;
        let cidr = self.env.pod_cidr;
        self.record(&format!("PodSandboxStatus({label})"), &res, |r| match &r.status {
            None => "no status".into(),
            Some(s) => {
                let ip = s.network.as_ref().map(|n| n.ip.clone()).unwrap_or_default();
                let ip = if ip.is_empty() {
                    "none".to_owned()
                } else if in_cidr(&ip, cidr) {
                    "in-pod-cidr".to_owned()
                } else {
                    format!("OUTSIDE {ip}")
                };
                format!(
                    "{} ip={ip} id_matches={} created_at_set={} metadata_kept={} labels_kept={} annotations_kept={}",
                    state_name_sandbox(s.state),
                    s.id == pod.0,
                    s.created_at > 0,
                    s.metadata == pod.1.metadata,
                    s.labels == pod.1.labels,
                    s.annotations == pod.1.annotations,
                )
            }
        });
    }

    pub(crate) async fn wait_exited(&mut self, id: &str) {
        for _ in 0..200 {
            match self
                .rt
                .container_status(cri::ContainerStatusRequest {
                    container_id: id.into(),
                    verbose: false,
                })
                .await
            {
                Ok(r)
                    if r.status
                        .as_ref()
                        .is_some_and(|s| s.state == cri::ContainerState::ContainerExited as i32) =>
                {
                    return;
                }
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(_) => return,
            }
        }
    }

    pub(crate) async fn exec(&mut self, label: &str, id: &str, cmd: &[&str]) {
        let res = self
            .rt
            .exec_sync(cri::ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| (*s).to_owned()).collect(),
                timeout: 10,
            })
            .await;
        self.record(&format!("ExecSync({label})"), &res, |r| {
            format!(
                "exit={} stdout={:?} stderr={:?}",
                r.exit_code,
                String::from_utf8_lossy(&r.stdout),
                String::from_utf8_lossy(&r.stderr)
            )
        });
    }

    pub(crate) async fn list_containers(
        &mut self,
        label: &str,
        filter: cri::ContainerFilter,
        known: &[(&str, &str)],
    ) {
        let res = self
            .rt
            .list_containers(cri::ListContainersRequest { filter: Some(filter) })
            .await;
        let run = self.env.run_id.clone();
        self.record(&format!("ListContainers({label})"), &res, |r| {
            let mut names: Vec<String> = r
                .containers
                .iter()
                .filter(|c| c.labels.get("walk-run") == Some(&run))
                .map(|c| {
                    let name = known.iter().find(|(_, id)| *id == c.id).map_or("?", |(n, _)| n);
                    format!("{name}:{}", state_name(c.state))
                })
                .collect();
            names.sort();
            format!("[{}]", names.join(" "))
        });
    }

    pub(crate) async fn list_sandboxes(
        &mut self,
        label: &str,
        filter: cri::PodSandboxFilter,
        known: &[(&str, &str)],
    ) {
        let res = self
            .rt
            .list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) })
            .await;
        let run = self.env.run_id.clone();
        self.record(&format!("ListPodSandbox({label})"), &res, |r| {
            let mut names: Vec<String> = r
                .items
                .iter()
                .filter(|p| p.labels.get("walk-run") == Some(&run))
                .map(|p| {
                    let name = known.iter().find(|(_, id)| *id == p.id).map_or("?", |(n, _)| n);
                    format!("{name}:{}", state_name_sandbox(p.state))
                })
                .collect();
            names.sort();
            format!("[{}]", names.join(" "))
        });
    }
}

pub(crate) fn state_name(state: i32) -> &'static str {
    cri::ContainerState::try_from(state).map_or("INVALID", |s| s.as_str_name())
}

pub(crate) fn state_name_sandbox(state: i32) -> &'static str {
    cri::PodSandboxState::try_from(state).map_or("INVALID", |s| s.as_str_name())
}

pub(crate) fn in_cidr(ip: &str, (net, bits): (std::net::Ipv4Addr, u8)) -> bool {
    let Ok(ip) = ip.parse::<std::net::Ipv4Addr>() else {
        return false;
    };
    let mask = if bits == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(bits))
    };
    u32::from(ip) & mask == u32::from(net) & mask
}

pub(crate) fn describe_container(s: &cri::ContainerStatus, id: &str) -> String {
    let exited = s.state == cri::ContainerState::ContainerExited as i32;
    let mut line = format!(
        "{} id_matches={} created_at_set={} started_at_set={} finished_at_set={}",
        state_name(s.state),
        s.id.starts_with(id),
        s.created_at > 0,
        s.started_at > 0,
        s.finished_at > 0,
    );
    if exited {
        line.push_str(&format!(
            " exit={} reason={:?} created_before_start={}",
            s.exit_code,
            s.reason,
            s.created_at <= s.started_at
        ));
    }
    line.push_str(&format!(
        " image={:?} image_ref_set={} log_path_set={}",
        s.image.as_ref().map(|i| i.image.as_str()).unwrap_or(""),
        !s.image_ref.is_empty(),
        !s.log_path.is_empty()
    ));
    line
}
