//! Value grammars of the behaviour keys: durations, distributions, quantities, timelines, probe targets and exec
//! rules. Every parser returns a plain `Err(String)` reason; the caller attaches the key and value.

use serde::Deserialize;

/// Nanoseconds per second.
pub(crate) const NS_PER_SEC: i64 = 1_000_000_000;

/// Parse a Go-style duration: `0`, `500ms`, `20s`, `1.5m`, `1h30m`. Units: ns, us (µs), ms, s, m, h.
pub(crate) fn duration_ns(text: &str) -> Result<i64, String> {
    let text = text.trim();
    if text == "0" {
        return Ok(0);
    }
    if text.is_empty() {
        return Err("empty duration".into());
    }
    let mut rest = text;
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let num_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if num_len == 0 {
            return Err(format!("expected a number in duration {text:?}"));
        }
        let number: f64 = rest[..num_len]
            .parse()
            .map_err(|_| format!("bad number in duration {text:?}"))?;
        rest = &rest[num_len..];
        let unit_len = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit_len] {
            "ns" => 1.0,
            "us" | "µs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            "" => return Err(format!("missing unit in duration {text:?} (use ms, s, m, h)")),
            other => return Err(format!("unknown unit {other:?} in duration {text:?}")),
        };
        rest = &rest[unit_len..];
        total += number * scale;
    }
    if total > i64::MAX as f64 / 2.0 {
        return Err(format!("duration {text:?} is too long"));
    }
    Ok(total.round() as i64)
}

/// Parse a quantity the Kubernetes way: `250m` (milli), `1.5`, `64Mi`, `2G`, `512Ki`.
pub(crate) fn quantity(text: &str) -> Result<f64, String> {
    let text = text.trim();
    let split = text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-' || c == '+' || c == 'e'));
    let (number, suffix) = match split {
        Some(i) => text.split_at(i),
        None => (text, ""),
    };
    let number: f64 = number.parse().map_err(|_| format!("bad quantity {text:?}"))?;
    let scale = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "Ki" => 1024.0,
        "Mi" => 1024.0 * 1024.0,
        "Gi" => 1024.0 * 1024.0 * 1024.0,
        "Ti" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        other => return Err(format!("unknown suffix {other:?} in quantity {text:?}")),
    };
    let value = number * scale;
    if !value.is_finite() || value < 0.0 {
        return Err(format!("quantity {text:?} must be a finite, non-negative number"));
    }
    Ok(value)
}

/// A duration drawn afresh each time it is used.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Dist {
    /// Always this many nanoseconds.
    Fixed(i64),
    /// Uniform between the two bounds (ns).
    Uniform(i64, i64),
    /// Normal with mean and standard deviation (ns), clamped at zero.
    Normal(i64, i64),
    /// Exponential with this mean (ns).
    Exp(i64),
}

impl Dist {
    /// No delay.
    pub const ZERO: Dist = Dist::Fixed(0);

    /// Parse `<duration>`, `uniform(<min>,<max>)`, `normal(<mean>,<stddev>)` or `exp(<mean>)`.
    pub(crate) fn parse(text: &str) -> Result<Dist, String> {
        let text = text.trim();
        let Some(open) = text.find('(') else {
            return duration_ns(text).map(Dist::Fixed);
        };
        let Some(args) = text[open + 1..].strip_suffix(')') else {
            return Err(format!("missing ')' in {text:?}"));
        };
        let args: Vec<i64> = args.split(',').map(duration_ns).collect::<Result<_, _>>()?;
        match (&text[..open], args.as_slice()) {
            ("uniform", [lo, hi]) if lo <= hi => Ok(Dist::Uniform(*lo, *hi)),
            ("uniform", [_, _]) => Err(format!("uniform bounds reversed in {text:?}")),
            ("normal", [mean, sd]) => Ok(Dist::Normal(*mean, *sd)),
            ("exp", [mean]) => Ok(Dist::Exp(*mean)),
            (name, _) => Err(format!(
                "unknown distribution {name:?} or wrong argument count in {text:?} \
                 (use uniform(a,b), normal(mean,sd) or exp(mean))"
            )),
        }
    }

    /// Draw a value (ns, never negative).
    pub(crate) fn sample(&self, rng: &mut Rng) -> i64 {
        let v = match *self {
            Dist::Fixed(v) => v as f64,
            Dist::Uniform(lo, hi) => lo as f64 + (hi - lo) as f64 * rng.unit(),
            Dist::Normal(mean, sd) => {
                let (u1, u2) = (1.0 - rng.unit(), rng.unit());
                let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
                mean as f64 + sd as f64 * z
            }
            Dist::Exp(mean) => -(mean as f64) * (1.0 - rng.unit()).ln(),
        };
        v.max(0.0).round() as i64
    }
}

