//! Go-style duration strings (`10s`, `1m30s`, `300ms`, `4h0m0s`), as `metav1.Duration` writes them in a
//! KubeletConfiguration and as kubelet flags accept them.

use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Deserializer};

/// Why a duration string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// Not a duration at all.
    #[error("invalid duration {0:?} (expected e.g. 10s, 1m30s, 300ms, 2h)")]
    Invalid(String),
    /// A negative duration where none is allowed.
    #[error("duration {0:?} must not be negative")]
    Negative(String),
}

/// Parses a Go duration string into a non-negative [`Duration`]. A bare `0` is accepted.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let invalid = || DurationError::Invalid(input.to_owned());
    let s = input.trim();
    let (negative, mut rest) = match s.strip_prefix('-') {
        Some(r) => (true, r),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }
    let mut total_nanos: u128 = 0;
    while !rest.is_empty() {
        let num_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(invalid)?;
        let (number, tail) = rest.split_at(num_end);
        if number.is_empty() || number == "." {
            return Err(invalid());
        }
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let unit_nanos: u128 = match unit {
            "ns" => 1,
            "us" | "µs" | "μs" => 1_000,
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60_000_000_000,
            "h" => 3_600_000_000_000,
            _ => return Err(invalid()),
        };
        let (int_part, frac_part) = number.split_once('.').unwrap_or((number, ""));
        let int: u128 = if int_part.is_empty() {
            0
        } else {
            int_part.parse().map_err(|_| invalid())?
        };
        total_nanos = total_nanos
            .checked_add(int.checked_mul(unit_nanos).ok_or_else(invalid)?)
            .ok_or_else(invalid)?;
        if !frac_part.is_empty() {
            let digits = &frac_part[..frac_part.len().min(18)];
            let frac: u128 = digits.parse().map_err(|_| invalid())?;
            let scale = 10u128.pow(digits.len() as u32);
            total_nanos = total_nanos
                .checked_add(frac * unit_nanos / scale)
                .ok_or_else(invalid)?;
        }
        rest = tail;
    }
    if negative && total_nanos != 0 {
        return Err(DurationError::Negative(input.to_owned()));
    }
    let secs = u64::try_from(total_nanos / 1_000_000_000).map_err(|_| invalid())?;
    Ok(Duration::new(secs, (total_nanos % 1_000_000_000) as u32))
}

/// Formats a duration the way Go prints one (`10s`, `5m0s`, `1h0m0s`, `300ms`, `0s`).
pub fn format(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    let mut out = String::new();
    if nanos < 1_000_000_000 {
        let (v, unit) = if nanos < 1_000 {
            (nanos as f64, "ns")
        } else if nanos < 1_000_000 {
            (nanos as f64 / 1e3, "µs")
        } else {
            (nanos as f64 / 1e6, "ms")
        };
        let _ = write!(out, "{v}{unit}");
        return out;
    }
    let total_secs = d.as_secs();
    let (h, m, s) = (total_secs / 3600, (total_secs / 60) % 60, total_secs % 60);
    let sub = d.subsec_nanos();
    if h > 0 {
        let _ = write!(out, "{h}h");
    }
    if h > 0 || m > 0 {
        let _ = write!(out, "{m}m");
    }
    if sub == 0 {
        let _ = write!(out, "{s}s");
    } else {
        let frac = format!("{sub:09}");
        let _ = write!(out, "{s}.{}s", frac.trim_end_matches('0'));
    }
    out
}

/// serde helper: an optional Go duration string.
pub(crate) fn deserialize_opt<'de, D: Deserializer<'de>>(de: D) -> Result<Option<Duration>, D::Error> {
    let raw: Option<String> = Option::deserialize(de)?;
    raw.map(|s| parse(&s).map_err(serde::de::Error::custom))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("5m0s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse("300ms"), Ok(Duration::from_millis(300)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("2h45m"), Ok(Duration::from_secs(2 * 3600 + 45 * 60)));
        assert!(matches!(parse("-1s"), Err(DurationError::Negative(_))));
        for bad in ["", "10", "s", "1x", "1.s.", "ten seconds", "1m1"] {
            assert!(parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_secs(10)), "10s");
        assert_eq!(format(Duration::from_secs(300)), "5m0s");
        assert_eq!(format(Duration::from_secs(3600)), "1h0m0s");
        assert_eq!(format(Duration::from_millis(300)), "300ms");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::ZERO), "0s");
        for d in [
            Duration::from_secs(7),
            Duration::from_secs(4 * 3600),
            Duration::from_millis(100),
        ] {
            assert_eq!(parse(&format(d)), Ok(d));
        }
    }
}
