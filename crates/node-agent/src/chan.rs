//! Unbounded channels for the plumbing every node and every pod keeps: control requests, worker messages,
//! runtime events, finished workers, pod statuses.
//!
//! Same surface as tokio's unbounded mpsc (`send`, `recv`, `try_recv`), but over `futures`' linked queue: a
//! tokio channel allocates ~1 KiB when it is made (a 512-byte cache-padded core and a first block of 32 slots),
//! which a hollow fleet pays for every idle channel of ten thousand nodes and of every pod; this one allocates
//! ~100 bytes and then a small node per message in flight.

use futures::StreamExt;
use futures::channel::mpsc;

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
    /// The next message; `None` once every sender is gone and the queue is empty. Cancel-safe.
    pub async fn recv(&mut self) -> Option<T> {
        self.0.next().await
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

#[cfg(test)]
mod tests {
    use super::*;

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
