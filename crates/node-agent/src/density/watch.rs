//! Single-value channels ("the latest value, and a wake-up when it changes") for the state every node and pod
//! publishes to the others: runtime health, the registered Node, the Node as last seen, allocatable, pressure,
//! the heartbeat switch, a pod's probe targets.
//!
//! Same surface and semantics as the subset of tokio's `watch` this crate used (`channel`, `borrow`,
//! `borrow_and_update`, `changed`, `has_changed`, `mark_unchanged`, `send`, `send_replace`, `send_modify`,
//! `send_if_modified`, `subscribe`, `is_closed`): receivers remember the version they saw, `changed` waits for
//! a newer one (and fails once every sender is gone with nothing new), and every version counts, not every
//! value. The difference is size: tokio's shared state carries nine wake-up lists (eight spread receivers over
//! for contention, one for `Sender::closed`), which a hollow fleet would pay for each state channel of every
//! node; this one has one wake-up list. Nothing here is contended: a channel has a handful of receivers, woken
//! a few times a minute.
//!
//! The wake-up list holds the wakers of the tasks waiting, not a node per waiting future: [`Receiver::changed`]
//! is a pointer to its receiver, where a future holding a `tokio::sync::Notified` carries its list node. Idle agents
//! wait in `changed` all the time (the status loop on three channels at once), so the futures they sleep in stay
//! smaller. A waker stays listed until the next version or the last sender's drop wakes it, even if the
//! future that listed it is gone meanwhile: at worst a spurious wake-up of a task that re-checks and sleeps.

use std::future::Future;
use std::ops::Deref;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock, RwLockReadGuard};
use std::task::{Context, Poll, Waker};

/// The version counter counts in twos; the lowest bit says every sender is gone.
const CLOSED: u64 = 1;

struct Shared<T> {
    value: RwLock<T>,
    state: AtomicU64,
    // 32-bit counts: a channel has a handful of handles, and every node keeps several of these states
    senders: AtomicU32,
    receivers: AtomicU32,
    waiting: Mutex<Waiting>,
}

/// The tasks to wake at the next version: mostly none or one.
#[derive(Default)]
enum Waiting {
    #[default]
    None,
    One(Waker),
    Many(Vec<Waker>),
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

    /// Lists `waker` for the next wake-up (once per task).
    fn wait(&self, waker: &Waker) {
        let mut waiting = self.waiting.lock().unwrap_or_else(PoisonError::into_inner);
        match &mut *waiting {
            Waiting::None => *waiting = Waiting::One(waker.clone()),
            Waiting::One(listed) if listed.will_wake(waker) => {}
            Waiting::One(_) => {
                let Waiting::One(first) = std::mem::take(&mut *waiting) else {
                    unreachable!()
                };
                *waiting = Waiting::Many(vec![first, waker.clone()]);
            }
            Waiting::Many(listed) => {
                if !listed.iter().any(|w| w.will_wake(waker)) {
                    listed.push(waker.clone());
                }
            }
        }
    }

    /// Wakes every listed task (after the state changed).
    fn wake_all(&self) {
        let waiting = std::mem::take(&mut *self.waiting.lock().unwrap_or_else(PoisonError::into_inner));
        match waiting {
            Waiting::None => {}
            Waiting::One(w) => w.wake(),
            Waiting::Many(all) => all.into_iter().for_each(Waker::wake),
        }
    }
}

/// A channel holding `init`; the receiver has seen it.
pub fn channel<T>(init: T) -> (Sender<T>, Receiver<T>) {
    let shared = Arc::new(Shared {
        value: RwLock::new(init),
        state: AtomicU64::new(0),
        senders: AtomicU32::new(1),
        receivers: AtomicU32::new(1),
        waiting: Mutex::new(Waiting::None),
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
        self.shared.wake_all();
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
            self.shared.wake_all();
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
    pub fn changed(&mut self) -> Changed<'_, T> {
        Changed { rx: self }
    }

    /// `Some` when a newer version (marked seen) or the senders' end is there.
    fn check(&mut self) -> Option<Result<(), RecvError>> {
        let state = self.shared.state.load(Ordering::Acquire);
        if state & !CLOSED != self.seen {
            self.seen = state & !CLOSED;
            return Some(Ok(()));
        }
        (state & CLOSED != 0).then_some(Err(RecvError))
    }
}

/// The future of [`Receiver::changed`].
#[must_use = "futures do nothing unless polled"]
pub struct Changed<'a, T> {
    rx: &'a mut Receiver<T>,
}

impl<T> Future for Changed<'_, T> {
    type Output = Result<(), RecvError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let rx = &mut *self.get_mut().rx;
        if let Some(done) = rx.check() {
            return Poll::Ready(done);
        }
        // listed before the second look: a version sent between the looks finds the waker listed
        rx.shared.wait(cx.waker());
        match rx.check() {
            Some(done) => Poll::Ready(done),
            None => Poll::Pending,
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

    #[tokio::test]
    async fn every_waiting_task_is_woken_and_a_task_is_listed_once() {
        let (tx, rx) = channel(0);
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let mut rx = rx.clone();
                tokio::spawn(async move {
                    rx.changed().await.unwrap();
                    *rx.borrow()
                })
            })
            .collect();
        // one task polling its wait again and again is listed once
        let mut again = rx.clone();
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        for _ in 0..5 {
            assert!(Pin::new(&mut again.changed()).poll(&mut cx).is_pending());
        }
        // the spawned tasks run up to their wait
        tokio::task::yield_now().await;
        let listed = match &*tx.shared.waiting.lock().unwrap() {
            Waiting::None => 0,
            Waiting::One(_) => 1,
            Waiting::Many(all) => all.len(),
        };
        assert_eq!(listed, 4, "three tasks and the polled future's waker, each once");
        tx.send_replace(7);
        for w in waiters {
            assert_eq!(w.await.unwrap(), 7);
        }
        assert!(
            matches!(*tx.shared.waiting.lock().unwrap(), Waiting::None),
            "a version wakes and unlists all"
        );
    }

    #[test]
    fn waiting_for_a_change_is_pointer_sized() {
        let (_tx, mut rx) = channel(0u64);
        assert_eq!(size_of_val(&rx.changed()), size_of::<usize>());
    }

    #[test]
    fn the_shared_state_is_small() {
        let size = size_of::<Shared<bool>>();
        println!("shared state of a watch of bool: {size} bytes");
        // the state with the `Arc`'s two counts within the ceiling every node's channels are held to (the
        // figure and its history: docs/density.md)
        assert!(size + 16 <= 80, "{size} bytes");
    }
}
