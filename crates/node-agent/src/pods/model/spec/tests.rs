use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;

use super::*;
use serde_json::json;

fn pod(v: serde_json::Value) -> Pod {
    serde_json::from_value(v).unwrap()
}

#[test]
fn extracts_defaults_ports_and_probes() {
    let p = pod(json!({
        "metadata": {"name": "web", "namespace": "ns", "uid": "u1", "labels": {"app": "x"}},
        "spec": {
            "nodeName": "n1",
            "initContainers": [
                {"name": "setup", "image": "busybox:1.36"},
                {"name": "proxy", "image": "envoy", "restartPolicy": "Always"}
            ],
            "containers": [{
                "name": "app", "image": "nginx:1.27",
                "ports": [{"name": "http", "containerPort": 8080}],
                "env": [
                    {"name": "A", "value": "1"},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                    {"name": "APP", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['app']"}}}
                ],
                "readinessProbe": {"httpGet": {"path": "healthz", "port": "http"}},
                "livenessProbe": {"tcpSocket": {"port": 8080}, "periodSeconds": 5, "failureThreshold": 1},
                "lifecycle": {"preStop": {"sleep": {"seconds": 3}}}
            }]
        }
    }));
    let d = DesiredPod::from_pod(&p).unwrap();
    assert_eq!(d.restart_policy, RestartPolicy::Always);
    assert_eq!(d.termination_grace_secs, 30);
    assert_eq!(d.display(), "web_ns(u1)");
    assert!(!d.init_containers[0].sidecar);
    assert!(d.init_containers[1].sidecar);
    assert_eq!(
        d.init_containers[1].pull_policy,
        PullPolicy::Always,
        "untagged image pulls always"
    );
    let app = &d.containers[0];
    assert_eq!(app.pull_policy, PullPolicy::IfNotPresent);
    let r = app.readiness.as_ref().unwrap();
    assert_eq!(
        (r.period, r.timeout, r.failure_threshold),
        (Duration::from_secs(10), Duration::from_secs(1), 3)
    );
    match &r.action {
        Action::Http(h) => assert_eq!((h.port, h.path.as_str()), (8080, "/healthz")),
        other => panic!("{other:?}"),
    }
    assert_eq!(app.liveness.as_ref().unwrap().period, Duration::from_secs(5));
    assert_eq!(
        app.pre_stop,
        Some(Box::new(Action::Sleep(Duration::from_secs(3))))
    );
    assert_eq!(
        app.env,
        vec![
            ("A".into(), EnvValue::Literal("1".into())),
            ("POD".into(), EnvValue::Literal("web".into())),
            ("IP".into(), EnvValue::PodIp),
            ("APP".into(), EnvValue::Literal("x".into())),
        ]
    );
    assert_eq!(d.field_path("proxy"), "spec.initContainers{proxy}");
    assert_eq!(d.field_path("app"), "spec.containers{app}");
    assert!(d.has_probes());
}

#[test]
fn hash_changes_with_image_only() {
    let mk = |image: &str| {
        let p = pod(json!({
            "metadata": {"name": "a", "uid": "u"},
            "spec": {"containers": [{"name": "c", "image": image}]}
        }));
        DesiredPod::from_pod(&p).unwrap().containers[0].hash
    };
    assert_eq!(mk("a:1"), mk("a:1"));
    assert_ne!(mk("a:1"), mk("a:2"));
}

#[test]
fn deletion_grace_overrides_spec() {
    let p = pod(json!({
        "metadata": {"name": "a", "uid": "u", "deletionTimestamp": "2024-01-01T00:00:00Z",
                      "deletionGracePeriodSeconds": 5},
        "spec": {"terminationGracePeriodSeconds": 60, "containers": [{"name": "c", "image": "i"}]}
    }));
    let d = DesiredPod::from_pod(&p).unwrap();
    assert_eq!(d.grace_secs(), 5);
}

#[test]
fn replicas_of_one_template_share_their_labels_and_keep_their_own_hostname() {
    let mk = |name: &str, labels: serde_json::Value, hostname: Option<&str>| {
        DesiredPod::from_pod(&pod(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "namespace": "ns", "labels": labels,
                         "annotations": {"note": name}},
            "spec": {"hostname": hostname, "containers": [{"name": "c", "image": "img"}]}
        })))
        .unwrap()
    };
    let (a, b) = (
        mk("a", json!({"app": "web", "pod-template-hash": "5d8"}), None),
        mk(
            "b",
            json!({"app": "web", "pod-template-hash": "5d8"}),
            Some("box"),
        ),
    );
    let c = mk("c", json!({"app": "db"}), None);
    assert!(a.labels.same_copy(&b.labels), "equal labels are one copy");
    assert!(!a.labels.same_copy(&c.labels));
    assert_eq!(b.labels.get("app").map(String::as_str), Some("web"));
    assert_eq!(c.labels.get("app").map(String::as_str), Some("db"));
    assert_eq!(a.annotations.get("note").map(String::as_str), Some("a"));
    // the sandbox hostname: the pod's name unless spec.hostname sets one
    assert_eq!((a.hostname(), b.hostname()), ("a", "box"));
}

