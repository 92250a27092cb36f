//! `/containerLogs/{namespace}/{pod}/{container}`: a container's log, read in the CRI log format
//! (`<RFC 3339 time> <stream> <P|F> <text>` per line, `P` for a partial line continued by the next one).
//!
//! The container is found through the runtime (the pod's newest sandbox by its namespace and name labels, the
//! container by name, the newest attempt or with `previous=true` the one before), its log through
//! `ContainerStatus.logPath`, read by a [`LogSource`]: [`FileLogs`] reads the file (real mode); a hollow node
//! reads what its in-memory runtime wrote. Query parameters as the kubelet takes them: `follow`, `tailLines`,
//! `limitBytes`, `sinceSeconds` / `sinceTime`, `timestamps`, `previous`. Bad values get 400, values out of range
//! 422, an unknown pod or container 404. Rotated log files (`<logPath>.<time>`, see [`crate::container_logs`])
//! are not read, except by a follower when the log it follows is rotated: it reads the rest of the file it
//! followed, then the new log from its start.

use std::collections::HashMap;
use std::time::Duration;

use async_trait::async_trait;
use axum::Extension;
use axum::body::Body;
use axum::extract::{Path, Query};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use runtime_api::cri;
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::NodeEndpoint;
use super::respond::{error, runtime_error};
use crate::cri_log::{Entry, parse};
use crate::pods::runtime::labels;

/// Where a container's CRI-format log is read.
#[async_trait]
pub trait LogSource: Send + Sync {
    /// The log of container `container_id` (whose status names `log_path`) from byte `offset` on.
    async fn read(&self, container_id: &str, log_path: &str, offset: u64) -> std::io::Result<Vec<u8>>;

    /// Which file `log_path` names now (its inode), for a follower to notice a rotation; `None` (the default)
    /// when the source's logs are never rotated.
    async fn file_id(&self, log_path: &str) -> Option<u64> {
        let _ = log_path;
        None
    }

    /// What the rotated file of `log_path` that is `file_id` holds from `offset` on: the end a follower had not
    /// read before the rotation (empty by default, and when that file is gone).
    async fn read_rotated(&self, log_path: &str, file_id: u64, offset: u64) -> Vec<u8> {
        let _ = (log_path, file_id, offset);
        Vec::new()
    }
}

/// Reads the log file the runtime writes (`ContainerStatus.logPath`).
#[derive(Debug, Clone, Copy, Default)]
pub struct FileLogs;

#[async_trait]
impl LogSource for FileLogs {
    async fn read(&self, _container_id: &str, log_path: &str, offset: u64) -> std::io::Result<Vec<u8>> {
        use tokio::io::{AsyncReadExt, AsyncSeekExt};
        let mut file = tokio::fs::File::open(log_path).await?;
        file.seek(std::io::SeekFrom::Start(offset)).await?;
        let mut out = Vec::new();
        file.read_to_end(&mut out).await?;
        Ok(out)
    }

    async fn file_id(&self, log_path: &str) -> Option<u64> {
        use std::os::unix::fs::MetadataExt;
        tokio::fs::metadata(log_path).await.ok().map(|m| m.ino())
    }

    async fn read_rotated(&self, log_path: &str, file_id: u64, offset: u64) -> Vec<u8> {
        let log = std::path::PathBuf::from(log_path);
        let found = tokio::task::spawn_blocking(move || {
            use std::os::unix::fs::MetadataExt;
            // the newest rotated files first: the one just renamed is plain, the older ones gzipped
            let rotated = crate::container_logs::rotated_files(&log).ok()?;
            rotated
                .into_iter()
                .rev()
                .find(|p| std::fs::metadata(p).is_ok_and(|m| m.ino() == file_id))
        })
        .await
        .ok()
        .flatten();
        let Some(path) = found else {
            return Vec::new();
        };
        self.read("", &path.display().to_string(), offset)
            .await
            .unwrap_or_default()
    }
}

/// Logs produced in memory: a function of the container ID giving its CRI-format log lines (an in-memory
/// runtime's scripted output).
pub struct ScriptedLogs(Box<LinesOf>);

/// A container ID to its CRI-format log lines.
type LinesOf = dyn Fn(&str) -> Result<Vec<String>, String> + Send + Sync;

impl ScriptedLogs {
    /// Logs answered by `lines`.
    pub fn new(lines: impl Fn(&str) -> Result<Vec<String>, String> + Send + Sync + 'static) -> Self {
        Self(Box::new(lines))
    }
}

#[async_trait]
impl LogSource for ScriptedLogs {
    async fn read(&self, container_id: &str, _log_path: &str, offset: u64) -> std::io::Result<Vec<u8>> {
        let lines =
            (self.0)(container_id).map_err(|e| std::io::Error::new(std::io::ErrorKind::NotFound, e))?;
        let mut all = Vec::new();
        for line in lines {
            all.extend_from_slice(line.as_bytes());
            all.push(b'\n');
        }
        let start = usize::try_from(offset).unwrap_or(usize::MAX).min(all.len());
        Ok(all.split_off(start))
    }
}

