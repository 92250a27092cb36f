//! The devices a container was given, written into its CRI config as the kubelet writes them: the device
//! plugins' environment variables after the container's own, their mounts after the volumes, their device
//! nodes, their annotations beside the kubelet's, and their CDI device names.

use runtime_api::cri;

use crate::devices::Allocation;

/// Adds `allocation` to `config`.
pub fn apply(config: &mut cri::ContainerConfig, allocation: &Allocation) {
    for (key, value) in &allocation.envs {
        // a plugin's variable replaces one of the same name from the spec, as the kubelet's run options do
        config.envs.retain(|e| &e.key != key);
        config.envs.push(cri::KeyValue {
            key: key.clone(),
            value: value.clone(),
        });
    }
    for (container_path, host_path, read_only) in &allocation.mounts {
        config.mounts.push(cri::Mount {
            container_path: container_path.clone(),
            host_path: host_path.clone(),
            readonly: *read_only,
            ..Default::default()
        });
    }
    for (container_path, host_path, permissions) in &allocation.devices {
        config.devices.push(cri::Device {
            container_path: container_path.clone(),
            host_path: host_path.clone(),
            permissions: permissions.clone(),
        });
    }
    for (key, value) in &allocation.annotations {
        config.annotations.insert(key.clone(), value.clone());
    }
    for name in &allocation.cdi_devices {
        config.cdi_devices.push(cri::CdiDevice { name: name.clone() });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    #[test]
    fn a_plugins_answer_lands_in_the_container_config() {
        let mut config = cri::ContainerConfig {
            envs: vec![cri::KeyValue {
                key: "DEVICE".into(),
                value: "from-spec".into(),
            }],
            ..Default::default()
        };
        let allocation = Allocation {
            envs: BTreeMap::from([("DEVICE".to_owned(), "d1".to_owned())]),
            mounts: vec![("/in".into(), "/tmp/d1".into(), true)],
            devices: vec![("/dev/x".into(), "/dev/null".into(), "rw".into())],
            annotations: BTreeMap::from([("a".to_owned(), "b".to_owned())]),
            cdi_devices: vec!["example.com/resource=d1".into()],
        };
        apply(&mut config, &allocation);
        assert_eq!(config.envs.len(), 1);
        assert_eq!(config.envs[0].value, "d1");
        assert_eq!(config.mounts[0].host_path, "/tmp/d1");
        assert!(config.mounts[0].readonly);
        assert_eq!(config.devices[0].permissions, "rw");
        assert_eq!(config.annotations["a"], "b");
        assert_eq!(config.cdi_devices[0].name, "example.com/resource=d1");
    }
}
