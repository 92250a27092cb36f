//! The API server's own count of the requests it answered (`apiserver_request_total` on its `/metrics`), for the
//! tests and benchmarks that compare what clients asked of it, and the one way to read a label of a Prometheus
//! text-format line.

/// One `apiserver_request_total` series: its label text (between the braces) and its value.
pub struct RequestCount {
    /// The series' labels as written, e.g. `code="200",component="apiserver",...,verb="PUT"`.
    pub labels: String,
    /// Requests answered so far.
    pub value: f64,
}

impl RequestCount {
    /// The value of label `key` (empty when the series has none).
    pub fn label(&self, key: &str) -> &str {
        label(&self.labels, key)
    }
}

/// Every `apiserver_request_total` series the API server reports now.
pub async fn request_counts(client: &kube::Client) -> anyhow::Result<Vec<RequestCount>> {
    let body = client
        .request_text(http::Request::get("/metrics").body(Vec::new())?)
        .await?;
    let mut out = Vec::new();
    for line in body.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else {
            continue;
        };
        let Some((labels, value)) = rest.rsplit_once("} ") else {
            continue;
        };
        out.push(RequestCount {
            labels: labels.to_owned(),
            value: value.trim().parse()?,
        });
    }
    Ok(out)
}

/// The value of label `key` in a Prometheus line's label text (empty when it has none).
pub fn label<'a>(labels: &'a str, key: &str) -> &'a str {
    labels
        .split_once(&format!("{key}=\""))
        .and_then(|(_, rest)| rest.split_once('"'))
        .map_or("", |(value, _)| value)
}

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn a_label_is_read_by_its_whole_key() {
        let labels = r#"code="200",resource="leases",subresource="",verb="PUT""#;
        assert_eq!(label(labels, "verb"), "PUT");
        assert_eq!(label(labels, "resource"), "leases");
        assert_eq!(label(labels, "subresource"), "");
        assert_eq!(label(labels, "scope"), "");
    }
}
