//! A wake-up for one waiter ([`Poke`]), for the idle loops of many agents.
//!
//! `tokio::sync::Notify` serves any number of waiters, and its wait future carries a waiter's list node, held
//! in the idle task for as long as it waits. The node-side loops that are poked (the status loop by the lease
//! task, the runtime monitor by the status loop) each have one waiter, so a flag and the waiter's waker do: the
//! wait is one reference. Like `Notify::notify_one`, a poke while nobody waits is kept for the next wait.

use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Poll;

use futures::task::AtomicWaker;

/// A one-waiter wake-up (see the module documentation).
#[derive(Debug, Default)]
pub struct Poke {
    poked: AtomicBool,
    waiter: AtomicWaker,
}

impl Poke {
    /// A poke nobody sent yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Wakes the waiter, or the next wait if none waits now.
    pub fn notify_one(&self) {
        self.poked.store(true, Ordering::Release);
        self.waiter.wake();
    }

    /// Completes at the next poke (at once if one came since the last wait). One waiter at a time: a second
    /// concurrent wait takes the wake-up from the first.
    pub fn notified(&self) -> impl Future<Output = ()> + Send + '_ {
        std::future::poll_fn(move |cx| {
            if self.poked.swap(false, Ordering::AcqRel) {
                return Poll::Ready(());
            }
            self.waiter.register(cx.waker());
            if self.poked.swap(false, Ordering::AcqRel) {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    #[test]
    fn a_wait_is_one_reference() {
        let poke = Poke::new();
        assert_eq!(size_of_val(&poke.notified()), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn a_poke_wakes_the_waiter_and_one_sent_before_is_kept() {
        let poke = Arc::new(Poke::new());
        poke.notify_one();
        poke.notify_one();
        tokio::time::timeout(Duration::from_secs(1), poke.notified())
            .await
            .expect("kept for the next wait");
        let waited = tokio::time::timeout(Duration::from_secs(1), poke.notified()).await;
        assert!(waited.is_err(), "two pokes before a wait are one");
        let sender = poke.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_secs(5)).await;
            sender.notify_one();
        });
        let start = tokio::time::Instant::now();
        poke.notified().await;
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }
}
