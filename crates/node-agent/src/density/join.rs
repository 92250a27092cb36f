//! Several long-lived futures run as one, each polled only when something woke it.
//!
//! An agent's managers mostly wait (on a timer, a channel, a watch). Run as a task each, every one costs a task
//! header of tokio's and the rounding of its future to the task cell's alignment, per node. Joined into one task
//! they cost one header, but a plain join (`futures::future::join`) polls every branch whenever any is woken,
//! and an idle fleet then spends much of its CPU polling branches that had nothing to do. Here each branch
//! gets a waker of its own that marks it woken before waking the task; a poll of the join polls only the marked
//! branches. The cost is one small shared allocation and one per branch (the branch wakers), made when the join
//! is built, and the wakers' array (boxed: the join's future is a node's largest task cell, held for the node's
//! whole life, so what it need not hold in place it does not). [`Wakers`] also serves
//! joins made elsewhere (the agent's supervised node side).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use futures::task::AtomicWaker;
use tokio_util::sync::CancellationToken;

/// What the branch wakers share: which branches were woken, and the task to wake.
struct Shared {
    woken: AtomicU32,
    task: AtomicWaker,
}

/// One branch's waker: marks its bit, then wakes the task.
struct BranchWaker {
    shared: Arc<Shared>,
    bit: u32,
}

impl Wake for BranchWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.shared.woken.fetch_or(self.bit, Ordering::AcqRel);
        self.shared.task.wake();
    }
}

/// The wakers of a join of `N` branches (at most 32).
pub(crate) struct Wakers<const N: usize> {
    shared: Arc<Shared>,
    each: Box<[Waker; N]>,
}

impl<const N: usize> Wakers<N> {
    /// The wakers of a join whose every branch is to be polled at its first poll.
    pub(crate) fn new() -> Self {
        const { assert!(N <= 32, "a join takes at most 32 branches") };
        // every branch is polled at the first poll
        let all = if N == 32 { u32::MAX } else { (1u32 << N) - 1 };
        let shared = Arc::new(Shared {
            woken: AtomicU32::new(all),
            task: AtomicWaker::new(),
        });
        let each = Box::new(std::array::from_fn(|i| {
            Waker::from(Arc::new(BranchWaker {
                shared: shared.clone(),
                bit: 1 << i,
            }))
        }));
        Self { shared, each }
    }

    /// Registers the task's waker and takes the set of branches woken since the last call.
    pub(crate) fn take_woken(&self, cx: &Context<'_>) -> u32 {
        self.shared.task.register(cx.waker());
        self.shared.woken.swap(0, Ordering::AcqRel)
    }

    /// The waker of branch `i`: waking it marks the branch and wakes the task.
    pub(crate) fn waker(&self, i: usize) -> &Waker {
        &self.each[i]
    }

    /// Polls `branch` (number `i`) with its own waker if it was woken and has not finished; whether it still
    /// runs.
    fn poll_branch<F: Future<Output = ()>>(
        &self,
        woken: u32,
        i: usize,
        branch: Pin<&mut futures::future::Fuse<F>>,
    ) -> bool {
        use futures::future::FusedFuture;
        if branch.is_terminated() {
            return false;
        }
        if woken & (1 << i) != 0 {
            let mut cx = Context::from_waker(&self.each[i]);
            return branch.poll(&mut cx).is_pending();
        }
        true
    }
}