/// The query of a log request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    /// Keep streaming while the container runs.
    pub follow: bool,
    /// Only the last N lines.
    pub tail_lines: Option<u64>,
    /// Stop after this many bytes.
    pub limit_bytes: Option<u64>,
    /// Only lines at or after this time.
    pub since: Option<OffsetDateTime>,
    /// Prefix every line with its time.
    pub timestamps: bool,
    /// The previous instance of the container.
    pub previous: bool,
}

/// Go's `strconv.ParseBool`.
fn parse_bool(key: &str, v: &str) -> Result<bool, String> {
    match v {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("{key}: invalid value {v:?}: not a boolean")),
    }
}

fn parse_int(key: &str, v: &str) -> Result<i64, String> {
    v.parse()
        .map_err(|_| format!("{key}: invalid value {v:?}: not an integer"))
}

impl LogOptions {
    /// Parses and validates a query: `Err((400 or 422, message))`.
    pub fn from_query(
        q: &HashMap<String, String>,
        now: OffsetDateTime,
    ) -> Result<Self, (StatusCode, String)> {
        let bad = |m: String| (StatusCode::BAD_REQUEST, m);
        let invalid = |field: &str, value: i64, rule: &str| {
            (
                StatusCode::UNPROCESSABLE_ENTITY,
                format!("{field}: Invalid value: {value}: {rule}"),
            )
        };
        let mut o = Self::default();
        let get = |k: &str| q.get(k).map(String::as_str).filter(|v| !v.is_empty());
        if let Some(v) = get("follow") {
            o.follow = parse_bool("follow", v).map_err(bad)?;
        }
        if let Some(v) = get("timestamps") {
            o.timestamps = parse_bool("timestamps", v).map_err(bad)?;
        }
        if let Some(v) = get("previous") {
            o.previous = parse_bool("previous", v).map_err(bad)?;
        }
        if let Some(v) = get("tailLines") {
            let n = parse_int("tailLines", v).map_err(bad)?;
            o.tail_lines = Some(
                u64::try_from(n)
                    .map_err(|_| invalid("tailLines", n, "must be greater than or equal to 0"))?,
            );
        }
        if let Some(v) = get("limitBytes") {
            let n = parse_int("limitBytes", v).map_err(bad)?;
            if n < 1 {
                return Err(invalid("limitBytes", n, "must be greater than 0"));
            }
            o.limit_bytes = u64::try_from(n).ok();
        }
        let since_seconds = get("sinceSeconds")
            .map(|v| parse_int("sinceSeconds", v))
            .transpose()
            .map_err(bad)?;
        let since_time = get("sinceTime")
            .map(|v| {
                OffsetDateTime::parse(v, &Rfc3339)
                    .map_err(|e| bad(format!("sinceTime: invalid value {v:?}: {e}")))
            })
            .transpose()?;
        match (since_seconds, since_time) {
            (Some(_), Some(_)) => {
                return Err((
                    StatusCode::UNPROCESSABLE_ENTITY,
                    "sinceSeconds, sinceTime: at most one of sinceSeconds or sinceTime may be specified"
                        .into(),
                ));
            }
            (Some(s), None) => {
                if s < 1 {
                    return Err(invalid("sinceSeconds", s, "must be greater than 0"));
                }
                // further back than time can say: every line (a subtraction that overflowed panicked here)
                o.since = now.checked_sub(time::Duration::seconds(s));
            }
            (None, t) => o.since = t,
        }
        Ok(o)
    }
}

fn render(entries: &[Entry], o: &LogOptions, written: &mut u64) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        if o.since.is_some_and(|since| e.time < since) {
            continue;
        }
        if o.timestamps {
            out.extend_from_slice(e.stamp.as_bytes());
            out.push(b' ');
        }
        out.extend_from_slice(&e.text);
    }
    if let Some(limit) = o.limit_bytes {
        let room = usize::try_from(limit.saturating_sub(*written)).unwrap_or(usize::MAX);
        out.truncate(room);
    }
    *written += out.len() as u64;
    out
}

/// The log of an instance of a container: the initial content per `o`, then (with `follow`) what it writes
/// while it runs.
fn select(entries: Vec<Entry>, o: &LogOptions) -> Vec<Entry> {
    match o.tail_lines {
        Some(n) => {
            let n = usize::try_from(n).unwrap_or(usize::MAX);
            let skip = entries.len().saturating_sub(n);
            entries.into_iter().skip(skip).collect()
        }
        None => entries,
    }
}

