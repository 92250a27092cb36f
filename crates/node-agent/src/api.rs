//! The gate every API request of one agent passes: client-side rate limit and request accounting.
//!
//! This module owns [`ApiCalls`] (a cheap clone per agent): requests wait for a token of the agent's
//! `kubeAPIQPS`/`kubeAPIBurst` bucket, then run, then are counted in `node_agent_api_requests_total` by verb,
//! resource and status code. It also holds the small helpers that classify `kube::Error`s.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::metrics::Metrics;

/// A token bucket refilled at `qps` tokens per second up to `burst`. Callers take a token each; when the
/// bucket is empty they wait their turn (reservations, so waiters are served in order).
#[derive(Debug)]
pub struct RateLimiter {
    qps: f64,
    burst: f64,
    state: Mutex<(f64, Instant)>,
}

impl RateLimiter {
    /// A limiter of `qps` per second with bursts of `burst`; `None` when `qps` is 0 (no limit).
    pub fn new(qps: u32, burst: u32) -> Option<Self> {
        if qps == 0 {
            return None;
        }
        let burst = f64::from(burst.max(1));
        Some(Self {
            qps: f64::from(qps),
            burst,
            state: Mutex::new((burst, Instant::now())),
        })
    }

    /// A fresh, full bucket of the same rate and burst.
    fn same_rate(&self) -> Self {
        Self {
            qps: self.qps,
            burst: self.burst,
            state: Mutex::new((self.burst, Instant::now())),
        }
    }

    /// Takes a token, waiting if none is left.
    pub async fn acquire(&self) {
        let wait = {
            let mut guard = match self.state.lock() {
                Ok(g) => g,
                Err(poisoned) => poisoned.into_inner(),
            };
            let (tokens, last) = &mut *guard;
            let now = Instant::now();
            *tokens =
                (*tokens + now.saturating_duration_since(*last).as_secs_f64() * self.qps).min(self.burst);
            *last = now;
            *tokens -= 1.0;
            if *tokens >= 0.0 {
                Duration::ZERO
            } else {
                Duration::from_secs_f64(-*tokens / self.qps)
            }
        };
        if !wait.is_zero() {
            tokio::time::sleep(wait).await;
        }
    }
}

/// The HTTP status of a failed request, 0 when there was no response.
pub fn status_code(err: &kube::Error) -> u16 {
    match err {
        kube::Error::Api(s) => s.code,
        _ => 0,
    }
}

/// Whether the API answered 404.
pub fn is_not_found(err: &kube::Error) -> bool {
    status_code(err) == 404
}

/// Whether the API answered 409 Conflict (stale resourceVersion) — not AlreadyExists.
pub fn is_conflict(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 409 && s.reason != "AlreadyExists")
}

/// Whether the API answered 409 AlreadyExists.
pub fn is_already_exists(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists")
}

struct Inner {
    metrics: Arc<Metrics>,
    limiter: Option<RateLimiter>,
    shared: Option<Arc<RateLimiter>>,
}

/// One agent's API gate: rate limit + accounting. Clones share the bucket.
#[derive(Clone)]
pub struct ApiCalls {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for ApiCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiCalls")
            .field("limited", &self.inner.limiter.is_some())
            .finish()
    }
}

impl ApiCalls {
    /// A gate with a `qps`/`burst` bucket (qps 0 = unlimited) counting into `metrics`.
    pub fn new(metrics: Arc<Metrics>, qps: u32, burst: u32) -> Self {
        Self {
            inner: Arc::new(Inner {
                metrics,
                limiter: RateLimiter::new(qps, burst),
                shared: None,
            }),
        }
    }

    /// The same gate, also taking a token of `shared` (a bucket many agents share, e.g. a fleet-wide cap)
    /// for every request after its own.
    pub fn with_shared_limit(self, shared: Arc<RateLimiter>) -> Self {
        Self {
            inner: Arc::new(Inner {
                metrics: self.inner.metrics.clone(),
                limiter: self.inner.limiter.as_ref().map(RateLimiter::same_rate),
                shared: Some(shared),
            }),
        }
    }

    /// A gate with the same accounting and fleet-wide cap but none of this agent's own bucket: for a client
    /// that has a rate limit of its own, as the kubelet's event client has (`eventRecordQPS`), so its requests do
    /// not spend `kubeAPIQPS`.
    pub fn without_own_limit(&self) -> Self {
        Self {
            inner: Arc::new(Inner {
                metrics: self.inner.metrics.clone(),
                limiter: None,
                shared: self.inner.shared.clone(),
            }),
        }
    }

