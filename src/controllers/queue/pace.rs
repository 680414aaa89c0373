//! How often converged Queues are checked: never more often than the resync flags say, and
//! never so often that the checks take more than a share of the SQS budget.
//!
//! Every Ready Queue reads its attributes once per resync. With the defaults (48 calls/s, 60 s)
//! 2,880 Ready Queues take the whole budget, and a new Queue's CreateQueue waits behind their
//! checks: 10,000 new Queues stalled near 2,900 Ready, at under 3 per second. So the period
//! stretches with the number of Queues instead, and new and changed Queues keep the rest.

use std::time::Duration;

/// The share of a budget periodic checks may take.
pub const CHECK_SHARE: f64 = 0.5;

/// The period at which `queues` checks, one call each, take at most [`CHECK_SHARE`] of
/// `rate_per_second`; never shorter than `floor` (the flag).
pub fn period(floor: Duration, queues: usize, rate_per_second: f64) -> Duration {
    let budget = rate_per_second.max(1.0) * CHECK_SHARE;
    floor.max(Duration::from_secs_f64(queues as f64 / budget))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_holds_until_the_checks_would_take_half_the_budget() {
        let minute = Duration::from_secs(60);
        assert_eq!(period(minute, 0, 48.0), minute);
        assert_eq!(period(minute, 1_440, 48.0), minute, "24 checks per second: half of 48");
        assert_eq!(period(minute, 2_880, 48.0), Duration::from_secs(120));
        assert_eq!(period(minute, 10_000, 48.0), Duration::from_secs_f64(10_000.0 / 24.0));
        // Tags: 10,000 Queues at the 24/s tagging budget are read every 833 s, not every 10 min.
        assert_eq!(period(10 * minute, 10_000, 24.0), Duration::from_secs_f64(10_000.0 / 12.0));
    }
}
