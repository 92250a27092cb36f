//! The agent's Prometheus metrics, registered into a registry the caller owns.
//!
//! One [`Metrics`] value is shared (`Arc`) by every agent of a process: a hollow fleet registers once and all
//! agents add to the same series, so the series count does not grow with the number of nodes.
//!
//! * `kubelet_node_startup_*_duration_seconds` — the kubelet's node startup phases, as histograms (one
//!   observation per agent start): `pre_registration` (start -> first registration attempt), `registration`
//!   (-> Node exists), `post_registration` (-> Ready reported), and the total.
//! * `node_agent_api_requests_total{verb,resource,code}` — every API request the agent made, by verb, resource
//!   (`nodes`, `nodes/status`, `leases`, `events`, ...) and HTTP status (`0` when no response came back).
//! * `kubelet_evictions_total{eviction_signal}` — pods evicted for node pressure, by the signal that drove it.
//! * `kubelet_image_garbage_collected_total{reason}` — images the image garbage collector removed, because they
//!   went unused longer than `imageMaximumGCAge` (`age`) or to free disk space (`space`).
//! * `node_agent_manager_restarts_total{manager}` — node-side managers rebuilt and started again after a panic or
//!   an unexpected end (`event_sink`, `runtime_health`, `node_status`, `lease`, `node_informer`, `gc`,
//!   `eviction`; see `agent::supervise`).

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Labels of the API request counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApiRequestLabels {
    /// `get`, `create`, `update`, `patch`, `delete`, `list`, `watch`.
    pub verb: &'static str,
    /// `nodes`, `nodes/status`, `leases`, `events`, `pods`, `pods/status`, ...
    pub resource: &'static str,
    /// HTTP status code; 0 when the request got no response.
    pub code: u16,
}

/// Labels of the eviction counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EvictionLabels {
    /// `memory.available`, `nodefs.available`, ...
    pub eviction_signal: &'static str,
}

/// Labels of the image GC counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ImageGcLabels {
    /// `age` or `space`, as the kubelet labels them.
    pub reason: &'static str,
}

/// Labels of the manager restart counter.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ManagerLabels {
    /// The manager's name (`gc`, `lease`, ...).
    pub manager: &'static str,
}

/// The agent's metrics.
#[derive(Debug, Clone)]
pub struct Metrics {
    api_requests: Family<ApiRequestLabels, Counter>,
    manager_restarts: Family<ManagerLabels, Counter>,
    evictions: Family<EvictionLabels, Counter>,
    images_collected: Family<ImageGcLabels, Counter>,
    startup_total: Histogram,
    startup_pre_registration: Histogram,
    startup_registration: Histogram,
    startup_post_registration: Histogram,
}

fn startup_histogram() -> Histogram {
    // 10 ms .. ~5 min
    Histogram::new(exponential_buckets(0.01, 2.0, 16))
}

