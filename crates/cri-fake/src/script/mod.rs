//! Scripted behaviour: the `cri-fake.node-agent.io/<key>` annotation keys, the runtime-wide [`Profile`] that
//! gives their defaults, and the resolved [`Script`] a container runs by.
//!
//! Precedence, highest first: the container's own annotations (`ContainerConfig.annotations`), the pod's
//! annotations naming the container (`<key>.<container-name>`), the pod's annotations (`<key>`), the profile.
//! See the crate documentation for the list of keys and their value grammars.

mod parse;

use std::collections::BTreeMap;
use std::sync::Arc;

pub(crate) use parse::{Dist, ExecRule, NS_PER_SEC, ProbeMatch, Rng, Timeline};

/// The annotation prefix of every behaviour key.
pub const ANNOTATION_PREFIX: &str = "cri-fake.node-agent.io/";

/// A behaviour key or value that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScriptError {
    /// The key is not one of the documented behaviour keys.
    #[error("unknown cri-fake behaviour key {key:?}")]
    UnknownKey {
        /// The key as written (without the annotation prefix).
        key: String,
    },
    /// The value does not parse.
    #[error("cri-fake behaviour {key:?} = {value:?}: {reason}")]
    InvalidValue {
        /// The key.
        key: String,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Every behaviour key, in documentation order.
pub const KEYS: &[&str] = &[
    "pull-duration",
    "pull-error",
    "image-size",
    "image-user",
    "sandbox-latency",
    "create-latency",
    "start-latency",
    "start-error",
    "exit-after",
    "exit-code",
    "exit-attempts",
    "oom-after",
    "stop-duration",
    "stop-exit-code",
    "exec",
    "probe",
    "cpu",
    "memory",
    "disk",
    "logs",
];

/// Everything a fake container (and the pulls and sandboxes around it) does, resolved from the keys.
#[derive(Debug, Clone, PartialEq)]
pub struct Script {
    pub(crate) pull_duration: Dist,
    pub(crate) pull_error: Option<Box<str>>,
    pub(crate) image_size: u64,
    pub(crate) image_user: Option<Box<str>>,
    pub(crate) sandbox_latency: Dist,
    pub(crate) create_latency: Dist,
    pub(crate) start_latency: Dist,
    pub(crate) start_error: Option<Box<str>>,
    pub(crate) exit_after: Option<Dist>,
    pub(crate) exit_code: i32,
    pub(crate) exit_attempts: Option<u32>,
    pub(crate) oom_after: Option<Dist>,
    pub(crate) stop_duration: Dist,
    pub(crate) stop_exit_code: i32,
    pub(crate) exec: Box<[ExecRule]>,
    pub(crate) probes: Box<[(ProbeMatch, Timeline)]>,
    pub(crate) cpu: Timeline,
    pub(crate) memory: Timeline,
    pub(crate) disk: Timeline,
    pub(crate) logs: Box<[Box<str>]>,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            pull_duration: Dist::ZERO,
            pull_error: None,
            image_size: 10 << 20,
            image_user: None,
            sandbox_latency: Dist::ZERO,
            create_latency: Dist::ZERO,
            start_latency: Dist::ZERO,
            start_error: None,
            exit_after: None,
            exit_code: 0,
            exit_attempts: None,
            oom_after: None,
            stop_duration: Dist::ZERO,
            stop_exit_code: 0,
            exec: Box::new([]),
            probes: Box::new([]),
            cpu: Timeline::constant(0.001),
            memory: Timeline::constant(4.0 * 1024.0 * 1024.0),
            disk: Timeline::constant(4096.0),
            logs: Box::new([]),
        }
    }
}

fn int<T: std::str::FromStr>(value: &str) -> Result<T, String> {
    value
        .trim()
        .parse()
        .map_err(|_| format!("expected an integer, got {value:?}"))
}

fn text(value: &str) -> Option<Box<str>> {
    let value = value.trim();
    (!value.is_empty()).then(|| value.into())
}

