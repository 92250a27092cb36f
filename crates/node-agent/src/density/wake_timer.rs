//! The pod manager's one timer for the wake times of all its workers ([`WakeTimer`]).
//!
//! Each worker, handed back to the manager after a turn, carries when it next wants to sync (its periodic sync, or
//! the end of a back-off); the manager keeps this timer at the earliest of those times and wakes the workers
//! that are due (the kubelet's pod workers are woken through its work queue likewise). A worker so holds no
//! timer of its own, and a node's timer is allocated only while some worker waits for a time.

use std::pin::Pin;

use tokio::time::{Instant, Sleep};

/// A timer that fires at the earliest time it was asked for, boxed and made only while one is wanted.
#[derive(Debug, Default)]
pub(crate) struct WakeTimer(Option<Pin<Box<Sleep>>>);

impl WakeTimer {
    /// Makes sure the timer fires at `at` or earlier.
    pub(crate) fn by(&mut self, at: Instant) {
        match &mut self.0 {
            Some(timer) if timer.deadline() <= at => {}
            Some(timer) => timer.as_mut().reset(at),
            None => self.0 = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }

    /// Fires at `next` from now on, or never (freeing the timer) when `None`.
    pub(crate) fn set(&mut self, next: Option<Instant>) {
        match (next, &mut self.0) {
            (None, _) => self.0 = None,
            (Some(at), Some(timer)) => timer.as_mut().reset(at),
            (Some(at), None) => self.0 = Some(Box::pin(tokio::time::sleep_until(at))),
        }
    }

    /// Whether a time is set.
    pub(crate) fn is_set(&self) -> bool {
        self.0.is_some()
    }

    /// Completes when the time set comes (at once, again, until [`set`](Self::set) moves or clears it);
    /// never while none is set.
    /// (A poll function, not an `async fn`: the manager's idle task holds this wait, and it is one reference.)
    pub(crate) fn fired(&mut self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| match &mut self.0 {
            Some(timer) => timer.as_mut().poll(cx),
            None => std::task::Poll::Pending,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn fires_at_the_earliest_time_asked_for() {
        let start = Instant::now();
        let mut timer = WakeTimer::default();
        assert!(!timer.is_set());
        timer.by(start + Duration::from_secs(60));
        timer.by(start + Duration::from_secs(10));
        timer.by(start + Duration::from_secs(30));
        timer.fired().await;
        assert_eq!(start.elapsed(), Duration::from_secs(10));
    }

    #[tokio::test(start_paused = true)]
    async fn set_moves_it_later_or_frees_it() {
        let start = Instant::now();
        let mut timer = WakeTimer::default();
        timer.by(start + Duration::from_secs(10));
        timer.set(Some(start + Duration::from_secs(40)));
        timer.fired().await;
        assert_eq!(start.elapsed(), Duration::from_secs(40));
        timer.set(None);
        assert!(!timer.is_set());
        let waited = tokio::time::timeout(Duration::from_secs(3600), timer.fired()).await;
        assert!(waited.is_err(), "a timer with no time never fires");
    }
}
