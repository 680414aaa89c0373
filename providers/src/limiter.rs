//! One rate limiter per cloud API, with counters of what went through it.
//!
//! Every cloud call awaits [`Limiter::acquire`] first, so a burst of reconciles (an operator
//! restart with thousands of objects) is smoothed to the configured budget instead of
//! tripping the provider's quotas. The counters let tests and benchmarks verify the budget and
//! count the calls a converged object costs.

use std::collections::BTreeMap;
use std::num::NonZeroU32;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// Outcome label of a successful call (failed calls carry the error's own label).
pub const SUCCESS: &str = "success";

/// Counts calls per operation name, their outcomes, and time spent waiting for the limiter.
#[derive(Debug, Default)]
pub struct CallCounters {
    calls: Mutex<BTreeMap<&'static str, u64>>,
    /// Finished calls per (operation, outcome).
    outcomes: Mutex<BTreeMap<(&'static str, &'static str), u64>>,
    waits: AtomicU64,
    waited_micros: AtomicU64,
}

impl CallCounters {
    pub fn record(&self, operation: &'static str) {
        let mut calls = self.calls.lock().unwrap_or_else(|p| p.into_inner());
        *calls.entry(operation).or_default() += 1;
    }

    /// Records how a call of `operation` ended: [`SUCCESS`] or an error label.
    pub fn record_outcome(&self, operation: &'static str, outcome: &'static str) {
        let mut outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        *outcomes.entry((operation, outcome)).or_default() += 1;
    }

    /// A copy of the finished-call counts per (operation, outcome).
    pub fn outcomes(&self) -> BTreeMap<(&'static str, &'static str), u64> {
        self.outcomes.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Successful calls per operation: unlike [`Self::snapshot`], a call that failed and was
    /// retried counts once, so it states what was done rather than what was tried.
    pub fn succeeded(&self) -> BTreeMap<&'static str, u64> {
        let outcomes = self.outcomes.lock().unwrap_or_else(|p| p.into_inner());
        outcomes.iter().filter(|((_, outcome), _)| *outcome == SUCCESS).map(|((op, _), n)| (*op, *n)).collect()
    }

    /// A copy of the per-operation call counts.
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        self.calls.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Total calls over all operations.
    pub fn total(&self) -> u64 {
        self.snapshot().values().sum()
    }

    /// How many acquisitions had to wait, and for how long in total.
    pub fn waits(&self) -> (u64, Duration) {
        (self.waits.load(Ordering::Relaxed), Duration::from_micros(self.waited_micros.load(Ordering::Relaxed)))
    }
}

/// A `governor` token bucket plus the counters of the calls it admitted.
#[derive(Debug)]
pub struct Limiter {
    bucket: DefaultDirectRateLimiter,
    /// The bucket's sustained rate, for callers that pace themselves by it.
    per_second: f64,
    /// A tighter budget that some operations spend as well as the shared one (SQS's tagging
    /// actions have a quota of their own).
    sub: Option<SubBudget>,
    pub counters: CallCounters,
}

#[derive(Debug)]
struct SubBudget {
    operations: &'static [&'static str],
    bucket: DefaultDirectRateLimiter,
    per_second: f64,
}

/// Sustained cells per second of `quota`.
fn rate_of(quota: &Quota) -> f64 {
    1.0 / quota.replenish_interval().as_secs_f64().max(f64::MIN_POSITIVE)
}

impl Limiter {
    /// `per_second` sustained calls with bursts of up to `burst`.
    pub fn new(per_second: NonZeroU32, burst: NonZeroU32) -> Self {
        Self::from_quota(Quota::per_second(per_second).allow_burst(burst))
    }