/// A small deterministic generator (splitmix64): one word of state per runtime.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed)
    }

    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// A value over time since the container started: steps, or linear ramps (`~`) between points.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Timeline {
    /// (offset ns, value, ramp from the previous point).
    points: Box<[(i64, f64, bool)]>,
}

impl Timeline {
    /// A constant.
    pub(crate) fn constant(value: f64) -> Self {
        Timeline {
            points: Box::new([(0, value, false)]),
        }
    }

    /// Parse `v0, v1@t1, ~v2@t2`: `v0` from the start, `v1` from `t1`, ramping linearly to `v2` at `t2`.
    pub(crate) fn parse(text: &str, value: impl Fn(&str) -> Result<f64, String>) -> Result<Timeline, String> {
        let mut points = Vec::new();
        for (i, part) in text.split(',').map(str::trim).enumerate() {
            let (ramp, part) = match part.strip_prefix('~') {
                Some(rest) => (true, rest.trim()),
                None => (false, part),
            };
            let (v, at) = match part.split_once('@') {
                Some((v, at)) => (v.trim(), duration_ns(at)?),
                None if i == 0 => (part, 0),
                None => {
                    return Err(format!(
                        "point {part:?} needs @<time> (only the first point may omit it)"
                    ));
                }
            };
            if i == 0 && (at != 0 || ramp) {
                return Err("the first point starts at 0 and cannot ramp".into());
            }
            if let Some(&(prev, _, _)) = points.last()
                && at <= prev
            {
                return Err(format!("times must increase: {part:?}"));
            }
            points.push((at, value(v)?, ramp));
        }
        if points.is_empty() {
            return Err("empty timeline".into());
        }
        Ok(Timeline {
            points: points.into(),
        })
    }

    /// The value `elapsed` ns after the start.
    pub(crate) fn at(&self, elapsed: i64) -> f64 {
        let idx = self.points.partition_point(|p| p.0 <= elapsed);
        let Some(&(t0, v0, _)) = self.points.get(idx.wrapping_sub(1)) else {
            return self.points.first().map_or(0.0, |p| p.1);
        };
        match self.points.get(idx) {
            Some(&(t1, v1, true)) => v0 + (v1 - v0) * ((elapsed - t0) as f64 / (t1 - t0) as f64),
            _ => v0,
        }
    }

    /// The integral of the value over [0, elapsed], in value × seconds.
    pub(crate) fn integral(&self, elapsed: i64) -> f64 {
        let mut sum = 0.0;
        for (i, &(t0, v0, _)) in self.points.iter().enumerate() {
            if t0 >= elapsed {
                break;
            }
            let (end, ramp_to) = match self.points.get(i + 1) {
                Some(&(t1, v1, ramp)) => (t1.min(elapsed), ramp.then_some((t1, v1))),
                None => (elapsed, None),
            };
            let secs = (end - t0) as f64 / NS_PER_SEC as f64;
            let v_end = match ramp_to {
                Some((t1, v1)) => v0 + (v1 - v0) * ((end - t0) as f64 / (t1 - t0) as f64),
                None => v0,
            };
            sum += secs * (v0 + v_end) / 2.0;
        }
        sum
    }
}

/// Parse a probe outcome word.
pub(crate) fn outcome(text: &str) -> Result<f64, String> {
    match text {
        "ok" | "success" | "pass" => Ok(1.0),
        "fail" | "failure" => Ok(0.0),
        other => Err(format!("unknown probe outcome {other:?} (use ok or fail)")),
    }
}

/// What a probe rule applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProbeMatch {
    /// `http`, `tcp`, `grpc`, or `None` for any kind.
    kind: Option<Box<str>>,
    /// `None` for any port.
    port: Option<u16>,
    /// HTTP path or gRPC service; `None` for any.
    detail: Option<Box<str>>,
}

