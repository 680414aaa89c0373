//! The operator-wide budget of exit servers (`--tunnel-max-hosts-per-hour`), drawn by every
//! creation after the Tunnel's own daily budget ([`super::plan::budget`]).
//!
//! The daily budget lives in the Tunnel's status, which skyport's token writes, and so can a thief
//! holding that token: it can erase `status.hostsCreated`, or delete a Service's Tunnel, which
//! skyport makes anew with no creations counted. Each would buy a fresh day's servers. This
//! budget is kept where no Kubernetes token reaches, in the operator process, so churn driven
//! through the API is bounded by it.
//!
//! The same token can also end the process: taking the leader (or a shard) Lease makes the holder
//! exit, and its container restarts. So that a restart does not hand out a fresh hour, each
//! creation's time is also appended to `--tunnel-creations-file`, on a volume of the operator's
//! Pod that no Kubernetes API reaches (the charts' emptyDir, which outlives the container, not
//! the Pod); a process starts with the last hour's creations drawn. Another replica taking over
//! starts with its own Pod's record, so the bound is this budget per replica.

use std::io::Write;
use std::num::NonZeroU32;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

const HOUR: u64 = 3600;

/// At most `per_hour` creations in any hour, all of them at once if need be (a burst of new
/// Tunnels), refilled at `per_hour` an hour.
pub struct HourlyBudget {
    limiter: DefaultDirectRateLimiter,
    per_hour: u32,
    /// Where each creation is appended, if anywhere.
    record: Option<PathBuf>,
}

impl HourlyBudget {
    /// A budget kept in this process only.
    pub fn new(per_hour: u32) -> Self {
        let n = NonZeroU32::new(per_hour).unwrap_or(NonZeroU32::MIN);
        HourlyBudget { limiter: RateLimiter::direct(Quota::per_hour(n)), per_hour: n.get(), record: None }
    }

    /// A budget that records its creations in `path` and starts with those of the last hour
    /// drawn (at once: they come back at the budget's rate from now, later than they would from
    /// their own times, never earlier). A record that cannot be read or written is logged and
    /// the budget is kept in the process only.
    pub fn recorded(per_hour: u32, path: &Path) -> Self {
        let mut budget = HourlyBudget::new(per_hour);
        match recent_creations(path, unix_now()) {
            Ok(recent) => {
                for _ in 0..recent.len() {
                    _ = budget.limiter.check();
                }
                if let Err(e) = rewrite(path, &recent) {
                    tracing::warn!(path = %path.display(), error = %e, "cannot write the record of exit servers created; the hourly budget is kept in this process only");
                    return budget;
                }
                tracing::info!(path = %path.display(), created_in_the_last_hour = recent.len(), "hourly exit-server budget read");
                budget.record = Some(path.to_path_buf());
            }
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cannot read the record of exit servers created; the hourly budget is kept in this process only");
            }
        }
        budget
    }

    /// Takes one creation (and records it), or says how long until one is free.
    pub fn take(&self) -> Result<(), Duration> {
        self.limiter.check().map_err(|not_until| not_until.wait_time_from(DefaultClock::default().now()))?;
        if let Some(path) = &self.record
            && let Err(e) = append(path, unix_now())
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot record an exit server's creation; a restart would not count it");
        }
        Ok(())
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

fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The creation times (Unix seconds) in `path` within the hour before `now`; a missing file has
/// none, and a line that is not a time counts as now (a damaged record must not free the budget).
fn recent_creations(path: &Path, now: u64) -> std::io::Result<Vec<u64>> {
    let text = match std::fs::read_to_string(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        read => read?,
    };
    let times = text.lines().filter(|l| !l.trim().is_empty()).map(|l| l.trim().parse().unwrap_or(now));
    Ok(times.filter(|at| at + HOUR > now).collect())
}

/// Replaces the record with `times` (dropping what left the hour), through a renamed file so a
/// crash leaves the old record or the new one.
fn rewrite(path: &Path, times: &[u64]) -> std::io::Result<()> {
    let text: String = times.iter().map(|t| format!("{t}\n")).collect();
    let partial = path.with_extension("partial");
    std::fs::write(&partial, text)?;
    std::fs::rename(&partial, path)
}

fn append(path: &Path, at: u64) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(file, "{at}")?;
    file.sync_data()
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

    #[test]
    fn a_restarted_process_starts_with_the_last_hours_creations_drawn() {
        let dir = std::env::temp_dir().join(format!("skyport-hourly-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("creations");
        _ = std::fs::remove_file(&path);
        let first = HourlyBudget::recorded(3, &path);
        first.take().unwrap();
        first.take().unwrap();
        drop(first);
        let restarted = HourlyBudget::recorded(3, &path);
        restarted.take().expect("one of three left");
        restarted.take().expect_err("the restart did not refill the hour");

        // What left the hour is dropped; a damaged line counts as now.
        let now = unix_now();
        std::fs::write(&path, format!("{}\n{}\ngarbage\n", now - 2 * HOUR, now - 60)).unwrap();
        assert_eq!(recent_creations(&path, now).unwrap(), [now - 60, now]);
        let reread = HourlyBudget::recorded(3, &path);
        assert_eq!(std::fs::read_to_string(&path).unwrap().lines().count(), 2, "the old one is pruned");
        reread.take().expect("one of three left");
        reread.take().expect_err("spent");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn without_a_readable_record_the_budget_is_the_processs_own() {
        let missing = std::env::temp_dir().join("skyport-hourly-no-such-dir/creations");
        let budget = HourlyBudget::recorded(1, &missing);
        assert!(budget.record.is_none());
        budget.take().expect("a full budget");
    }
}