impl Script {
    /// Set one behaviour from its key (without prefix) and value.
    pub(crate) fn apply(&mut self, key: &str, value: &str) -> Result<(), ScriptError> {
        let invalid = |reason: String| ScriptError::InvalidValue {
            key: key.to_owned(),
            value: value.to_owned(),
            reason,
        };
        let never = |v: &str| v.trim() == "never" || v.trim().is_empty();
        match key {
            "pull-duration" => self.pull_duration = Dist::parse(value).map_err(invalid)?,
            "pull-error" => self.pull_error = text(value),
            "image-size" => self.image_size = parse::quantity(value).map_err(invalid)? as u64,
            "image-user" => self.image_user = text(value),
            "sandbox-latency" => self.sandbox_latency = Dist::parse(value).map_err(invalid)?,
            "create-latency" => self.create_latency = Dist::parse(value).map_err(invalid)?,
            "start-latency" => self.start_latency = Dist::parse(value).map_err(invalid)?,
            "start-error" => self.start_error = text(value),
            "exit-after" if never(value) => self.exit_after = None,
            "exit-after" => self.exit_after = Some(Dist::parse(value).map_err(invalid)?),
            "exit-code" => self.exit_code = int(value).map_err(invalid)?,
            "exit-attempts" => self.exit_attempts = Some(int(value).map_err(invalid)?),
            "oom-after" if never(value) => self.oom_after = None,
            "oom-after" => self.oom_after = Some(Dist::parse(value).map_err(invalid)?),
            "stop-duration" => self.stop_duration = Dist::parse(value).map_err(invalid)?,
            "stop-exit-code" => self.stop_exit_code = int(value).map_err(invalid)?,
            "exec" => self.exec = parse::exec_rules(value).map_err(invalid)?,
            "probe" => self.probes = parse::probe_rules(value).map_err(invalid)?,
            "cpu" => self.cpu = Timeline::parse(value, parse::quantity).map_err(invalid)?,
            "memory" => self.memory = Timeline::parse(value, parse::quantity).map_err(invalid)?,
            "disk" => self.disk = Timeline::parse(value, parse::quantity).map_err(invalid)?,
            "logs" => self.logs = value.lines().map(Into::into).collect(),
            _ => return Err(ScriptError::UnknownKey { key: key.to_owned() }),
        }
        Ok(())
    }

    /// Whether a container of this attempt runs the scripted exit / OOM kill.
    pub(crate) fn exits_on_attempt(&self, attempt: u32) -> bool {
        self.exit_attempts.is_none_or(|n| attempt < n)
    }
}

/// The runtime-wide defaults of every behaviour key: what a container does when its pod says nothing.
/// Built from the same keys and values as the annotations; shared (`Arc`) by every runtime of a fleet.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Profile {
    settings: BTreeMap<String, String>,
    script: Arc<Script>,
}

impl Profile {
    /// A profile from `(key, value)` pairs; keys may carry the annotation prefix or not.
    pub fn from_pairs<K: AsRef<str>, V: AsRef<str>>(
        pairs: impl IntoIterator<Item = (K, V)>,
    ) -> Result<Profile, ScriptError> {
        let mut settings = BTreeMap::new();
        let mut script = Script::default();
        for (key, value) in pairs {
            let key = key.as_ref();
            let key = key.strip_prefix(ANNOTATION_PREFIX).unwrap_or(key);
            script.apply(key, value.as_ref())?;
            settings.insert(key.to_owned(), value.as_ref().to_owned());
        }
        Ok(Profile {
            settings,
            script: Arc::new(script),
        })
    }

    /// The settings this profile was built from (key without prefix → value).
    pub fn settings(&self) -> &BTreeMap<String, String> {
        &self.settings
    }

    pub(crate) fn script(&self) -> &Script {
        &self.script
    }

    pub(crate) fn script_arc(&self) -> &Arc<Script> {
        &self.script
    }
}

/// Where a container's behaviour keys come from, in increasing precedence.
pub(crate) struct Sources<'a, P, C> {
    /// The pod's annotations.
    pub(crate) pod: P,
    /// The container's name (selects `<key>.<name>` pod annotations); `None` for pod-level behaviour.
    pub(crate) container: Option<&'a str>,
    /// The container's own annotations.
    pub(crate) own: C,
}

