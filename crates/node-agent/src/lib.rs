//! The node agent core: registration, heartbeats, pod lifecycle.