macro_rules! woken_join {
    ($(#[$doc:meta])* $name:ident, $make:ident, $n:literal; $($f:ident: $t:ident = $i:literal),+) => {
        pin_project_lite::pin_project! {
            $(#[$doc])*
            #[must_use = "futures do nothing unless polled"]
            pub(crate) struct $name<$($t),+> {
                $(#[pin] $f: futures::future::Fuse<$t>,)+
                wakers: Wakers<$n>,
                // see `join3_stop`
                stop: Option<CancellationToken>,
            }
        }

        impl<$($t: Future<Output = ()>),+> Future for $name<$($t),+> {
            type Output = ();

            fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                let mut this = self.project();
                let woken = this.wakers.take_woken(cx);
                if this.stop.as_ref().is_some_and(CancellationToken::is_cancelled) {
                    *this.stop = None;
                    // every branch but the first is dropped where it waits
                    $(if $i > 0 {
                        this.$f.set(futures::future::Fuse::terminated());
                    })+
                }
                let mut running = false;
                $(running |= this.wakers.poll_branch(woken, $i, this.$f.as_mut());)+
                if running { Poll::Pending } else { Poll::Ready(()) }
            }
        }

        /// Joins the futures; each is polled only when it was woken.
        pub(crate) fn $make<$($t: Future<Output = ()>),+>($($f: $t),+) -> $name<$($t),+> {
            use futures::FutureExt;
            $name { $($f: $f.fuse(),)+ wakers: Wakers::new(), stop: None }
        }
    };
}

woken_join!(
    /// Three futures joined (see the module).
    Join3, join3, 3; a: A = 0, b: B = 1, c: C = 2
);
/// Three futures joined, the last two run until `stop` fires: at the join's next poll after that they are
/// dropped where they wait, and the first runs on to its end. Neither of the two needs a cancellation wait of its
/// own (one would sit in every idle future that holds it); the first must wait on `stop` itself, which is what
/// wakes the join when `stop` fires. Without that the two are dropped at the next poll either causes.
pub(crate) fn join3_stop<A, B, C>(stop: CancellationToken, a: A, b: B, c: C) -> Join3<A, B, C>
where
    A: Future<Output = ()>,
    B: Future<Output = ()>,
    C: Future<Output = ()>,
{
    let mut joined = join3(a, b, c);
    joined.stop = Some(stop);
    joined
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    use tokio::sync::Notify;

    use super::*;

    /// Waits for `n` notifications, counting its polls.
    async fn counted(notify: Arc<Notify>, n: usize, polls: Arc<AtomicUsize>) {
        struct Counting<F> {
            inner: Pin<Box<F>>,
            polls: Arc<AtomicUsize>,
        }
        impl<F: Future<Output = ()>> Future for Counting<F> {
            type Output = ();
            fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
                self.polls.fetch_add(1, Ordering::Relaxed);
                self.inner.as_mut().poll(cx)
            }
        }
        Counting {
            inner: Box::pin(async move {
                for _ in 0..n {
                    notify.notified().await;
                }
            }),
            polls,
        }
        .await;
    }

    #[tokio::test(start_paused = true)]
    async fn only_the_woken_branch_is_polled_and_the_join_ends_with_the_last() {
        let notify: Vec<Arc<Notify>> = (0..3).map(|_| Arc::new(Notify::new())).collect();
        let polls: Vec<Arc<AtomicUsize>> = (0..3).map(|_| Arc::new(AtomicUsize::new(0))).collect();
        let joined = join3(
            counted(notify[0].clone(), 1, polls[0].clone()),
            counted(notify[1].clone(), 3, polls[1].clone()),
            counted(notify[2].clone(), 1, polls[2].clone()),
        );
        let task = tokio::spawn(joined);
        let settle = || tokio::time::sleep(Duration::from_millis(1));
        settle().await;
        let counts = || {
            polls
                .iter()
                .map(|p| p.load(Ordering::Relaxed))
                .collect::<Vec<_>>()
        };
        assert_eq!(counts(), [1, 1, 1], "each branch is polled once at the start");
        notify[1].notify_one();
        settle().await;
        assert_eq!(
            counts(),
            [1, 2, 1],
            "a wake-up of the second polls the second only"
        );
        notify[1].notify_one();
        notify[0].notify_one();
        settle().await;
        assert_eq!(counts(), [2, 3, 1]);
        assert!(!task.is_finished(), "two branches still run");
        notify[1].notify_one();
        settle().await;
        assert!(!task.is_finished(), "the third still runs");
        notify[2].notify_one();
        settle().await;
        assert!(task.is_finished(), "the join ends when every branch has");
        assert_eq!(counts(), [2, 4, 2], "a finished branch is not polled again");
    }

    #[tokio::test(start_paused = true)]
    async fn timers_in_branches_wake_their_own_branch() {
        let fired = Arc::new(AtomicUsize::new(0));
        let at = |secs: u64| {
            let fired = fired.clone();
            async move {
                tokio::time::sleep(Duration::from_secs(secs)).await;
                fired.fetch_add(1, Ordering::Relaxed);
            }
        };
        let joined = join3(at(1), at(2), at(3));
        let start = tokio::time::Instant::now();
        joined.await;
        assert_eq!(fired.load(Ordering::Relaxed), 3);
        assert_eq!(start.elapsed(), Duration::from_secs(3));
    }

    #[tokio::test(start_paused = true)]
    async fn a_stop_drops_all_but_the_first_where_they_wait_and_the_first_runs_on() {
        /// Counts its drops.
        struct Dropped(Arc<AtomicUsize>);
        impl Drop for Dropped {
            fn drop(&mut self) {
                self.0.fetch_add(1, Ordering::Relaxed);
            }
        }
        let dropped = Arc::new(AtomicUsize::new(0));
        let forever = || {
            let guard = Dropped(dropped.clone());
            async move {
                std::future::pending::<()>().await;
                drop(guard);
            }
        };
        let stop = CancellationToken::new();
        let drained = Arc::new(AtomicUsize::new(0));
        let first = {
            let (stop, drained) = (stop.clone(), drained.clone());
            async move {
                stop.cancelled().await;
                // a drain after the stop, as the event writer's
                tokio::time::sleep(Duration::from_secs(2)).await;
                drained.fetch_add(1, Ordering::Relaxed);
            }
        };
        let joined = join3_stop(stop.clone(), first, forever(), forever());
        let task = tokio::spawn(joined);
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(dropped.load(Ordering::Relaxed), 0, "all run until the stop");
        let stopped_at = tokio::time::Instant::now();
        stop.cancel();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(
            dropped.load(Ordering::Relaxed),
            2,
            "the two are dropped at once, where they wait"
        );
        assert!(!task.is_finished(), "the first drains");
        task.await.unwrap();
        assert_eq!(drained.load(Ordering::Relaxed), 1);
        assert_eq!(
            stopped_at.elapsed(),
            Duration::from_secs(2),
            "the join ends with the first"
        );
    }
}
