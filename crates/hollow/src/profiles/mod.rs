//! Node profiles: what kinds of hollow nodes a fleet has, and which node gets which.
//!
//! A profile file is YAML:
//!
//! ```yaml
//! profiles:
//!   - name: gpu
//!     count: 10                 # exactly one of count, percent, weight
//!     capacity: {cpu: "16", memory: 64Gi, pods: "110", ephemeral-storage: 200Gi, nvidia.com/gpu: "4"}
//!     labels: {accelerator: nvidia}
//!     taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
//!     zones: [zone-a, zone-b]   # topology.kubernetes.io/zone, round robin over the profile's nodes
//!     devicePlugins:            # fake device plugins: capacity and allocatable from their devices, devices
//!                               # given to pods through the agent's device manager
//!       - {resource: example.com/fpga, count: 2, flapEvery: 60s}   # flapEvery: one device unhealthy in turn
//!     dra: {driver: gpu.example.com, devices: 8, prepareLatency: 200ms}   # a DRA driver (crate::dra)
//!     csi: {driver: hollow.csi.node-agent.io, maxVolumes: 64}   # a CSI driver (crate::csi)
//!   - name: general
//!     weight: 1                 # the rest of the fleet, split by weight
//!     capacity: {cpu: "8", memory: 32Gi, pods: "110"}
//!     baseline: {cpu: 80m, memory: 640Mi}   # what the machine uses without pods (default: 1% of the CPU,
//!                                           # 2% of the memory capacity)
//!     staticPods:               # run on every node of the profile as static pods, mirrored in the API
//!       - apiVersion: v1
//!         kind: Pod
//!         metadata: {name: kube-proxy, namespace: kube-system, labels: {k8s-app: kube-proxy}}
//!         spec:
//!           priorityClassName: system-node-critical
//!           hostNetwork: true
//!           containers: [{name: kube-proxy, image: registry.k8s.io/kube-proxy:v1.36.3}]
//! ```
//!
//! The file may also hold a `chaos:` section (runtime outages, flapping, churn; see [`crate::chaos`]):
//!
//! ```yaml
//! chaos:
//!   runtimeDown: {fraction: 0.1, duration: 30s, every: 5m}
//!   flapping: {fraction: 0.02, duration: 90s, every: 10m}
//!   churn: {nodes: 20, perMinute: 4}
//! ```
//!
//! [`assign`] turns profiles and a fleet size into one [`Assignment`] per node: counts first, then
//! percentages of the fleet, then the remainder split by weight; nodes get profiles in contiguous blocks, in
//! file order, so node `i` always gets the same profile for the same file and size.

pub mod chaos;

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

/// Errors reading or applying a profile file.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The YAML is malformed or has unknown fields.
    #[error("parsing {path}: {source}")]
    Parse {
        /// The file.
        path: String,
        /// Why.
        #[source]
        source: serde_yaml::Error,
    },
    /// A profile is invalid.
    #[error("profiles[{index}] ({name}): {message}")]
    Invalid {
        /// Position in the file.
        index: usize,
        /// The profile's name.
        name: String,
        /// What is wrong.
        message: String,
    },
    /// The chaos section is invalid.
    #[error("{path}: chaos.{source}")]
    Chaos {
        /// The file.
        path: String,
        /// What is wrong.
        #[source]
        source: chaos::ChaosError,
    },
    /// The counts and percentages ask for more nodes than the fleet has, or nothing covers the rest.
    #[error("profiles do not fit a fleet of {nodes} nodes: {message}")]
    Fit {
        /// Fleet size.
        nodes: usize,
        /// What is wrong.
        message: String,
    },
}

/// A taint as written in a profile.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct TaintSpec {
    /// Taint key.
    pub key: String,
    /// Taint value.
    #[serde(default)]
    pub value: Option<String>,
    /// NoSchedule, PreferNoSchedule or NoExecute.
    pub effect: String,
}

/// A node's usage besides its pods, as written in a profile (Kubernetes quantities).
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct BaselineSpec {
    /// CPU, e.g. `80m`.
    #[serde(default)]
    pub cpu: Option<String>,
    /// Memory working set, e.g. `640Mi`.
    #[serde(default)]
    pub memory: Option<String>,
}

