//! When to look at an object again: per-object error backoff and resync jitter.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use rand::Rng;

/// Per-object exponential backoff for transient errors (kube-runtime has none built in).
///
/// The delay doubles with each consecutive failure of the same object, up to `max`, with
/// random jitter so that many objects failing together (an unreachable endpoint) do not retry
/// in lockstep. A success forgets the object's history. With `min == max` the delay is fixed
/// (the Service controller's default: it retries every 5 s, as it always has).
#[derive(Debug)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    /// Shortest retry of a failure that heals slowly ([`crate::Error::heals_slowly`]).
    slow_floor: Option<Duration>,
    failures: Mutex<HashMap<String, u32>>,
    /// Per object: no retry before this instant unless its spec changed ([`Backoff::held`]).
    holds: Mutex<HashMap<String, Hold>>,
}

#[derive(Debug, Clone, Copy)]
struct Hold {
    until: Instant,
    /// The object's [`Backoff::held`] `change` when it failed.
    change: u64,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        Backoff { min, max: max.max(min), slow_floor: None, failures: Mutex::default(), holds: Mutex::default() }
    }

    /// Failures that heal slowly are retried no sooner than `floor` (and no later than the
    /// longer of `floor` and `max`).
    pub fn with_slow_floor(mut self, floor: Duration) -> Self {
        self.slow_floor = Some(floor);
        self
    }

    /// `delay` for a failure that heals slowly: at least the slow floor, at most the longest
    /// backoff (or the floor, when that is longer).
    pub fn slow(&self, delay: Duration) -> Duration {
        let floor = self.slow_floor.unwrap_or(self.max);
        delay.max(floor).min(self.max.max(floor))
    }

    /// Records a failure of `key` and returns how long to wait before retrying.
    pub fn next_delay(&self, key: &str) -> Duration {
        let mut failures = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = failures.entry(key.to_string()).or_default();
        let delay = self.delay_for(*n);
        *n = n.saturating_add(1);
        delay
    }

    /// The delay after `n` earlier consecutive failures, before jitter.
    pub fn delay_for(&self, n: u32) -> Duration {
        if self.min == self.max {
            return self.min;
        }
        let factor = 2u32.saturating_pow(n.min(20));
        let base = self.min.saturating_mul(factor).min(self.max);
        // Up to 25% less, never more, so `max` stays a true bound.
        base.mul_f64(1.0 - rand::rng().random_range(0.0..0.25))
    }

    pub fn reset(&self, key: &str) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        self.holds.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    /// Keeps `key` from being retried before `delay` has passed, unless `change` (what the
    /// object's owner controls: its generation, its deletion) differs by then.
    pub fn hold(&self, key: &str, delay: Duration, change: u64) {
        let hold = Hold { until: Instant::now() + delay, change };
        self.holds.lock().unwrap_or_else(|p| p.into_inner()).insert(key.to_string(), hold);
    }

    /// How much longer `key` must wait after its last failure, if the object's `change` is the
    /// one it failed with. kube-runtime runs an object at once when a watch event (our own
    /// finalizer write, an owned object's update) arrived while its failing reconcile ran,
    /// whatever delay the error policy asked for: without this the cloud would see the same
    /// failing call again within milliseconds. A user's edit or deletion is acted on at once.
    pub fn held(&self, key: &str, change: u64) -> Option<Duration> {
        let holds = self.holds.lock().unwrap_or_else(|p| p.into_inner());
        let hold = holds.get(key).filter(|h| h.change == change)?;
        // A requeue timer may fire a little early; a few milliseconds are not worth a round.
        hold.until.checked_duration_since(Instant::now()).filter(|left| *left > Duration::from_millis(20))
    }

    pub fn failures(&self, key: &str) -> u32 {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied().unwrap_or(0)
    }
}

/// `period` shortened by up to 10% at random: spreads periodic resyncs of objects created
/// together without ever exceeding the configured period.
pub fn jittered(period: Duration) -> Duration {
    period.mul_f64(1.0 - rand::rng().random_range(0.0..0.1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_is_capped_and_resets() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        let d0 = b.next_delay("a");
        let d1 = b.next_delay("a");
        let d2 = b.next_delay("a");
        assert!(d0 <= Duration::from_secs(1) && d0 >= Duration::from_millis(750), "{d0:?}");
        assert!(d1 <= Duration::from_secs(2) && d1 >= Duration::from_millis(1500), "{d1:?}");
        assert!(d2 <= Duration::from_secs(4) && d2 >= Duration::from_secs(3), "{d2:?}");
        for _ in 0..50 {
            assert!(b.next_delay("a") <= Duration::from_secs(10));
        }
        assert_eq!(b.failures("b"), 0, "objects back off independently");
        b.reset("a");
        assert!(b.next_delay("a") <= Duration::from_secs(1));
    }

    #[test]
    fn refused_credentials_are_retried_slowly_other_failures_on_the_backoff() {
        let settings = crate::config::QueueArgs::default();
        let b = Backoff::new(settings.backoff_min, settings.backoff_max).with_slow_floor(settings.resync);
        let rejected = crate::Error::Queue(providers::QueueError::from_code("ExpiredToken", "m".into()));
        assert!(!rejected.is_permanent(), "retried, not parked until the spec changes");
        assert!(rejected.heals_slowly());
        assert_eq!(b.slow(Duration::from_secs(1)), settings.resync);
        assert_eq!(b.slow(Duration::from_secs(3600)), settings.backoff_max);
        let flaky = crate::Error::Queue(providers::QueueError::Unavailable("x".into()));
        assert!(!flaky.heals_slowly(), "other failures keep the plain backoff");
    }

    #[test]
    fn a_held_object_waits_out_its_backoff_unless_its_spec_changed() {
        let b = Backoff::new(Duration::from_secs(1), Duration::from_secs(10));
        assert_eq!(b.held("a", 7), None, "nothing failed yet");
        b.hold("a", Duration::from_secs(5), 7);
        let left = b.held("a", 7).expect("held");
        assert!(left > Duration::from_secs(4) && left <= Duration::from_secs(5), "{left:?}");
        assert_eq!(b.held("a", 8), None, "an edit or a deletion goes ahead");
        assert_eq!(b.held("b", 7), None, "per object");
        b.hold("a", Duration::from_millis(5), 7);
        assert_eq!(b.held("a", 7), None, "a hold about to end is not worth a round");
        b.hold("a", Duration::from_secs(5), 7);
        b.reset("a");
        assert_eq!(b.held("a", 7), None, "a success ends the hold");
    }

    #[test]
    fn equal_bounds_give_a_fixed_delay() {
        let b = Backoff::new(Duration::from_secs(5), Duration::from_secs(5));
        for _ in 0..10 {
            assert_eq!(b.next_delay("a"), Duration::from_secs(5));
        }
    }

    #[test]
    fn jitter_never_exceeds_the_period() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(60));
            assert!(d <= Duration::from_secs(60) && d >= Duration::from_secs(54));
        }
    }
}
