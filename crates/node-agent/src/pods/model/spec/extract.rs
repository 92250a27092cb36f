//! Reading containers out of the API object: environment (literal values and pod fields), ports, probes with
//! the kubelet's defaults and named ports resolved, lifecycle hooks, resources, and the spec hash.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, HTTPGetAction, LifecycleHandler, Probe, TCPSocketAction};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;

use crate::pods::model::resources::ContainerResources;
use crate::pods::model::spec::volumes::{DeviceSpec, EnvFrom, MountSpec, resource_ref};
use crate::pods::model::spec::{
    Action, ContainerSpec, EnvValue, HttpGet, KeyRef, Port, ProbeSpec, PullPolicy,
};

pub(crate) struct EnvCtx<'a> {
    pub(crate) name: &'a str,
    pub(crate) namespace: &'a str,
    pub(crate) uid: &'a str,
    pub(crate) node: &'a str,
    pub(crate) service_account: &'a str,
    pub(crate) labels: Option<&'a BTreeMap<String, String>>,
    pub(crate) annotations: Option<&'a BTreeMap<String, String>>,
    /// `spec.volumes`, which mounts refer to by index.
    pub(crate) volumes: &'a [k8s_openapi::api::core::v1::Volume],
}

impl EnvCtx<'_> {
    fn field(&self, path: &str) -> Option<EnvValue> {
        let lit = |s: &str| Some(EnvValue::Literal(s.to_owned()));
        match path {
            "metadata.name" => lit(self.name),
            "metadata.namespace" => lit(self.namespace),
            "metadata.uid" => lit(self.uid),
            "spec.nodeName" => lit(self.node),
            "spec.serviceAccountName" => lit(self.service_account),
            "status.podIP" | "status.podIPs" => Some(EnvValue::PodIp),
            "status.hostIP" | "status.hostIPs" => Some(EnvValue::HostIp),
            _ => {
                let key = |prefix: &str| path.strip_prefix(prefix)?.strip_suffix("']");
                if let Some(k) = key("metadata.labels['") {
                    return lit(self
                        .labels
                        .and_then(|l| l.get(k))
                        .map(String::as_str)
                        .unwrap_or_default());
                }
                if let Some(k) = key("metadata.annotations['") {
                    return lit(self
                        .annotations
                        .and_then(|a| a.get(k))
                        .map(String::as_str)
                        .unwrap_or_default());
                }
                None
            }
        }
    }
}

/// An ephemeral container as a container: the fields they share (the API server refuses ports, probes, hooks,
/// resources and restart policies on ephemeral containers).
pub(crate) fn as_container(e: &k8s_openapi::api::core::v1::EphemeralContainer) -> Container {
    Container {
        name: e.name.clone(),
        image: e.image.clone(),
        image_pull_policy: e.image_pull_policy.clone(),
        command: e.command.clone(),
        args: e.args.clone(),
        working_dir: e.working_dir.clone(),
        env: e.env.clone(),
        env_from: e.env_from.clone(),
        volume_mounts: e.volume_mounts.clone(),
        volume_devices: e.volume_devices.clone(),
        security_context: e.security_context.clone(),
        stdin: e.stdin,
        stdin_once: e.stdin_once,
        tty: e.tty,
        termination_message_path: e.termination_message_path.clone(),
        termination_message_policy: e.termination_message_policy.clone(),
        ..Default::default()
    }
}

