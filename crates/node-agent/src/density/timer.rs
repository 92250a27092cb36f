//! One timer for the idle waits of many agents ([`Timer`]).
//!
//! An agent's node-side managers spend their life waiting for a deadline: the next lease renewal, status tick,
//! runtime poll, collection or eviction pass. A tokio `Sleep` held in the waiting future carries a timer entry
//! of its own in place, and a hollow fleet's agents hold several each. A [`Wait`] on a [`Timer`] is a reference
//! and two integers: the timer keeps each waiting task's waker in a table of deadlines on the process-wide
//! [`grid`](crate::density::grid), and one task sleeps until the earliest of them and wakes every waiter due then.
//! Deadlines are served at the first grid point at or after them (at most [`GRID`] late; periodic deadlines
//! already sit on it), and a deadline already past is ready at once.
//!
//! A hollow fleet gives all its agents one timer; an agent alone makes its own. The driving task starts at the
//! first wait, on the runtime that polls it (a paused test clock advances to its deadlines as to any tokio
//! timer's), and ends when the last handle to the timer is dropped.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::density::grid::GRID;
use crate::density::periodic::JitteredInterval;

/// A timer shared by many waits (cheap to clone; see the module documentation).
#[derive(Clone)]
pub struct Timer(Arc<Handle>);

impl std::fmt::Debug for Timer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timer").finish_non_exhaustive()
    }
}

/// What the timer's users hold: when the last one goes, the driving task stops.
struct Handle(Arc<Wheel>);

impl Drop for Handle {
    fn drop(&mut self) {
        self.0.closed.store(true, Ordering::Release);
        self.0.kick.notify_one();
    }
}

struct Wheel {
    /// Slot 0: a grid point at or before the timer's creation. Slot `n` is due at `origin + n × GRID`.
    origin: Instant,
    state: Mutex<State>,
    /// Wakes the driving task: a new earliest deadline, or the last handle gone.
    kick: Notify,
    closed: AtomicBool,
}

#[derive(Default)]
struct State {
    /// Waiting tasks' wakers by slot (a dropped wait leaves a no-op waker until its slot is due).
    slots: BTreeMap<u64, Vec<Waker>>,
    /// Every slot before this one has fired (none is made again).
    unfired: u64,
    /// Whether the driving task was started.
    driving: bool,
}

/// No waker registered yet.
const UNREGISTERED: u32 = u32::MAX;

impl Default for Timer {
    fn default() -> Self {
        Self::new()
    }
}

impl Timer {
    /// A new timer (its task starts at the first wait).
    pub fn new() -> Self {
        let origin = crate::density::grid::round_down(Instant::now());
        Self(Arc::new(Handle(Arc::new(Wheel {
            origin,
            state: Mutex::new(State::default()),
            kick: Notify::new(),
            closed: AtomicBool::new(false),
        }))))
    }

    /// Completes at the first grid point at or after `at`, or at once if `at` has passed.
    pub fn sleep_until(&self, at: Instant) -> Wait<'_> {
        Wait {
            timer: self,
            place: self.place(at),
        }
    }

    /// The slot a wait for `at` waits for, not yet registered.
    fn place(&self, at: Instant) -> Place {
        let slot = if at <= Instant::now() {
            0
        } else {
            self.0.0.slot_at_or_after(at)
        };
        Place {
            slot,
            entry: UNREGISTERED,
        }
    }

    /// Waits for the next tick of `interval` (at the first grid point at or after its deadline) and schedules
    /// the one after it, as [`JitteredInterval::tick`] does on a tokio timer.
    pub async fn tick(&self, interval: &mut JitteredInterval) -> Instant {
        self.sleep_until(interval.deadline()).await;
        let now = Instant::now();
        interval.advance(now);
        now
    }

    /// How many waits are registered (dropped ones included until their slot is due).
    #[cfg(test)]
    fn registered(&self) -> usize {
        self.0.0.lock().slots.values().map(Vec::len).sum()
    }
}

impl Wheel {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn deadline(&self, slot: u64) -> Instant {
        let step = u64::try_from(GRID.as_nanos()).unwrap_or(u64::MAX);
        self.origin + Duration::from_nanos(slot.saturating_mul(step))
    }

