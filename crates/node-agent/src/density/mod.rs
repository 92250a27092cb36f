//! The density seam: small primitives that let thousands of agents share one process.
//!
//! A hollow fleet runs ten thousand kubelets in one process, so whatever one node or one pod holds while it
//! waits is multiplied by the fleet. The kubelet logic above this module is written against the plain
//! interfaces below — a channel, a latest-value watch, a timer, a shared copy — and reads as a kubelet; how
//! each is made small lives here, and a reader of the pod or node managers can skip this module.
//!
//! | module | what it stands in for | why it is here |
//! |---|---|---|
//! | [`chan`] | tokio's mpsc channels | a queue per node and per pod that holds nothing while empty |
//! | [`watch`] | `tokio::sync::watch` | a latest-value channel whose waiting side is a single wake-up |
//! | [`poke`] | `tokio::sync::Notify` | a wake-up for exactly one waiter |
//! | [`join`] | one task per manager | an agent's idle managers polled as one task, each only when woken |
//! | [`grid`] | free-running jittered deadlines | periodic deadlines rounded onto one process-wide grid, so many agents wake together |
//! | [`periodic`] | the kubelet's jittered loop periods | the same jitter, each tick landing on the grid |
//! | [`timer`] | a `tokio::time::Sleep` per waiting loop | one timer shared by the idle loops of many agents |
//! | [`wake_timer`] | a timer per pod worker | one timer per pod manager at its workers' earliest wake time |
//! | [`intern`] | a copy per node or pod | one shared copy of values many nodes or pods hold the same |
//! | [`lean_watch`] | kube-runtime's `watcher` | a list+watch that keeps nothing between events |
//!
//! Each behaves as what it stands in for (each module's tests show it); what each saves, measured with the
//! density benchmark, and what it costs is in docs/density.md.

pub mod chan;
pub mod grid;
pub mod intern;
pub(crate) mod join;
pub mod lean_watch;
pub mod periodic;
pub mod poke;
pub mod timer;
pub(crate) mod wake_timer;
pub mod watch;
