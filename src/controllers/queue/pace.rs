//! How often converged Queues are checked: never more often than the resync flags say, and
//! never so often that the checks take more than a share of the SQS budget they spend.
//!
//! Every Ready Queue reads its attributes once per resync. With the defaults (48 calls/s, 60 s)
//! 2,880 Ready Queues take the whole budget, and a new Queue's CreateQueue waits behind their
//! checks: 10,000 new Queues stalled near 2,900 Ready, at under 3 per second. So the period
//! stretches with the number of Queues instead, and new and changed Queues keep the rest.
//!
//! SQS quotas are per AWS account and region, and so is the budget ([`super::accounts`]): each
//! (account, region) is paced by its own Queues and its own rate. Queues without an AwsAccount
//! spend the operator's own budget, the `default` account. 100,000 Queues over 10 accounts check
//! their attributes every 7 minutes and their tags every 14, where one shared count would give
//! 69 minutes and 2.3 hours.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use providers::Limiter;

use super::State;
use super::accounts::{Budget, budget_key, default_budget};
use crate::crd::queue::Queue;

/// The share of a budget periodic checks may take.
pub const CHECK_SHARE: f64 = 0.5;

/// The period at which `queues` checks, one call each, take at most [`CHECK_SHARE`] of
/// `rate_per_second`; never shorter than `floor` (the flag).
pub fn period(floor: Duration, queues: usize, rate_per_second: f64) -> Duration {
    let budget = rate_per_second.max(1.0) * CHECK_SHARE;
    floor.max(Duration::from_secs_f64(queues as f64 / budget))
}

/// The drift checks of the Queues spending one budget.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pace {
    /// Queues spending the budget.
    pub queues: usize,
    /// How often each reads its attributes.
    pub resync: Duration,
    /// How often, at most, each reads its tags.
    pub tag_resync: Duration,
}

impl Pace {
    /// The pace of `queues` Queues on `limiter`'s budget, with the flags `resync` and `tag_resync`
    /// as floors.
    pub fn of(queues: usize, resync: Duration, tag_resync: Duration, limiter: &Limiter) -> Pace {
        Pace {
            queues,
            resync: period(resync, queues, limiter.rate_for("GetQueueAttributes")),
            tag_resync: period(tag_resync, queues, limiter.rate_for("ListQueueTags")),
        }
    }
}

/// `period` as status shows it: whole seconds, e.g. `6m 56s`.
pub fn shown(period: Duration) -> String {
    humantime::format_duration(Duration::from_secs(period.as_secs())).to_string()
}

/// Queues per budget.
pub type Counts = HashMap<Budget, usize>;

/// How long a count is used before the cache is counted again.
const RECOUNT_AFTER: Duration = Duration::from_secs(10);

/// Whether a count of `counted` Queues made `age` ago is stale now that the cache holds `now`
/// (pure): after [`RECOUNT_AFTER`], or once the total moved by more than a tenth. Counting is a
/// pass over the whole cache; a storm of new Queues recounts at each tenth, not per Queue.
pub fn stale(age: Duration, counted: usize, now: usize) -> bool {
    age >= RECOUNT_AFTER || counted.abs_diff(now) > counted / 10
}

/// The last count of Queues per budget.
#[derive(Default)]
pub struct Tally(Mutex<Option<(Instant, usize, Arc<Counts>)>>);

impl Tally {
    /// The counts, from `count` when the last ones are [`stale`] for a cache of `len` Queues.
    pub fn get(&self, len: usize, count: impl FnOnce() -> Counts) -> Arc<Counts> {
        let mut last = self.0.lock().unwrap_or_else(|p| p.into_inner());
        match &*last {
            Some((at, counted, counts)) if !stale(at.elapsed(), *counted, len) => counts.clone(),
            _ => {
                let counts = Arc::new(count());
                *last = Some((Instant::now(), len, counts.clone()));
                counts
            }
        }
    }
}

impl State {
    /// The budget `queue`'s SQS calls spend, if it has one now (`None`: its AwsAccount is not
    /// found or not allowed; it makes no SQS call).
    fn budget_of(&self, queue: &Queue) -> Option<Budget> {
        match &queue.spec.account_ref {
            None => Some(default_budget(&*self.sqs)),
            Some(_) => self.accounts.account_of(queue).map(|a| budget_key(&a.spec)),
        }
    }