pub(crate) fn container(c: &Container, init: bool, ctx: &mut EnvCtx<'_>) -> ContainerSpec {
    let image = c.image.clone().unwrap_or_default();
    let ports: Vec<(i32, i32, String)> = c
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.container_port,
                p.host_port.unwrap_or(0),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
            )
        })
        .collect();
    let resolve = |port: &IntOrString| -> Port {
        match port {
            IntOrString::Int(n) => u16::try_from(*n).unwrap_or(0),
            IntOrString::String(name) => c
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name.as_str()))
                .and_then(|p| u16::try_from(p.container_port).ok())
                .or_else(|| name.parse().ok())
                .unwrap_or(0),
        }
    };
    let env = c
        .env
        .iter()
        .flatten()
        .filter_map(
            |e| match (e.value.as_deref().filter(|v| !v.is_empty()), &e.value_from) {
                (None, Some(from)) => {
                    let key_ref = |name: &Option<String>, key: &str, optional: Option<bool>| {
                        Box::new(KeyRef {
                            name: name.clone().unwrap_or_default(),
                            key: key.to_owned(),
                            optional: optional.unwrap_or(false),
                        })
                    };
                    let value = if let Some(f) = &from.field_ref {
                        ctx.field(&f.field_path)?
                    } else if let Some(r) = &from.resource_field_ref {
                        EnvValue::Resource(Box::new(resource_ref(r)))
                    } else if let Some(c) = &from.config_map_key_ref {
                        EnvValue::ConfigMapKey(key_ref(&Some(c.name.clone()), &c.key, c.optional))
                    } else if let Some(s) = &from.secret_key_ref {
                        EnvValue::SecretKey(key_ref(&Some(s.name.clone()), &s.key, s.optional))
                    } else {
                        return None;
                    };
                    Some((e.name.clone(), value))
                }
                (Some(v), _) if v.contains('$') => Some((e.name.clone(), EnvValue::Expand(v.to_owned()))),
                (value, _) => Some((
                    e.name.clone(),
                    EnvValue::Literal(value.unwrap_or_default().to_owned()),
                )),
            },
        )
        .collect();
    let env_from = c
        .env_from
        .iter()
        .flatten()
        .filter_map(|f| {
            let prefix = f.prefix.clone().unwrap_or_default();
            if let Some(s) = &f.secret_ref {
                Some(EnvFrom {
                    secret: true,
                    name: s.name.clone(),
                    prefix,
                    optional: s.optional.unwrap_or(false),
                })
            } else {
                f.config_map_ref.as_ref().map(|m| EnvFrom {
                    secret: false,
                    name: m.name.clone(),
                    prefix,
                    optional: m.optional.unwrap_or(false),
                })
            }
        })
        .collect();
    let mounts = c
        .volume_mounts
        .iter()
        .flatten()
        .map(|m| MountSpec::from_api(m, ctx.volumes))
        .collect();
    let devices = c
        .volume_devices
        .iter()
        .flatten()
        .map(|d| DeviceSpec::from_api(d, ctx.volumes))
        .collect();
    let lifecycle = c.lifecycle.as_ref();
    let hash = {
        let mut h = Fnv::new();
        for part in [
            c.name.as_str(),
            image.as_str(),
            c.working_dir.as_deref().unwrap_or_default(),
        ] {
            h.write(part);
        }
        for part in c.command.iter().flatten().chain(c.args.iter().flatten()) {
            h.write(part);
        }
        for e in c.env.iter().flatten() {
            h.write(&e.name);
            h.write(e.value.as_deref().unwrap_or_default());
        }
        for (cp, hp, proto) in &ports {
            h.write(&format!("{cp}/{hp}/{proto}"));
        }
        h.finish()
    };
    ContainerSpec {
        pull_policy: PullPolicy::parse(c.image_pull_policy.as_deref(), &image),
        image,
        name: c.name.clone(),
        command: c.command.clone().unwrap_or_default(),
        args: c.args.clone().unwrap_or_default(),
        working_dir: c.working_dir.clone().unwrap_or_default(),
        env,
        env_from,
        mounts,
        devices,
        readiness: c
            .readiness_probe
            .as_ref()
            .and_then(|p| probe(p, &resolve))
            .map(Box::new),
        liveness: c
            .liveness_probe
            .as_ref()
            .and_then(|p| probe(p, &resolve))
            .map(Box::new),
        startup: c
            .startup_probe
            .as_ref()
            .and_then(|p| probe(p, &resolve))
            .map(Box::new),
        post_start: lifecycle
            .and_then(|l| l.post_start.as_ref())
            .and_then(|h| handler(h, &resolve))
            .map(Box::new),
        pre_stop: lifecycle
            .and_then(|l| l.pre_stop.as_ref())
            .and_then(|h| handler(h, &resolve))
            .map(Box::new),
        sidecar: init && c.restart_policy.as_deref() == Some("Always"),
        resources: ContainerResources::from_api(c.resources.as_ref()),
        resize_restart: crate::pods::model::spec::ResizeRestart::from_api(c.resize_policy.as_deref()),
        termination_message_path: c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| "/dev/termination-log".to_owned()),
        termination_fallback_to_logs: c.termination_message_policy.as_deref()
            == Some(crate::pods::model::spec::FALLBACK_TO_LOGS),
        tty: c.tty.unwrap_or(false),
        stdin: c.stdin.unwrap_or(false),
        stdin_once: c.stdin_once.unwrap_or(false),
        ports,
        security: crate::pods::model::security::ContainerSecurity::from_api(c.security_context.as_ref()),
        hash,
    }
}

fn http_get(h: &HTTPGetAction, resolve: &dyn Fn(&IntOrString) -> Port) -> Action {
    let path = h.path.clone().unwrap_or_default();
    Action::Http(HttpGet {
        https: h
            .scheme
            .as_deref()
            .is_some_and(|s| s.eq_ignore_ascii_case("https")),
        host: h.host.clone().filter(|s| !s.is_empty()),
        port: resolve(&h.port),
        path: if path.starts_with('/') {
            path
        } else {
            format!("/{path}")
        },
        headers: h
            .http_headers
            .iter()
            .flatten()
            .map(|x| (x.name.clone(), x.value.clone()))
            .collect(),
    })
}

