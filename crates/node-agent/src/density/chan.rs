//! Unbounded channels for the plumbing every node and every pod keeps: control requests, worker messages,
//! runtime events, finished workers, pod statuses.
//!
//! Same surface as tokio's unbounded mpsc (`send`, `recv`, `try_recv`), but over `futures`' linked queue: a
//! tokio channel allocates a cache-padded core and a first block of slots when it is made, which a hollow fleet
//! would pay for every idle channel of every node and every pod; this one allocates a small shared head and
//! then one node per message in flight, so an idle channel holds next to nothing.
//!
//! [`channel`] is the bounded variant (the pod watch's hand-over to the pod manager): the same queue, with a
//! semaphore of `capacity` permits that each queued message holds until it is received, so a sender waits
//! while `capacity` messages are queued; idle, it holds no room for them (tokio's bounded channel does).

use std::sync::Arc;
use std::task::{Context, Poll};

use futures::StreamExt;
use futures::channel::mpsc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The sending half; cheap to clone.
#[derive(Debug)]
pub struct UnboundedSender<T>(mpsc::UnboundedSender<T>);

impl<T> Clone for UnboundedSender<T> {
    fn clone(&self) -> Self {
        Self(self.0.clone())
    }
}

/// The receiver is gone; the message comes back.
#[derive(Debug, PartialEq, Eq)]
pub struct SendError<T>(pub T);

impl<T> UnboundedSender<T> {
    /// Queues `value`; fails only when the receiver is gone.
    pub fn send(&self, value: T) -> Result<(), SendError<T>> {
        self.0
            .unbounded_send(value)
            .map_err(|e| SendError(e.into_inner()))
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.0.is_closed()
    }
}

/// Why [`UnboundedReceiver::try_recv`] got nothing.
#[derive(Debug, PartialEq, Eq)]
pub enum TryRecvError {
    /// Nothing is queued now.
    Empty,
    /// Nothing is queued and every sender is gone.
    Disconnected,
}

/// The receiving half.
#[derive(Debug)]
pub struct UnboundedReceiver<T>(mpsc::UnboundedReceiver<T>);

impl<T> UnboundedReceiver<T> {
    /// The next message; `None` once every sender is gone and the queue is empty. Cancel-safe. The wait is one
    /// pointer (a long-lived task waiting here keeps nothing else for it).
    pub fn recv(&mut self) -> impl Future<Output = Option<T>> + '_ {
        std::future::poll_fn(move |cx| self.poll_recv(cx))
    }

    /// [`recv`](Self::recv) for a future polled by hand: the next message, or `Pending` with `cx` woken when one
    /// is queued.
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.0.poll_next_unpin(cx)
    }

    /// A message queued now, if any.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.0.try_recv().map_err(|e| match e {
            mpsc::TryRecvError::Empty => TryRecvError::Empty,
            mpsc::TryRecvError::Closed => TryRecvError::Disconnected,
        })
    }

    /// Refuses further messages (those queued can still be received).
    pub fn close(&mut self) {
        self.0.close();
    }
}

/// A new channel.
pub fn unbounded_channel<T>() -> (UnboundedSender<T>, UnboundedReceiver<T>) {
    let (tx, rx) = mpsc::unbounded();
    (UnboundedSender(tx), UnboundedReceiver(rx))
}

/// The sending half of a bounded channel; cheap to clone.
#[derive(Debug)]
pub struct Sender<T> {
    tx: UnboundedSender<(T, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
            room: self.room.clone(),
        }
    }
}

impl<T> Sender<T> {
    /// Queues `value`, waiting while the channel is full; fails only when the receiver is gone.
    pub async fn send(&self, value: T) -> Result<(), SendError<T>> {
        let Ok(permit) = self.room.clone().acquire_owned().await else {
            return Err(SendError(value));
        };
        self.tx
            .send((value, permit))
            .map_err(|SendError((value, _))| SendError(value))
    }

    /// Queues `value` if there is room now; hands it back when the channel is full or the receiver is gone.
    pub fn try_send(&self, value: T) -> Result<(), SendError<T>> {
        let Ok(permit) = self.room.clone().try_acquire_owned() else {
            return Err(SendError(value));
        };
        self.tx
            .send((value, permit))
            .map_err(|SendError((value, _))| SendError(value))
    }

