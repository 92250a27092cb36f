//! What a pod worker does to a pod, one action at a time, all through the agent's shared [`context`]:
//!
//! * [`images`] — pulling a container's image per `imagePullPolicy` ([`pull_gate`] paces pulls,
//!   [`pull_secrets`] finds credentials).
//! * [`volumes`] — setting up and tearing down the volumes a node provides itself; [`objects`] reads the
//!   ConfigMaps, Secrets and tokens they name, through [`object_watches`] or [`read_cache`] ([`object_data`]: what
//!   such an object holds; [`object_refs`]: which ones a pod names).
//! * [`env`](mod@env) — a container's environment, command and arguments ([`service_links`] adds the Services).
//! * [`action`] — one probe or lifecycle-hook action (exec, HTTP, TCP, gRPC, sleep).
//! * [`kill`] — stopping containers and pods.
//!
//! None of these knows about workers or the pod manager: a worker calls them in the order its sync decides.

pub(crate) mod action;
pub(crate) mod context;
pub(crate) mod env;
pub(crate) mod images;
pub(crate) mod kill;
pub(crate) mod object_data;
pub(crate) mod object_refs;
pub(crate) mod object_watches;
pub mod objects;
pub mod pull_gate;
pub(crate) mod pull_secrets;
pub(crate) mod read_cache;
pub(crate) mod service_links;
pub(crate) mod volumes;