fn tcp(t: &TCPSocketAction, resolve: &dyn Fn(&IntOrString) -> Port) -> Action {
    Action::Tcp {
        host: t.host.clone().filter(|s| !s.is_empty()),
        port: resolve(&t.port),
    }
}

fn secs(value: Option<i32>, default: u64, min: u64) -> Duration {
    Duration::from_secs(
        value
            .and_then(|v| u64::try_from(v).ok())
            .unwrap_or(default)
            .max(min),
    )
}

fn probe(p: &Probe, resolve: &dyn Fn(&IntOrString) -> Port) -> Option<ProbeSpec> {
    let action = if let Some(exec) = &p.exec {
        Action::Exec(exec.command.clone().unwrap_or_default())
    } else if let Some(h) = &p.http_get {
        http_get(h, resolve)
    } else if let Some(t) = &p.tcp_socket {
        tcp(t, resolve)
    } else if let Some(g) = &p.grpc {
        Action::Grpc {
            port: u16::try_from(g.port).unwrap_or(0),
            service: g.service.clone().unwrap_or_default(),
        }
    } else {
        return None;
    };
    let threshold =
        |v: Option<i32>, default: u32| v.and_then(|v| u32::try_from(v).ok()).unwrap_or(default).max(1);
    Some(ProbeSpec {
        action,
        initial_delay: secs(p.initial_delay_seconds, 0, 0),
        period: secs(p.period_seconds, 10, 1),
        timeout: secs(p.timeout_seconds, 1, 1),
        success_threshold: threshold(p.success_threshold, 1),
        failure_threshold: threshold(p.failure_threshold, 3),
        termination_grace_secs: p.termination_grace_period_seconds,
    })
}

fn handler(h: &LifecycleHandler, resolve: &dyn Fn(&IntOrString) -> Port) -> Option<Action> {
    if let Some(exec) = &h.exec {
        Some(Action::Exec(exec.command.clone().unwrap_or_default()))
    } else if let Some(g) = &h.http_get {
        Some(http_get(g, resolve))
    } else if let Some(s) = &h.sleep {
        Some(Action::Sleep(Duration::from_secs(
            u64::try_from(s.seconds).unwrap_or(0),
        )))
    } else {
        h.tcp_socket.as_ref().map(|t| tcp(t, resolve))
    }
}

/// FNV-1a, 64 bit: a stable hash (the same across builds and restarts), used for the container hash
/// annotation that a restarted agent compares against.
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Self(0xcbf2_9ce4_8422_2325)
    }

    fn write(&mut self, s: &str) {
        for b in s.bytes().chain(std::iter::once(0xff)) {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// `spec.resourceClaims`, each resolved to its ResourceClaim as the kubelet resolves it: a named claim is that
/// claim; one from a template is the claim the pod's `status.resourceClaimStatuses` names for it (none named
/// there: no claim was needed; no entry: the claim is not created yet).
pub(super) fn resource_claims(pod: &k8s_openapi::api::core::v1::Pod) -> Vec<crate::dra::PodClaim> {
    use crate::dra::manager::ClaimName;
    let statuses = pod
        .status
        .as_ref()
        .and_then(|s| s.resource_claim_statuses.as_deref())
        .unwrap_or_default();
    pod.spec
        .iter()
        .flat_map(|s| s.resource_claims.iter().flatten())
        .map(|c| {
            let claim = if let Some(name) = &c.resource_claim_name {
                ClaimName::Named(name.clone())
            } else if c.resource_claim_template_name.is_some() {
                match statuses.iter().find(|s| s.name == c.name) {
                    Some(s) => s
                        .resource_claim_name
                        .clone()
                        .map_or(ClaimName::NotNeeded, ClaimName::Generated),
                    None => ClaimName::NotCreatedYet,
                }
            } else {
                ClaimName::Unsupported
            };
            crate::dra::PodClaim {
                name: c.name.clone(),
                claim,
            }
        })
        .collect()
}

/// Per container naming claims in `resources.claims`, its (claim, request) pairs.
pub(super) fn container_claims(
    spec: &k8s_openapi::api::core::v1::PodSpec,
) -> Vec<(String, Vec<(String, String)>)> {
    let named = |name: &str, r: Option<&k8s_openapi::api::core::v1::ResourceRequirements>| {
        let claims: Vec<(String, String)> = r
            .and_then(|r| r.claims.as_deref())
            .unwrap_or_default()
            .iter()
            .map(|c| (c.name.clone(), c.request.clone().unwrap_or_default()))
            .collect();
        (!claims.is_empty()).then(|| (name.to_owned(), claims))
    };
    let init = spec.init_containers.iter().flatten();
    init.chain(&spec.containers)
        .filter_map(|c| named(&c.name, c.resources.as_ref()))
        .chain(
            spec.ephemeral_containers
                .iter()
                .flatten()
                .filter_map(|c| named(&c.name, c.resources.as_ref())),
        )
        .collect()
}