    fn slot_at_or_after(&self, at: Instant) -> u64 {
        let since = at.saturating_duration_since(self.origin).as_nanos();
        let slot = since.div_ceil(GRID.as_nanos());
        u64::try_from(slot).unwrap_or(u64::MAX)
    }

    /// Wakes every waiter whose slot is due at `now`.
    fn fire(&self, now: Instant) {
        let since = now.saturating_duration_since(self.origin).as_nanos();
        let next = u64::try_from(since / GRID.as_nanos() + 1).unwrap_or(u64::MAX);
        let due = {
            let mut state = self.lock();
            let later = state.slots.split_off(&next);
            state.unfired = state.unfired.max(next);
            std::mem::replace(&mut state.slots, later)
        };
        for waker in due.into_values().flatten() {
            waker.wake();
        }
    }

    /// The driving task: sleeps until the earliest slot (or a kick), fires what is due, until the timer's
    /// last handle is dropped.
    async fn drive(self: Arc<Self>) {
        loop {
            if self.closed.load(Ordering::Acquire) {
                return;
            }
            let earliest = self.lock().slots.first_key_value().map(|(slot, _)| *slot);
            match earliest {
                None => self.kick.notified().await,
                Some(slot) => {
                    tokio::select! {
                        () = tokio::time::sleep_until(self.deadline(slot)) => self.fire(Instant::now()),
                        () = self.kick.notified() => {}
                    }
                }
            }
        }
    }
}

/// A wait on a [`Timer`] (from [`Timer::sleep_until`]).
#[must_use = "futures do nothing unless polled"]
pub struct Wait<'a> {
    timer: &'a Timer,
    place: Place,
}

/// A wait on a [`Timer`] that holds a handle of its own on it (from [`Timer::sleep_until_owned`]): the same
/// size as a [`Wait`], for a future that cannot also borrow where the timer is kept.
#[must_use = "futures do nothing unless polled"]
pub struct OwnedWait {
    timer: Timer,
    place: Place,
}

/// Where a wait is: its slot, and its waker's index in that slot once registered.
struct Place {
    slot: u64,
    entry: u32,
}

impl Timer {
    /// As [`Timer::sleep_until`], the wait holding a handle on the timer.
    pub fn sleep_until_owned(&self, at: Instant) -> OwnedWait {
        OwnedWait {
            timer: self.clone(),
            place: self.place(at),
        }
    }
}

impl Place {
    fn poll(&mut self, timer: &Timer, cx: &mut Context<'_>) -> Poll<()> {
        let wheel = &timer.0.0;
        if Instant::now() >= wheel.deadline(self.slot) {
            self.entry = UNREGISTERED;
            return Poll::Ready(());
        }
        let mut state = wheel.lock();
        if self.slot < state.unfired {
            self.entry = UNREGISTERED;
            return Poll::Ready(());
        }
        if self.entry != UNREGISTERED {
            // polled again before its slot: keep the waker current
            let slot = self.slot;
            if let Some(waker) = state
                .slots
                .get_mut(&slot)
                .and_then(|list| list.get_mut(self.entry as usize))
                && !waker.will_wake(cx.waker())
            {
                waker.clone_from(cx.waker());
            }
            return Poll::Pending;
        }
        // the driving task sleeps until the earliest slot: wake it only for an earlier one (waits joining the
        // slot it sleeps for, the common case, do not)
        let earlier = state
            .slots
            .first_key_value()
            .is_none_or(|(first, _)| self.slot < *first);
        let list = state.slots.entry(self.slot).or_default();
        let entry = u32::try_from(list.len()).unwrap_or(UNREGISTERED);
        list.push(cx.waker().clone());
        let start = !std::mem::replace(&mut state.driving, true);
        drop(state);
        self.entry = entry;
        if start {
            tokio::spawn(wheel.clone().drive());
        } else if earlier {
            wheel.kick.notify_one();
        }
        Poll::Pending
    }

    /// Lets go of the task's waker now; the entry itself goes when its slot is due.
    fn release(&mut self, timer: &Timer) {
        if self.entry == UNREGISTERED {
            return;
        }
        let mut state = timer.0.0.lock();
        if let Some(waker) = state
            .slots
            .get_mut(&self.slot)
            .and_then(|list| list.get_mut(self.entry as usize))
        {
            *waker = Waker::noop().clone();
        }
    }
}

