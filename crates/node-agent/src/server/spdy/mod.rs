//! SPDY/3.1, the stream protocol the API server speaks to a kubelet for `exec`: the frame codec
//! ([`frame`], with the header-block [`dictionary`]) and a minimal server-side [`session`] over an upgraded
//! connection. Used when the container runtime has no streaming server of its own (the fake runtime of
//! hollow nodes), so the node serves the stream itself.

pub mod dictionary;
pub mod frame;
pub mod session;

#[cfg(test)]
mod bad_input_tests;

pub use session::{IncomingStream, Session};
