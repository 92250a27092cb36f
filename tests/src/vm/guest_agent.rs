//! A client of the QEMU guest agent (`qemu-guest-agent` in the guest, reached over a virtio-serial port that
//! QEMU exposes as a unix socket on the host): runs programs in the guest and collects their exit code and
//! output (`guest-exec`, `guest-exec-status`).
//!
//! The connection is a blocking socket used from the blocking pool, so it is tied to no async runtime: a guest
//! shared by the tests of a binary outlives the runtime of the test that booted it. The protocol is one JSON
//! object a line each way. Before the first command, and whenever a command timed out,
//! the client resynchronises with `guest-sync-delimited` (a random id the agent echoes after a `0xFF` byte), so
//! answers to earlier requests are never taken for answers to later ones.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use base64::Engine;
use serde_json::{Value, json};

/// What a command run in the guest gave.
#[derive(Debug, Clone)]
pub struct Output {
    /// Its exit code (`None`: killed by a signal).
    pub code: Option<i64>,
    /// Its standard output.
    pub stdout: String,
    /// Its standard error.
    pub stderr: String,
}

/// One connection to the guest agent; commands go one at a time.
#[derive(Debug)]
pub struct GuestAgent {
    conn: Arc<Mutex<Conn>>,
}

#[derive(Debug)]
struct Conn {
    reader: BufReader<UnixStream>,
    writer: UnixStream,
    in_sync: bool,
}

/// How long one answer may take before the connection is resynchronised.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(20);

impl GuestAgent {
    /// Connects to the socket and waits until the agent in the guest answers (the guest boots meanwhile), at
    /// most `timeout`.
    pub async fn connect(socket: &Path, timeout: Duration) -> anyhow::Result<Self> {
        let socket = socket.to_owned();
        let conn = tokio::task::spawn_blocking(move || Conn::open(&socket, timeout)).await??;
        Ok(Self {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Sends one command and returns its `return` value.
    pub async fn call(&self, command: &str, arguments: Value) -> anyhow::Result<Value> {
        let conn = self.conn.clone();
        let command = command.to_owned();
        tokio::task::spawn_blocking(move || {
            let mut conn = conn
                .lock()
                .map_err(|_| anyhow::anyhow!("guest agent connection poisoned"))?;
            conn.call(&command, arguments)
        })
        .await?
    }

    /// Runs `program args…` in the guest and waits at most `timeout` for it to exit.
    pub async fn exec(&self, program: &str, args: &[&str], timeout: Duration) -> anyhow::Result<Output> {
        let started = self
            .call(
                "guest-exec",
                json!({"path": program, "arg": args, "capture-output": true}),
            )
            .await?;
        let pid = started["pid"].as_i64().context("guest-exec gave no pid")?;
        let deadline = tokio::time::Instant::now() + timeout;
        let mut pause = Duration::from_millis(20);
        loop {
            let status = self.call("guest-exec-status", json!({"pid": pid})).await?;
            if status["exited"].as_bool() == Some(true) {
                let text = |key: &str| -> anyhow::Result<String> {
                    let data = status[key].as_str().unwrap_or_default();
                    let bytes = base64::engine::general_purpose::STANDARD.decode(data)?;
                    Ok(String::from_utf8_lossy(&bytes).into_owned())
                };
                return Ok(Output {
                    code: status["exitcode"].as_i64(),
                    stdout: text("out-data")?,
                    stderr: text("err-data")?,
                });
            }
            if tokio::time::Instant::now() >= deadline {
                bail!("{program} {args:?} did not exit in {timeout:?} in the guest");
            }
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(500));
        }
    }
}

impl Conn {
    /// Connects and waits until the agent in the guest answers, at most `timeout`.
    fn open(socket: &Path, timeout: Duration) -> anyhow::Result<Self> {
        let deadline = Instant::now() + timeout;
        let stream = loop {
            match UnixStream::connect(socket) {
                Ok(s) => break s,
                Err(e) if Instant::now() >= deadline => {
                    return Err(e).with_context(|| format!("connecting to {}", socket.display()));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        };
        let mut conn = Self {
            reader: BufReader::new(stream.try_clone()?),
            writer: stream,
            in_sync: false,
        };
        loop {
            match conn.sync(Duration::from_secs(3)) {
                Ok(()) => return Ok(conn),
                Err(e) if Instant::now() >= deadline => {
                    return Err(e).context("the guest agent did not answer (has the guest booted?)");
                }
                Err(_) => {}
            }
        }
    }

    fn call(&mut self, command: &str, arguments: Value) -> anyhow::Result<Value> {
        if !self.in_sync {
            self.sync(ANSWER_TIMEOUT)?;
        }
        self.send(&json!({"execute": command, "arguments": arguments}))?;
        let answer = match self.answer(Instant::now() + ANSWER_TIMEOUT) {
            Ok(answer) => answer,
            Err(e) => {
                self.in_sync = false;
                return Err(e.context(format!("guest agent: {command}")));
            }
        };
        if let Some(error) = answer.get("error") {
            bail!("guest agent: {command}: {error}");
        }
        Ok(answer.get("return").cloned().unwrap_or(Value::Null))
    }

    fn send(&mut self, message: &Value) -> anyhow::Result<()> {
        let mut line = serde_json::to_vec(message)?;
        line.push(b'\n');
        self.writer.write_all(&line)?;
        Ok(())
    }

    /// The next JSON line before `deadline` (the `0xFF` bytes a delimited sync puts before its answer skipped).
    fn answer(&mut self, deadline: Instant) -> anyhow::Result<Value> {
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("no answer in time");
            }
            self.reader.get_ref().set_read_timeout(Some(left))?;
            let mut line = Vec::new();
            let n = self.reader.read_until(b'\n', &mut line)?;
            if n == 0 {
                bail!("the guest agent's socket closed");
            }
            line.retain(|b| *b != 0xFF);
            let text = String::from_utf8_lossy(&line);
            if text.trim().is_empty() {
                continue;
            }
            return serde_json::from_str(text.trim()).with_context(|| format!("guest agent sent {text:?}"));
        }
    }

    /// Resets the agent's parser (a `0xFF` byte) and waits for the answer to a fresh sync id, dropping whatever
    /// came before it.
    fn sync(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let id = (u64::from(std::process::id()) << 32) | u64::from(rand_u32());
        self.writer.write_all(&[0xFF])?;
        self.send(&json!({"execute": "guest-sync-delimited", "arguments": {"id": id}}))?;
        let deadline = Instant::now() + timeout;
        loop {
            let answer = match self.answer(deadline) {
                Ok(a) => a,
                // a half line left from before the reset
                Err(e) if e.to_string().starts_with("guest agent sent") => continue,
                Err(e) => return Err(e.context("guest agent: guest-sync-delimited")),
            };
            if answer.get("return").and_then(Value::as_u64) == Some(id) {
                self.in_sync = true;
                return Ok(());
            }
        }
    }
}

/// A number that differs between calls (the sync ids need not be secret, only fresh).
fn rand_u32() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(1);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    nanos ^ NEXT.fetch_add(0x9E37_79B9, Ordering::Relaxed)
}