async fn find_container(
    node: &NodeEndpoint,
    namespace: &str,
    pod: &str,
    container: &str,
    previous: bool,
) -> Result<String, Response> {
    let runtime = &node.ctx.runtime;
    let selector = HashMap::from([
        (labels::POD_NAMESPACE.to_owned(), namespace.to_owned()),
        (labels::POD_NAME.to_owned(), pod.to_owned()),
    ]);
    let mut sandboxes = runtime
        .list_pod_sandbox(cri::ListPodSandboxRequest {
            filter: Some(cri::PodSandboxFilter {
                label_selector: selector,
                ..Default::default()
            }),
        })
        .await
        .map_err(|e| runtime_error("ListPodSandbox", &e))?
        .items;
    sandboxes.sort_by_key(|s| std::cmp::Reverse(s.created_at));
    let Some(uid) = sandboxes
        .first()
        .and_then(|s| s.labels.get(labels::POD_UID).cloned())
    else {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!("pod {pod:?} does not exist\n"),
        ));
    };
    let mut containers = runtime
        .list_containers(cri::ListContainersRequest {
            filter: Some(cri::ContainerFilter {
                label_selector: HashMap::from([
                    (labels::POD_UID.to_owned(), uid),
                    (labels::CONTAINER_NAME.to_owned(), container.to_owned()),
                ]),
                ..Default::default()
            }),
        })
        .await
        .map_err(|e| runtime_error("ListContainers", &e))?
        .containers;
    if containers.is_empty() {
        return Err(error(
            StatusCode::NOT_FOUND,
            format!("container {container:?} not found in pod {pod:?}\n"),
        ));
    }
    containers
        .sort_by_key(|c| std::cmp::Reverse((c.metadata.as_ref().map_or(0, |m| m.attempt), c.created_at)));
    let index = usize::from(previous);
    containers.get(index).map(|c| c.id.clone()).ok_or_else(|| {
        error(
            StatusCode::BAD_REQUEST,
            format!("previous terminated container {container:?} in pod {pod:?} not found\n"),
        )
    })
}

async fn status(node: &NodeEndpoint, id: &str) -> Result<cri::ContainerStatus, Response> {
    node.ctx
        .runtime
        .container_status(cri::ContainerStatusRequest {
            container_id: id.to_owned(),
            verbose: false,
        })
        .await
        .map_err(|e| runtime_error("ContainerStatus", &e))?
        .status
        .ok_or_else(|| error(StatusCode::NOT_FOUND, format!("container {id:?} has no status\n")))
}

/// `GET /containerLogs/{namespace}/{pod}/{container}`.
pub async fn container_logs(
    Extension(node): Extension<NodeEndpoint>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let options = match LogOptions::from_query(&query, OffsetDateTime::now_utc()) {
        Ok(o) => o,
        Err((status, message)) => return error(status, format!("{message}\n")),
    };
    let id = match find_container(&node, &namespace, &pod, &container, options.previous).await {
        Ok(id) => id,
        Err(resp) => return resp,
    };
    let st = match status(&node, &id).await {
        Ok(st) => st,
        Err(resp) => return resp,
    };
    let first_file = node.logs.file_id(&st.log_path).await;
    let raw = match node.logs.read(&id, &st.log_path, 0).await {
        Ok(raw) => raw,
        Err(e) => {
            return error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!(
                    "failed to read log of container {container:?} ({}): {e}\n",
                    st.log_path
                ),
            );
        }
    };
    let (entries, consumed) = parse(&raw);
    let mut written = 0;
    let first = render(&select(entries, &options), &options, &mut written);
    let running = st.state == cri::ContainerState::ContainerRunning as i32;
    let headers = [(header::CONTENT_TYPE, "text/plain")];
    if !options.follow || !running || options.limit_bytes.is_some_and(|l| written >= l) {
        return (StatusCode::OK, headers, first).into_response();
    }
    // follow: poll the log for what the container writes next, until it stops or the limit is reached; a
    // rotation (the path names another file) is followed into the new file
    let file = first_file;
    let state = (
        node,
        id,
        st.log_path,
        (file, consumed as u64),
        written,
        options,
        false,
    );
    let rest = futures::stream::unfold(
        state,
        |(node, id, path, (mut file, mut offset), mut written, o, done)| async move {
            if done {
                return None;
            }
            let mut tick = tokio::time::interval(Duration::from_millis(250));
            tick.tick().await;
            loop {
                tick.tick().await;
                let running = status(&node, &id)
                    .await
                    .is_ok_and(|s| s.state == cri::ContainerState::ContainerRunning as i32);
                let mut chunk = Vec::new();
                let now = node.logs.file_id(&path).await;
                if now.is_some() && now != file {
                    if let Some(old) = file {
                        let rest = node.logs.read_rotated(&path, old, offset).await;
                        chunk = render(&parse(&rest).0, &o, &mut written);
                    }
                    (file, offset) = (now, 0);
                }
                let raw = node.logs.read(&id, &path, offset).await.unwrap_or_default();
                let (entries, consumed) = parse(&raw);
                chunk.extend(render(&entries, &o, &mut written));
                let finished = !running || o.limit_bytes.is_some_and(|l| written >= l);
                offset += consumed as u64;
                if !chunk.is_empty() || finished {
                    return Some((
                        Ok::<_, std::io::Error>(chunk),
                        (node, id, path, (file, offset), written, o, finished),
                    ));
                }
            }
        },
    );
    let body = futures::stream::once(async move { Ok::<_, std::io::Error>(first) }).chain(rest);
    (StatusCode::OK, headers, Body::from_stream(body)).into_response()
}

