//! Time as the fake runtime sees it: CRI wants wall-clock nanoseconds, tests want `tokio::time` (pausable). The
//! clock anchors tokio's monotonic clock to the wall clock once, at construction, and derives every timestamp
//! from tokio time, so paused-time tests see timestamps advance exactly with `tokio::time::advance`.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use tokio::time::Instant;

/// Converts between tokio instants and CRI timestamps (Unix nanoseconds).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Clock {
    start: Instant,
    start_ns: i64,
}

impl Clock {
    pub(crate) fn new() -> Self {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO);
        Clock {
            start: Instant::now(),
            start_ns: i64::try_from(wall.as_nanos()).unwrap_or(i64::MAX / 2),
        }
    }

    /// Now, in Unix nanoseconds.
    pub(crate) fn now(&self) -> i64 {
        self.start_ns + i64::try_from(self.start.elapsed().as_nanos()).unwrap_or(i64::MAX / 4)
    }

    /// The tokio instant of a timestamp.
    pub(crate) fn instant(&self, ns: i64) -> Instant {
        self.start + Duration::from_nanos(u64::try_from(ns - self.start_ns).unwrap_or(0))
    }
}

/// A duration in nanoseconds as a `Duration` (negative → zero).
pub(crate) fn nanos(ns: i64) -> Duration {
    Duration::from_nanos(u64::try_from(ns).unwrap_or(0))
}

/// Format a Unix-nanosecond timestamp as RFC 3339 with nanoseconds, UTC (the CRI log line prefix).
pub(crate) fn rfc3339(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let frac = ns.rem_euclid(1_000_000_000);
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // civil date from days since 1970-01-01 (proleptic Gregorian)
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{frac:09}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc3339_formats_known_instants() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000000000Z");
        assert_eq!(rfc3339(951_782_400_000_000_001), "2000-02-29T00:00:00.000000001Z");
        assert_eq!(
            rfc3339(1_700_000_000_123_456_789),
            "2023-11-14T22:13:20.123456789Z"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn timestamps_follow_paused_tokio_time() {
        let clock = Clock::new();
        let t0 = clock.now();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(clock.now() - t0, 5_000_000_000);
        assert_eq!(
            clock.instant(t0 + 1_000_000_000),
            clock.instant(t0) + Duration::from_secs(1)
        );
    }
}
