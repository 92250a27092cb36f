//! The kubelet API's plain responses: JSON bodies and text errors with the status codes the kubelet uses.

use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};

/// A JSON response.
pub(super) fn json_response(status: StatusCode, value: &serde_json::Value) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        value.to_string(),
    )
        .into_response()
}

/// A plain-text error response.
pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        message.into(),
    )
        .into_response()
}

/// A runtime failure as a 500 naming the call.
pub(super) fn runtime_error(call: &str, e: &runtime_api::RuntimeError) -> Response {
    error(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("container runtime {call}: {e}"),
    )
}
