//! Single-value channels ("the latest value, and a wake-up when it changes") for the state every node and pod
//! publishes to the others: runtime health, the registered Node, the Node as last seen, allocatable, pressure,
//! the heartbeat switch, a pod's probe targets.
//!
//! Same surface and semantics as the subset of tokio's `watch` this crate used (`channel`, `borrow`,
//! `borrow_and_update`, `changed`, `has_changed`, `mark_unchanged`, `send`, `send_replace`, `send_modify`,
//! `send_if_modified`, `subscribe`, `is_closed`): receivers remember the version they saw, `changed` waits for
//! a newer one (and fails once every sender is gone with nothing new), and every version counts, not every
//! value. The difference is size: tokio's shared state carries nine wake-up lists (eight spread receivers over
//! for contention, one for `Sender::closed`), ~330 bytes per channel before the value, which a hollow fleet pays
//! for seven channels of each of ten thousand nodes; this one has one wake-up list, ~70 bytes. Nothing here is
//! contended: a channel has a handful of receivers, woken a few times a minute.

use std::ops::Deref;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, PoisonError, RwLock, RwLockReadGuard};

use tokio::sync::Notify;

/// The version counter counts in twos; the lowest bit says every sender is gone.
const CLOSED: u64 = 1;

struct Shared<T> {
    value: RwLock<T>,
    state: AtomicU64,
    senders: AtomicUsize,
    receivers: AtomicUsize,
    notify: Notify,
}

impl<T> Shared<T> {
    fn version(&self) -> u64 {
        self.state.load(Ordering::Acquire) & !CLOSED
    }

    fn closed(&self) -> bool {
        self.state.load(Ordering::Acquire) & CLOSED != 0
    }

    fn read(&self) -> RwLockReadGuard<'_, T> {
        self.value.read().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A channel holding `init`; the receiver has seen it.
pub fn channel<T>(init: T) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        value: RwLock::new(init),
        state: AtomicU64::new(0),
        senders: AtomicUsize::new(1),
        receivers: AtomicUsize::new(1),
        notify: Notify::new(),
    });
    let rx = Receiver {
        shared: shared.clone(),
        seen: 0,
    };
    (Sender { shared }, rx)
}

/// A read of the current value; hold it briefly (senders wait for it) and never across an await.
pub struct Ref<'a, T>(RwLockReadGuard<'a, T>);

impl<T> Deref for Ref<'_, T> {
    type Target = T;

    fn deref(&self) -> &T {
        &self.0
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Ref<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// Every sender is gone (from [`Receiver::changed`] and [`Receiver::has_changed`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the channel's senders are gone")]
pub struct RecvError;

/// No receiver is left; the value comes back (from [`Sender::send`]).
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
#[error("the channel's receivers are gone")]
pub struct SendError<T>(pub T);

/// The publishing half; cheap to clone.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

impl<T> Sender<T> {
    /// A channel holding `init` with no receiver yet (see [`Sender::subscribe`]).
    pub fn new(init: T) -> Self {
        let (tx, rx) = channel(init);
        drop(rx);
        tx
    }

    /// Publishes `value` unless no receiver is left (then it comes back).
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        if self.is_closed() {
            return Err(SendError(value));
        }
        self.send_replace(value);
        Ok(())
    }

    /// Publishes `value` (whether or not anyone listens) and returns the value it replaced.
    pub fn send_replace(&self, mut value: T) -> T {
        self.send_modify(|old| std::mem::swap(old, &mut value));
        value
    }

    /// Changes the value in place and wakes the receivers.
    pub fn send_modify(&self, modify: impl FnOnce(&mut T)) {
        self.send_if_modified(|v| {
            modify(v);
            true
        });
    }

    /// Changes the value in place; wakes the receivers (a new version) only if `modify` says it changed it.
    pub fn send_if_modified(&self, modify: impl FnOnce(&mut T) -> bool) -> bool {
        {
            let mut value = self.shared.value.write().unwrap_or_else(PoisonError::into_inner);
            if !modify(&mut value) {
                return false;
            }
            // under the lock: a reader holding the lock sees the version of the value it reads
            self.shared.state.fetch_add(2, Ordering::AcqRel);
        }
        self.shared.notify.notify_waiters();
        true
    }

    /// The current value.
    pub fn borrow(&self) -> Ref<'_, T> {
        Ref(self.shared.read())
    }

    /// Whether every receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.shared.receivers.load(Ordering::Relaxed) == 0
    }

    /// A new receiver that has seen the current value.
    pub fn subscribe(&self) -> Receiver<T> {
        self.shared.receivers.fetch_add(1, Ordering::Relaxed);
        Receiver {
            seen: self.shared.version(),
            shared: self.shared.clone(),
        }
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        self.shared.senders.fetch_add(1, Ordering::Relaxed);
        Self {
            shared: self.shared.clone(),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.shared.state.fetch_or(CLOSED, Ordering::AcqRel);
            self.shared.notify.notify_waiters();
        }
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Sender").field(&*self.borrow()).finish()
    }
}

/// The reading half; a clone has seen what its original saw.
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
    seen: u64,
}

