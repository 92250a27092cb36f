//! What the agent does not act on: the start-up warnings about settings that are accepted but have no effect, or
//! only part of the kubelet's effect.
//!
//! This module owns one question — "which of the settings given to this process will a user believe took effect
//! when they did not?" — and answers it as an [`Unacted`] value the binaries log at start. The tables it reads are
//! in [`super::fields`]; `docs/configuration.md` lists the same fields, and a test keeps the two equal.

use std::collections::{BTreeMap, BTreeSet};

use super::KubeletConfig;
use super::fields::{PARTIAL, READ_WITHOUT_EFFECT};

/// Settings given to this process that do not (fully) take effect.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Unacted {
    /// Fields accepted without any effect, by their file name (set in the file, or by a flag).
    pub no_effect: Vec<String>,
    /// Fields that act only in part: (field, what of the kubelet's behaviour is missing).
    pub partial: Vec<(String, &'static str)>,
}

impl Unacted {
    /// True when everything given takes effect.
    pub fn is_empty(&self) -> bool {
        self.no_effect.is_empty() && self.partial.is_empty()
    }

    /// Every field named, no-effect and partial together, sorted.
    pub fn all_fields(&self) -> BTreeSet<String> {
        self.no_effect
            .iter()
            .cloned()
            .chain(self.partial.iter().map(|(f, _)| f.clone()))
            .collect()
    }

    /// Logs one warning for the fields without effect and one per partial field.
    pub fn warn(&self, program: &str) {
        if !self.no_effect.is_empty() {
            tracing::warn!(
                fields = ?self.no_effect,
                "configuration fields accepted but not acted on by {program} (no effect yet)"
            );
        }
        for (field, missing) in &self.partial {
            tracing::warn!(%field, missing, "configuration field acts only in part in {program}");
        }
    }
}

/// The unacted settings of a configuration: `ignored` are the upstream-only fields present in the file, `set` the
/// fields given a value (in the file or by a flag), `config` the resolved result (a partial field is named when its
/// resolved value asks for the part that is missing, whether given or by default).
pub(crate) fn unacted<'a>(
    ignored: &[String],
    set: impl IntoIterator<Item = &'a str>,
    config: &KubeletConfig,
) -> Unacted {
    let set: BTreeSet<&str> = set.into_iter().collect();
    let mut no_effect: BTreeSet<String> = ignored.iter().cloned().collect();
    for field in READ_WITHOUT_EFFECT {
        if set.contains(field) {
            no_effect.insert((*field).to_owned());
        }
    }
    let mut partial = BTreeMap::new();
    for p in PARTIAL {
        if (p.on)(config) {
            partial.insert(p.field.to_owned(), p.missing);
        }
    }
    Unacted {
        no_effect: no_effect.into_iter().collect(),
        partial: partial.into_iter().collect(),
    }
}