    /// Whether the receiver is gone.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// Waits until the channel has room for one more message (for a [`try_send`](Self::try_send) right after, by
    /// the only sender); fails when the receiver is gone.
    pub async fn ready(&self) -> Result<(), SendError<()>> {
        self.room.acquire().await.map(drop).map_err(|_| SendError(()))
    }
}

/// The receiving half of a bounded channel.
#[derive(Debug)]
pub struct Receiver<T> {
    rx: UnboundedReceiver<(T, OwnedSemaphorePermit)>,
    room: Arc<Semaphore>,
}

impl<T> Receiver<T> {
    /// The next message (its room freed); `None` once every sender is gone and the queue is empty.
    /// Cancel-safe. The wait is one pointer.
    pub fn recv(&mut self) -> impl Future<Output = Option<T>> + '_ {
        std::future::poll_fn(move |cx| self.poll_recv(cx))
    }

    /// [`recv`](Self::recv) for a future polled by hand (its room freed when it is ready).
    pub fn poll_recv(&mut self, cx: &mut Context<'_>) -> Poll<Option<T>> {
        self.rx
            .poll_recv(cx)
            .map(|next| next.map(|(value, _permit)| value))
    }

    /// A message queued now, if any.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        self.rx.try_recv().map(|(value, _permit)| value)
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        // senders waiting for room give up
        self.room.close();
    }
}

/// A new bounded channel holding at most `capacity` (at least 1) queued messages.
pub fn channel<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let (tx, rx) = unbounded_channel();
    let room = Arc::new(Semaphore::new(capacity.max(1)));
    (
        Sender {
            tx,
            room: room.clone(),
        },
        Receiver { rx, room },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_unbounded_wait_is_one_pointer_and_gets_what_was_sent() {
        let (tx, mut rx) = unbounded_channel::<u32>();
        assert_eq!(size_of_val(&rx.recv()), size_of::<usize>());
        let (_bounded_tx, mut bounded_rx) = channel::<u32>(1);
        assert_eq!(size_of_val(&bounded_rx.recv()), size_of::<usize>());
        tx.send(7).unwrap();
        drop(tx);
        assert_eq!(rx.recv().await, Some(7));
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_bounded_channel_makes_the_sender_wait_until_a_message_is_received() {
        let (tx, mut rx) = channel(2);
        tx.send(1).await.unwrap();
        tx.send(2).await.unwrap();
        let third = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send(3).await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert!(!third.is_finished(), "a full channel took a third message");
        assert_eq!(tx.try_send(4), Err(SendError(4)));
        assert_eq!(rx.recv().await, Some(1));
        third.await.unwrap().unwrap();
        assert_eq!(rx.try_recv(), Ok(2));
        assert_eq!(rx.recv().await, Some(3));
        drop(tx);
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sender_waiting_for_room_gets_its_message_back_when_the_receiver_goes() {
        let (tx, rx) = channel(1);
        tx.send("first").await.unwrap();
        let waiting = tokio::spawn({
            let tx = tx.clone();
            async move { tx.send("second").await }
        });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        drop(rx);
        assert_eq!(waiting.await.unwrap(), Err(SendError("second")));
        assert!(tx.is_closed());
        assert_eq!(tx.send("late").await, Err(SendError("late")));
    }

    #[tokio::test]
    async fn delivers_in_order_and_ends_when_senders_go() {
        let (tx, mut rx) = unbounded_channel();
        let tx2 = tx.clone();
        tx.send(1).unwrap();
        tx2.send(2).unwrap();
        assert_eq!(rx.try_recv(), Ok(1));
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Empty));
        drop((tx, tx2));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn a_closed_receiver_hands_the_message_back() {
        let (tx, rx) = unbounded_channel::<&str>();
        assert!(!tx.is_closed());
        drop(rx);
        assert!(tx.is_closed());
        assert_eq!(tx.send("late"), Err(SendError("late")));
    }
}
