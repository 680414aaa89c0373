//! Shared plumbing for the REST adapters (DigitalOcean, Hetzner Cloud): bearer auth with a token
//! that never reaches logs or errors, a base-URL override, one error mapping, and rate limiting
//! in three layers:
//!
//! 1. our own budget, a `governor` bucket sized below the provider's published quota
//!    ([`Limiter`], counted per operation);
//! 2. the provider's view, from the `RateLimit-Limit` / `-Remaining` / `-Reset` headers both
//!    clouds send: when `remaining` reaches 0 we hold further calls until the next request
//!    will be admitted, instead of spending one on a 429;
//! 3. a 429: its `Retry-After` is honoured once inside the call when it is short
//!    ([`MAX_INLINE_WAIT`]); otherwise the call fails with [`HostError::RateLimited`] carrying
//!    the wait, so the controller requeues instead of blocking a worker.
//!
//! No other retries happen here: transient errors go back to the controller, whose backoff is
//! per object.

use std::num::NonZeroU32;
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

use governor::Quota;
use reqwest::header::ACCEPT;
use reqwest::{Method, StatusCode, Url};
use serde::de::DeserializeOwned;

use crate::error::HostError;
use crate::limiter::Limiter;

mod errors;
mod rate_limit;

use errors::error_fields;
pub use errors::map_error;
pub use rate_limit::{RateLimitInfo, RefillModel, parse_retry_after};

/// The longest wait the adapter sits out itself (a short `Retry-After`, or the time until the
/// provider's quota admits the next request). Anything longer is returned as `RateLimited`.
pub const MAX_INLINE_WAIT: Duration = Duration::from_secs(5);

/// An API token. It is only ever sent in the `Authorization` header: `Debug` prints
/// `<redacted>`, there is no `Display`, and error messages are scrubbed of it.
#[derive(Clone)]
pub struct ApiToken(String);

impl ApiToken {
    pub fn new(token: impl Into<String>) -> Self {
        ApiToken(token.into().trim().to_string())
    }

    /// The first non-empty variable of `names` (e.g. `DIGITALOCEAN_TOKEN`, `HCLOUD_TOKEN`).
    pub fn from_env(names: &[&str]) -> Option<Self> {
        names.iter().filter_map(|n| std::env::var(n).ok()).map(ApiToken::new).find(|t| !t.0.is_empty())
    }

    fn expose(&self) -> &str {
        &self.0
    }

    /// `text` with every occurrence of the token replaced, for anything that may echo a
    /// request back (error bodies, transport errors).
    fn scrub(&self, text: &str) -> String {
        if self.0.is_empty() { text.to_string() } else { text.replace(&self.0, "<redacted>") }
    }
}

impl std::fmt::Debug for ApiToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A sustained rate of one call per `period`, with bursts of up to `burst` calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    pub period: Duration,
    pub burst: NonZeroU32,
}

impl Budget {
    pub fn quota(&self) -> Quota {
        Quota::with_period(self.period.max(Duration::from_nanos(1))).expect("non-zero period").allow_burst(self.burst)
    }
}

/// A successful response.
#[derive(Debug)]
pub struct Response {
    pub status: StatusCode,
    pub body: Vec<u8>,
}

/// Connection settings shared by the REST adapters.
#[derive(Debug, Clone)]
pub struct RestSettings {
    /// `https://api.digitalocean.com`, `https://api.hetzner.cloud/v1`, or an API-compatible
    /// endpoint (tests, proxies).
    pub base_url: String,
    pub token: ApiToken,
    pub budget: Budget,
    /// Upper bound for one HTTP exchange.
    pub timeout: Duration,
}

/// One provider's HTTP client, limiter and rate-limit state.
#[derive(Debug)]
pub struct RestClient {
    provider: &'static str,
    http: reqwest::Client,
    base: Url,
    token: ApiToken,
    limiter: Limiter,
    model: RefillModel,
    /// Set while the provider says our quota is used up: no request before this instant.
    hold_until: Mutex<Option<Instant>>,
    last_seen: Mutex<RateLimitInfo>,
}

impl RestClient {
    /// Needs a process-wide rustls crypto provider (the binary installs ring at startup).
    pub fn new(provider: &'static str, settings: &RestSettings, model: RefillModel) -> Result<Self, HostError> {
        let invalid = |message: String| HostError::Invalid { provider, message };
        let base = Url::parse(settings.base_url.trim_end_matches('/'))
            .map_err(|e| invalid(format!("base URL {:?}: {e}", settings.base_url)))?;
        if !matches!(base.scheme(), "http" | "https") {
            return Err(invalid(format!("base URL {:?} must be http or https", settings.base_url)));
        }
        if settings.token.expose().is_empty() {
            return Err(HostError::Unauthorized { provider, message: "no API token configured".into() });
        }
        let http = reqwest::Client::builder()
            .user_agent(concat!("skyport/", env!("CARGO_PKG_VERSION")))
            .connect_timeout(Duration::from_secs(5).min(settings.timeout))
            .timeout(settings.timeout)
            .build()
            .map_err(|e| {
                invalid(format!("cannot build the HTTP client (is a rustls crypto provider installed?): {e}"))
            })?;
        Ok(RestClient {
            provider,
            http,
            base,
            token: settings.token.clone(),
            limiter: Limiter::from_quota(settings.budget.quota()),
            model,
            hold_until: Mutex::new(None),
            last_seen: Mutex::new(RateLimitInfo::default()),
        })
    }

