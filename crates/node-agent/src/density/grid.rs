//! Where periodic deadlines land: on a process-wide grid of [`GRID`] (50 ms).
//!
//! A hollow fleet runs thousands of agents, each with a lease renewal, a runtime health poll, an eviction pass,
//! a status tick and a resync per pod, all periods of seconds to minutes with their own jitter. Left alone, every
//! one of those deadlines is a wake-up of its own for the runtime's worker threads, and an idle fleet spends
//! its CPU switching threads in and out for them. On a shared grid, every deadline due within the same 50 ms
//! is served by one wake-up. Each loop keeps its period: a jittered deadline moves within
//! its own jitter window (see [`within`]), a fixed one at most [`GRID`] later. Back-offs and short waits are not
//! moved; only periods of a second and more are.

use std::sync::OnceLock;
use std::time::Duration;

use tokio::time::Instant;

/// The grid's step.
pub const GRID: Duration = Duration::from_millis(50);

/// Periods shorter than this keep their exact deadlines.
const MIN_PERIOD: Duration = Duration::from_secs(1);

/// The grid's origin (the first time the grid was asked, process-wide; tokio's clock, paused or not, is a
/// standard instant underneath).
fn origin() -> std::time::Instant {
    static ORIGIN: OnceLock<std::time::Instant> = OnceLock::new();
    *ORIGIN.get_or_init(std::time::Instant::now)
}

/// How far past the last grid point `at` is, in nanoseconds (instants before the origin count backwards from it).
fn phase(at: Instant) -> u64 {
    let step = GRID.as_nanos();
    let at = at.into_std();
    let o = origin();
    let p = match at.checked_duration_since(o) {
        Some(since) => since.as_nanos() % step,
        None => (step - o.duration_since(at).as_nanos() % step) % step,
    };
    u64::try_from(p).unwrap_or(0)
}

/// `at` as whole seconds since the grid's origin (0 before it; saturating after ~136 years): a `u32`
/// timestamp for records kept by the thousand, where a second is precise enough.
pub fn secs(at: Instant) -> u32 {
    let since = at.into_std().saturating_duration_since(origin()).as_secs();
    u32::try_from(since).unwrap_or(u32::MAX)
}

/// The first grid point at or after `at`.
pub fn round_up(at: Instant) -> Instant {
    let p = phase(at);
    if p == 0 {
        return at;
    }
    let step = u64::try_from(GRID.as_nanos()).unwrap_or(0);
    at + Duration::from_nanos(step - p)
}

/// The last grid point at or before `at`.
pub(crate) fn round_down(at: Instant) -> Instant {
    at.checked_sub(Duration::from_nanos(phase(at))).unwrap_or(at)
}

/// `at` moved onto the grid without leaving `[earliest, latest]`: the next grid point when it is in the window,
/// else the previous one when that is, else `at` itself (a window narrower than the grid with no point in it).
pub fn within(at: Instant, earliest: Instant, latest: Instant) -> Instant {
    let up = round_up(at);
    if up <= latest {
        return up;
    }
    let down = round_down(at);
    if down >= earliest { down } else { at }
}

/// The deadline of a periodic tick due `delay` from `now`, where `delay` is `period` stretched by up to `jitter`
/// of itself (as [`jittered`](crate::backoff::jittered) makes it). Periods under a second are not moved; a
/// jittered one stays in its jitter window; a fixed one (`jitter` 0) moves at most one grid step later.
pub fn periodic(now: Instant, period: Duration, jitter: f64, delay: Duration) -> Instant {
    let at = now + delay;
    if period < MIN_PERIOD {
        return at;
    }
    let earliest = now + period;
    let stretch =
        Duration::try_from_secs_f64(period.as_secs_f64() * jitter.max(0.0)).unwrap_or(Duration::ZERO);
    let latest = if stretch.is_zero() {
        at + GRID
    } else {
        (now + period + stretch).max(at)
    };
    within(at, earliest.min(at), latest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_grid(at: Instant) -> bool {
        phase(at) == 0
    }

    #[tokio::test(start_paused = true)]
    async fn seconds_since_the_origin_count_whole_seconds() {
        // a paused clock may stand before the origin (read from the real clock): start past it
        let now = Instant::from_std(origin()) + Duration::from_millis(2_500);
        assert_eq!(secs(now), 2);
        assert_eq!(secs(now + Duration::from_secs(7)) - secs(now), 7);
        assert!(secs(now + Duration::from_millis(999)) - secs(now) <= 1);
        if let Some(before) = Instant::from_std(origin()).checked_sub(Duration::from_secs(5)) {
            assert_eq!(secs(before), 0, "before the origin");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn deadlines_of_many_agents_share_grid_points() {
        let now = Instant::now();
        // 1,000 agents' renewals, each 10 s plus its own jitter of up to 4 %
        let mut points = std::collections::BTreeSet::new();
        for i in 0..1_000u32 {
            let delay = Duration::from_secs(10) + Duration::from_micros(u64::from(i) * 397);
            let at = periodic(now, Duration::from_secs(10), 0.04, delay);
            assert!(on_grid(at), "agent {i} off the grid");
            assert!(at >= now + Duration::from_secs(10) && at <= now + Duration::from_millis(10_400));
            points.insert(at);
        }
        // the 397 ms they spread over: 8 or 9 grid points, not 1,000 deadlines
        assert!(points.len() <= 9, "{} distinct deadlines", points.len());
    }

    #[tokio::test(start_paused = true)]
    async fn a_jittered_deadline_stays_in_its_window() {
        let now = Instant::now();
        let period = Duration::from_secs(10);
        for ms in [0u64, 1, 49, 50, 51, 399, 400] {
            let delay = period + Duration::from_millis(ms);
            let at = periodic(now, period, 0.04, delay);
            assert!(at >= now + period, "{ms}: before the period");
            assert!(
                at <= now + Duration::from_millis(10_400),
                "{ms}: past the jitter window"
            );
            assert!(on_grid(at), "{ms}: off the grid");
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_fixed_period_moves_at_most_one_step_and_short_waits_not_at_all() {
        let now = Instant::now();
        let at = periodic(now, Duration::from_secs(10), 0.0, Duration::from_secs(10));
        assert!(at >= now + Duration::from_secs(10) && at <= now + Duration::from_secs(10) + GRID);
        assert!(on_grid(at));
        let short = periodic(now, Duration::from_millis(200), 0.0, Duration::from_millis(200));
        assert_eq!(short, now + Duration::from_millis(200));
    }

    #[test]
    fn a_window_without_a_grid_point_keeps_the_deadline() {
        let base = Instant::now();
        let at = round_up(base) + Duration::from_millis(10);
        let (earliest, latest) = (at - Duration::from_millis(5), at + Duration::from_millis(5));
        assert_eq!(within(at, earliest, latest), at);
    }
}