/// One kind of node.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Name (shown in logs and the `hollow.node-agent.io/profile` label).
    pub name: String,
    /// Exactly this many nodes.
    #[serde(default)]
    pub count: Option<usize>,
    /// This percentage of the fleet (rounded down).
    #[serde(default)]
    pub percent: Option<f64>,
    /// A share of the nodes left after counts and percentages.
    #[serde(default)]
    pub weight: Option<u32>,
    /// Capacity: cpu, memory, pods, ephemeral-storage and extended resources (e.g. nvidia.com/gpu).
    #[serde(default)]
    pub capacity: BTreeMap<String, String>,
    /// Extra node labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Taints to register with.
    #[serde(default)]
    pub taints: Vec<TaintSpec>,
    /// Zones, assigned round robin (label `topology.kubernetes.io/zone`).
    #[serde(default)]
    pub zones: Vec<String>,
    /// What each node uses besides its pods (system daemons, runtime, agent): its node CPU and memory are this
    /// plus its pods', as a kubelet reports the machine's own usage. Default: 1% of the CPU and 2% of the memory
    /// capacity.
    #[serde(default)]
    pub baseline: BaselineSpec,
    /// Pod manifests every node of the profile runs as static pods (named `<name>-<node>`, with mirror pods
    /// in the API server, as a kubelet's `staticPodPath` gives them).
    #[serde(default, rename = "staticPods")]
    pub static_pods: Vec<serde_yaml::Value>,
    /// Fake device plugins every node of the profile has: their devices are the node's capacity and
    /// allocatable of the resource, and pods asking for it are given devices through the agent's device
    /// manager.
    #[serde(default, rename = "devicePlugins")]
    pub device_plugins: Vec<DevicePluginSpec>,
    /// A DRA driver on every node of the profile (see [`crate::dra`]).
    #[serde(default)]
    pub dra: Option<crate::dra::DraSpec>,
    /// A CSI driver on every node of the profile (see [`crate::csi`]).
    #[serde(default)]
    pub csi: Option<crate::csi::CsiSpec>,
}

/// A fake device plugin as written in a profile.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct DevicePluginSpec {
    /// The extended resource (`example.com/gpu`).
    pub resource: String,
    /// How many devices each node has.
    pub count: u32,
    /// Every this long the next device turns unhealthy and the one before healthy again (`30s`), so one device
    /// is out of allocatable from the first period on; absent: always healthy.
    #[serde(default, rename = "flapEvery", with = "crate::duration::text_opt")]
    pub flap_every: Option<std::time::Duration>,
}