impl ProbeMatch {
    /// Parse `*`, `http:*`, `http:8080`, `http:8080/healthz`, `tcp:5432`, `grpc:9090`, `grpc:9090/service`.
    pub(crate) fn parse(text: &str) -> Result<ProbeMatch, String> {
        let text = text.trim();
        if text == "*" {
            return Ok(ProbeMatch {
                kind: None,
                port: None,
                detail: None,
            });
        }
        let (kind, rest) = text
            .split_once(':')
            .ok_or_else(|| format!("probe target {text:?} needs kind:port"))?;
        if !matches!(kind, "http" | "tcp" | "grpc") {
            return Err(format!("unknown probe kind {kind:?} (use http, tcp or grpc)"));
        }
        let (port, detail) = match rest.find('/') {
            Some(i) => (&rest[..i], Some(&rest[i..])),
            None => (rest, None),
        };
        let port = match port {
            "*" => None,
            p => Some(
                p.parse::<u16>()
                    .map_err(|_| format!("bad port {p:?} in probe target {text:?}"))?,
            ),
        };
        let detail = match (kind, detail) {
            (_, None) => None,
            ("tcp", Some(_)) => return Err(format!("tcp probe target {text:?} cannot have a path")),
            ("grpc", Some(d)) => Some(d.trim_start_matches('/').into()),
            (_, Some(d)) => Some(d.into()),
        };
        Ok(ProbeMatch {
            kind: Some(kind.into()),
            port,
            detail,
        })
    }

    pub(crate) fn matches(&self, kind: &str, port: u16, detail: &str) -> bool {
        self.kind.as_deref().is_none_or(|k| k == kind)
            && self.port.is_none_or(|p| p == port)
            && self.detail.as_deref().is_none_or(|d| d == detail)
    }
}

/// One `exec` rule as written in JSON.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ExecRuleJson {
    cmd: CmdJson,
    #[serde(default)]
    exit_code: i32,
    #[serde(default)]
    stdout: String,
    #[serde(default)]
    stderr: String,
    after: Option<String>,
    duration: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum CmdJson {
    Joined(String),
    Argv(Vec<String>),
}

/// A scripted `ExecSync` answer.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ExecRule {
    /// The command, argv joined by single spaces; `None` matches every command.
    pub(crate) cmd: Option<Box<str>>,
    pub(crate) exit_code: i32,
    pub(crate) stdout: Box<[u8]>,
    pub(crate) stderr: Box<[u8]>,
    /// Applies from this long after the container started.
    pub(crate) after: i64,
    /// How long the command runs.
    pub(crate) duration: Dist,
}

/// Parse the JSON list of exec rules.
pub(crate) fn exec_rules(text: &str) -> Result<Box<[ExecRule]>, String> {
    let rules: Vec<ExecRuleJson> =
        serde_json::from_str(text).map_err(|e| format!("invalid exec rules: {e}"))?;
    rules
        .into_iter()
        .map(|r| {
            let cmd = match r.cmd {
                CmdJson::Joined(s) if s == "*" => None,
                CmdJson::Joined(s) => Some(s.into_boxed_str()),
                CmdJson::Argv(v) => Some(v.join(" ").into_boxed_str()),
            };
            Ok(ExecRule {
                cmd,
                exit_code: r.exit_code,
                stdout: r.stdout.into_bytes().into(),
                stderr: r.stderr.into_bytes().into(),
                after: r.after.as_deref().map(duration_ns).transpose()?.unwrap_or(0),
                duration: r
                    .duration
                    .as_deref()
                    .map(Dist::parse)
                    .transpose()?
                    .unwrap_or(Dist::ZERO),
            })
        })
        .collect()
}

