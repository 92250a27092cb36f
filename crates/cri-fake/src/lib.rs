//! In-memory CRI v1 runtime for hollow nodes (see the cri-fake issue).
