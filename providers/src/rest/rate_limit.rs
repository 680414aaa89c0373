//! The provider's side of rate limiting (layers 2 and 3 of the parent module): its
//! `RateLimit-*` headers, how its quota refills, and a 429's `Retry-After`.

use std::time::{Duration, SystemTime};

use reqwest::header::{HeaderMap, RETRY_AFTER};

/// How a provider's `RateLimit-Reset` relates to the next admitted request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RefillModel {
    /// Each request counts for one hour; `reset` is when the oldest one expires, i.e. when the
    /// next request is admitted (DigitalOcean).
    SlidingHour,
    /// `remaining` grows by `limit / 3600` every second; `reset` is when the bucket is full
    /// again, so the next request is admitted after `3600 / limit` seconds (Hetzner Cloud).
    GradualPerHour,
}

/// The rate-limit headers of one response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct RateLimitInfo {
    pub limit: Option<u64>,
    pub remaining: Option<u64>,
    /// `RateLimit-Reset` (Unix seconds).
    pub reset: Option<SystemTime>,
}

impl RateLimitInfo {
    /// Reads `RateLimit-Limit`, `RateLimit-Remaining` and `RateLimit-Reset` (names are
    /// case-insensitive; DigitalOcean writes them lower-case, Hetzner capitalised).
    pub fn from_headers(headers: &HeaderMap) -> Self {
        let num = |name: &str| headers.get(name)?.to_str().ok()?.trim().parse::<u64>().ok();
        RateLimitInfo {
            limit: num("ratelimit-limit"),
            remaining: num("ratelimit-remaining"),
            reset: num("ratelimit-reset").map(|s| SystemTime::UNIX_EPOCH + Duration::from_secs(s)),
        }
    }

    /// How long until the provider admits the next request, when `remaining` is 0.
    pub fn wait_for_next(&self, model: RefillModel, now: SystemTime) -> Option<Duration> {
        if self.remaining != Some(0) {
            return None;
        }
        let until_reset = self.reset.map(|r| r.duration_since(now).unwrap_or_default());
        match model {
            RefillModel::SlidingHour => until_reset,
            RefillModel::GradualPerHour => {
                let slot = self.limit.filter(|l| *l > 0).map(|l| Duration::from_secs_f64(3600.0 / l as f64));
                match (slot, until_reset) {
                    (Some(s), Some(r)) => Some(s.min(r)),
                    (s, r) => s.or(r),
                }
            }
        }
    }
}

/// `Retry-After` as delay-seconds or an HTTP-date (RFC 9110 §10.2.3).
pub fn parse_retry_after(headers: &HeaderMap, now: SystemTime) -> Option<Duration> {
    let raw = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = raw.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let at = httpdate::parse_http_date(raw).ok()?;
    Some(at.duration_since(now).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use reqwest::header::HeaderValue;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_str(v).unwrap());
        }
        h
    }

    #[test]
    fn retry_after_accepts_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after(&headers(&[("retry-after", "29")]), now), Some(Duration::from_secs(29)));
        let later = httpdate::fmt_http_date(now + Duration::from_secs(90));
        assert_eq!(parse_retry_after(&headers(&[("retry-after", &later)]), now), Some(Duration::from_secs(90)));
        assert_eq!(parse_retry_after(&headers(&[("retry-after", "soon")]), now), None);
        assert_eq!(parse_retry_after(&HeaderMap::new(), now), None);
    }

    #[test]
    fn an_exhausted_quota_waits_per_the_providers_refill_model() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        let info = RateLimitInfo::from_headers(&headers(&[
            ("RateLimit-Limit", "3600"),
            ("RateLimit-Remaining", "0"),
            ("RateLimit-Reset", "1700003600"),
        ]));
        assert_eq!(info.limit, Some(3600));
        // DigitalOcean: the next request is admitted when the oldest expires (the reset time).
        assert_eq!(info.wait_for_next(RefillModel::SlidingHour, now), Some(Duration::from_secs(3600)));
        // Hetzner: one request comes back every 3600/limit seconds.
        assert_eq!(info.wait_for_next(RefillModel::GradualPerHour, now), Some(Duration::from_secs(1)));
        let left = RateLimitInfo { remaining: Some(3), ..info };
        assert_eq!(left.wait_for_next(RefillModel::SlidingHour, now), None);
    }
}