impl Profile {
    /// The profile's static pod manifests, decoded; each with the name that stands for its file
    /// (`profile/<profile>/<index>`).
    pub fn static_manifests(
        &self,
    ) -> Result<
        Vec<(String, k8s_openapi::api::core::v1::Pod)>,
        node_agent::pods::static_pods::manifest::ManifestError,
    > {
        use node_agent::pods::static_pods::manifest;
        self.static_pods
            .iter()
            .enumerate()
            .map(|(i, value)| {
                let text = serde_yaml::to_string(value).unwrap_or_default();
                let mut pods = manifest::decode(&text, false).map_err(|e| manifest::ManifestError {
                    field: format!("staticPods[{i}].{}", e.field),
                    message: e.message,
                })?;
                let pod = pods.pop().ok_or_else(|| manifest::ManifestError {
                    field: format!("staticPods[{i}]"),
                    message: "no pod".into(),
                })?;
                // the checks the agent applies, on a throw-away node name
                manifest::prepare(pod.clone(), manifest::Origin::File("profile"), "check").map_err(|e| {
                    manifest::ManifestError {
                        field: format!("staticPods[{i}].{}", e.field),
                        message: e.message,
                    }
                })?;
                Ok((format!("profile/{}/{i}", self.name), pod))
            })
            .collect()
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ProfileFile {
    profiles: Vec<Profile>,
    #[serde(default)]
    chaos: chaos::ChaosSpec,
}

/// The default fleet: one profile, 8 CPUs, 32 GiB, 110 pods.
pub fn default_profiles() -> Vec<Profile> {
    vec![Profile {
        name: "default".into(),
        count: None,
        percent: None,
        weight: Some(1),
        capacity: [
            ("cpu", "8"),
            ("memory", "32Gi"),
            ("pods", "110"),
            ("ephemeral-storage", "100Gi"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
        labels: BTreeMap::new(),
        taints: Vec::new(),
        zones: Vec::new(),
        baseline: BaselineSpec::default(),
        static_pods: Vec::new(),
        device_plugins: Vec::new(),
        dra: None,
        csi: None,
    }]
}

/// Reads and checks a profile file.
pub fn load(path: &Path) -> Result<Vec<Profile>, ProfileError> {
    Ok(load_with_chaos(path)?.0)
}

/// Reads and checks a profile file with its optional chaos section.
pub fn load_with_chaos(path: &Path) -> Result<(Vec<Profile>, chaos::ChaosSpec), ProfileError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| ProfileError::Read {
        path: p.clone(),
        source,
    })?;
    parse_with_chaos(&text, &p)
}

/// Parses and checks profile YAML (`origin` names it in errors).
pub fn parse(text: &str, origin: &str) -> Result<Vec<Profile>, ProfileError> {
    Ok(parse_with_chaos(text, origin)?.0)
}

/// Parses and checks profile YAML and its optional chaos section.
pub fn parse_with_chaos(text: &str, origin: &str) -> Result<(Vec<Profile>, chaos::ChaosSpec), ProfileError> {
    let file: ProfileFile = serde_yaml::from_str(text).map_err(|source| ProfileError::Parse {
        path: origin.to_owned(),
        source,
    })?;
    for (index, p) in file.profiles.iter().enumerate() {
        let invalid = |message: String| ProfileError::Invalid {
            index,
            name: p.name.clone(),
            message,
        };
        let shares = [p.count.is_some(), p.percent.is_some(), p.weight.is_some()]
            .iter()
            .filter(|b| **b)
            .count();
        if shares != 1 {
            return Err(invalid("set exactly one of count, percent, weight".into()));
        }
        if let Some(dra) = &p.dra {
            dra.check().map_err(invalid)?;
        }
        if let Some(csi) = &p.csi {
            csi.check().map_err(invalid)?;
        }
        if let Some(pc) = p.percent
            && !(0.0..=100.0).contains(&pc)
        {
            return Err(invalid(format!("percent {pc} is not within 0..100")));
        }
        for (k, v) in &p.capacity {
            node_agent::quantity::Quantity::from_api(
                &k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.clone()),
            )
            .map_err(|e| invalid(format!("capacity.{k}: {e}")))?;
        }
        for (k, v) in [("cpu", &p.baseline.cpu), ("memory", &p.baseline.memory)] {
            if let Some(v) = v {
                let q = node_agent::quantity::Quantity::from_api(
                    &k8s_openapi::apimachinery::pkg::api::resource::Quantity(v.clone()),
                )
                .map_err(|e| invalid(format!("baseline.{k}: {e}")))?;
                if q.milli() <= 0 {
                    return Err(invalid(format!(
                        "baseline.{k}: {v} is not above zero (metrics-server drops a node reporting 0)"
                    )));
                }
            }
        }
        for t in &p.taints {
            if !matches!(t.effect.as_str(), "NoSchedule" | "PreferNoSchedule" | "NoExecute") {
                return Err(invalid(format!("taint {}: unknown effect {:?}", t.key, t.effect)));
            }
        }
        p.static_manifests().map_err(|e| invalid(e.to_string()))?;
        for d in &p.device_plugins {
            if !node_agent::devices::registration::is_extended_resource(&d.resource) {
                return Err(invalid(format!(
                    "devicePlugins: {:?} is not an extended resource name (e.g. example.com/gpu)",
                    d.resource
                )));
            }
            if p.capacity.contains_key(&d.resource) {
                return Err(invalid(format!(
                    "devicePlugins: {} is also in capacity; a device plugin's resource is counted from its devices",
                    d.resource
                )));
            }
            if d.flap_every.is_some_and(|e| e.is_zero()) {
                return Err(invalid(format!(
                    "devicePlugins: {}: flapEvery must be above zero",
                    d.resource
                )));
            }
        }
    }
    if file.profiles.is_empty() {
        return Err(ProfileError::Fit {
            nodes: 0,
            message: "no profiles".into(),
        });
    }
    file.chaos.validate().map_err(|source| ProfileError::Chaos {
        path: origin.to_owned(),
        source,
    })?;
    Ok((file.profiles, file.chaos))
}

/// Which profile a node has, and its zone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    /// Index into the profile list.
    pub profile: usize,
    /// Zone, if the profile has zones.
    pub zone: Option<String>,
}

