//! API request latency during a run, from the API server's own `/metrics`
//! (`apiserver_request_duration_seconds`): scraped every few seconds while the run goes on, so the report
//! can show each interval's p99 per verb and the whole run's percentiles per verb and resource.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

const METRIC: &str = "apiserver_request_duration_seconds_bucket{";

/// Cumulative buckets (upper bound s → count) per key.
pub type Buckets = BTreeMap<String, Vec<(f64, u64)>>;

/// One scrape: seconds since the run began, buckets per verb, and per `VERB resource[/subresource]`.
#[derive(Debug, Clone, Default)]
pub struct Scrape {
    /// Seconds since the start of the run.
    pub at: f64,
    /// Keyed by verb.
    pub by_verb: Buckets,
    /// Keyed by `VERB resource[/subresource]`.
    pub by_resource: Buckets,
}

fn label<'a>(line: &'a str, name: &str) -> &'a str {
    line.split(&format!("{name}=\""))
        .nth(1)
        .and_then(|r| r.split('"').next())
        .unwrap_or("")
}

fn add(map: &mut Buckets, key: String, le: f64, count: u64) {
    let v = map.entry(key).or_default();
    match v.iter_mut().find(|(l, _)| *l == le) {
        Some(slot) => slot.1 += count,
        None => v.push((le, count)),
    }
}

/// Parses the request-duration buckets of a `/metrics` body (long-running verbs left out).
pub fn parse(text: &str, at: f64) -> Scrape {
    let mut s = Scrape {
        at,
        ..Default::default()
    };
    for line in text.lines().filter(|l| l.starts_with(METRIC)) {
        let verb = label(line, "verb");
        if matches!(verb, "WATCH" | "CONNECT" | "") {
            continue;
        }
        let le = match label(line, "le") {
            "+Inf" => f64::INFINITY,
            v => match v.parse() {
                Ok(v) => v,
                Err(_) => continue,
            },
        };
        let Some(count) = line.rsplit(' ').next().and_then(|c| c.parse::<f64>().ok()) else {
            continue;
        };
        let count = count as u64;
        let (resource, sub) = (label(line, "resource"), label(line, "subresource"));
        let key = if sub.is_empty() {
            format!("{verb} {resource}")
        } else {
            format!("{verb} {resource}/{sub}")
        };
        add(&mut s.by_verb, verb.to_owned(), le, count);
        add(&mut s.by_resource, key, le, count);
    }
    for v in s.by_verb.values_mut().chain(s.by_resource.values_mut()) {
        v.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    s
}

/// `later − earlier` per key (keys only in `later` count from zero).
pub fn delta(later: &Buckets, earlier: &Buckets) -> Buckets {
    later
        .iter()
        .map(|(k, v)| {
            let before = earlier.get(k);
            let d = v
                .iter()
                .map(|(le, n)| {
                    let was = before
                        .and_then(|b| b.iter().find(|(l, _)| l == le))
                        .map_or(0, |(_, c)| *c);
                    (*le, n.saturating_sub(was))
                })
                .collect();
            (k.clone(), d)
        })
        .collect()
}

/// Requests in a set of cumulative buckets.
pub fn total(buckets: &[(f64, u64)]) -> u64 {
    buckets.last().map_or(0, |b| b.1)
}

/// Quantile `q` in ms, interpolated within buckets as `histogram_quantile` does (0 for no requests).
pub fn quantile_ms(buckets: &[(f64, u64)], q: f64) -> f64 {
    let n = total(buckets);
    if n == 0 {
        return 0.0;
    }
    let rank = q * n as f64;
    let mut lower = (0.0, 0u64);
    for (le, count) in buckets {
        if *count as f64 >= rank {
            if le.is_infinite() {
                return lower.0 * 1000.0;
            }
            let inside = (*count - lower.1) as f64;
            let frac = if inside > 0.0 {
                (rank - lower.1 as f64) / inside
            } else {
                1.0
            };
            return (lower.0 + (le - lower.0) * frac) * 1000.0;
        }
        lower = (*le, *count);
    }
    lower.0 * 1000.0
}

/// Scrapes the API server's `/metrics` every `every` until `token` fires. The first failure ends it
/// (the report then says the metrics were not reachable), returning what it had.
pub async fn scrape(
    client: kube::Client,
    start: Instant,
    every: Duration,
    token: CancellationToken,
) -> Result<Vec<Scrape>, (Vec<Scrape>, String)> {
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(every);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            () = token.cancelled() => {}
        }
        let req = match http::Request::get("/metrics").body(Vec::new()) {
            Ok(r) => r,
            Err(e) => return Err((out, e.to_string())),
        };
        match client.request_text(req).await {
            Ok(text) => out.push(parse(&text, start.elapsed().as_secs_f64())),
            Err(e) => return Err((out, e.to_string())),
        }
        if token.is_cancelled() {
            return Ok(out);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="0.05"} 8
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="0.1"} 10
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="POST",version="v1",le="+Inf"} 10
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1",le="0.05"} 4
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1",le="0.1"} 4
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="status",verb="PATCH",version="v1",le="+Inf"} 4
apiserver_request_duration_seconds_bucket{component="apiserver",dry_run="",group="",resource="pods",scope="resource",subresource="",verb="WATCH",version="v1",le="+Inf"} 99
"#;

    #[test]
    fn request_latency_comes_per_verb_and_resource_without_watches() {
        let s = parse(TEXT, 1.0);
        assert_eq!(s.by_verb.keys().collect::<Vec<_>>(), ["PATCH", "POST"]);
        assert_eq!(total(&s.by_resource["POST pods"]), 10);
        assert_eq!(total(&s.by_resource["PATCH pods/status"]), 4);
        // rank 5 of 10 lies in (0, 0.05] which holds 8: 5/8 of 50 ms
        assert!((quantile_ms(&s.by_verb["POST"], 0.5) - 31.25).abs() < 1e-9);
        let d = delta(&s.by_verb, &parse("", 0.0).by_verb);
        assert_eq!(total(&d["POST"]), 10);
        assert_eq!(total(&delta(&s.by_verb, &s.by_verb)["POST"]), 0);
    }
}
