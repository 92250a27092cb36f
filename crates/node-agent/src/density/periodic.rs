//! When periodic loops run: each node-side loop (lease, status, runtime health, GC, eviction, resync) waits
//! for its next round through [`JitteredInterval`] or [`next_tick`].
//!
//! Each period is jittered as the kubelet jitters its loops, and periods of a second and more land on the
//! process-wide [`grid`](crate::density::grid), so that thousands of agents in one process wake together
//! rather than one after another.

use std::time::Duration;

use tokio::time::Instant;

use crate::backoff::{jittered, random_phase};

/// One jittered period after `now`, on the [`grid`](crate::density::grid) shared with other agents: the deadline of every
/// periodic loop's next round.
pub fn next_tick(now: Instant, period: Duration, jitter: f64) -> Instant {
    crate::density::grid::periodic(now, period, jitter, jittered(period, jitter))
}

/// A periodic timer whose every period is jittered, for loops that thousands of agents run side by side.
///
/// The first tick comes after a random phase within one period (or immediately, see
/// [`immediate`](Self::immediate)); every following tick comes `jittered(period, jitter)` after the previous
/// tick *completed* (sliding, like the kubelet's `JitterUntil`). Ticks of periods of a second and more land on
/// the process-wide [`grid`](crate::density::grid), within their jitter.
#[derive(Debug)]
pub struct JitteredInterval {
    period: Duration,
    jitter: f64,
    next: Instant,
}

impl JitteredInterval {
    /// A timer whose first tick is at a random phase within one period.
    pub fn new(period: Duration, jitter: f64) -> Self {
        let first = Instant::now() + random_phase(period);
        Self {
            period,
            jitter,
            next: if period >= Duration::from_secs(1) {
                crate::density::grid::round_up(first)
            } else {
                first
            },
        }
    }

    /// A timer whose first tick is after exactly one jittered period.
    pub fn after_period(period: Duration, jitter: f64) -> Self {
        Self {
            period,
            jitter,
            next: next_tick(Instant::now(), period, jitter),
        }
    }

    /// A timer whose first tick is immediate.
    pub fn immediate(period: Duration, jitter: f64) -> Self {
        Self {
            period,
            jitter,
            next: Instant::now(),
        }
    }

    /// Waits for the next tick and schedules the one after it.
    pub async fn tick(&mut self) -> Instant {
        tokio::time::sleep_until(self.next).await;
        let now = Instant::now();
        self.advance(now);
        now
    }

    /// Takes the tick that was due and schedules the next one a jittered period after `now`.
    pub fn advance(&mut self, now: Instant) {
        self.next = next_tick(now, self.period, self.jitter);
    }

    /// Moves the next tick to one jittered period from now (after work done outside the timer).
    pub fn reset(&mut self) {
        self.next = next_tick(Instant::now(), self.period, self.jitter);
    }

    /// Moves the next tick to `at`.
    pub fn reset_at(&mut self, at: Instant) {
        self.next = at;
    }

    /// When the next tick is due.
    pub fn deadline(&self) -> Instant {
        self.next
    }

    /// The nominal period.
    pub fn period(&self) -> Duration {
        self.period
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[tokio::test(start_paused = true)]
    async fn jittered_interval_ticks_within_period_bounds() {
        let mut t = JitteredInterval::new(Duration::from_secs(10), 0.04);
        let t0 = Instant::now();
        let first = t.tick().await;
        assert!(
            first - t0 <= Duration::from_secs(10) + crate::density::grid::GRID,
            "first tick within one period (and a grid step)"
        );
        let mut prev = first;
        for _ in 0..50 {
            let now = t.tick().await;
            let gap = now - prev;
            // the paused clock rounds sleeps up to the next millisecond
            assert!(
                gap >= Duration::from_secs(10) && gap <= Duration::from_millis(10_401),
                "gap {gap:?}"
            );
            prev = now;
        }
        let mut imm = JitteredInterval::immediate(Duration::from_secs(5), 0.0);
        let now = Instant::now();
        assert_eq!(imm.tick().await, now);
        // a fixed period: at most one grid step later, on the grid shared with other agents
        let second = imm.tick().await;
        let due = now + Duration::from_secs(5);
        assert!(
            second >= due && second <= due + crate::density::grid::GRID + ms(1),
            "{:?}",
            second - now
        );
        let mut tight = JitteredInterval::immediate(Duration::from_secs(5), 0.0);
        tight.tick().await;
        let set = tight.next;
        assert_eq!(
            crate::density::grid::round_up(set),
            set,
            "the next tick sits on the grid"
        );
    }
}
