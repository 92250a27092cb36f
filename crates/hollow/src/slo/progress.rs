//! Progress of an SLO run: pods created / scheduled / running, as a bar redrawn in place when stderr is a
//! terminal, a log line every few seconds otherwise.

use std::io::{IsTerminal, Write};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::measure::Counts;

/// `[#####.....] created 500  scheduled 480  running 450` — the bar fills with running over created.
pub fn line(created: u64, c: Counts, width: usize) -> String {
    let running = c.running as u64;
    let filled = usize::try_from(
        (running.min(created) * width as u64)
            .checked_div(created)
            .unwrap_or(0),
    )
    .unwrap_or(width);
    format!(
        "[{}{}] created {created}  scheduled {}  running {}",
        "#".repeat(filled),
        ".".repeat(width - filled),
        c.scheduled,
        c.running
    )
}

/// Reports `state()` (pods created, watch counts) until `token` fires, then once more.
pub async fn report(state: impl Fn() -> (u64, Counts), every: Duration, token: CancellationToken) {
    let tty = std::io::stderr().is_terminal();
    let start = Instant::now();
    let mut tick = tokio::time::interval(if tty { Duration::from_millis(250) } else { every });
    loop {
        let stop = tokio::select! {
            _ = tick.tick() => false,
            () = token.cancelled() => true,
        };
        let (created, counts) = state();
        let elapsed = start.elapsed().as_secs_f64();
        if tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{} {elapsed:.1}s", line(created, counts, 30));
            if stop {
                let _ = writeln!(err);
            }
            let _ = err.flush();
        } else {
            tracing::info!(
                created,
                scheduled = counts.scheduled,
                running = counts.running,
                elapsed_s = format!("{elapsed:.1}"),
                "pods"
            );
        }
        if stop {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bar_fills_with_running_pods() {
        let c = Counts {
            seen: 10,
            scheduled: 8,
            running: 5,
        };
        assert_eq!(line(10, c, 10), "[#####.....] created 10  scheduled 8  running 5");
        assert_eq!(
            line(0, Counts::default(), 4),
            "[....] created 0  scheduled 0  running 0"
        );
    }
}
