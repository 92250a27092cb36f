//! Container restart back-off (CrashLoopBackOff) with the kubelet's semantics, on the tokio clock.
//!
//! Per container name: the first restart after an exit is immediate and arms a 10 s back-off; every later exit
//! must wait the current back-off, measured from that exit, and doubling it (capped at 300 s) when the restart
//! happens. An exit more than 10 minutes after the previous one (the container ran that long) starts over.
//! The numbers come from [`BackoffPolicy::crash_loop`].
//!
//! (The shared [`KeyedBackoff`](crate::backoff::KeyedBackoff) measures "in back-off" from the previous
//! failure; the kubelet measures it from the latest exit, so restarts need this small variant.)

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::BackoffPolicy;

/// Why a restart must wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wait {
    /// The current back-off (shown in the CrashLoopBackOff message).
    pub backoff: Duration,
    /// How long until the restart may happen.
    pub remaining: Duration,
}

/// Restart back-off per container name of one pod.
#[derive(Debug, Clone)]
pub struct RestartBackoff {
    initial: Duration,
    max: Duration,
    expiry: Duration,
    entries: HashMap<String, (Duration, Instant)>,
}

impl Default for RestartBackoff {
    fn default() -> Self {
        Self::new(&BackoffPolicy::crash_loop())
    }
}

impl RestartBackoff {
    /// Back-off following `policy` (initial, cap, reset-after).
    pub fn new(policy: &BackoffPolicy) -> Self {
        Self {
            initial: policy.initial(),
            max: policy.max(),
            expiry: policy.reset_after().unwrap_or(policy.max() * 2),
            entries: HashMap::new(),
        }
    }

    /// May container `name`, which exited at `exited`, restart `now`? If so the restart is recorded (and the
    /// back-off for the next exit grows); if not, how long it must still wait.
    pub fn try_restart(&mut self, name: &str, exited: Instant, now: Instant) -> Result<(), Wait> {
        let live = self
            .entries
            .get(name)
            .copied()
            .filter(|(_, last)| exited.saturating_duration_since(*last) <= self.expiry);
        if let Some((backoff, _)) = live {
            let since = now.saturating_duration_since(exited);
            if since < backoff {
                return Err(Wait {
                    backoff,
                    remaining: backoff - since,
                });
            }
        }
        let next = live.map_or(self.initial, |(backoff, _)| (backoff * 2).min(self.max));
        self.entries.insert(name.to_owned(), (next, exited));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A container that exits the moment it starts, restarted as soon as the back-off allows: restarts come
    /// at 0, 10, 30, 70, 150, 310, 610, 910 s — gaps 0, 10, 20, 40, 80, 160, 300, 300.
    #[tokio::test(start_paused = true)]
    async fn crash_loop_gaps_double_from_10s_to_300s() {
        let mut b = RestartBackoff::default();
        let t0 = Instant::now();
        let mut restarts = Vec::new();
        let mut exited = t0;
        while restarts.len() < 8 {
            match b.try_restart("app", exited, Instant::now()) {
                Ok(()) => {
                    restarts.push((Instant::now() - t0).as_secs());
                    exited = Instant::now(); // crashes immediately again
                }
                Err(wait) => tokio::time::advance(wait.remaining).await,
            }
        }
        assert_eq!(restarts, vec![0, 10, 30, 70, 150, 310, 610, 910]);
    }

    #[tokio::test(start_paused = true)]
    async fn waiting_reports_backoff_and_remaining() {
        let mut b = RestartBackoff::default();
        let t0 = Instant::now();
        assert_eq!(b.try_restart("app", t0, t0), Ok(()));
        tokio::time::advance(Duration::from_secs(3)).await;
        let exit2 = Instant::now();
        tokio::time::advance(Duration::from_secs(4)).await;
        let wait = b.try_restart("app", exit2, Instant::now()).unwrap_err();
        assert_eq!(
            wait,
            Wait {
                backoff: Duration::from_secs(10),
                remaining: Duration::from_secs(6)
            }
        );
        assert!(
            b.try_restart("other", exit2, Instant::now()).is_ok(),
            "per container"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn resets_after_ten_minutes_of_running() {
        let mut b = RestartBackoff::default();
        let t0 = Instant::now();
        assert!(b.try_restart("app", t0, t0).is_ok());
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(b.try_restart("app", t0, Instant::now()).is_ok()); // backoff now 20 s from this exit
        // the restarted container runs for 11 minutes, then exits: immediate restart, back-off back to 10 s
        tokio::time::advance(Duration::from_secs(660)).await;
        let exit = Instant::now();
        assert!(
            b.try_restart("app", exit, exit).is_ok(),
            "no back-off after a long run"
        );
        tokio::time::advance(Duration::from_secs(1)).await;
        let wait = b.try_restart("app", Instant::now(), Instant::now()).unwrap_err();
        assert_eq!(wait.backoff, Duration::from_secs(10));
    }
}
