//! What the load generator creates: the pod template (built in, or from a user's YAML) and the Pod,
//! Deployment or Job objects made from it, each labelled with the run's id so the measurement watches the
//! run's pods alone.

use std::collections::BTreeMap;

use anyhow::Context;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodTemplateSpec};
use serde_json::json;

/// The label every object and pod of a run carries, valued with the run's id.
pub const RUN_LABEL: &str = "hollow.node-agent.io/slo-run";
/// The label tying a Deployment's or Job's pods to their object.
pub const OBJECT_LABEL: &str = "hollow.node-agent.io/slo-object";

/// What kind of object the load generator creates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Kind {
    /// Bare pods.
    Pod,
    /// Deployments of `--replicas` pods each.
    Deployment,
    /// Jobs of `--replicas` parallel pods each.
    Job,
}

/// The built-in template: one stateless container, no init containers, `imagePullPolicy: IfNotPresent` (a
/// node pulls the image once), and requests of 100m CPU and 64Mi: large enough that the scheduler's
/// least-allocated scoring tells a node with one more pod from an empty one (with tiny requests every node
/// scores the same and identical pods pile onto one node).
pub fn builtin() -> PodTemplateSpec {
    serde_json::from_value(json!({
        "spec": {
            "containers": [{
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "imagePullPolicy": "IfNotPresent",
                "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
            }],
            "terminationGracePeriodSeconds": 0,
        }
    }))
    .unwrap_or_default()
}

/// Reads a pod template from YAML: a `Pod`, a `PodTemplate`, a workload whose `spec.template` is one
/// (`Deployment`, `ReplicaSet`, `StatefulSet`, `DaemonSet`, `Job`), or a bare template (`metadata` and a
/// `spec` with containers). Anything else is refused, naming what it is.
pub fn from_yaml(text: &str, origin: &str) -> anyhow::Result<PodTemplateSpec> {
    let doc: serde_yaml::Value = serde_yaml::from_str(text).with_context(|| format!("{origin}: not YAML"))?;
    let not_template = |what: String| anyhow::anyhow!("{origin}: not a pod template: {what}");
    let doc = serde_json::to_value(doc).with_context(|| format!("{origin}: not a YAML mapping"))?;
    if !doc.is_object() {
        return Err(not_template("the document is not a mapping".into()));
    }
    let template = match doc.get("kind").and_then(|k| k.as_str()) {
        Some("Pod") => json!({"metadata": doc.get("metadata"), "spec": doc.get("spec")}),
        Some("PodTemplate") => doc.get("template").cloned().unwrap_or_default(),
        Some("Deployment" | "ReplicaSet" | "StatefulSet" | "DaemonSet" | "Job") => doc
            .get("spec")
            .and_then(|s| s.get("template"))
            .cloned()
            .unwrap_or_default(),
        Some(other) => {
            return Err(not_template(format!(
                "kind {other} (expected Pod, PodTemplate, a workload with spec.template, or a bare template)"
            )));
        }
        None => doc,
    };
    let has_containers = template
        .get("spec")
        .and_then(|s| s.get("containers"))
        .and_then(|c| c.as_array())
        .is_some_and(|c| !c.is_empty());
    if !has_containers {
        return Err(not_template("it has no spec.containers".into()));
    }
    let mut t: PodTemplateSpec = serde_json::from_value(template)
        .map_err(|e| not_template(format!("its template does not parse: {e}")))?;
    // names and namespaces are the generator's to give
    if let Some(meta) = t.metadata.as_mut() {
        meta.name = None;
        meta.generate_name = None;
        meta.namespace = None;
    }
    Ok(t)
}

/// The template with the run's labels added (pod-level).
fn labelled(template: &PodTemplateSpec, run_id: &str, object: &str) -> PodTemplateSpec {
    let mut t = template.clone();
    let meta = t.metadata.get_or_insert_with(Default::default);
    let labels = meta.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(RUN_LABEL.to_owned(), run_id.to_owned());
    labels.insert(OBJECT_LABEL.to_owned(), object.to_owned());
    t
}

/// One object the generator creates.
#[derive(Debug, Clone)]
pub enum Object {
    /// A pod.
    Pod(Pod),
    /// A Deployment.
    Deployment(Deployment),
    /// A Job.
    Job(Job),
}

