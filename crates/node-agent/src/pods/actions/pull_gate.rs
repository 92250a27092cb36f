//! How many image pulls one node runs at once and how fast it starts them, as the kubelet paces them:
//! `serializeImagePulls` (default true: one at a time), else at most `maxParallelImagePulls` (unlimited when
//! unset), and `registryPullQPS` / `registryBurst` (5 / 10; 0 QPS: no limit). One gate per node, shared by its
//! pod workers, made with the node's pod side (a node without pods holds only its [`PullSettings`]).

use tokio::sync::{Semaphore, SemaphorePermit};

use crate::api::RateLimiter;

/// The KubeletConfiguration values a node's gate is made from (default: no limits).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PullSettings {
    /// `serializeImagePulls`: one pull at a time.
    pub serialize: bool,
    /// `maxParallelImagePulls` (when not serialized; `None`: unlimited).
    pub max_parallel: Option<u32>,
    /// `registryPullQPS` (0: no rate limit).
    pub qps: u32,
    /// `registryBurst`.
    pub burst: u32,
}

/// One node's image pull gate.
#[derive(Debug)]
pub struct PullGate {
    parallel: Option<Semaphore>,
    rate: Option<RateLimiter>,
}

impl Default for PullGate {
    /// No limits.
    fn default() -> Self {
        Self {
            parallel: None,
            rate: None,
        }
    }
}

impl PullGate {
    /// A gate from the KubeletConfiguration values.
    pub fn new(settings: PullSettings) -> Self {
        let PullSettings {
            serialize,
            max_parallel,
            qps,
            burst,
        } = settings;
        let parallel = if serialize { Some(1) } else { max_parallel };
        Self {
            parallel: parallel.map(|n| Semaphore::new(usize::try_from(n.max(1)).unwrap_or(usize::MAX))),
            rate: RateLimiter::new(qps, burst),
        }
    }

    /// Waits for a pull slot and a token; the pull runs while the returned permit lives.
    pub async fn acquire(&self) -> Option<SemaphorePermit<'_>> {
        let permit = match &self.parallel {
            Some(s) => s.acquire().await.ok(),
            None => None,
        };
        if let Some(r) = &self.rate {
            r.acquire().await;
        }
        permit
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use tokio::time::Instant;

    use super::*;

    /// Six pulls of 1 s each through a gate: how long until all are done.
    async fn six_pulls(gate: PullGate) -> Duration {
        let gate = Arc::new(gate);
        let start = Instant::now();
        let tasks: Vec<_> = (0..6)
            .map(|_| {
                let gate = gate.clone();
                tokio::spawn(async move {
                    let _permit = gate.acquire().await;
                    tokio::time::sleep(Duration::from_secs(1)).await;
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        start.elapsed()
    }

    /// Six one-second pulls through a gate of these settings: how long until the last ends.
    async fn six_pulls_with(serialize: bool, max_parallel: Option<u32>, qps: u32, burst: u32) -> Duration {
        six_pulls(PullGate::new(PullSettings {
            serialize,
            max_parallel,
            qps,
            burst,
        }))
        .await
    }

    #[tokio::test(start_paused = true)]
    async fn serialized_parallel_and_rate_limited_pulls() {
        assert_eq!(six_pulls_with(true, None, 0, 0).await, Duration::from_secs(6));
        assert_eq!(six_pulls_with(false, Some(3), 0, 0).await, Duration::from_secs(2));
        assert_eq!(six_pulls_with(false, None, 0, 0).await, Duration::from_secs(1));
        // 2 per second after a burst of 2: starts at 0, 0, 0.5, 1, 1.5, 2 s; the last ends at 3 s
        assert_eq!(six_pulls_with(false, None, 2, 2).await, Duration::from_secs(3));
    }
}
