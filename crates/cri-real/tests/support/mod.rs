//! Test support shared by the conformance tests.

pub mod containerd;
pub mod walk;
pub mod walkthrough;
