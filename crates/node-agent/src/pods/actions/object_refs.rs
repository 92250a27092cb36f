//! Which ConfigMaps and Secrets a pod names ([`referenced`]): what the kubelet's managers register for a pod,
//! so each object is followed while a pod naming it runs and let go when the last such pod is done.
//!
//! A pod names an object through a `configMap` / `secret` volume, a projected volume's sources, an inline CSI
//! volume's `nodePublishSecretRef`, an environment variable's `configMapKeyRef` / `secretKeyRef` or an
//! `envFrom` of any container (init, app, ephemeral), and its `imagePullSecrets`.

use crate::pods::actions::object_data::ObjectKind;
use crate::pods::model::spec::volumes::{Projection, VolumeSource};
use crate::pods::model::spec::{ContainerSpec, DesiredPod, EnvValue};

/// Every object `pod` names, each once, in the pod's namespace.
pub(crate) fn referenced(pod: &DesiredPod) -> Vec<(ObjectKind, &str)> {
    let mut refs: Vec<(ObjectKind, &str)> = Vec::new();
    for volume in pod.volumes.iter() {
        match &*volume.source {
            VolumeSource::ConfigMap(v) => refs.push((ObjectKind::ConfigMap, &v.name)),
            VolumeSource::Secret(v) => refs.push((ObjectKind::Secret, &v.name)),
            VolumeSource::Projected(sources) => {
                for source in sources {
                    match source {
                        Projection::ConfigMap(v) => refs.push((ObjectKind::ConfigMap, &v.name)),
                        Projection::Secret(v) => refs.push((ObjectKind::Secret, &v.name)),
                        _ => {}
                    }
                }
            }
            VolumeSource::Csi(csi) => {
                if let Some(name) = &csi.node_publish_secret {
                    refs.push((ObjectKind::Secret, name));
                }
            }
            _ => {}
        }
    }
    let containers = pod
        .init_containers
        .iter()
        .chain(pod.containers.iter())
        .chain(pod.ephemeral().iter().map(|e| &e.container));
    for container in containers {
        container_refs(container, &mut refs);
    }
    for name in pod.image_pull_secrets() {
        refs.push((ObjectKind::Secret, name));
    }
    refs.retain(|(_, name)| !name.is_empty());
    refs.sort_unstable();
    refs.dedup();
    refs
}

fn container_refs<'a>(container: &'a ContainerSpec, refs: &mut Vec<(ObjectKind, &'a str)>) {
    for (_, value) in &container.env {
        match value {
            EnvValue::ConfigMapKey(r) => refs.push((ObjectKind::ConfigMap, &r.name)),
            EnvValue::SecretKey(r) => refs.push((ObjectKind::Secret, &r.name)),
            _ => {}
        }
    }
    for from in &container.env_from {
        let kind = if from.secret {
            ObjectKind::Secret
        } else {
            ObjectKind::ConfigMap
        };
        refs.push((kind, &from.name));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn every_way_a_pod_names_an_object_counts_once() {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {
                "imagePullSecrets": [{"name": "pull"}],
                "volumes": [
                    {"name": "a", "configMap": {"name": "settings"}},
                    {"name": "b", "secret": {"secretName": "creds"}},
                    {"name": "c", "projected": {"sources": [
                        {"configMap": {"name": "kube-root-ca.crt"}},
                        {"secret": {"name": "creds"}},
                        {"serviceAccountToken": {"path": "token"}},
                    ]}},
                    {"name": "d", "csi": {"driver": "x", "nodePublishSecretRef": {"name": "csi-creds"}}},
                    {"name": "e", "emptyDir": {}},
                ],
                "initContainers": [{"name": "i", "image": "img",
                    "envFrom": [{"configMapRef": {"name": "init-env"}}]}],
                "containers": [{"name": "c", "image": "img",
                    "env": [
                        {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "k"}}},
                        {"name": "B", "valueFrom": {"secretKeyRef": {"name": "token", "key": "k"}}},
                        {"name": "C", "value": "literal"},
                    ],
                    "envFrom": [{"secretRef": {"name": "all-secret"}}]}],
            }
        }))
        .unwrap();
        let pod = DesiredPod::from_pod(&pod).unwrap();
        let cm = |n| (ObjectKind::ConfigMap, n);
        let secret = |n| (ObjectKind::Secret, n);
        let mut want = vec![
            cm("init-env"),
            cm("kube-root-ca.crt"),
            cm("settings"),
            secret("all-secret"),
            secret("creds"),
            secret("csi-creds"),
            secret("pull"),
            secret("token"),
        ];
        want.sort_unstable();
        assert_eq!(referenced(&pod), want);
    }

    #[test]
    fn a_pod_naming_nothing_names_nothing() {
        let pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": "img"}]}
        }))
        .unwrap();
        assert!(referenced(&DesiredPod::from_pod(&pod).unwrap()).is_empty());
    }
}
