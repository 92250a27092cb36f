//! Service links: the docker-link style environment variables a container gets for the Services of its pod's
//! namespace (`spec.enableServiceLinks`, default true) and, always, for the `kubernetes` Service of the
//! `default` namespace — `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT[_<PORTNAME>]`, `<NAME>_PORT` and per port
//! `<NAME>_PORT_<port>_<PROTO>[_PROTO|_PORT|_ADDR]`. Only Services with a cluster IP count; a Service of the
//! pod's own namespace replaces a `default/kubernetes` of the same name.
//!
//! The variables go in before the container's own, so its `envFrom` and `env` override them and can refer to
//! them with `$(VAR)`. Services come from [`PodObjects::services`](crate::pods::actions::objects::PodObjects): the node's Services
//! informer.

use std::collections::BTreeMap;

use crate::pods::actions::context::ActionCtx;
use crate::pods::actions::objects::ServiceLink;
use crate::pods::model::spec::DesiredPod;
use crate::pods::model::spec::SOURCE_ANNOTATION;

/// The namespace and name of the Service every pod gets links to.
const MASTER: (&str, &str) = ("default", "kubernetes");

/// A Service name as a variable prefix: upper case, `-` as `_`.
fn prefix(name: &str) -> String {
    name.replace('-', "_").to_ascii_uppercase()
}

/// `ip:port`, with brackets around an IPv6 address.
fn host_port(ip: &str, port: i32) -> String {
    if ip.contains(':') {
        format!("[{ip}]:{port}")
    } else {
        format!("{ip}:{port}")
    }
}

/// The variables of `services`, in order, each Service's together.
pub fn link_vars<'a>(services: impl IntoIterator<Item = &'a ServiceLink>) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for svc in services {
        let Some((_, first, _)) = svc.ports.first() else {
            // validation gives every Service with a cluster IP a port; without one there is nothing to link
            continue;
        };
        let p = prefix(&svc.name);
        out.push((format!("{p}_SERVICE_HOST"), svc.cluster_ip.clone()));
        out.push((format!("{p}_SERVICE_PORT"), first.to_string()));
        for (name, port, _) in &svc.ports {
            if !name.is_empty() {
                out.push((format!("{p}_SERVICE_PORT_{}", prefix(name)), port.to_string()));
            }
        }
        for (i, (_, port, protocol)) in svc.ports.iter().enumerate() {
            let proto = protocol.to_ascii_lowercase();
            let url = format!("{proto}://{}", host_port(&svc.cluster_ip, *port));
            if i == 0 {
                out.push((format!("{p}_PORT"), url.clone()));
            }
            let pp = format!("{p}_PORT_{port}_{}", protocol.to_ascii_uppercase());
            out.push((format!("{pp}_PROTO"), proto));
            out.push((format!("{pp}_PORT"), port.to_string()));
            out.push((format!("{pp}_ADDR"), svc.cluster_ip.clone()));
            out.push((pp, url));
        }
    }
    out
}

/// The Services `pod` links to, by name: `default/kubernetes`, then (with links enabled) its namespace's.
fn select(pod: &DesiredPod, master: &[ServiceLink], own: &[ServiceLink]) -> BTreeMap<String, ServiceLink> {
    let mut by_name: BTreeMap<String, ServiceLink> = master
        .iter()
        .filter(|s| s.name == MASTER.1)
        .map(|s| (s.name.clone(), s.clone()))
        .collect();
    if pod.service_links {
        by_name.extend(own.iter().map(|s| (s.name.clone(), s.clone())));
    }
    by_name
}