/// Builds object number `index` of the run `run_id` in `namespace`.
pub fn object(
    kind: Kind,
    template: &PodTemplateSpec,
    run_id: &str,
    index: u64,
    namespace: &str,
    replicas: u32,
) -> anyhow::Result<Object> {
    let name = format!("slo-{run_id}-{index}");
    let t = labelled(template, run_id, &name);
    let meta = json!({
        "name": name,
        "namespace": namespace,
        "labels": {RUN_LABEL: run_id, OBJECT_LABEL: name},
    });
    Ok(match kind {
        Kind::Pod => {
            let mut pod_meta = t.metadata.clone().unwrap_or_default();
            pod_meta.name = Some(name.clone());
            pod_meta.namespace = Some(namespace.to_owned());
            Object::Pod(Pod {
                metadata: pod_meta,
                spec: t.spec.clone(),
                status: None,
            })
        }
        Kind::Deployment => Object::Deployment(serde_json::from_value(json!({
            "metadata": meta,
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {RUN_LABEL: run_id, OBJECT_LABEL: name}},
                "template": t,
            },
        }))?),
        Kind::Job => {
            let mut t = t;
            if let Some(spec) = t.spec.as_mut() {
                let policy = spec.restart_policy.get_or_insert_with(|| "Never".to_owned());
                if policy == "Always" {
                    *policy = "Never".to_owned();
                }
            }
            Object::Job(serde_json::from_value(json!({
                "metadata": meta,
                "spec": {
                    "parallelism": replicas,
                    "completions": replicas,
                    "template": t,
                },
            }))?)
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pods_workloads_and_bare_templates_are_pod_templates() {
        for yaml in [
            "kind: Pod\nmetadata: {name: x, namespace: y}\nspec: {containers: [{name: a, image: b}]}",
            "kind: PodTemplate\ntemplate: {spec: {containers: [{name: a, image: b}]}}",
            "kind: Deployment\nspec: {template: {metadata: {labels: {a: b}}, spec: {containers: [{name: a, image: b}]}}}",
            "spec: {containers: [{name: a, image: b}]}",
        ] {
            let t = from_yaml(yaml, "t.yaml").unwrap_or_else(|e| panic!("{yaml}: {e}"));
            assert_eq!(t.spec.unwrap().containers[0].image.as_deref(), Some("b"));
            assert!(
                t.metadata
                    .is_none_or(|m| m.name.is_none() && m.namespace.is_none())
            );
        }
    }

    #[test]
    fn other_documents_are_refused_by_what_they_are() {
        let err = |yaml: &str| from_yaml(yaml, "t.yaml").unwrap_err().to_string();
        assert!(err("kind: ConfigMap\ndata: {a: b}").contains("not a pod template: kind ConfigMap"));
        assert!(err("spec: {replicas: 3}").contains("no spec.containers"));
        assert!(err("- a\n- b").contains("not a mapping"));
        assert!(err("kind: Pod\nspec: {containers: []}").contains("no spec.containers"));
        assert!(err("a: [").contains("not YAML"));
    }

    #[test]
    fn objects_carry_the_run_label_down_to_their_pods() {
        let t = builtin();
        let Object::Deployment(d) = object(Kind::Deployment, &t, "r1", 3, "ns", 5).unwrap() else {
            panic!("a Deployment")
        };
        let spec = d.spec.unwrap();
        assert_eq!(spec.replicas, Some(5));
        let labels = spec.template.metadata.unwrap().labels.unwrap();
        assert_eq!(labels[RUN_LABEL], "r1");
        assert_eq!(spec.selector.match_labels.unwrap()[OBJECT_LABEL], "slo-r1-3");
        let Object::Job(j) = object(Kind::Job, &t, "r1", 4, "ns", 2).unwrap() else {
            panic!("a Job")
        };
        let spec = j.spec.unwrap();
        assert_eq!((spec.parallelism, spec.completions), (Some(2), Some(2)));
        assert_eq!(
            spec.template.spec.unwrap().restart_policy.as_deref(),
            Some("Never")
        );
        let Object::Pod(p) = object(Kind::Pod, &t, "r1", 5, "ns", 1).unwrap() else {
            panic!("a Pod")
        };
        assert_eq!(p.metadata.name.as_deref(), Some("slo-r1-5"));
        assert_eq!(p.metadata.labels.unwrap()[RUN_LABEL], "r1");
    }
}