/// One assignment per node for a fleet of `nodes`.
pub fn assign(profiles: &[Profile], nodes: usize) -> Result<Vec<Assignment>, ProfileError> {
    let mut counts = vec![0usize; profiles.len()];
    let mut fixed = 0usize;
    for (i, p) in profiles.iter().enumerate() {
        if let Some(c) = p.count {
            counts[i] = c;
        } else if let Some(pc) = p.percent {
            // whole nodes only: round down
            counts[i] = ((nodes as f64) * pc / 100.0).floor() as usize;
        } else {
            continue;
        }
        fixed += counts[i];
    }
    if fixed > nodes {
        return Err(ProfileError::Fit {
            nodes,
            message: format!("counts and percentages ask for {fixed} nodes"),
        });
    }
    let rest = nodes - fixed;
    let total_weight: u64 = profiles.iter().filter_map(|p| p.weight).map(u64::from).sum();
    if rest > 0 {
        if total_weight == 0 {
            return Err(ProfileError::Fit {
                nodes,
                message: format!("{rest} nodes left over and no profile has a weight"),
            });
        }
        let mut given = 0usize;
        let weighted: Vec<usize> = (0..profiles.len())
            .filter(|i| profiles[*i].weight.is_some())
            .collect();
        for (n, i) in weighted.iter().enumerate() {
            let w = u64::from(profiles[*i].weight.unwrap_or(0));
            let share = if n + 1 == weighted.len() {
                rest - given
            } else {
                usize::try_from((rest as u64) * w / total_weight).unwrap_or(0)
            };
            counts[*i] = share;
            given += share;
        }
    }
    let mut out = Vec::with_capacity(nodes);
    for (i, c) in counts.iter().enumerate() {
        let zones = &profiles[i].zones;
        for k in 0..*c {
            let zone = (!zones.is_empty()).then(|| zones[k % zones.len()].clone());
            out.push(Assignment { profile: i, zone });
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = r#"
profiles:
  - name: gpu
    count: 3
    capacity: {cpu: "16", memory: 64Gi, nvidia.com/gpu: "4"}
    taints: [{key: nvidia.com/gpu, value: present, effect: NoSchedule}]
    zones: [a, b]
  - name: big
    percent: 10
    capacity: {cpu: "64"}
  - name: small
    weight: 1
  - name: medium
    weight: 3
"#;

    #[test]
    fn counts_then_percentages_then_weights() {
        let profiles = parse(FILE, "test").unwrap();
        let a = assign(&profiles, 43).unwrap();
        assert_eq!(a.len(), 43);
        let per = |p: usize| a.iter().filter(|x| x.profile == p).count();
        assert_eq!(per(0), 3);
        assert_eq!(per(1), 4); // 10% of 43, rounded down
        assert_eq!(per(2), 9); // 36 left: 1/4 of them
        assert_eq!(per(3), 27);
        let zones: Vec<_> = a
            .iter()
            .filter(|x| x.profile == 0)
            .map(|x| x.zone.clone().unwrap())
            .collect();
        assert_eq!(zones, ["a", "b", "a"]);
        // stable: node i keeps its profile
        assert_eq!(assign(&profiles, 43).unwrap(), a);
    }

    #[test]
    fn bad_profiles_name_what_is_wrong() {
        let two = "profiles:\n  - {name: x, count: 1, weight: 2}\n";
        assert!(
            parse(two, "t")
                .unwrap_err()
                .to_string()
                .contains("profiles[0] (x): set exactly one")
        );
        let chaos = "profiles:\n  - {name: x, weight: 1}\nchaos:\n  churn: {nodes: 0, perMinute: 1}\n";
        assert_eq!(
            parse(chaos, "t.yaml").unwrap_err().to_string(),
            "t.yaml: chaos.churn: per-minute must be above zero and nodes at least 1"
        );
        let unknown = "profiles:\n  - {name: x, weight: 1, colour: red}\n";
        assert!(parse(unknown, "t").unwrap_err().to_string().contains("colour"));
        let quantity = "profiles:\n  - {name: x, weight: 1, capacity: {cpu: lots}}\n";
        assert!(
            parse(quantity, "t")
                .unwrap_err()
                .to_string()
                .contains("capacity.cpu")
        );
        let zero = "profiles:\n  - {name: x, weight: 1, baseline: {cpu: \"0\"}}\n";
        let err = parse(zero, "t").unwrap_err().to_string();
        assert!(err.contains("baseline.cpu: 0 is not above zero"), "{err}");
        let bad = "profiles:\n  - {name: x, weight: 1, baseline: {memory: much}}\n";
        assert!(
            parse(bad, "t")
                .unwrap_err()
                .to_string()
                .contains("baseline.memory")
        );
        let typo = "profiles:\n  - {name: x, weight: 1, baseline: {cpus: 1}}\n";
        assert!(parse(typo, "t").unwrap_err().to_string().contains("cpus"));
        let fine = "profiles:\n  - {name: x, weight: 1, baseline: {cpu: 50m, memory: 300Mi}}\n";
        assert_eq!(
            parse(fine, "t").unwrap()[0].baseline,
            BaselineSpec {
                cpu: Some("50m".into()),
                memory: Some("300Mi".into())
            }
        );
        let effect = "profiles:\n  - {name: x, weight: 1, taints: [{key: k, effect: Never}]}\n";
        assert!(
            parse(effect, "t")
                .unwrap_err()
                .to_string()
                .contains("unknown effect")
        );
        let too_many = parse("profiles:\n  - {name: x, count: 5}\n", "t").unwrap();
        assert!(
            assign(&too_many, 3)
                .unwrap_err()
                .to_string()
                .contains("ask for 5")
        );
        assert!(
            assign(&too_many, 7)
                .unwrap_err()
                .to_string()
                .contains("2 nodes left over")
        );
    }
}
