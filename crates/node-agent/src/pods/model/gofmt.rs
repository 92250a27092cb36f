//! Durations printed the way the kubelet (Go's `time.Duration`) prints them in messages users grep for:
//! `10s`, `1m20s`, `5m0s`, `1.5s`, `250ms`.

use std::time::Duration;

/// Formats `d` like Go's `Duration.String()` (to millisecond precision).
pub fn duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_owned();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let total_secs = d.as_secs();
    let frac = ms % 1000;
    let secs = total_secs % 60;
    let mins = (total_secs / 60) % 60;
    let hours = total_secs / 3600;
    let mut secs_text = secs.to_string();
    if frac != 0 {
        let f = format!("{frac:03}");
        secs_text.push('.');
        secs_text.push_str(f.trim_end_matches('0'));
    }
    match (hours, mins) {
        (0, 0) => format!("{secs_text}s"),
        (0, m) => format!("{m}m{secs_text}s"),
        (h, m) => format!("{h}h{m}m{secs_text}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_go() {
        let s = Duration::from_secs;
        assert_eq!(duration(s(10)), "10s");
        assert_eq!(duration(s(80)), "1m20s");
        assert_eq!(duration(s(300)), "5m0s");
        assert_eq!(duration(s(3725)), "1h2m5s");
        assert_eq!(duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(duration(Duration::from_millis(1234)), "1.234s");
        assert_eq!(duration(Duration::from_millis(250)), "250ms");
        assert_eq!(duration(Duration::ZERO), "0s");
    }
}