impl Metrics {
    /// Creates the metrics and registers them into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Self::unregistered();
        registry.register(
            "node_agent_api_requests",
            "API server requests made by the node agent, by verb, resource and HTTP status code",
            m.api_requests.clone(),
        );
        registry.register(
            "kubelet_evictions",
            "Pods evicted for node pressure, by the eviction signal",
            m.evictions.clone(),
        );
        registry.register(
            "kubelet_node_startup_duration_seconds",
            "Time from agent start until the node first reported Ready",
            m.startup_total.clone(),
        );
        registry.register(
            "kubelet_node_startup_pre_registration_duration_seconds",
            "Time from agent start until the first node registration attempt",
            m.startup_pre_registration.clone(),
        );
        registry.register(
            "kubelet_node_startup_registration_duration_seconds",
            "Time from the first registration attempt until the Node object existed",
            m.startup_registration.clone(),
        );
        registry.register(
            "kubelet_node_startup_post_registration_duration_seconds",
            "Time from registration until the node first reported Ready",
            m.startup_post_registration.clone(),
        );
        registry.register(
            "kubelet_image_garbage_collected",
            "Total number of images garbage collected by the kubelet, whether through disk usage or image age",
            m.images_collected.clone(),
        );
        registry.register(
            "node_agent_manager_restarts",
            "Node-side managers started again after a panic or an unexpected end, by manager",
            m.manager_restarts.clone(),
        );
        m
    }

    /// Metrics that are not exported anywhere (tests, or a caller without a registry).
    pub fn unregistered() -> Self {
        Self {
            api_requests: Family::default(),
            manager_restarts: Family::default(),
            evictions: Family::default(),
            images_collected: Family::default(),
            startup_total: startup_histogram(),
            startup_pre_registration: startup_histogram(),
            startup_registration: startup_histogram(),
            startup_post_registration: startup_histogram(),
        }
    }

    /// Counts one API request.
    pub fn count_request(&self, verb: &'static str, resource: &'static str, code: u16) {
        self.api_requests
            .get_or_create(&ApiRequestLabels { verb, resource, code })
            .inc();
    }

    /// Counts one eviction driven by `signal`.
    pub fn eviction(&self, signal: &'static str) {
        self.evictions
            .get_or_create(&EvictionLabels {
                eviction_signal: signal,
            })
            .inc();
    }

    /// How many evictions `signal` drove.
    pub fn eviction_count(&self, signal: &'static str) -> u64 {
        self.evictions
            .get_or_create(&EvictionLabels {
                eviction_signal: signal,
            })
            .get()
    }

    /// How many requests with these labels were counted.
    pub fn request_count(&self, verb: &'static str, resource: &'static str, code: u16) -> u64 {
        self.api_requests
            .get_or_create(&ApiRequestLabels { verb, resource, code })
            .get()
    }

    /// Counts one image removed by the image garbage collector, for `reason` (`age` or `space`).
    pub fn image_collected(&self, reason: &'static str) {
        self.images_collected
            .get_or_create(&ImageGcLabels { reason })
            .inc();
    }

    /// How many images were collected for `reason`.
    pub fn images_collected(&self, reason: &'static str) -> u64 {
        self.images_collected
            .get_or_create(&ImageGcLabels { reason })
            .get()
    }

    /// Counts one restart of node-side manager `manager`.
    pub fn manager_restarted(&self, manager: &'static str) {
        self.manager_restarts
            .get_or_create(&ManagerLabels { manager })
            .inc();
    }

    /// How many times `manager` was restarted.
    pub fn manager_restarts(&self, manager: &'static str) -> u64 {
        self.manager_restarts
            .get_or_create(&ManagerLabels { manager })
            .get()
    }

    /// Records one agent's startup phases.
    pub fn observe_startup(&self, phases: &StartupPhases) {
        self.startup_pre_registration
            .observe(phases.pre_registration.as_secs_f64());
        self.startup_registration
            .observe(phases.registration.as_secs_f64());
        self.startup_post_registration
            .observe(phases.post_registration.as_secs_f64());
        self.startup_total.observe(phases.total().as_secs_f64());
    }
}

/// How long each node startup phase took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StartupPhases {
    /// Agent start -> first registration attempt.
    pub pre_registration: Duration,
    /// First registration attempt -> the Node exists.
    pub registration: Duration,
    /// Node exists -> Ready reported.
    pub post_registration: Duration,
}

impl StartupPhases {
    /// Agent start -> Ready reported.
    pub fn total(&self) -> Duration {
        self.pre_registration + self.registration + self.post_registration
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_encode_with_kubelet_names() {
        let mut registry = Registry::default();
        let m = Metrics::register(&mut registry);
        m.count_request("update", "leases", 200);
        m.count_request("update", "leases", 200);
        m.image_collected("space");
        m.manager_restarted("gc");
        m.observe_startup(&StartupPhases {
            pre_registration: Duration::from_millis(5),
            registration: Duration::from_millis(50),
            post_registration: Duration::from_millis(100),
        });
        assert_eq!(m.request_count("update", "leases", 200), 2);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains(
                "node_agent_api_requests_total{verb=\"update\",resource=\"leases\",code=\"200\"} 2"
            ),
            "{text}"
        );
        assert!(
            text.contains("kubelet_node_startup_duration_seconds_count 1"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_image_garbage_collected_total{reason=\"space\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("kubelet_node_startup_registration_duration_seconds_sum 0.05"),
            "{text}"
        );
        assert!(
            text.contains("node_agent_manager_restarts_total{manager=\"gc\"} 1"),
            "{text}"
        );
    }
}