impl<T> Receiver<T> {
    /// The current value, without marking it seen.
    pub fn borrow(&self) -> Ref<'_, T> {
        Ref(self.shared.read())
    }

    /// The current value, marked seen.
    pub fn borrow_and_update(&mut self) -> Ref<'_, T> {
        let value = self.shared.read();
        // no sender can write while the read lock is held: this is the version of `value`
        self.seen = self.shared.version();
        Ref(value)
    }

    /// Whether a version newer than the last one seen was published; an error once every sender is gone.
    pub fn has_changed(&self) -> Result<bool, RecvError> {
        let state = self.shared.state.load(Ordering::Acquire);
        if state & CLOSED != 0 {
            return Err(RecvError);
        }
        Ok(state & !CLOSED != self.seen)
    }

    /// Marks the current version seen.
    pub fn mark_unchanged(&mut self) {
        self.seen = self.shared.version();
    }

    /// Whether every sender is gone.
    pub fn is_closed(&self) -> bool {
        self.shared.closed()
    }

    /// Waits for a version newer than the last one seen and marks it seen; an error once every sender is gone
    /// and nothing newer was published. Cancel-safe.
    pub async fn changed(&mut self) -> Result<(), RecvError> {
        loop {
            // ask to be woken before looking, so a send between the look and the wait is not missed
            let notified = self.shared.notify.notified();
            let state = self.shared.state.load(Ordering::Acquire);
            if state & !CLOSED != self.seen {
                self.seen = state & !CLOSED;
                return Ok(());
            }
            if state & CLOSED != 0 {
                return Err(RecvError);
            }
            notified.await;
        }
    }
}

impl<T> Clone for Receiver<T> {
    fn clone(&self) -> Self {
        self.shared.receivers.fetch_add(1, Ordering::Relaxed);
        Self {
            shared: self.shared.clone(),
            seen: self.seen,
        }
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        self.shared.receivers.fetch_sub(1, Ordering::Relaxed);
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("value", &*self.borrow())
            .field("seen", &self.seen)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_receiver_wakes_for_each_new_version_and_reads_the_latest_value() {
        let (tx, mut rx) = channel(0);
        assert!(!rx.has_changed().unwrap());
        tx.send_replace(1);
        tx.send_replace(2);
        assert!(rx.has_changed().unwrap());
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow(), 2);
        assert!(!rx.has_changed().unwrap());
        let waiter = tokio::spawn(async move {
            rx.changed().await.unwrap();
            *rx.borrow_and_update()
        });
        tokio::task::yield_now().await;
        tx.send_replace(3);
        assert_eq!(waiter.await.unwrap(), 3);
    }

    #[tokio::test]
    async fn an_unmodified_value_is_not_a_new_version() {
        let (tx, mut rx) = channel(5);
        assert!(!tx.send_if_modified(|v| *v == 6));
        assert!(!rx.has_changed().unwrap());
        assert!(tx.send_if_modified(|v| {
            *v = 6;
            true
        }));
        assert_eq!(*rx.borrow_and_update(), 6);
        assert!(!rx.has_changed().unwrap());
        tx.send_modify(|v| *v += 1);
        rx.mark_unchanged();
        assert!(!rx.has_changed().unwrap());
        assert_eq!(*rx.borrow(), 7);
    }

    #[tokio::test]
    async fn changed_fails_once_the_senders_are_gone_but_not_before_a_pending_version() {
        let (tx, mut rx) = channel("a");
        let second = tx.clone();
        drop(tx);
        assert!(!rx.is_closed());
        second.send_replace("b");
        drop(second);
        assert!(rx.is_closed());
        assert_eq!(rx.has_changed(), Err(RecvError));
        // the last value still arrives, then the channel reports closed
        rx.changed().await.unwrap();
        assert_eq!(*rx.borrow(), "b");
        assert_eq!(rx.changed().await, Err(RecvError));
    }

    #[tokio::test]
    async fn a_waiting_receiver_is_woken_when_the_last_sender_goes() {
        let (tx, mut rx) = channel(());
        let waiter = tokio::spawn(async move { rx.changed().await });
        tokio::task::yield_now().await;
        drop(tx);
        assert_eq!(waiter.await.unwrap(), Err(RecvError));
    }

    #[tokio::test]
    async fn send_needs_a_receiver_and_subscribers_start_from_the_current_value() {
        let tx = Sender::new(1);
        assert!(tx.is_closed());
        assert_eq!(tx.send(2), Err(SendError(2)));
        let mut rx = tx.subscribe();
        assert!(!tx.is_closed());
        assert!(!rx.has_changed().unwrap());
        tx.send(3).unwrap();
        let copy = rx.clone();
        assert!(copy.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), 3);
        assert!(copy.has_changed().unwrap());
        drop(rx);
        drop(copy);
        assert!(tx.is_closed());
    }

    #[test]
    fn the_shared_state_is_small() {
        let size = size_of::<Shared<bool>>();
        println!("shared state of a watch of bool: {size} bytes");
        assert!(size <= 96, "{size} bytes");
    }
}
