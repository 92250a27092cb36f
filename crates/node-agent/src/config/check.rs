//! The validation helper of [`resolve`](super::resolve): typed conversions that record a [`FieldError`]
//! naming the field (and the flag that set it) instead of failing at the first problem.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Taint;

use super::file::FileTaint;
use super::validate::{self, EVICTION_SIGNALS};
use super::{FieldError, Threshold};
use crate::quantity::Quantity;

pub(crate) struct Check<'a> {
    pub(crate) errors: Vec<FieldError>,
    origins: &'a BTreeMap<&'static str, &'static str>,
}

impl<'a> Check<'a> {
    pub(crate) fn new(origins: &'a BTreeMap<&'static str, &'static str>) -> Self {
        Check {
            errors: Vec::new(),
            origins,
        }
    }

    pub(crate) fn name(&self, field: &str) -> String {
        let base = field.split('[').next().unwrap_or(field);
        match self.origins.get(base) {
            Some(flag) => format!("{field} ({flag})"),
            None => field.to_owned(),
        }
    }

    pub(crate) fn err(&mut self, field: &str, message: impl Into<String>) {
        let field = self.name(field);
        self.errors.push(FieldError {
            field,
            message: message.into(),
        });
    }

    pub(crate) fn positive(&mut self, field: &str, v: Option<Duration>, default: Duration) -> Duration {
        let d = v.unwrap_or(default);
        if d.is_zero() {
            self.err(field, "must be greater than zero");
        }
        d
    }

    pub(crate) fn port(&mut self, field: &str, v: Option<i64>, default: u16, allow_zero: bool) -> u16 {
        let v = v.unwrap_or(i64::from(default));
        let lo = if allow_zero { 0 } else { 1 };
        match u16::try_from(v) {
            Ok(p) if i64::from(p) >= lo => p,
            _ => {
                self.err(field, format!("{v} must be between {lo} and 65535"));
                default
            }
        }
    }

    pub(crate) fn non_negative(&mut self, field: &str, v: Option<i64>, default: u32) -> u32 {
        let v = v.unwrap_or(i64::from(default));
        match u32::try_from(v) {
            Ok(n) => n,
            Err(_) if v < 0 => {
                self.err(field, format!("{v} must not be negative"));
                default
            }
            Err(_) => {
                self.err(field, format!("{v} is too large (at most {})", u32::MAX));
                default
            }
        }
    }

    pub(crate) fn percent(&mut self, field: &str, v: Option<i64>, default: u8) -> u8 {
        let v = v.unwrap_or(i64::from(default));
        match u8::try_from(v) {
            Ok(p) if p <= 100 => p,
            _ => {
                self.err(field, format!("{v} must be between 0 and 100"));
                default
            }
        }
    }

    pub(crate) fn ip(&mut self, field: &str, v: Option<&str>, default: IpAddr) -> IpAddr {
        match v {
            None => default,
            Some(s) => s.parse().unwrap_or_else(|_| {
                self.err(field, format!("{s:?} is not an IP address"));
                default
            }),
        }
    }

    pub(crate) fn path(v: Option<&String>) -> Option<PathBuf> {
        v.filter(|s| !s.is_empty()).map(PathBuf::from)
    }

    pub(crate) fn reserved(
        &mut self,
        field: &str,
        v: Option<&BTreeMap<String, String>>,
    ) -> BTreeMap<String, Quantity> {
        let mut out = BTreeMap::new();
        for (k, raw) in v.into_iter().flatten() {
            let key_field = format!("{field}[{k}]");
            let known = matches!(k.as_str(), "cpu" | "memory" | "ephemeral-storage" | "pid")
                || k.starts_with("hugepages-");
            if !known {
                self.err(
                    &key_field,
                    "unknown resource; expected cpu, memory, ephemeral-storage, pid or hugepages-<size>",
                );
                continue;
            }
            match raw.parse::<Quantity>() {
                Ok(q) if q.is_negative() => self.err(&key_field, format!("{raw:?} must not be negative")),
                Ok(q) => {
                    out.insert(k.clone(), q);
                }
                Err(e) => self.err(&key_field, e.to_string()),
            }
        }
        out
    }

    pub(crate) fn thresholds(
        &mut self,
        field: &str,
        v: Option<&BTreeMap<String, String>>,
    ) -> BTreeMap<String, Threshold> {
        let mut out = BTreeMap::new();
        for (signal, raw) in v.into_iter().flatten() {
            let key_field = format!("{field}[{signal}]");
            if !EVICTION_SIGNALS.contains(&signal.as_str()) {
                self.err(
                    &key_field,
                    format!(
                        "unknown eviction signal; expected one of {}",
                        EVICTION_SIGNALS.join(", ")
                    ),
                );
                continue;
            }
            match parse_threshold(raw) {
                Ok(t) => {
                    out.insert(signal.clone(), t);
                }
                Err(message) => self.err(&key_field, message),
            }
        }
        out
    }
}

/// Parses an eviction threshold value: a quantity (`100Mi`) or a percentage (`10%`).
pub(crate) fn parse_threshold(raw: &str) -> Result<Threshold, String> {
    let raw = raw.trim();
    if let Some(num) = raw.strip_suffix('%') {
        let p: f32 = num
            .trim()
            .parse()
            .map_err(|_| format!("{raw:?} is not a percentage"))?;
        if !(0.0..=100.0).contains(&p) {
            return Err(format!("{raw:?} must be between 0% and 100%"));
        }
        return Ok(Threshold::Percentage(p / 100.0));
    }
    let q: Quantity = raw
        .parse()
        .map_err(|e: crate::quantity::QuantityError| e.to_string())?;
    if q.is_negative() {
        return Err(format!("{raw:?} must not be negative"));
    }
    Ok(Threshold::Quantity(q))
}

pub(crate) fn taint(t: &FileTaint) -> Result<Taint, String> {
    validate::validate_label_key(&t.key)?;
    if let Some(v) = &t.value {
        validate::validate_label_value(v)?;
    }
    validate::validate_taint_effect(&t.effect)?;
    Ok(Taint {
        key: t.key.clone(),
        value: t.value.clone().filter(|v| !v.is_empty()),
        effect: t.effect.clone(),
        time_added: None,
    })
}