    pub fn limiter(&self) -> &Limiter {
        &self.limiter
    }

    /// The rate-limit headers of the latest response (for metrics and diagnostics).
    pub fn last_rate_limit(&self) -> RateLimitInfo {
        *self.last_seen.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn url(&self, path: &str, query: &[(&str, &str)]) -> Url {
        let mut url = self.base.clone();
        let joined = format!("{}{}", self.base.path().trim_end_matches('/'), path);
        url.set_path(&joined);
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        url
    }

    /// Sits out a short provider-side hold, or fails fast with `RateLimited` for a long one.
    async fn respect_hold(&self) -> Result<(), HostError> {
        let until = *self.hold_until.lock().unwrap_or_else(|p| p.into_inner());
        let Some(until) = until else { return Ok(()) };
        let wait = until.saturating_duration_since(Instant::now());
        if wait.is_zero() {
            return Ok(());
        }
        if wait > MAX_INLINE_WAIT {
            return Err(HostError::RateLimited { provider: self.provider, retry_after: Some(wait) });
        }
        tokio::time::sleep(wait).await;
        self.limiter.record_wait(wait);
        Ok(())
    }

    fn note_rate_limit(&self, info: RateLimitInfo, now: SystemTime) {
        if info == RateLimitInfo::default() {
            return;
        }
        *self.last_seen.lock().unwrap_or_else(|p| p.into_inner()) = info;
        let wait = info.wait_for_next(self.model, now);
        if let Some(w) = wait {
            tracing::debug!(
                provider = self.provider,
                wait_ms = w.as_millis() as u64,
                "provider quota used up; holding calls"
            );
        }
        *self.hold_until.lock().unwrap_or_else(|p| p.into_inner()) = wait.map(|w| Instant::now() + w);
    }

    /// One API call, counted as `operation`. Returns the response for any 2xx status and a
    /// mapped [`HostError`] otherwise.
    pub async fn send(
        &self,
        operation: &'static str,
        method: Method,
        path: &str,
        query: &[(&str, &str)],
        body: Option<&serde_json::Value>,
    ) -> Result<Response, HostError> {
        let mut retried = false;
        loop {
            self.respect_hold().await?;
            self.limiter.acquire(operation).await;
            let mut request = self
                .http
                .request(method.clone(), self.url(path, query))
                .bearer_auth(self.token.expose())
                .header(ACCEPT, "application/json");
            if let Some(body) = body {
                request = request.json(body);
            }
            let response = request.send().await.map_err(|e| self.transport_error(&e))?;
            let status = response.status();
            let headers = response.headers().clone();
            let now = SystemTime::now();
            let info = RateLimitInfo::from_headers(&headers);
            self.note_rate_limit(info, now);
            let body = response.bytes().await.map_err(|e| self.transport_error(&e))?.to_vec();

            if status == StatusCode::TOO_MANY_REQUESTS {
                // `Retry-After` wins (DigitalOcean sends it for its per-minute burst limit, when
                // `remaining` is 0 although the hourly quota is not); without it, the provider's
                // headers say when the next request is admitted, or at least when the window
                // resets.
                let header = parse_retry_after(&headers, now);
                let retry_after = header
                    .or_else(|| info.wait_for_next(self.model, now))
                    .or_else(|| info.reset.map(|r| r.duration_since(now).unwrap_or_default()));
                if let Some(wait) = retry_after {
                    *self.hold_until.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now() + wait);
                }
                if let Some(wait) = header
                    && wait <= MAX_INLINE_WAIT
                    && !retried
                {
                    tracing::debug!(
                        provider = self.provider,
                        operation,
                        wait_ms = wait.as_millis() as u64,
                        "429; retrying once"
                    );
                    retried = true;
                    continue;
                }
                return Err(HostError::RateLimited { provider: self.provider, retry_after });
            }
            if status.is_success() {
                return Ok(Response { status, body });
            }
            let (code, message) = error_fields(status, &body);
            return Err(map_error(self.provider, status, code.as_deref(), self.token.scrub(&message)));
        }
    }

    /// Decodes a JSON body; a body that does not match is the provider's fault (transient).
    pub fn decode<T: DeserializeOwned>(&self, operation: &str, response: &Response) -> Result<T, HostError> {
        serde_json::from_slice(&response.body).map_err(|e| HostError::Unavailable {
            provider: self.provider,
            message: format!("malformed {operation} response: {e}"),
        })
    }

    fn transport_error(&self, e: &reqwest::Error) -> HostError {
        let what = if e.is_timeout() {
            "request timed out"
        } else if e.is_connect() {
            "connection failed"
        } else if e.is_decode() || e.is_body() {
            "response could not be read"
        } else {
            "request failed"
        };
        // The URL never holds the token, but scrub anyway: errors end up in Events.
        let detail = self.token.scrub(&e.to_string());
        HostError::Unavailable { provider: self.provider, message: format!("{what}: {detail}") }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_never_shows_in_debug_output() {
        let token = ApiToken::new("dop_v1_supersecret");
        assert_eq!(format!("{token:?}"), "<redacted>");
        let settings = RestSettings {
            base_url: "https://example.invalid".into(),
            token,
            budget: Budget { period: Duration::from_secs(1), burst: NonZeroU32::new(1).unwrap() },
            timeout: Duration::from_secs(1),
        };
        assert!(!format!("{settings:?}").contains("supersecret"));
        assert_eq!(settings.token.scrub("echo: Bearer dop_v1_supersecret"), "echo: Bearer <redacted>");
    }
}
