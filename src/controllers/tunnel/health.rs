//! One health tracker for every exit server, a single Tunnel's and each server of a pair's: per
//! host, the failed health checks in a row and since when. The single path reads how long a
//! host has failed (its boot timeout and replacement wait), the pair path also how many checks
//! in a row (the failover hysteresis); both read the same record. Beside it, what the metrics
//! count per Tunnel from the same passes: failovers and time unserved ([`PerTunnel`]).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::plan::failover::Health;

/// Per host id: the streak of failed health checks (how many in a row, since when). In memory:
/// a restarted operator starts every streak anew, which only delays a replacement by the boot
/// timeout and a failover by the hysteresis. A streak also keeps, once diagnosed, why its failing
/// server is not replaced: diagnosing asks the cloud (the VM's console), which a pair's pass
/// every second must not do each time.
#[derive(Default)]
pub struct HealthTracker(Mutex<HashMap<String, Streak>>);

struct Streak {
    failures: u32,
    since: Instant,
    kept: Option<(Instant, String)>,
}

impl Streak {
    fn new() -> Self {
        Streak { failures: 0, since: Instant::now(), kept: None }
    }
}

impl HealthTracker {
    fn streaks(&self) -> std::sync::MutexGuard<'_, HashMap<String, Streak>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records one check of `host`; returns its streak (nothing failing once it passed).
    pub fn record(&self, host: &str, passed: bool) -> Health {
        let mut streaks = self.streaks();
        if passed {
            streaks.remove(host);
            return Health::default();
        }
        let streak = streaks.entry(host.to_string()).or_insert_with(Streak::new);
        streak.failures += 1;
        Health { failures: streak.failures, failing_for: streak.since.elapsed() }
    }

    /// Why failing `host` was kept, if that was decided less than `max_age` ago in this streak.
    pub fn kept(&self, host: &str, max_age: Duration) -> Option<String> {
        let streaks = self.streaks();
        let (at, why) = streaks.get(host)?.kept.as_ref()?;
        (at.elapsed() < max_age).then(|| why.clone())
    }

    /// Records why failing `host` is kept, for [`HealthTracker::kept`].
    pub fn keep(&self, host: &str, why: String) {
        if let Some(streak) = self.streaks().get_mut(host) {
            streak.kept = Some((Instant::now(), why));
        }
    }

    /// Drops the streak of a host that is gone (or replaced).
    pub fn forget(&self, host: &str) {
        self.streaks().remove(host);
    }

    /// Moves `host`'s streak back by `by`, as if it had been failing that much longer.
    #[cfg(test)]
    pub fn backdate(&self, host: &str, by: Duration) {
        let mut streaks = self.streaks();
        let streak = streaks.entry(host.to_string()).or_insert_with(Streak::new);
        streak.since = streak.since.checked_sub(by).expect("the machine has been up longer than the backdate");
    }
}

/// Per Tunnel uid: since when its pair's client roll has been halted (a new client that does not
/// roll out or pass keeps the other slot's client on its previous version), and whether that was
/// warned of. In memory: a restarted operator waits the deadline anew.
#[derive(Default)]
pub struct HaltedRolls(Mutex<HashMap<String, (Instant, bool)>>);

impl HaltedRolls {
    fn rolls(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, bool)>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records whether `uid`'s roll is halted this pass. True once per halt: at the first pass
    /// after it has been halted for `deadline`, for one Warning rather than one a pass.
    pub fn overdue(&self, uid: &str, halted: bool, deadline: Duration) -> bool {
        let mut rolls = self.rolls();
        if !halted {
            rolls.remove(uid);
            return false;
        }
        let (since, warned) = rolls.entry(uid.to_string()).or_insert_with(|| (Instant::now(), false));
        let due = !*warned && since.elapsed() >= deadline;
        *warned |= due;
        due
    }

    /// Moves the start of `uid`'s halt back by `by`.
    #[cfg(test)]
    pub fn backdate(&self, uid: &str, by: Duration) {
        let mut rolls = self.rolls();
        let (since, _) = rolls.entry(uid.to_string()).or_insert_with(|| (Instant::now(), false));
        *since = since.checked_sub(by).expect("the machine has been up longer than the backdate");
    }
}

/// A counter per Tunnel, by (namespace, name), for the metrics: kept in the process (a Tunnel's
/// status is writable by anyone who may write `tunnels/status`), dropped with the Tunnel.
#[derive(Default)]
pub struct PerTunnel(Mutex<BTreeMap<(String, String), f64>>);

