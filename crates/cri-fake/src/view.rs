//! Rendering the fake's records as CRI messages: statuses, list items, list filters and stats. Read-only over
//! [`State`]; callers settle due transitions first.

use runtime_api::cri;

use crate::ids;
use crate::store::{CState, State};

/// Where the fake says container writable layers live (the `fs_id` of stats).
const CONTAINER_FS: &str = "/var/lib/cri-fake/containers";
/// Where the fake says images live (the `fs_id` of `ImageFsInfo`).
pub(crate) const IMAGE_FS: &str = "/var/lib/cri-fake/images";

fn u64v(value: u64) -> Option<cri::UInt64Value> {
    Some(cri::UInt64Value { value })
}

impl State {
    pub(crate) fn sandbox_status(&self, key: u64) -> Option<cri::PodSandboxStatus> {
        let sb = self.sandboxes.get(&key)?;
        let mut ips = sb.ips.to_vec().into_iter().map(|ip| ip.to_string());
        let ip = ips.next().unwrap_or_default();
        let [network, pid, ipc] = sb.namespaces.map(i32::from);
        Some(cri::PodSandboxStatus {
            id: self.codec.render(key),
            metadata: Some(cri::PodSandboxMetadata {
                name: sb.name().to_owned(),
                uid: sb.uid().to_owned(),
                namespace: sb.namespace().to_owned(),
                attempt: sb.attempt,
            }),
            state: if sb.ready {
                cri::PodSandboxState::SandboxReady
            } else {
                cri::PodSandboxState::SandboxNotready
            } as i32,
            created_at: sb.created,
            network: Some(cri::PodSandboxNetworkStatus {
                ip,
                additional_ips: ips.map(|ip| cri::PodIp { ip }).collect(),
            }),
            linux: Some(cri::LinuxPodSandboxStatus {
                namespaces: Some(cri::Namespace {
                    options: Some(cri::NamespaceOption {
                        network,
                        pid,
                        ipc,
                        ..Default::default()
                    }),
                }),
            }),
            labels: sb.labels().to_map(),
            annotations: sb.annotations().to_map(),
            runtime_handler: sb.runtime_handler().to_owned(),
        })
    }

    pub(crate) fn sandbox_item(&self, key: u64) -> Option<cri::PodSandbox> {
        let sb = self.sandboxes.get(&key)?;
        Some(cri::PodSandbox {
            id: self.codec.render(key),
            metadata: Some(cri::PodSandboxMetadata {
                name: sb.name().to_owned(),
                uid: sb.uid().to_owned(),
                namespace: sb.namespace().to_owned(),
                attempt: sb.attempt,
            }),
            state: if sb.ready {
                cri::PodSandboxState::SandboxReady
            } else {
                cri::PodSandboxState::SandboxNotready
            } as i32,
            created_at: sb.created,
            labels: sb.labels().to_map(),
            annotations: sb.annotations().to_map(),
            runtime_handler: sb.runtime_handler().to_owned(),
        })
    }

    pub(crate) fn container_status(&self, key: u64) -> Option<cri::ContainerStatus> {
        let c = self.containers.get(&key)?;
        let log_dir = self
            .sandboxes
            .get(&c.sandbox)
            .map(|sb| sb.log_directory())
            .unwrap_or_default();
        let log_path = if c.log_path().is_empty() || log_dir.is_empty() {
            c.log_path().to_owned()
        } else {
            format!("{}/{}", log_dir.trim_end_matches('/'), c.log_path())
        };
        Some(cri::ContainerStatus {
            id: self.codec.render(key),
            metadata: Some(cri::ContainerMetadata {
                name: c.name().to_owned(),
                attempt: c.attempt,
            }),
            state: c.state.cri() as i32,
            created_at: c.created,
            started_at: c.started,
            finished_at: c.finished,
            exit_code: c.exit_code,
            image: Some(cri::ImageSpec {
                image: c.image.name.to_string(),
                ..Default::default()
            }),
            image_ref: c.image.image_ref().to_owned(),
            reason: c.reason.as_str().to_owned(),
            message: c.message.as_deref().unwrap_or("").to_owned(),
            labels: c.labels().to_map(),
            annotations: c.annotations().to_map(),
            log_path,
            resources: c.resources().map(|r| cri::ContainerResources {
                linux: Some(r),
                windows: None,
            }),
            image_id: c.image.id.to_string(),
            ..Default::default()
        })
    }

