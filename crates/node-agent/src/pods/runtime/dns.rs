//! A pod's resolver configuration as the kubelet computes it: cluster DNS (`clusterDNS`, search path
//! `<ns>.svc.<domain> svc.<domain> <domain>` plus the node's, `ndots:5`) for `ClusterFirst` pods off the host
//! network and `ClusterFirstWithHostNet` pods; the node's own `resolvConf` for `Default` (and `ClusterFirst` on
//! the host network, or when no `clusterDNS` is set); nothing for `None`; then `dnsConfig` appended (servers and
//! searches without duplicates, options replaced by name). The runtime writes the sandbox's resolv.conf from it.

use runtime_api::cri;

use crate::pods::model::spec::{DesiredPod, DnsPolicy};

/// The node's DNS settings, read once per agent.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeDns {
    /// `clusterDNS`.
    pub cluster_dns: Vec<String>,
    /// `clusterDomain` (empty when unset).
    pub cluster_domain: String,
    /// Name servers of the node's `resolvConf`.
    pub host_servers: Vec<String>,
    /// Search domains of the node's `resolvConf`.
    pub host_searches: Vec<String>,
    /// Options of the node's `resolvConf`.
    pub host_options: Vec<String>,
}

impl NodeDns {
    /// Settings from the KubeletConfiguration values and the text of the node's resolv.conf (empty when
    /// `resolvConf` is `""`).
    pub fn new(cluster_dns: Vec<String>, cluster_domain: String, resolv_conf: &str) -> Self {
        let mut dns = Self {
            cluster_dns,
            cluster_domain,
            ..Self::default()
        };
        for line in resolv_conf.lines() {
            let line = line.split(['#', ';']).next().unwrap_or_default();
            let mut words = line.split_whitespace();
            match words.next() {
                Some("nameserver") => dns.host_servers.extend(words.next().map(str::to_owned)),
                Some("search") => dns.host_searches = words.map(str::to_owned).collect(),
                Some("options") => dns.host_options.extend(words.map(str::to_owned)),
                _ => {}
            }
        }
        dns
    }
}

fn push_unique(list: &mut Vec<String>, items: impl IntoIterator<Item = String>) {
    for item in items {
        if !list.contains(&item) {
            list.push(item);
        }
    }
}

/// Whether the pod gets cluster DNS (and, when it should but none is configured, the kubelet's
/// `MissingClusterDNS` event text).
pub fn uses_cluster_dns(pod: &DesiredPod, node: &NodeDns) -> (bool, Option<String>) {
    let wants = match pod.dns_policy {
        DnsPolicy::ClusterFirstWithHostNet => true,
        DnsPolicy::ClusterFirst => !pod.host_network,
        DnsPolicy::Default | DnsPolicy::None => false,
    };
    if wants && node.cluster_dns.is_empty() {
        let policy = match pod.dns_policy {
            DnsPolicy::ClusterFirstWithHostNet => "ClusterFirstWithHostNet",
            _ => "ClusterFirst",
        };
        let msg = format!(
            "pod: {:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using {policy:?} \
             policy. Falling back to \"Default\" policy.",
            pod.display()
        );
        return (false, Some(msg));
    }
    (wants, None)
}