impl PerTunnel {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String), f64>> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn add(&self, (namespace, name): (&str, &str), amount: f64) {
        *self.map().entry((namespace.to_string(), name.to_string())).or_default() += amount;
    }

    /// Drops a deleted Tunnel's series.
    pub fn remove(&self, (namespace, name): (&str, &str)) {
        self.map().remove(&(namespace.to_string(), name.to_string()));
    }

    pub fn by_tunnel(&self) -> BTreeMap<(String, String), f64> {
        self.map().clone()
    }

    pub fn total(&self) -> f64 {
        self.map().values().sum()
    }
}

/// The time highly available Tunnels spent unserved: Active once, then a pass without a server
/// passing behind the address. Summed pass by pass: each adds the time since that Tunnel's
/// previous pass, at most [`UNSERVED_STEP`] (a longer one means the operator was away).
#[derive(Default)]
pub struct Unserved {
    last: Mutex<HashMap<String, Instant>>,
    /// Seconds, by Tunnel.
    pub seconds: PerTunnel,
}

/// The most one pass adds to [`Unserved`].
pub const UNSERVED_STEP: Duration = Duration::from_secs(5);

impl Unserved {
    /// Records a pass of Tunnel `uid` (named `at`): `serving` is `None` before it was first Active.
    pub fn record(&self, uid: &str, at: (&str, &str), serving: Option<bool>) {
        let now = Instant::now();
        let previous = self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(uid.to_string(), now);
        if let (Some(previous), Some(false)) = (previous, serving) {
            self.seconds.add(at, now.duration_since(previous).min(UNSERVED_STEP).as_secs_f64());
        }
    }

    /// Drops a deleted Tunnel.
    pub fn forget(&self, uid: &str, at: (&str, &str)) {
        self.last.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(uid);
        self.seconds.remove(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINUTE: Duration = Duration::from_secs(60);

    #[test]
    fn a_streak_counts_failed_checks_in_a_row_and_a_pass_ends_it() {
        let t = HealthTracker::default();
        assert_eq!(t.record("h-1", true), Health::default());
        assert_eq!(t.record("h-1", false).failures, 1);
        t.backdate("h-1", MINUTE);
        let health = t.record("h-1", false);
        assert_eq!(health.failures, 2);
        assert!(health.failing_for >= MINUTE, "{health:?}");
        assert_eq!(t.record("h-2", false).failures, 1, "each host its own streak");
        assert_eq!(t.record("h-1", true), Health::default());
        let again = t.record("h-1", false);
        assert_eq!(again.failures, 1, "a new streak after a pass");
        assert!(again.failing_for < MINUTE, "{again:?}");
    }

    #[test]
    fn why_a_failing_server_is_kept_lasts_for_its_streak_and_its_age() {
        let t = HealthTracker::default();
        t.keep("h-1", "no streak yet".into());
        assert_eq!(t.kept("h-1", MINUTE), None, "nothing is kept for a host that does not fail");
        t.record("h-1", false);
        t.keep("h-1", "its client is not available".into());
        assert_eq!(t.kept("h-1", MINUTE).as_deref(), Some("its client is not available"));
        assert_eq!(t.kept("h-1", Duration::ZERO), None, "too old");
        t.forget("h-1");
        assert_eq!(t.kept("h-1", MINUTE), None);
        assert_eq!(t.record("h-1", false).failures, 1, "a forgotten host starts anew");
    }

    #[test]
    fn a_halted_roll_is_overdue_once_past_its_deadline_and_anew_after_it_moved_on() {
        let rolls = HaltedRolls::default();
        assert!(!rolls.overdue("t-1", true, MINUTE), "halted just now");
        rolls.backdate("t-1", MINUTE);
        assert!(rolls.overdue("t-1", true, MINUTE), "halted for the deadline");
        assert!(!rolls.overdue("t-1", true, MINUTE), "said once per halt");
        assert!(!rolls.overdue("t-2", true, MINUTE), "each Tunnel its own");
        assert!(!rolls.overdue("t-1", false, MINUTE), "the roll moved on");
        rolls.backdate("t-1", MINUTE);
        assert!(rolls.overdue("t-1", true, MINUTE), "a new halt, a new Warning");
    }
}