    /// Queues per budget, counted from the cache at most every [`RECOUNT_AFTER`].
    fn counts(&self) -> Arc<Counts> {
        self.pacing.get(self.queues.len(), || {
            let mut counts = Counts::new();
            for queue in self.queues.state() {
                if let Some(budget) = self.budget_of(&queue) {
                    *counts.entry(budget).or_default() += 1;
                }
            }
            counts
        })
    }

    /// The pace of the Queues spending `budget`: the default client's own limiter for the
    /// operator's account (an operator embedded with other settings than its client's cannot pace
    /// by the wrong one), else the budget AwsAccounts' clients share.
    pub fn pace_of(&self, budget: &Budget) -> Pace {
        let queues = self.counts().get(budget).copied().unwrap_or(0);
        let (resync, tag_resync) = (self.settings.resync, self.settings.tag_resync);
        if *budget == default_budget(&*self.sqs) {
            return Pace::of(queues, resync, tag_resync, self.sqs.limiter());
        }
        Pace::of(queues, resync, tag_resync, &self.accounts.limiter_of(budget))
    }

    /// The pace of every budget Queues spend, and of the operator's own.
    pub fn paces(&self) -> Vec<(Budget, Pace)> {
        let mut budgets: Vec<Budget> = self.counts().keys().cloned().collect();
        let own = default_budget(&*self.sqs);
        if !budgets.contains(&own) {
            budgets.push(own);
        }
        budgets.sort();
        budgets.into_iter().map(|b| (b.clone(), self.pace_of(&b))).collect()
    }

    /// The pace of `queue`'s budget; the flags alone when it has none.
    pub fn pace(&self, queue: &Queue) -> Pace {
        match self.budget_of(queue) {
            Some(budget) => self.pace_of(&budget),
            None => Pace { queues: 0, resync: self.settings.resync, tag_resync: self.settings.tag_resync },
        }
    }

    /// How often converged `queue` reads its attributes: `--queue-resync`, stretched so these
    /// checks take at most half its account and region's SQS budget.
    pub fn resync(&self, queue: &Queue) -> Duration {
        self.pace(queue).resync
    }

    /// How often, at most, converged `queue` reads its tags: `--queue-tag-resync`, stretched
    /// against its account and region's tagging budget in the same way.
    pub fn tag_resync(&self, queue: &Queue) -> Duration {
        self.pace(queue).tag_resync
    }
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

    /// 100,000 Queues over 10 accounts at the default budgets (48 calls/s, 24 tagging calls/s):
    /// each account paces its own 10,000, about 7 and 14 minutes; one shared count would give
    /// about 69 minutes and 2.3 hours.
    #[test]
    fn each_account_paces_its_own_queues_by_its_own_budget() {
        let limiter = providers::SqsSettings::default().limiter();
        let (minute, ten) = (Duration::from_secs(60), Duration::from_secs(600));
        let each = Pace::of(10_000, minute, ten, &limiter);
        assert_eq!(each.resync.as_secs(), 416, "10,000 / 24 per second: about 7 minutes");
        assert_eq!(each.tag_resync.as_secs(), 833, "10,000 / 12 per second: about 14 minutes");
        let shared = Pace::of(100_000, minute, ten, &limiter);
        assert_eq!(shared.resync.as_secs() / 60, 69);
        assert_eq!(shared.tag_resync.as_secs() / 60, 138);
        let small = Pace::of(500, minute, ten, &limiter);
        assert_eq!((small.resync, small.tag_resync), (minute, ten), "a small account keeps the flags");
        assert_eq!(shown(each.resync), "6m 56s");
        assert_eq!(shown(each.tag_resync), "13m 53s");
    }

    #[test]
    fn the_count_is_redone_after_a_while_or_after_a_tenth_more_or_fewer_queues() {
        let now = Duration::ZERO;
        assert!(!stale(now, 1_000, 1_000));
        assert!(!stale(now, 1_000, 1_100), "a tenth: the same pace, near enough");
        assert!(stale(now, 1_000, 1_101));
        assert!(stale(now, 1_000, 899));
        assert!(stale(now, 0, 1), "the first Queues");
        assert!(stale(RECOUNT_AFTER, 1_000, 1_000));
    }

    #[test]
    fn a_tally_counts_again_only_when_stale() {
        let tally = Tally::default();
        let counts = |n| move || Counts::from([(("default".to_string(), String::new()), n)]);
        assert_eq!(tally.get(10, counts(10)).values().sum::<usize>(), 10);
        assert_eq!(tally.get(11, counts(11)).values().sum::<usize>(), 10, "within a tenth");
        assert_eq!(tally.get(12, counts(12)).values().sum::<usize>(), 12);
    }
}