    pub(crate) fn container_item(&self, key: u64) -> Option<cri::Container> {
        let c = self.containers.get(&key)?;
        Some(cri::Container {
            id: self.codec.render(key),
            pod_sandbox_id: self.codec.render(c.sandbox),
            metadata: Some(cri::ContainerMetadata {
                name: c.name().to_owned(),
                attempt: c.attempt,
            }),
            image: Some(cri::ImageSpec {
                image: c.image.name.to_string(),
                ..Default::default()
            }),
            image_ref: c.image.image_ref().to_owned(),
            state: c.state.cri() as i32,
            created_at: c.created,
            labels: c.labels().to_map(),
            annotations: c.annotations().to_map(),
            image_id: c.image.id.to_string(),
        })
    }

    /// `ListPodSandbox`: every filter field that is set must match (id or unique id prefix, state, labels).
    pub(crate) fn list_sandboxes(&self, filter: Option<&cri::PodSandboxFilter>) -> Vec<cri::PodSandbox> {
        let only = match filter.map(|f| f.id.as_str()).filter(|id| !id.is_empty()) {
            Some(id) => match ids::resolve(&self.codec, id, self.sandboxes.keys().copied(), |k| {
                self.sandboxes.contains_key(&k)
            }) {
                Some(key) => Some(key),
                None => return Vec::new(),
            },
            None => None,
        };
        self.sandboxes
            .iter()
            .filter(|(key, _)| only.is_none_or(|o| o == **key))
            .filter(|(_, sb)| {
                let Some(f) = filter else { return true };
                let state = if sb.ready {
                    cri::PodSandboxState::SandboxReady
                } else {
                    cri::PodSandboxState::SandboxNotready
                };
                f.state.as_ref().is_none_or(|s| s.state == state as i32)
                    && sb.labels().matches(&f.label_selector)
            })
            .filter_map(|(key, _)| self.sandbox_item(*key))
            .collect()
    }

    /// `ListContainers`: every filter field that is set must match (id or prefix, state, sandbox id or prefix,
    /// labels).
    pub(crate) fn list_containers(&self, filter: Option<&cri::ContainerFilter>) -> Vec<cri::Container> {
        self.select_containers(
            filter.map_or("", |f| f.id.as_str()),
            filter.map_or("", |f| f.pod_sandbox_id.as_str()),
            filter.and_then(|f| f.state.as_ref()).map(|s| s.state),
            filter.map(|f| &f.label_selector),
        )
        .into_iter()
        .filter_map(|key| self.container_item(key))
        .collect()
    }

    /// The containers matching the CRI filter fields (empty string / `None` = any).
    pub(crate) fn select_containers(
        &self,
        id: &str,
        sandbox_id: &str,
        state: Option<i32>,
        labels: Option<&std::collections::HashMap<String, String>>,
    ) -> Vec<u64> {
        let only = if id.is_empty() {
            None
        } else {
            match ids::resolve(&self.codec, id, self.containers.keys().copied(), |k| {
                self.containers.contains_key(&k)
            }) {
                Some(key) => Some(key),
                None => return Vec::new(),
            }
        };
        let sandbox = if sandbox_id.is_empty() {
            None
        } else {
            match ids::resolve(&self.codec, sandbox_id, self.sandboxes.keys().copied(), |k| {
                self.sandboxes.contains_key(&k)
            }) {
                Some(key) => Some(key),
                None => return Vec::new(),
            }
        };
        self.containers
            .iter()
            .filter(|(key, c)| {
                only.is_none_or(|o| o == **key)
                    && sandbox.is_none_or(|s| s == c.sandbox)
                    && state.is_none_or(|s| s == c.state.cri() as i32)
                    && labels.is_none_or(|l| c.labels().matches(l))
            })
            .map(|(key, _)| *key)
            .collect()
    }

