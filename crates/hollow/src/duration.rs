//! Durations as people write them in flags and profile files: `500ms`, `30s`, `5m`, `1h`.

use std::time::Duration;

/// Durations written as `500ms`, `30s`, `5m`, `1h`.
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    let t = text.trim();
    let (number, unit) = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .map_or((t, ""), |i| t.split_at(i));
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (e.g. 500ms, 30s, 5m)"))?;
    let secs = match unit {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        _ => return Err(format!("{text:?}: the unit must be ms, s, m or h")),
    };
    Duration::try_from_secs_f64(secs).map_err(|e| format!("{text:?}: {e}"))
}

/// Reads a [`parse_duration`] text in serde (`#[serde(with = "crate::duration::text")]`).
pub mod text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    /// Reads one duration text.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// Reads an optional [`parse_duration`] text in serde (`#[serde(default, with = "crate::duration::opt_text")]`).
pub mod opt_text {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    /// Reads one duration text, if present.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        Option::<String>::deserialize(d)?
            .map(|text| super::parse_duration(&text).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_the_usual_units_and_reject_others() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("1.5m"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_duration("30").unwrap_err().contains("unit"));
        assert!(parse_duration("fast").unwrap_err().contains("not a duration"));
    }
}