    /// Also holds `operations` to `per_second` (bursts of `burst`), within the shared budget.
    pub fn with_sub_budget(
        mut self,
        operations: &'static [&'static str],
        per_second: NonZeroU32,
        burst: NonZeroU32,
    ) -> Self {
        let quota = Quota::per_second(per_second).allow_burst(burst);
        self.sub = Some(SubBudget { operations, bucket: RateLimiter::direct(quota), per_second: rate_of(&quota) });
        self
    }

    /// Any `governor` quota, e.g. one cell per 900 ms with a burst of 60 for an hourly budget.
    pub fn from_quota(quota: Quota) -> Self {
        Limiter {
            bucket: RateLimiter::direct(quota),
            per_second: rate_of(&quota),
            sub: None,
            counters: CallCounters::default(),
        }
    }

    /// Sustained calls per second `operation` may make: its sub-budget's rate when it has one
    /// (never more than the shared rate), else the shared rate.
    pub fn rate_for(&self, operation: &'static str) -> f64 {
        match &self.sub {
            Some(sub) if sub.operations.contains(&operation) => sub.per_second.min(self.per_second),
            _ => self.per_second,
        }
    }

    /// Counts `waited` as time spent waiting before a call, for waits decided outside the
    /// bucket (a provider saying its quota is exhausted until a reset time).
    pub fn record_wait(&self, waited: Duration) {
        self.counters.waits.fetch_add(1, Ordering::Relaxed);
        self.counters.waited_micros.fetch_add(waited.as_micros() as u64, Ordering::Relaxed);
    }

    /// Counts how a provider call of `operation` ended: [`SUCCESS`] or its error's label.
    pub fn count_result<T>(&self, operation: &'static str, result: &Result<T, crate::error::HostError>) {
        self.counters
            .record_outcome(operation, result.as_ref().map_or_else(crate::error::HostError::label, |_| SUCCESS));
    }

    /// Waits for a token, then counts `operation` as one call.
    pub async fn acquire(&self, operation: &'static str) {
        self.acquire_from(self, operation).await;
    }

    /// Waits for a token of `bucket`'s budget, but counts the call (and any wait) here: one
    /// provider with a budget per region (EC2 throttles per account and region) still reports
    /// all its calls in one place.
    pub async fn acquire_from(&self, bucket: &Limiter, operation: &'static str) {
        let start = Instant::now();
        let mut waited = false;
        // The sub-budget first: a call waiting for it holds no token of the shared one meanwhile.
        if let Some(sub) = bucket.sub.as_ref().filter(|s| s.operations.contains(&operation))
            && sub.bucket.check().is_err()
        {
            sub.bucket.until_ready().await;
            waited = true;
        }
        if bucket.bucket.check().is_err() {
            bucket.bucket.until_ready().await;
            waited = true;
        }
        if waited {
            self.counters.waits.fetch_add(1, Ordering::Relaxed);
            self.counters.waited_micros.fetch_add(start.elapsed().as_micros() as u64, Ordering::Relaxed);
        }
        self.counters.record(operation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The rates below refill a token every 250 ms: at 1000/s one came back within a millisecond,
    // and a loaded machine that took that long over the burst saw no wait.
    #[tokio::test]
    async fn calls_beyond_the_burst_wait_for_the_rate() {
        let limiter = Limiter::new(NonZeroU32::new(4).unwrap(), NonZeroU32::new(5).unwrap());
        for _ in 0..5 {
            limiter.acquire("GetQueueAttributes").await;
        }
        assert_eq!(limiter.counters.waits().0, 0, "the burst is free");
        limiter.acquire("GetQueueAttributes").await;
        assert_eq!(limiter.counters.waits().0, 1, "the sixth call waited");
        assert_eq!(limiter.counters.snapshot()["GetQueueAttributes"], 6);
    }

    #[tokio::test]
    async fn operations_with_a_sub_budget_wait_for_it_and_the_rest_do_not() {
        let n = |v| NonZeroU32::new(v).unwrap();
        let limiter = Limiter::new(n(1000), n(1000)).with_sub_budget(&["ListQueueTags"], n(4), n(2));
        limiter.acquire("ListQueueTags").await;
        limiter.acquire("ListQueueTags").await;
        for _ in 0..10 {
            limiter.acquire("GetQueueAttributes").await;
        }
        assert_eq!(limiter.counters.waits().0, 0, "within both budgets");
        limiter.acquire("ListQueueTags").await;
        assert_eq!(limiter.counters.waits().0, 1, "the third tagging call waited for its own budget");
        assert_eq!(limiter.counters.total(), 13);
    }

    #[test]
    fn the_sustained_rate_is_known_per_operation() {
        let n = |v| NonZeroU32::new(v).unwrap();
        let limiter = Limiter::new(n(48), n(96)).with_sub_budget(&["ListQueueTags"], n(24), n(24));
        assert!((limiter.rate_for("GetQueueAttributes") - 48.0).abs() < 1e-6);
        assert!((limiter.rate_for("ListQueueTags") - 24.0).abs() < 1e-6);
        let capped = Limiter::new(n(10), n(10)).with_sub_budget(&["ListQueueTags"], n(24), n(24));
        assert!((capped.rate_for("ListQueueTags") - 10.0).abs() < 1e-6, "the shared budget caps a sub-budget");
        let hourly = Limiter::from_quota(Quota::with_period(Duration::from_millis(900)).unwrap());
        assert!((hourly.rate_for("GET") - 1.0 / 0.9).abs() < 1e-6);
    }

    #[test]
    fn outcomes_are_counted_per_operation_and_label() {
        let counters = CallCounters::default();
        counters.record_outcome("CreateQueue", SUCCESS);
        counters.record_outcome("CreateQueue", "throttled");
        counters.record_outcome("CreateQueue", SUCCESS);
        let outcomes = counters.outcomes();
        assert_eq!(outcomes[&("CreateQueue", SUCCESS)], 2);
        assert_eq!(outcomes[&("CreateQueue", "throttled")], 1);
        counters.record_outcome("ListQueueTags", "timeout");
        let succeeded = counters.succeeded();
        assert_eq!(succeeded.get("CreateQueue"), Some(&2), "the throttled attempt is not among them");
        assert_eq!(succeeded.get("ListQueueTags"), None, "an operation that never succeeded");
    }
}