impl Future for Wait<'_> {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        this.place.poll(this.timer, cx)
    }
}

impl Drop for Wait<'_> {
    fn drop(&mut self) {
        self.place.release(self.timer);
    }
}

impl Future for OwnedWait {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = &mut *self;
        this.place.poll(&this.timer, cx)
    }
}

impl Drop for OwnedWait {
    fn drop(&mut self) {
        self.place.release(&self.timer);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The most a wait may end after its deadline: a grid step, and tokio's rounding to the millisecond.
    const LATE: Duration = GRID.saturating_add(Duration::from_millis(1));

    #[test]
    fn a_wait_is_a_fifth_of_a_tokio_sleep() {
        assert_eq!(size_of::<Wait<'_>>(), 24);
        assert_eq!(size_of::<OwnedWait>(), 24);
        assert_eq!(size_of::<Timer>(), 8);
    }

    #[tokio::test(start_paused = true)]
    async fn waits_end_at_the_first_grid_point_at_or_after_their_deadline() {
        let timer = Timer::new();
        let start = Instant::now();
        let at = start + Duration::from_millis(10_020);
        timer.sleep_until(at).await;
        let now = Instant::now();
        assert!(now >= at, "not before its deadline");
        // on the grid (tokio's own timers, which the driving task sleeps on, round up to the millisecond)
        let point = crate::density::grid::round_up(at);
        assert!(
            now >= point && now - point < Duration::from_millis(1),
            "{:?} after the grid point",
            now - point
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_deadline_already_past_is_ready_at_once() {
        let timer = Timer::new();
        let start = Instant::now();
        timer.sleep_until(start).await;
        timer
            .sleep_until(start.checked_sub(Duration::from_secs(1)).unwrap_or(start))
            .await;
        assert_eq!(Instant::now(), start);
    }

    #[tokio::test(start_paused = true)]
    async fn many_waiters_each_end_at_their_own_time() {
        let timer = Timer::new();
        let start = Instant::now();
        let ends = futures::future::join_all((1..=20u64).rev().map(|i| {
            let timer = timer.clone();
            async move {
                timer.sleep_until(start + Duration::from_secs(i)).await;
                (i, Instant::now() - start)
            }
        }))
        .await;
        for (i, took) in ends {
            assert!(
                took >= Duration::from_secs(i) && took <= Duration::from_secs(i) + LATE,
                "wait {i} s took {took:?}"
            );
        }
        assert_eq!(timer.registered(), 0, "fired slots are gone");
    }

    #[tokio::test(start_paused = true)]
    async fn an_earlier_deadline_registered_later_is_not_held_up() {
        let timer = Timer::new();
        let start = Instant::now();
        let late = {
            let timer = timer.clone();
            tokio::spawn(async move { timer.sleep_until(start + Duration::from_secs(60)).await })
        };
        tokio::task::yield_now().await;
        timer.sleep_until(start + Duration::from_secs(5)).await;
        let took = Instant::now() - start;
        assert!(took <= Duration::from_secs(5) + LATE, "took {took:?}");
        late.await.expect("the late wait ends");
        assert!(Instant::now() - start >= Duration::from_secs(60));
    }

    #[tokio::test(start_paused = true)]
    async fn a_dropped_wait_lets_go_of_its_waker_and_others_still_fire() {
        let timer = Timer::new();
        let start = Instant::now();
        let dropped = tokio::time::timeout(
            Duration::from_secs(1),
            timer.sleep_until(start + Duration::from_secs(30)),
        )
        .await;
        assert!(dropped.is_err(), "the timeout came first");
        assert_eq!(timer.registered(), 1, "a no-op entry until its slot is due");
        timer.sleep_until(start + Duration::from_secs(30)).await;
        assert!(Instant::now() - start >= Duration::from_secs(30));
        assert_eq!(timer.registered(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn the_driving_task_ends_with_the_last_handle() {
        let timer = Timer::new();
        timer.sleep_until(Instant::now() + Duration::from_secs(2)).await;
        let wheel = Arc::downgrade(&timer.0.0);
        drop(timer);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(wheel.upgrade().is_none(), "the task let go of the wheel");
    }
}