    /// Runs one request through the gate.
    ///
    /// A combinator, not an `async fn`: an `async fn` keeps its `request` argument, the body's copy of it and the
    /// awaited future apart, three copies of a request future, held by every node at once during a fleet's
    /// start; here the request is held once.
    pub fn run<'a, T, F>(
        &'a self,
        verb: &'static str,
        resource: &'static str,
        request: F,
    ) -> impl Future<Output = kube::Result<T>> + 'a
    where
        F: Future<Output = kube::Result<T>> + 'a,
    {
        use futures::FutureExt;
        self.admit().then(move |()| request).map(move |result| {
            let code = match &result {
                Ok(_) if verb == "create" => 201,
                Ok(_) => 200,
                Err(e) => status_code(e),
            };
            self.inner.metrics.count_request(verb, resource, code);
            result
        })
    }

    /// Waits for a token of the agent's bucket, then of the shared one.
    async fn admit(&self) {
        if let Some(l) = &self.inner.limiter {
            l.acquire().await;
        }
        if let Some(l) = &self.inner.shared {
            l.acquire().await;
        }
    }

    /// The metrics this gate counts into.
    pub fn metrics(&self) -> &Arc<Metrics> {
        &self.inner.metrics
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A request waits in the gate with its whole future: held once, a fleet's start holds thousands of them.
    #[test]
    fn a_request_in_the_gate_is_held_once() {
        let calls = ApiCalls::new(Arc::new(Metrics::unregistered()), 10, 10)
            .with_shared_limit(Arc::new(RateLimiter::new(100, 100).unwrap()));
        let request = async {
            let held = [7u8; 2048];
            tokio::task::yield_now().await;
            Ok::<_, kube::Error>(held[0])
        };
        let alone = std::mem::size_of_val(&request);
        let gated = std::mem::size_of_val(&calls.run("get", "pods", request));
        println!("a {alone}-byte request is {gated} bytes in the gate");
        // held once: an `async fn` would hold three copies (its argument, the body's copy and the awaited future)
        assert!(
            gated <= alone + 256,
            "{alone}-byte request, {gated} bytes in the gate"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn bucket_allows_burst_then_paces() {
        let l = RateLimiter::new(10, 5).unwrap();
        let t0 = Instant::now();
        for _ in 0..5 {
            l.acquire().await;
        }
        assert_eq!(Instant::now(), t0, "burst is free");
        for _ in 0..10 {
            l.acquire().await;
        }
        let waited = Instant::now() - t0;
        assert!(
            waited >= Duration::from_millis(990) && waited <= Duration::from_millis(1010),
            "{waited:?}"
        );
        assert!(RateLimiter::new(0, 10).is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn a_gate_without_its_own_limit_spends_none_of_the_agents_bucket() {
        let m = Arc::new(Metrics::unregistered());
        let gate = ApiCalls::new(m.clone(), 1, 1);
        let events = gate.without_own_limit();
        let ok = || async { Ok::<_, kube::Error>(()) };
        let t0 = Instant::now();
        for _ in 0..20 {
            events.run("create", "events", ok()).await.unwrap();
        }
        gate.run("get", "nodes", ok()).await.unwrap();
        assert_eq!(Instant::now(), t0, "the agent's one token is still there");
        gate.run("get", "nodes", ok()).await.unwrap();
        assert_eq!(
            Instant::now() - t0,
            Duration::from_secs(1),
            "and its own bucket still paces it"
        );
        assert_eq!(
            m.request_count("create", "events", 201),
            20,
            "counted in the same metrics"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_shared_bucket_caps_many_gates_together() {
        let m = Arc::new(Metrics::unregistered());
        let fleet = Arc::new(RateLimiter::new(10, 10).unwrap());
        // two agents, each allowed 50/s with burst 100, under a 10/s cap for both
        let gates: Vec<ApiCalls> = (0..2)
            .map(|_| ApiCalls::new(m.clone(), 50, 100).with_shared_limit(fleet.clone()))
            .collect();
        let t0 = Instant::now();
        let runs = (0..30).map(|i| {
            let gate = gates[i % 2].clone();
            async move { gate.run("get", "pods", async { Ok::<_, kube::Error>(()) }).await }
        });
        futures::future::join_all(runs).await;
        let waited = Instant::now() - t0;
        // 10 from the burst, then 20 more at 10/s
        assert!(
            waited >= Duration::from_millis(1990) && waited <= Duration::from_millis(2010),
            "{waited:?}"
        );
        assert_eq!(m.request_count("get", "pods", 200), 30);
    }

    #[tokio::test]
    async fn gate_counts_by_outcome() {
        let m = Arc::new(Metrics::unregistered());
        let gate = ApiCalls::new(m.clone(), 0, 0);
        let _ = gate
            .run("create", "events", async { Ok::<_, kube::Error>(()) })
            .await;
        let _ = gate
            .run("update", "leases", async {
                Err::<(), _>(kube::Error::Api(Box::new(
                    kube::core::Status::failure("stale", "Conflict").with_code(409),
                )))
            })
            .await;
        assert_eq!(m.request_count("create", "events", 201), 1);
        assert_eq!(m.request_count("update", "leases", 409), 1);
    }
}
