//! The runtime-api trait over a CRI v1 gRPC client on a unix socket.