/// Parse `target=timeline; target=timeline` probe rules.
pub(crate) fn probe_rules(text: &str) -> Result<Box<[(ProbeMatch, Timeline)]>, String> {
    text.split(';')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|rule| {
            let (target, timeline) = rule
                .split_once('=')
                .ok_or_else(|| format!("probe rule {rule:?} needs target=outcomes"))?;
            Ok((ProbeMatch::parse(target)?, Timeline::parse(timeline, outcome)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!(duration_ns("0"), Ok(0));
        assert_eq!(duration_ns("500ms"), Ok(500_000_000));
        assert_eq!(duration_ns("1h30m"), Ok(5_400 * NS_PER_SEC));
        assert_eq!(duration_ns("1.5s"), Ok(1_500_000_000));
        assert_eq!(duration_ns("10us"), Ok(10_000));
        for bad in ["", "5", "s", "5x", "1.2.3s", "-1s"] {
            assert!(duration_ns(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn quantities() {
        assert_eq!(quantity("250m"), Ok(0.25));
        assert_eq!(quantity("2"), Ok(2.0));
        assert_eq!(quantity("64Mi"), Ok(64.0 * 1024.0 * 1024.0));
        assert_eq!(quantity("1G"), Ok(1e9));
        assert!(quantity("1X").is_err());
        assert!(quantity("-1").is_err());
        assert!(quantity("").is_err());
    }

    #[test]
    fn distributions_parse_and_stay_in_range() {
        assert_eq!(Dist::parse("2s"), Ok(Dist::Fixed(2 * NS_PER_SEC)));
        assert_eq!(
            Dist::parse("uniform(1s,3s)"),
            Ok(Dist::Uniform(NS_PER_SEC, 3 * NS_PER_SEC))
        );
        assert!(Dist::parse("uniform(3s,1s)").is_err());
        assert!(Dist::parse("gamma(1s)").is_err());
        assert!(Dist::parse("exp(1s").is_err());
        let mut rng = Rng::new(7);
        let uniform = Dist::parse("uniform(1s,3s)").unwrap();
        let exp = Dist::parse("exp(1s)").unwrap();
        let normal = Dist::parse("normal(1s,5s)").unwrap();
        let mut exp_sum = 0;
        for _ in 0..10_000 {
            let u = uniform.sample(&mut rng);
            assert!((NS_PER_SEC..=3 * NS_PER_SEC).contains(&u));
            exp_sum += exp.sample(&mut rng);
            assert!(normal.sample(&mut rng) >= 0);
        }
        let mean = exp_sum as f64 / 10_000.0 / NS_PER_SEC as f64;
        assert!((0.9..1.1).contains(&mean), "exp mean {mean}");
    }

    #[test]
    fn timelines_step_ramp_and_integrate() {
        let t = Timeline::parse("10, 20@10s, ~40@20s", |v| {
            v.parse().map_err(|_| "nan".to_string())
        })
        .unwrap();
        let s = NS_PER_SEC;
        assert_eq!(t.at(0), 10.0);
        assert_eq!(t.at(9 * s), 10.0);
        assert_eq!(t.at(10 * s), 20.0);
        assert_eq!(t.at(15 * s), 30.0);
        assert_eq!(t.at(20 * s), 40.0);
        assert_eq!(t.at(100 * s), 40.0);
        // 10*10 + (20+40)/2*10 + 40*10
        assert!((t.integral(30 * s) - (100.0 + 300.0 + 400.0)).abs() < 1e-6);
        assert!((t.integral(15 * s) - (100.0 + (20.0 + 30.0) / 2.0 * 5.0)).abs() < 1e-6);
        assert!(Timeline::parse("1@5s", |v| v.parse().map_err(|_| String::new())).is_err());
        assert!(Timeline::parse("1, 2@5s, 3@5s", |v| v.parse().map_err(|_| String::new())).is_err());
        assert!(Timeline::parse("1, 2", |v| v.parse().map_err(|_| String::new())).is_err());
    }

    #[test]
    fn probe_targets() {
        let m = ProbeMatch::parse("http:8080/healthz").unwrap();
        assert!(m.matches("http", 8080, "/healthz"));
        assert!(!m.matches("http", 8080, "/ready"));
        assert!(!m.matches("tcp", 8080, ""));
        assert!(ProbeMatch::parse("http:*").unwrap().matches("http", 1, "/x"));
        assert!(ProbeMatch::parse("*").unwrap().matches("grpc", 1, ""));
        assert!(
            ProbeMatch::parse("grpc:9090/health")
                .unwrap()
                .matches("grpc", 9090, "health")
        );
        for bad in ["udp:1", "http", "tcp:1/x", "http:99999"] {
            assert!(ProbeMatch::parse(bad).is_err(), "{bad}");
        }
        let rules = probe_rules("http:8080/ready=fail, ok@20s; tcp:*=ok").unwrap();
        assert_eq!(rules.len(), 2);
    }

    #[test]
    fn exec_rules_parse() {
        let rules = exec_rules(
            r#"[{"cmd": ["cat", "/tmp/ready"], "exitCode": 1, "stderr": "no"},
                {"cmd": "*", "after": "20s", "stdout": "ok\n", "duration": "1s"}]"#,
        )
        .unwrap();
        assert_eq!(rules[0].cmd.as_deref(), Some("cat /tmp/ready"));
        assert_eq!(rules[0].exit_code, 1);
        assert_eq!(&*rules[1].stdout, b"ok\n");
        assert_eq!(rules[1].after, 20 * NS_PER_SEC);
        assert_eq!(rules[1].cmd, None);
        assert!(exec_rules(r#"[{"cmd": "x", "exitcode": 1}]"#).is_err());
        assert!(exec_rules("{").is_err());
    }
}