/// The service-link variables of `pod`'s containers. A failed read of the Services fails the container's
/// creation (the kubelet's `CreateContainerConfigError`), except for a static pod, which must start without
/// the API server: it gets what could be read.
pub(crate) async fn vars(ctx: &ActionCtx, pod: &DesiredPod) -> Result<Vec<(String, String)>, String> {
    let own = if pod.service_links {
        ctx.objects.services(&pod.namespace, None).await
    } else {
        Ok(std::sync::Arc::new([]) as std::sync::Arc<[ServiceLink]>)
    };
    let master = if pod.service_links && pod.namespace == MASTER.0 {
        own.clone()
    } else {
        ctx.objects.services(MASTER.0, Some(MASTER.1)).await
    };
    let static_pod = pod.annotations.get(SOURCE_ANNOTATION).is_some_and(|s| s != "api");
    let (own, master) = match (own, master) {
        (Ok(own), Ok(master)) => (own, master),
        (own, master) if static_pod => {
            tracing::warn!(pod = %pod.display(), "cannot list services; the static pod starts without some service links");
            (own.unwrap_or_default(), master.unwrap_or_default())
        }
        (Err(e), _) | (_, Err(e)) => {
            return Err(format!("failed to list services when setting up env vars: {e}"));
        }
    };
    Ok(link_vars(select(pod, &master, &own).values()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn link(name: &str, ip: &str, ports: &[(&str, i32, &str)]) -> ServiceLink {
        ServiceLink {
            name: name.into(),
            cluster_ip: ip.into(),
            ports: ports
                .iter()
                .map(|(n, p, proto)| ((*n).to_owned(), *p, (*proto).to_owned()))
                .collect(),
        }
    }

    #[test]
    fn variables_follow_the_kubelet_names() {
        let vars = link_vars([&link(
            "my-db",
            "10.0.0.5",
            &[("", 5432, "TCP"), ("metrics", 9187, "UDP")],
        )]);
        let get = |k: &str| vars.iter().find(|(n, _)| n == k).map(|(_, v)| v.as_str());
        assert_eq!(get("MY_DB_SERVICE_HOST"), Some("10.0.0.5"));
        assert_eq!(get("MY_DB_SERVICE_PORT"), Some("5432"));
        assert_eq!(get("MY_DB_SERVICE_PORT_METRICS"), Some("9187"));
        assert_eq!(get("MY_DB_PORT"), Some("tcp://10.0.0.5:5432"));
        assert_eq!(get("MY_DB_PORT_5432_TCP"), Some("tcp://10.0.0.5:5432"));
        assert_eq!(get("MY_DB_PORT_5432_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("MY_DB_PORT_5432_TCP_PORT"), Some("5432"));
        assert_eq!(get("MY_DB_PORT_5432_TCP_ADDR"), Some("10.0.0.5"));
        assert_eq!(get("MY_DB_PORT_9187_UDP"), Some("udp://10.0.0.5:9187"));
        assert_eq!(vars.len(), 12);
        let v6 = link_vars([&link("v6", "fd00::1", &[("https", 443, "TCP")])]);
        assert!(v6.contains(&("V6_PORT".into(), "tcp://[fd00::1]:443".into())));
        assert!(v6.contains(&("V6_SERVICE_PORT_HTTPS".into(), "443".into())));
    }

    #[test]
    fn only_services_with_a_cluster_ip() {
        let svc = |ip: Option<&str>| -> k8s_openapi::api::core::v1::Service {
            serde_json::from_value(json!({
                "metadata": {"name": "s"},
                "spec": {"clusterIP": ip, "ports": [{"port": 80}]}
            }))
            .unwrap()
        };
        assert!(ServiceLink::from_api(&svc(Some("None"))).is_none());
        assert!(ServiceLink::from_api(&svc(None)).is_none());
        let l = ServiceLink::from_api(&svc(Some("10.0.0.1"))).unwrap();
        assert_eq!(l.ports, vec![(String::new(), 80, "TCP".to_owned())]);
    }

    #[test]
    fn links_off_keep_the_master_service_and_own_services_replace_it() {
        let pod = |links: bool| {
            let p = serde_json::from_value(json!({
                "metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                "spec": {"enableServiceLinks": links, "containers": [{"name": "c", "image": "i"}]}
            }))
            .unwrap();
            DesiredPod::from_pod(&p).unwrap()
        };
        let master = [link("kubernetes", "10.96.0.1", &[("https", 443, "TCP")])];
        let own = [
            link("web", "10.96.0.7", &[("", 80, "TCP")]),
            link("kubernetes", "10.96.0.9", &[("", 443, "TCP")]),
        ];
        let off = select(&pod(false), &master, &own);
        assert_eq!(off.keys().collect::<Vec<_>>(), ["kubernetes"]);
        assert_eq!(off["kubernetes"].cluster_ip, "10.96.0.1");
        let on = select(&pod(true), &master, &own);
        assert_eq!(on.keys().collect::<Vec<_>>(), ["kubernetes", "web"]);
        assert_eq!(
            on["kubernetes"].cluster_ip, "10.96.0.9",
            "the namespace's own wins"
        );
    }
}
