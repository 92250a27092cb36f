//! Start-up progress of the fleet: a bar redrawn in place when stderr is a terminal, a log line every few
//! seconds otherwise (a chart's pod log, CI).

use std::io::{IsTerminal, Write};
use std::time::Duration;

use tokio::time::Instant;

use crate::fleet::FleetView;

/// `[#####.....]  500/1000 registered` for `width` cells.
pub fn bar(done: usize, total: usize, width: usize) -> String {
    let filled = (done.min(total) * width).checked_div(total).unwrap_or(width);
    let digits = total.to_string().len();
    format!(
        "[{}{}] {done:>digits$}/{total} registered",
        "#".repeat(filled),
        ".".repeat(width - filled)
    )
}

/// Reports registration progress until all `total` nodes are registered (then logs the time and the
/// process's memory once) or forever if they never are; cancel it by dropping.
pub async fn report(view: FleetView, total: usize, start: Instant) {
    let tty = std::io::stderr().is_terminal();
    let mut tick = tokio::time::interval(if tty {
        Duration::from_millis(250)
    } else {
        Duration::from_secs(5)
    });
    loop {
        tick.tick().await;
        let n = view.registered();
        let elapsed = start.elapsed().as_secs_f64();
        if tty {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r{} {elapsed:.1}s", bar(n, total, 40));
            if n >= total {
                let _ = writeln!(err);
            }
            let _ = err.flush();
        } else {
            tracing::info!(registered = n, of = total, elapsed_s = elapsed, "registering");
        }
        if n >= total {
            tracing::info!(
                elapsed_s = elapsed,
                rss_mib = crate::server::rss_bytes() >> 20,
                "all nodes registered"
            );
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::bar;

    #[test]
    fn the_bar_fills_in_proportion() {
        assert_eq!(bar(0, 1000, 10), "[..........]    0/1000 registered");
        assert_eq!(bar(500, 1000, 10), "[#####.....]  500/1000 registered");
        assert_eq!(bar(1000, 1000, 10), "[##########] 1000/1000 registered");
        assert_eq!(bar(7, 0, 4), "[####] 7/0 registered");
    }
}