/// Resolve the script for one container (or, with no container, for the pod's pulls and sandbox): the profile's
/// script shared as is when nothing overrides it.
pub(crate) fn resolve<'a, P, C>(
    profile: &Arc<Script>,
    sources: Sources<'a, P, C>,
) -> Result<Arc<Script>, ScriptError>
where
    P: Iterator<Item = (&'a str, &'a str)> + Clone,
    C: Iterator<Item = (&'a str, &'a str)>,
{
    let ours = |(k, v): (&'a str, &'a str)| k.strip_prefix(ANNOTATION_PREFIX).map(|k| (k, v));
    let mut pod_level = Vec::new();
    let mut named = Vec::new();
    for (key, value) in sources.pod.filter_map(ours) {
        match key.split_once('.') {
            None => pod_level.push((key, value)),
            Some((key, name)) => {
                if !KEYS.contains(&key) {
                    return Err(ScriptError::UnknownKey { key: key.to_owned() });
                }
                if Some(name) == sources.container {
                    named.push((key, value));
                }
            }
        }
    }
    let own: Vec<_> = sources.own.filter_map(ours).collect();
    if pod_level.is_empty() && named.is_empty() && own.is_empty() {
        return Ok(Arc::clone(profile));
    }
    let mut script = Script::clone(profile);
    for (key, value) in pod_level.into_iter().chain(named).chain(own) {
        script.apply(key, value)?;
    }
    Ok(Arc::new(script))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(
        list: &[(&'static str, &'static str)],
    ) -> std::slice::Iter<'static, (&'static str, &'static str)> {
        // leak a copy so the iterator is 'static in tests
        Box::leak(list.to_vec().into_boxed_slice()).iter()
    }

    #[test]
    fn every_documented_key_is_accepted() {
        let samples = [
            ("pull-duration", "uniform(1s,2s)"),
            ("pull-error", "manifest unknown"),
            ("image-size", "100Mi"),
            ("image-user", "1000:1000"),
            ("sandbox-latency", "100ms"),
            ("create-latency", "exp(50ms)"),
            ("start-latency", "normal(100ms,10ms)"),
            ("start-error", "exec: \"app\": executable file not found"),
            ("exit-after", "30s"),
            ("exit-code", "2"),
            ("exit-attempts", "3"),
            ("oom-after", "1m"),
            ("stop-duration", "5s"),
            ("stop-exit-code", "143"),
            ("exec", r#"[{"cmd": "*"}]"#),
            ("probe", "http:8080/healthz=fail,ok@20s"),
            ("cpu", "100m, ~500m@1m"),
            ("memory", "64Mi, 128Mi@30s"),
            ("disk", "1Gi"),
            ("logs", "hello\nworld"),
        ];
        assert_eq!(samples.len(), KEYS.len());
        for (key, value) in samples {
            assert!(KEYS.contains(&key), "{key} not in KEYS");
            let mut script = Script::default();
            script.apply(key, value).unwrap_or_else(|e| panic!("{e}"));
            assert_ne!(script, Script::default(), "{key} changed nothing");
        }
        let err = Script::default().apply("exit-afterr", "1s").unwrap_err();
        assert!(matches!(err, ScriptError::UnknownKey { .. }));
        let err = Script::default().apply("exit-after", "soon").unwrap_err();
        assert!(err.to_string().contains("exit-after"), "{err}");
    }

    #[test]
    fn precedence_container_then_named_then_pod_then_profile() {
        let profile =
            Profile::from_pairs([("exit-code", "1"), ("cri-fake.node-agent.io/stop-exit-code", "9")])
                .unwrap()
                .script;
        let pod = pairs(&[
            ("cri-fake.node-agent.io/exit-code", "2"),
            ("cri-fake.node-agent.io/exit-code.app", "3"),
            ("cri-fake.node-agent.io/exit-after.sidecar", "5s"),
            ("unrelated/key", "x"),
        ]);
        let own = pairs(&[("cri-fake.node-agent.io/exit-after", "1s")]);
        let pod_iter = || pod.clone().map(|(k, v)| (*k, *v));

        let app = resolve(
            &profile,
            Sources {
                pod: pod_iter(),
                container: Some("app"),
                own: own.clone().map(|(k, v)| (*k, *v)),
            },
        )
        .unwrap();
        assert_eq!(app.exit_code, 3);
        assert_eq!(app.exit_after, Some(Dist::Fixed(NS_PER_SEC)));
        assert_eq!(app.stop_exit_code, 9);

        let other = resolve(
            &profile,
            Sources {
                pod: pod_iter(),
                container: Some("other"),
                own: std::iter::empty(),
            },
        )
        .unwrap();
        assert_eq!(other.exit_code, 2);
        assert_eq!(other.exit_after, None);

        let untouched = resolve(
            &profile,
            Sources {
                pod: pairs(&[("a", "b")]).map(|(k, v)| (*k, *v)),
                container: Some("x"),
                own: std::iter::empty(),
            },
        )
        .unwrap();
        assert!(
            Arc::ptr_eq(&untouched, &profile),
            "no override shares the profile script"
        );

        let bad = resolve(
            &profile,
            Sources {
                pod: pairs(&[("cri-fake.node-agent.io/exit-afterr.app", "1s")]).map(|(k, v)| (*k, *v)),
                container: Some("x"),
                own: std::iter::empty(),
            },
        );
        assert!(matches!(bad, Err(ScriptError::UnknownKey { .. })));
    }

    #[test]
    fn attempts_gate_the_scripted_exit() {
        let mut s = Script::default();
        assert!(s.exits_on_attempt(100));
        s.apply("exit-attempts", "2").unwrap();
        assert!(s.exits_on_attempt(0) && s.exits_on_attempt(1));
        assert!(!s.exits_on_attempt(2));
    }
}