#[test]
fn long_hostnames_are_cut_and_an_fqdn_too_long_is_refused() {
    let mk = |name: &str, spec: serde_json::Value| {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "img"}]);
        DesiredPod::from_pod(&pod(json!({
            "metadata": {"name": name, "uid": "u", "namespace": "ns"}, "spec": spec
        })))
        .unwrap()
    };
    // 62 characters, then a '-', then more: cut to 63, the trailing '-' dropped
    let long = format!("{}-{}", "a".repeat(62), "b".repeat(10));
    let p = mk(&long, json!({}));
    assert_eq!(p.hostname(), "a".repeat(62));
    assert_eq!(p.kernel_hostname("cluster.local").unwrap(), "a".repeat(62));
    let short = mk(
        "web",
        json!({"hostname": "h", "subdomain": "s", "setHostnameAsFQDN": true}),
    );
    assert_eq!(
        short.kernel_hostname("cluster.local").unwrap(),
        "h.s.ns.svc.cluster.local"
    );
    let without_subdomain = mk("web", json!({"setHostnameAsFQDN": true}));
    assert_eq!(without_subdomain.kernel_hostname("cluster.local").unwrap(), "web");
    let too_long = mk(
        "web",
        json!({"hostname": "a".repeat(42), "subdomain": "s", "setHostnameAsFQDN": true}),
    );
    let err = too_long.kernel_hostname("cluster.local").unwrap_err();
    assert!(
        err.contains("is too long (64 characters is the max, 65 characters requested)"),
        "{err}"
    );
}

#[test]
fn replicas_of_one_template_share_their_container_list() {
    let mk = |name: &str, image: &str, env: &str| {
        let p = pod(json!({
            "metadata": {"name": name, "uid": format!("uid-{name}"), "namespace": "ns"},
            // as admitted: the service-account token volume's name has a per-pod suffix
            "spec": {"volumes": [{"name": format!("kube-api-access-{name}"), "emptyDir": {}}],
                     "containers": [{"name": "c", "image": image, "env": [
                {"name": "A", "value": "1"},
                {"name": "ME", "valueFrom": {"fieldRef": {"fieldPath": env}}}],
                "volumeMounts": [{"name": format!("kube-api-access-{name}"), "mountPath": "/var/run/x"},
                                 {"name": "missing", "mountPath": "/m"}]}]}
        }));
        DesiredPod::from_pod(&p).unwrap()
    };
    let (a, b) = (
        mk("a", "img:1", "metadata.namespace"),
        mk("b", "img:1", "metadata.namespace"),
    );
    assert!(
        Arc::ptr_eq(&a.containers, &b.containers),
        "equal lists are one copy"
    );
    assert!(Arc::ptr_eq(&a.init_containers, &b.init_containers));
    assert_eq!((a.name.as_str(), b.name.as_str()), ("a", "b"));
    // each mount names its own pod's volume by place; a mount of no volume names none
    let mounts = &a.containers[0].mounts;
    assert_eq!((mounts[0].volume, mounts[1].volume), (Some(0), None));
    assert_eq!(b.volumes[0].name, "kube-api-access-b");
    // a different image, or an environment that names the pod itself, is a list of its own
    let c = mk("c", "img:2", "metadata.namespace");
    assert!(!Arc::ptr_eq(&a.containers, &c.containers));
    assert_eq!(c.containers[0].image, "img:2");
    // a field reference resolves when the pod is read: each pod's own name makes its list its own
    let (d, e) = (
        mk("d", "img:1", "metadata.name"),
        mk("e", "img:1", "metadata.name"),
    );
    assert!(!Arc::ptr_eq(&d.containers, &e.containers));
    assert_eq!(d.containers[0].env[1].1, EnvValue::Literal("d".into()));
    assert_eq!(e.containers[0].env[1].1, EnvValue::Literal("e".into()));
}

#[test]
fn hostname_override_names_the_hostname_whole_and_drops_the_domain() {
    let mk = |spec: serde_json::Value| {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "img"}]);
        DesiredPod::from_pod(&pod(json!({
            "metadata": {"name": "web", "uid": "u", "namespace": "ns"}, "spec": spec
        })))
        .unwrap()
    };
    let p = mk(json!({"hostname": "h", "subdomain": "s", "hostnameOverride": "override.example.host"}));
    assert_eq!(p.hostname(), "override.example.host");
    assert_eq!(p.subdomain(), "");
    assert_eq!(
        p.kernel_hostname("cluster.local").unwrap(),
        "override.example.host"
    );
    let invalid = mk(json!({"hostnameOverride": "Not-RFC1123"}));
    let err = invalid.kernel_hostname("cluster.local").unwrap_err();
    assert!(
        err.starts_with("pod HostnameOverride \"Not-RFC1123\" is not a valid DNS subdomain"),
        "{err}"
    );
    // without an override, spec.subdomain is the domain as before
    assert_eq!(mk(json!({"subdomain": "s"})).subdomain(), "s");
}