use futures::StreamExt as _;

#[cfg(test)]
mod tests {
    use super::*;

    fn q(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    const LOG: &[u8] = b"2026-01-01T00:00:01.000000000Z stdout F one\n\
2026-01-01T00:00:02.000000000Z stderr P tw\n\
2026-01-01T00:00:02.100000000Z stderr F o\n\
2026-01-01T00:00:03.000000000Z stdout F three\n\
2026-01-01T00:00:04.000000000Z stdout P unfinis";

    fn run(o: &LogOptions) -> String {
        let (entries, _) = parse(LOG);
        let mut written = 0;
        String::from_utf8(render(&select(entries, o), o, &mut written)).unwrap_or_default()
    }

    #[test]
    fn partial_lines_are_joined_and_an_unfinished_one_is_held_back() {
        let (entries, consumed) = parse(LOG);
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[1].text, b"two\n");
        assert_eq!(
            &LOG[consumed..],
            b"2026-01-01T00:00:04.000000000Z stdout P unfinis"
        );
        assert_eq!(run(&LogOptions::default()), "one\ntwo\nthree\n");
    }

    #[test]
    fn output_without_a_final_newline_is_shown_as_the_runtime_wrote_it() {
        // what containerd writes for `echo one; echo -n DONE`: the unended text as a partial line, then nothing
        let log = b"2026-01-01T00:00:01.000000000Z stdout F one\n\
2026-01-01T00:00:01.100000000Z stdout P DONE\n";
        let (entries, consumed) = parse(log);
        assert_eq!(consumed, log.len());
        let mut written = 0;
        let shown = render(
            &select(entries, &LogOptions::default()),
            &LogOptions::default(),
            &mut written,
        );
        assert_eq!(String::from_utf8(shown).unwrap(), "one\nDONE");
    }

    #[test]
    fn tail_since_timestamps_and_limit_shape_the_output() {
        let now = OffsetDateTime::now_utc();
        let tail = LogOptions::from_query(&q(&[("tailLines", "2")]), now).unwrap_or_default();
        assert_eq!(run(&tail), "two\nthree\n");
        let since =
            LogOptions::from_query(&q(&[("sinceTime", "2026-01-01T00:00:02Z")]), now).unwrap_or_default();
        assert_eq!(run(&since), "two\nthree\n");
        let stamps = LogOptions::from_query(&q(&[("timestamps", "true"), ("tailLines", "1")]), now)
            .unwrap_or_default();
        assert_eq!(run(&stamps), "2026-01-01T00:00:03.000000000Z three\n");
        let limit = LogOptions::from_query(&q(&[("limitBytes", "6")]), now).unwrap_or_default();
        assert_eq!(run(&limit), "one\ntw");
    }

    #[test]
    fn bad_values_get_400_and_out_of_range_ones_422() {
        let now = OffsetDateTime::now_utc();
        let code = |pairs: &[(&str, &str)]| LogOptions::from_query(&q(pairs), now).err().map(|e| e.0);
        assert_eq!(code(&[("tailLines", "x")]), Some(StatusCode::BAD_REQUEST));
        assert_eq!(code(&[("follow", "maybe")]), Some(StatusCode::BAD_REQUEST));
        assert_eq!(code(&[("sinceTime", "yesterday")]), Some(StatusCode::BAD_REQUEST));
        assert_eq!(
            code(&[("tailLines", "-1")]),
            Some(StatusCode::UNPROCESSABLE_ENTITY)
        );
        assert_eq!(
            code(&[("limitBytes", "0")]),
            Some(StatusCode::UNPROCESSABLE_ENTITY)
        );
        assert_eq!(
            code(&[("sinceSeconds", "0")]),
            Some(StatusCode::UNPROCESSABLE_ENTITY)
        );
        assert_eq!(
            code(&[("sinceSeconds", "5"), ("sinceTime", "2026-01-01T00:00:02Z")]),
            Some(StatusCode::UNPROCESSABLE_ENTITY)
        );
        assert_eq!(
            code(&[("follow", "true"), ("previous", "1"), ("tailLines", "0")]),
            None
        );
    }
}
