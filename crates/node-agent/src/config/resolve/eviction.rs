//! The eviction thresholds: the upstream defaults of `evictionHard` (merged with the given ones when
//! `mergeDefaultEvictionSettings` says so), `evictionSoft` with the grace period each soft threshold needs, and
//! `evictionMinimumReclaim`.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::config::Threshold;
use crate::config::check::Check;
use crate::config::file::FileConfig;
use crate::config::validate::EVICTION_SIGNALS;
use crate::quantity::Quantity;

/// The upstream default eviction thresholds.
pub fn default_eviction_hard() -> BTreeMap<String, Threshold> {
    let mut m = BTreeMap::new();
    m.insert(
        "memory.available".to_owned(),
        Threshold::Quantity(Quantity::from_units(
            100 * 1024 * 1024,
            crate::quantity::Format::BinarySI,
        )),
    );
    m.insert(
        "nodefs.available".to_owned(),
        Threshold::Percentage(10.0f32 / 100.0),
    );
    m.insert(
        "nodefs.inodesFree".to_owned(),
        Threshold::Percentage(5.0f32 / 100.0),
    );
    m.insert(
        "imagefs.available".to_owned(),
        Threshold::Percentage(15.0f32 / 100.0),
    );
    m.insert(
        "imagefs.inodesFree".to_owned(),
        Threshold::Percentage(5.0f32 / 100.0),
    );
    m
}

/// The eviction settings, resolved.
pub(super) struct Eviction {
    pub(super) eviction_hard: BTreeMap<String, Threshold>,
    pub(super) eviction_soft: BTreeMap<String, Threshold>,
    pub(super) eviction_minimum_reclaim: BTreeMap<String, Threshold>,
    pub(super) eviction_soft_grace_period: BTreeMap<String, Duration>,
}

/// `evictionHard`, `evictionSoft`, `evictionMinimumReclaim` and `evictionSoftGracePeriod`, checked.
pub(super) fn eviction(c: &mut Check<'_>, f: &FileConfig) -> Eviction {
    let merge_defaults = f.merge_default_eviction_settings.unwrap_or(false);
    let eviction_hard = match &f.eviction_hard {
        None => default_eviction_hard(),
        Some(given) => {
            let given = c.thresholds("evictionHard", Some(given));
            if merge_defaults {
                let mut m = default_eviction_hard();
                m.extend(given);
                m
            } else {
                given
            }
        }
    };
    let eviction_soft = c.thresholds("evictionSoft", f.eviction_soft.as_ref());
    let eviction_minimum_reclaim =
        c.thresholds("evictionMinimumReclaim", f.eviction_minimum_reclaim.as_ref());
    let mut eviction_soft_grace_period = BTreeMap::new();
    for (signal, raw) in f.eviction_soft_grace_period.iter().flatten() {
        let field = format!("evictionSoftGracePeriod[{signal}]");
        if !EVICTION_SIGNALS.contains(&signal.as_str()) {
            c.err(&field, "unknown eviction signal");
            continue;
        }
        match crate::config::duration::parse(raw) {
            Ok(d) => {
                eviction_soft_grace_period.insert(signal.clone(), d);
            }
            Err(e) => c.err(&field, e.to_string()),
        }
    }
    for signal in eviction_soft.keys() {
        if !eviction_soft_grace_period.contains_key(signal) {
            c.err(
                &format!("evictionSoftGracePeriod[{signal}]"),
                "a soft eviction threshold needs a grace period",
            );
        }
    }
    Eviction {
        eviction_hard,
        eviction_soft,
        eviction_minimum_reclaim,
        eviction_soft_grace_period,
    }
}
