//! Reading the desired pod out of a `Pod` object ([`DesiredPod::from_pod`]): identity, policies, containers, the
//! fields kept aside in [`PodExtras`] only where a pod has them, the QoS class and priority.

use std::sync::Arc;

use k8s_openapi::api::core::v1::{Pod, PodCondition};

use super::container::intern_containers;
use super::extract::{self, EnvCtx, container};
use super::{
    ContainerSpec, Deletion, DesiredPod, DnsConfig, DnsPolicy, EphemeralSpec, PodExtras, RestartPolicy,
    SmallMap, VolumeSpec,
};
use crate::pods::model::resources;
use crate::pods::model::security::PodSecurity;

/// Service account names, one copy each.
static NAMES: crate::density::intern::Interner<str> = crate::density::intern::Interner::new();

/// `system-cluster-critical`'s priority: pods at or above it are critical.
pub const SYSTEM_CRITICAL_PRIORITY: i32 = 2_000_000_000;

fn priority(spec: &k8s_openapi::api::core::v1::PodSpec) -> i32 {
    spec.priority
        .unwrap_or(match spec.priority_class_name.as_deref() {
            Some("system-node-critical") => SYSTEM_CRITICAL_PRIORITY + 1000,
            Some("system-cluster-critical") => SYSTEM_CRITICAL_PRIORITY,
            _ => 0,
        })
}

impl DesiredPod {
    /// Extracts the desired pod from an API object. Fails only when the object has no UID or name.
    pub fn from_pod(pod: &Pod) -> Option<Arc<Self>> {
        let meta = &pod.metadata;
        let uid = meta.uid.clone()?;
        let name = meta.name.clone()?;
        let namespace = meta.namespace.clone().unwrap_or_else(|| "default".to_owned());
        let spec = pod.spec.as_ref()?;
        let mut ctx = EnvCtx {
            name: &name,
            namespace: &namespace,
            uid: &uid,
            node: spec.node_name.as_deref().unwrap_or_default(),
            service_account: spec.service_account_name.as_deref().unwrap_or_default(),
            labels: meta.labels.as_ref(),
            annotations: meta.annotations.as_ref(),
            volumes: spec.volumes.as_deref().unwrap_or_default(),
        };
        let init_containers: Vec<ContainerSpec> = spec
            .init_containers
            .iter()
            .flatten()
            .map(|c| container(c, true, &mut ctx))
            .collect();
        let containers: Vec<ContainerSpec> = spec
            .containers
            .iter()
            .map(|c| container(c, false, &mut ctx))
            .collect();
        let readiness_gates: Vec<String> = spec
            .readiness_gates
            .iter()
            .flatten()
            .map(|g| g.condition_type.clone())
            .collect();
        let conditions: &[PodCondition] = pod
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let gate_status = readiness_gates
            .iter()
            .filter_map(|gate| {
                conditions
                    .iter()
                    .find(|c| &c.type_ == gate)
                    .map(|c| (gate.clone(), c.status == "True"))
            })
            .collect();
        let extras = PodExtras {
            readiness_gates,
            gate_status,
            runtime_class: spec.runtime_class_name.clone().unwrap_or_default(),
            subdomain: spec.subdomain.clone().unwrap_or_default(),
            host_aliases: spec
                .host_aliases
                .iter()
                .flatten()
                .map(|a| (a.ip.clone(), a.hostnames.clone().unwrap_or_default()))
                .collect(),
            image_pull_secrets: spec
                .image_pull_secrets
                .iter()
                .flatten()
                .map(|s| s.name.clone())
                .collect(),
            hostname: spec.hostname.clone().unwrap_or_default(),
            hostname_override: spec.hostname_override.clone(),
            hostname_as_fqdn: spec.set_hostname_as_fqdn.unwrap_or(false),
            active_deadline_secs: spec.active_deadline_seconds,
            overhead: resources::overhead(spec.overhead.as_ref()),
            pod_level: resources::PodLevel::from_api(spec.resources.as_ref()),
            ephemeral: spec
                .ephemeral_containers
                .iter()
                .flatten()
                .map(|e| EphemeralSpec {
                    container: container(&extract::as_container(e), false, &mut ctx),
                    target: e.target_container_name.clone(),
                })
                .collect(),
            resize_pending: None,
            extended: resources::extended_requests(
                spec.init_containers
                    .iter()
                    .flatten()
                    .chain(spec.containers.iter())
                    .map(|c| (c.name.as_str(), c.resources.as_ref())),
            ),
            hugepages: spec
                .init_containers
                .iter()
                .flatten()
                .chain(spec.containers.iter())
                .flat_map(|c| {
                    resources::hugepages_of(c.resources.as_ref())
                        .into_iter()
                        .map(|(size, bytes)| (c.name.clone(), size, bytes))
                })
                .collect(),
            pod_hugepages: resources::hugepages_of(spec.resources.as_ref()),
            resource_claims: extract::resource_claims(pod),
            container_claims: extract::container_claims(spec),
        };
        let extras = (extras != PodExtras::default()).then(|| Box::new(extras));
        // as the kubelet: pod-level resources, where the pod has them, decide alone
        let qos = match extras.as_ref().and_then(|e| e.pod_level.as_ref()) {
            Some(p) => p.qos(),
            None => resources::qos_class(init_containers.iter().chain(&containers)),
        };
        Some(Arc::new(Self {
            uid: uid.into(),
            name,
            namespace,
            generation: meta.generation,
            created: meta.creation_timestamp.as_ref().map(|t| t.0),
            labels: meta.labels.as_ref().map(SmallMap::shared).unwrap_or_default(),
            annotations: meta.annotations.as_ref().map(SmallMap::from).unwrap_or_default(),
            restart_policy: RestartPolicy::parse(spec.restart_policy.as_deref()),
            termination_grace_secs: spec.termination_grace_period_seconds.unwrap_or(30).max(0),
            deletion: meta.deletion_timestamp.as_ref().map(|t| {
                Box::new(Deletion {
                    at: t.0,
                    grace_secs: meta.deletion_grace_period_seconds,
                })
            }),
            init_containers: intern_containers(init_containers),
            containers: intern_containers(containers),
            qos,
            host_network: spec.host_network.unwrap_or(false),
            service_links: spec.enable_service_links.unwrap_or(true),
            priority: priority(spec),
            volumes: spec.volumes.iter().flatten().map(VolumeSpec::from_api).collect(),
            service_account: NAMES.intern_str(spec.service_account_name.as_deref().unwrap_or_default()),
            dns_policy: match spec.dns_policy.as_deref() {
                Some("ClusterFirstWithHostNet") => DnsPolicy::ClusterFirstWithHostNet,
                Some("Default") => DnsPolicy::Default,
                Some("None") => DnsPolicy::None,
                _ => DnsPolicy::ClusterFirst,
            },
            dns_config: spec.dns_config.as_ref().map(|c| {
                Box::new(DnsConfig {
                    nameservers: c.nameservers.clone().unwrap_or_default(),
                    searches: c.searches.clone().unwrap_or_default(),
                    options: c
                        .options
                        .iter()
                        .flatten()
                        .filter_map(|o| Some((o.name.clone()?, o.value.clone())))
                        .collect(),
                })
            }),
            security: PodSecurity::from_api(spec),
            extras,
        }))
    }
}