/// The sandbox's DNS configuration.
pub fn pod_dns(pod: &DesiredPod, node: &NodeDns) -> cri::DnsConfig {
    let mut out = cri::DnsConfig::default();
    match (pod.dns_policy, uses_cluster_dns(pod, node).0) {
        (DnsPolicy::None, _) => {}
        (_, true) => {
            out.servers = node.cluster_dns.clone();
            if !node.cluster_domain.is_empty() {
                let d = &node.cluster_domain;
                out.searches = vec![
                    format!("{}.svc.{d}", pod.namespace),
                    format!("svc.{d}"),
                    d.clone(),
                ];
            }
            push_unique(&mut out.searches, node.host_searches.iter().cloned());
            out.options = vec!["ndots:5".to_owned()];
        }
        (_, false) => {
            out.servers = node.host_servers.clone();
            out.searches = node.host_searches.clone();
            out.options = node.host_options.clone();
        }
    }
    if let Some(extra) = &pod.dns_config {
        push_unique(&mut out.servers, extra.nameservers.iter().cloned());
        push_unique(&mut out.searches, extra.searches.iter().cloned());
        for (name, value) in &extra.options {
            let text = match value {
                Some(v) => format!("{name}:{v}"),
                None => name.clone(),
            };
            let same = |o: &String| o.split(':').next() == Some(name.as_str());
            match out.options.iter_mut().find(|o| same(o)) {
                Some(o) => *o = text,
                None => out.options.push(text),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn pod(spec: serde_json::Value) -> std::sync::Arc<DesiredPod> {
        let mut spec = spec;
        spec["containers"] = json!([{"name": "c", "image": "i"}]);
        let p = serde_json::from_value(
            json!({"metadata": {"name": "p", "namespace": "ns", "uid": "u"}, "spec": spec}),
        )
        .unwrap();
        DesiredPod::from_pod(&p).unwrap()
    }

    fn node() -> NodeDns {
        NodeDns::new(
            vec!["10.96.0.10".into()],
            "cluster.local".into(),
            "# comment\nnameserver 192.0.2.53\nsearch corp.example\noptions timeout:2\n",
        )
    }

    #[test]
    fn cluster_first_pods_get_cluster_dns() {
        let dns = pod_dns(&pod(json!({})), &node());
        assert_eq!(dns.servers, ["10.96.0.10"]);
        assert_eq!(
            dns.searches,
            [
                "ns.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example"
            ]
        );
        assert_eq!(dns.options, ["ndots:5"]);
    }

    #[test]
    fn host_network_and_default_pods_get_the_nodes_resolver() {
        for spec in [json!({"hostNetwork": true}), json!({"dnsPolicy": "Default"})] {
            let dns = pod_dns(&pod(spec), &node());
            assert_eq!(dns.servers, ["192.0.2.53"]);
            assert_eq!(dns.searches, ["corp.example"]);
            assert_eq!(dns.options, ["timeout:2"]);
        }
        let with_host_net = pod(json!({"hostNetwork": true, "dnsPolicy": "ClusterFirstWithHostNet"}));
        assert_eq!(pod_dns(&with_host_net, &node()).servers, ["10.96.0.10"]);
    }

    #[test]
    fn dns_config_is_merged_and_none_uses_only_it() {
        let p = pod(json!({"dnsPolicy": "None", "dnsConfig": {
            "nameservers": ["1.1.1.1"], "searches": ["a.example"], "options": [{"name": "ndots", "value": "2"}]
        }}));
        let dns = pod_dns(&p, &node());
        assert_eq!(
            (dns.servers, dns.searches, dns.options),
            (
                vec!["1.1.1.1".to_owned()],
                vec!["a.example".to_owned()],
                vec!["ndots:2".to_owned()]
            )
        );
        let p = pod(
            json!({"dnsConfig": {"nameservers": ["10.96.0.10"], "options": [{"name": "ndots", "value": "1"},
                                                                                   {"name": "edns0"}]}}),
        );
        let dns = pod_dns(&p, &node());
        assert_eq!(dns.servers, ["10.96.0.10"], "no duplicate server");
        assert_eq!(dns.options, ["ndots:1", "edns0"], "an option is replaced by name");
    }

    #[test]
    fn no_cluster_dns_falls_back_to_the_node_with_an_event() {
        let n = NodeDns::new(vec![], "cluster.local".into(), "nameserver 192.0.2.53\n");
        let p = pod(json!({}));
        let (cluster, event) = uses_cluster_dns(&p, &n);
        assert!(!cluster);
        assert!(event.unwrap().contains("Falling back to \"Default\" policy"));
        assert_eq!(pod_dns(&p, &n).servers, ["192.0.2.53"]);
    }
}