    /// `ContainerStats` of one container at `now`, from its scripted usage.
    pub(crate) fn container_stats(&self, key: u64, now: i64) -> Option<cri::ContainerStats> {
        let c = self.containers.get(&key)?;
        let running = c.state == CState::Running;
        let end = if c.state == CState::Exited {
            c.finished
        } else {
            now
        };
        let elapsed = if c.state == CState::Created {
            0
        } else {
            (end - c.started).max(0)
        };
        let live = |v: f64| if running { v } else { 0.0 };
        let cores = live(c.script.cpu.at(elapsed));
        let cpu_seconds = if c.state == CState::Created {
            0.0
        } else {
            c.script.cpu.integral(elapsed)
        };
        let memory = live(c.script.memory.at(elapsed)) as u64;
        let limit = c.resources().map_or(0, |r| r.memory_limit_in_bytes);
        let disk = if c.state == CState::Created {
            0
        } else {
            c.script.disk.at(elapsed) as u64
        };
        Some(cri::ContainerStats {
            attributes: Some(cri::ContainerAttributes {
                id: self.codec.render(key),
                metadata: Some(cri::ContainerMetadata {
                    name: c.name().to_owned(),
                    attempt: c.attempt,
                }),
                labels: c.labels().to_map(),
                annotations: c.annotations().to_map(),
            }),
            cpu: Some(cri::CpuUsage {
                timestamp: now,
                usage_core_nano_seconds: u64v((cpu_seconds * 1e9) as u64),
                usage_nano_cores: u64v((cores * 1e9) as u64),
            }),
            memory: Some(cri::MemoryUsage {
                timestamp: now,
                working_set_bytes: u64v(memory),
                available_bytes: u64v(u64::try_from(limit).unwrap_or(0).saturating_sub(memory)),
                usage_bytes: u64v(memory),
                rss_bytes: u64v(memory),
                page_faults: u64v(0),
                major_page_faults: u64v(0),
            }),
            writable_layer: Some(cri::FilesystemUsage {
                timestamp: now,
                fs_id: Some(cri::FilesystemIdentifier {
                    mountpoint: CONTAINER_FS.into(),
                }),
                used_bytes: u64v(disk),
                inodes_used: u64v(disk.div_ceil(4096)),
            }),
            swap: None,
        })
    }

    /// `PodSandboxStats`: the sums over the sandbox's running containers.
    pub(crate) fn sandbox_stats(&self, key: u64, now: i64) -> Option<cri::PodSandboxStats> {
        let sb = self.sandboxes.get(&key)?;
        let containers: Vec<cri::ContainerStats> = self
            .containers_of(key)
            .filter(|k| self.containers.get(k).is_some_and(|c| c.state == CState::Running))
            .filter_map(|k| self.container_stats(k, now))
            .collect();
        let sum = |f: &dyn Fn(&cri::ContainerStats) -> Option<u64>| -> u64 {
            containers.iter().filter_map(f).sum()
        };
        let cpu_total = sum(&|s| s.cpu.as_ref()?.usage_core_nano_seconds.as_ref().map(|v| v.value));
        let cpu_now = sum(&|s| s.cpu.as_ref()?.usage_nano_cores.as_ref().map(|v| v.value));
        let memory = sum(&|s| s.memory.as_ref()?.working_set_bytes.as_ref().map(|v| v.value));
        let zero = cri::NetworkInterfaceUsage {
            name: "eth0".into(),
            rx_bytes: u64v(0),
            rx_errors: u64v(0),
            tx_bytes: u64v(0),
            tx_errors: u64v(0),
        };
        Some(cri::PodSandboxStats {
            attributes: Some(cri::PodSandboxAttributes {
                id: self.codec.render(key),
                metadata: Some(cri::PodSandboxMetadata {
                    name: sb.name().to_owned(),
                    uid: sb.uid().to_owned(),
                    namespace: sb.namespace().to_owned(),
                    attempt: sb.attempt,
                }),
                labels: sb.labels().to_map(),
                annotations: sb.annotations().to_map(),
            }),
            linux: Some(cri::LinuxPodSandboxStats {
                cpu: Some(cri::CpuUsage {
                    timestamp: now,
                    usage_core_nano_seconds: u64v(cpu_total),
                    usage_nano_cores: u64v(cpu_now),
                }),
                memory: Some(cri::MemoryUsage {
                    timestamp: now,
                    working_set_bytes: u64v(memory),
                    usage_bytes: u64v(memory),
                    rss_bytes: u64v(memory),
                    ..Default::default()
                }),
                network: Some(cri::NetworkUsage {
                    timestamp: now,
                    default_interface: Some(zero.clone()),
                    interfaces: vec![zero],
                }),
                process: Some(cri::ProcessUsage {
                    timestamp: now,
                    process_count: u64v(containers.len() as u64),
                }),
                containers,
            }),
            windows: None,
        })
    }
}
