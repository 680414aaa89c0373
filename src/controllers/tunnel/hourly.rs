//! The operator-wide budget of exit servers (`--tunnel-max-hosts-per-hour`), drawn by every
//! creation after the Tunnel's own daily budget ([`super::plan::budget`]).
//!
//! The daily budget lives in the Tunnel's status, which skyport's token writes, and so can a thief
//! holding that token: it can erase `status.hostsCreated`, or delete a Service's Tunnel, which
//! skyport makes anew with no creations counted. Each would buy a fresh day's servers. This
//! budget is kept where no Kubernetes token reaches, in the operator process, so churn driven
//! through the API is bounded by it. A new process starts with a full budget.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

/// At most `per_hour` creations in any hour, all of them at once if need be (a burst of new
/// Tunnels), refilled at `per_hour` an hour.
pub struct HourlyBudget {
    limiter: DefaultDirectRateLimiter,
    per_hour: u32,
}

impl HourlyBudget {
    pub fn new(per_hour: u32) -> Self {
        let n = NonZeroU32::new(per_hour).unwrap_or(NonZeroU32::MIN);
        HourlyBudget { limiter: RateLimiter::direct(Quota::per_hour(n)), per_hour: n.get() }
    }

    /// Takes one creation, or says how long until one is free.
    pub fn take(&self) -> Result<(), Duration> {
        self.limiter.check().map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))
    }

    /// The message of a spent budget, the wait included.
    pub fn spent_message(&self, wait: Duration) -> String {
        format!(
            "this operator created {} exit server(s) in the last hour for all Tunnels together (--tunnel-max-hosts-per-hour {}); \
             the next may be created in {}s: look for Tunnels whose servers do not last, or that are deleted and made again",
            self.per_hour,
            self.per_hour,
            wait.as_secs().max(1)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_of_the_hours_budget_then_a_wait_of_its_refill() {
        let budget = HourlyBudget::new(4);
        for _ in 0..4 {
            budget.take().expect("the hour's budget, at once");
        }
        let wait = budget.take().expect_err("spent");
        assert!(wait > Duration::from_secs(14 * 60) && wait <= Duration::from_secs(15 * 60), "{wait:?}");
        let message = budget.spent_message(wait);
        assert!(message.contains("--tunnel-max-hosts-per-hour 4"), "{message}");
    }
}
