//! How a failed response becomes a [`HostError`]: the provider's error code or, failing that,
//! the HTTP status, read from either cloud's error body.

use reqwest::StatusCode;

use crate::error::HostError;

/// Maps a failed response to a [`HostError`]: the provider's machine-readable code first
/// (Hetzner `error.code`, DigitalOcean `id`), the HTTP status otherwise.
pub fn map_error(provider: &'static str, status: StatusCode, code: Option<&str>, message: String) -> HostError {
    match code.unwrap_or_default() {
        "unauthorized" | "forbidden" | "token_readonly" => HostError::Unauthorized { provider, message },
        "invalid_input"
        | "json_error"
        | "unprocessable_entity"
        | "bad_request"
        | "protected"
        | "unsupported_error"
        | "deprecated_api_endpoint"
        | "primary_ip_assigned"
        | "primary_ip_datacenter_mismatch"
        | "primary_ip_version_mismatch" => HostError::Invalid { provider, message },
        "not_found" => HostError::NotFound { provider, message },
        "uniqueness_error" => HostError::AlreadyExists { provider, message },
        "resource_limit_exceeded" => HostError::Quota { provider, message },
        "rate_limit_exceeded" | "too_many_requests" => HostError::RateLimited { provider, retry_after: None },
        "locked"
        | "conflict"
        | "maintenance"
        | "timeout"
        | "unavailable"
        | "resource_unavailable"
        | "placement_error"
        | "server_error"
        | "service_error" => HostError::Unavailable { provider, message },
        _ => match status.as_u16() {
            400 | 422 => HostError::Invalid { provider, message },
            401 | 403 => HostError::Unauthorized { provider, message },
            404 | 410 => HostError::NotFound { provider, message },
            409 => HostError::AlreadyExists { provider, message },
            429 => HostError::RateLimited { provider, retry_after: None },
            // Other 4xx are our request's fault, except timeouts and locks, which pass.
            s if (400..500).contains(&s) && s != 408 && s != 423 => HostError::Invalid { provider, message },
            _ => HostError::Unavailable { provider, message },
        },
    }
}

/// `(code, message)` from either error shape: Hetzner `{"error": {"code", "message"}}`,
/// DigitalOcean `{"id", "message"}`. A body that is neither yields the status text and the
/// start of the body.
pub(super) fn error_fields(status: StatusCode, body: &[u8]) -> (Option<String>, String) {
    let text = |v: &serde_json::Value, k: &str| v.get(k).and_then(|s| s.as_str()).map(str::to_string);
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) {
        let inner = v.get("error").filter(|e| e.is_object()).unwrap_or(&v);
        let code = text(inner, "code").or_else(|| text(inner, "id"));
        if let Some(message) = text(inner, "message") {
            return (code, message);
        }
        if code.is_some() {
            return (code, format!("HTTP {status}"));
        }
    }
    let snippet: String = String::from_utf8_lossy(body).chars().take(200).collect();
    let snippet = snippet.trim();
    (None, if snippet.is_empty() { format!("HTTP {status}") } else { format!("HTTP {status}: {snippet}") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_codes_win_over_statuses() {
        let p = "test";
        let e = map_error(p, StatusCode::FORBIDDEN, Some("resource_limit_exceeded"), "server limit".into());
        assert!(matches!(e, HostError::Quota { .. }), "{e:?}");
        let e = map_error(p, StatusCode::BAD_REQUEST, Some("invalid_input"), "bad".into());
        assert!(matches!(e, HostError::Invalid { .. }));
        let e = map_error(p, StatusCode::CONFLICT, Some("uniqueness_error"), "name taken".into());
        assert!(matches!(e, HostError::AlreadyExists { .. }));
        let e = map_error(p, StatusCode::UNPROCESSABLE_ENTITY, Some("unprocessable_entity"), "x".into());
        assert!(matches!(e, HostError::Invalid { .. }));
        let e = map_error(p, StatusCode::LOCKED, Some("locked"), "x".into());
        assert!(matches!(e, HostError::Unavailable { .. }));
        let e = map_error(p, StatusCode::SERVICE_UNAVAILABLE, None, "x".into());
        assert!(matches!(e, HostError::Unavailable { .. }));
        let e = map_error(p, StatusCode::UNAUTHORIZED, Some("something_new"), "x".into());
        assert!(matches!(e, HostError::Unauthorized { .. }));
    }

    #[test]
    fn both_error_body_shapes_are_read() {
        let hz = br#"{"error":{"code":"invalid_input","message":"invalid input in field 'name'","details":{}}}"#;
        assert_eq!(
            error_fields(StatusCode::BAD_REQUEST, hz),
            (Some("invalid_input".into()), "invalid input in field 'name'".into())
        );
        let dg = br#"{"id":"unprocessable_entity","message":"request payload validation failed","request_id":"x"}"#;
        assert_eq!(
            error_fields(StatusCode::UNPROCESSABLE_ENTITY, dg),
            (Some("unprocessable_entity".into()), "request payload validation failed".into())
        );
        assert_eq!(
            error_fields(StatusCode::BAD_GATEWAY, b"<html>oops</html>").1,
            "HTTP 502 Bad Gateway: <html>oops</html>"
        );
    }
}
