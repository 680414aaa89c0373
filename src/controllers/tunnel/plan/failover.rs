//! Where the reserved address of a highly available Tunnel belongs: pure, from each exit
//! server's recent health checks.
//!
//! The server holding the address is the active one. It keeps the address through a blip: only
//! after [`Hysteresis::failures`] failed checks in a row spanning at least
//! [`Hysteresis::after`] does the address move, and only to a server whose own last check
//! passed. A server that recovers does not get the address back (nothing moves while the holder
//! passes), so two servers failing in turn never bounce it to and fro.

use std::time::Duration;

/// What the health checks said of one exit server lately.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Health {
    /// Checks failed in a row; 0 when the last one passed.
    pub failures: u32,
    /// Since the first failure of that streak; zero when the last check passed.
    pub failing_for: Duration,
}

impl Health {
    /// The last check passed.
    pub fn passing(&self) -> bool {
        self.failures == 0
    }
}

/// One running exit server of the pair, as checked on its own address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Server<'a> {
    pub id: &'a str,
    pub health: Health,
    /// The last failed check's message (for the failover's reason).
    pub error: &'a str,
    /// How long it may fail while the other server holds the address before it is replaced
    /// (`--tunnel-replace-after`, doubled for each replacement of its slot in a row); `None`
    /// once `--tunnel-max-replacements` of its slot are spent.
    pub replace_after: Option<Duration>,
}

/// How much failing makes a failover.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hysteresis {
    /// Failed checks in a row (at least 1).
    pub failures: u32,
    /// Time the streak must span.
    pub after: Duration,
}

/// How long one check of a pair's server may take, from `--tunnel-failover-probe-interval`:
/// the interval itself, at least [`MIN_PROBE_TIMEOUT`] and at most [`PROBE_TIMEOUT`]. A hung
/// server (it accepts connections and never answers) fails each check only at this timeout, and
/// a pass waits for it, so the hysteresis takes `failures × (interval + timeout)`: with the
/// single server's 3 s, about 12 s at the defaults, with the interval's 1 s about 6 s. A server
/// that is slow but alive does not flap for it: one late answer is a blip the hysteresis absorbs;
/// the address moves only to a server that answered within the same timeout in the same pass (a
/// slow path from the operator, a loaded node, fails both, and nothing moves); and it never moves
/// back while its holder passes. A server slower than the interval at every check, beside one that
/// answers in time, does lose the address.
pub fn probe_timeout(interval: Duration) -> Duration {
    interval.clamp(MIN_PROBE_TIMEOUT, PROBE_TIMEOUT)
}

/// How long a single server's check may take (a tunnel that answers slower is not fit to carry
/// traffic; nothing to move to, a failing check only withdraws or replaces), and the most a
/// pair's may take.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The least a pair's check may take: a healthy answer takes milliseconds, and a second leaves
/// room for a loaded node's scheduling stall even at a fast interval.
pub const MIN_PROBE_TIMEOUT: Duration = Duration::from_secs(1);

/// What to do with the address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FailoverStep {
    /// Leave it where it is. `degraded` says why no server could take over, when none can.
    Keep { degraded: Option<String> },
    /// It is on neither server: put it on `to`, whose check passes.
    Assign { to: String },
    /// Take it from the failing holder `from` to `to`, whose check passes.
    Move { from: String, to: String, reason: String },
    /// The holder is fine; the other server failed long enough ([`Server::replace_after`]) to be
    /// replaced, if a new one can help (the caller diagnoses that first).
    ReplaceStandby { id: String, reason: String },
}

/// Decides from the running servers of the pair (up to two, in slot order) and the id of the
/// host holding the address (`None`: unassigned, or on a host that is not running any more).
pub fn failover_step(servers: &[Server], holder: Option<&str>, h: &Hysteresis) -> FailoverStep {
    let active = holder.and_then(|id| servers.iter().find(|s| s.id == id));
    let others = || servers.iter().filter(move |s| Some(s.id) != holder);
    let healthy_other = others().find(|s| s.health.passing());
    let Some(active) = active else {
        return match (healthy_other, holder) {
            (Some(to), None) => FailoverStep::Assign { to: to.id.to_string() },
            (Some(to), Some(from)) => FailoverStep::Move {
                from: from.to_string(),
                to: to.id.to_string(),
                reason: format!("exit server {from} is not running"),
            },
            // Nothing serves: a new server in the failing one's slot may.
            (None, _) => {
                replace_due(others(), "").unwrap_or(FailoverStep::Keep { degraded: Some(no_healthy(servers)) })
            }
        };
    };
    if !failed(&active.health, h) {
        return replace_due(others(), "").unwrap_or(FailoverStep::Keep { degraded: None });
    }
    let reason = format!(
        "exit server {} failed {} health checks in a row over {}: {}",
        active.id,
        active.health.failures,
        whole_seconds(active.health.failing_for),
        active.error
    );
    match healthy_other {
        Some(to) => FailoverStep::Move { from: active.id.to_string(), to: to.id.to_string(), reason },
        // Both fail: the address stays, and the other server is replaced when due (within its
        // slot's budget), so the pair can serve again.
        None => replace_due(others(), &format!("; {reason}"))
            .unwrap_or_else(|| FailoverStep::Keep { degraded: Some(format!("{reason}; {}", no_healthy(servers))) }),
    }
}

/// Replaces the first of `others` (the servers without the address) that fails and has failed
/// long enough ([`Server::replace_after`]); `also` is appended to the reason.
fn replace_due<'a>(mut others: impl Iterator<Item = &'a Server<'a>>, also: &str) -> Option<FailoverStep> {
    let due = |s: &Server| s.replace_after.is_some_and(|after| s.health.failing_for >= after);
    let s = others.find(|s| due(s) && !s.health.passing())?;
    Some(FailoverStep::ReplaceStandby {
        id: s.id.to_string(),
        reason: format!(
            "standby exit server {} has failed its health check for {}: {}{also}",
            s.id,
            whole_seconds(s.health.failing_for),
            s.error
        ),
    })
}

/// A client Deployment of the pair against what it should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Client {
    /// Rolled out: its only Pod runs the current config and image.
    Current,
    /// The current config and image applied, the roll not done: the check may still be
    /// answered by the old Pod, so it proves nothing about the new one yet.
    Rolling,
    /// Another config or image: applying it restarts the client.
    Stale,
    /// Not there: nothing to interrupt.
    Missing,
}

/// What to do about the pair's clients this pass.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Roll {
    /// Move the address to this slot (its client is current and passes), so that rolling the
    /// holder's client, at the next pass, interrupts nothing: connections made through the old
    /// holder just before the move finish meanwhile.
    pub handover_to: Option<usize>,
    /// Apply these slots' Deployments.
    pub apply: Vec<usize>,
}

/// Rolls the pair's clients one at a time: a missing one is made at once; a stale one of the
/// server without the address first; the holder's only once the other is current and passes
/// (the address is handed over to it, and the old holder's client rolls at the next pass, as the
/// server without the address), or once the holder itself has failed for `patience` (it carries
/// nothing a roll could interrupt). A new client that never rolls out or never passes (a bad
/// image, a config the servers refuse) halts the roll there, like a Deployment's rolling update
/// with no unavailable Pod allowed: the holder keeps serving with its previous client.
/// `clients[i]` is slot `i`'s client (`None` without a server to point it at), `failing_for[i]`
/// how long slot `i` has been failing.
pub fn roll(
    clients: [Option<Client>; 2],
    holder: Option<usize>,
    passing: [bool; 2],
    failing_for: [Duration; 2],
    patience: Duration,
) -> Roll {
    let mut roll = Roll::default();
    let stale = |i: usize| clients[i] == Some(Client::Stale);
    for (i, client) in clients.iter().enumerate() {
        let wanted = match client {
            Some(Client::Missing) => true,
            Some(Client::Stale) => Some(i) != holder,
            _ => false,
        };
        if wanted {
            roll.apply.push(i);
        }
    }
    let Some(h) = holder.filter(|h| stale(*h)) else { return roll };
    let other = 1 - h;
    match clients[other] {
        Some(Client::Current) if passing[other] => roll.handover_to = Some(other),
        _ if failing_for[h] >= patience => roll.apply.push(h),
        _ => {}
    }
    roll.apply.sort_unstable();
    roll
}

/// [`roll`] for a pair that publishes both servers' own addresses: there is no address to hand
/// over, but each address carries traffic, so the clients still roll one at a time, the first
/// stale one last, once the other is current and passes (or once it failed itself for
/// `patience`).
pub fn roll_both(
    clients: [Option<Client>; 2],
    passing: [bool; 2],
    failing_for: [Duration; 2],
    patience: Duration,
) -> Roll {
    let guarded = clients.iter().position(|c| *c == Some(Client::Stale));
    let step = roll(clients, guarded, passing, failing_for, patience);
    // Where `roll` would hand the address over, the other server already carries its own.
    let mut apply: Vec<usize> = step.apply.into_iter().chain(guarded.filter(|_| step.handover_to.is_some())).collect();
    apply.sort_unstable();
    Roll { handover_to: None, apply }
}

/// Past the hysteresis: enough failures in a row, over long enough.
fn failed(health: &Health, h: &Hysteresis) -> bool {
    health.failures >= h.failures.max(1) && health.failing_for >= h.after
}

fn no_healthy(servers: &[Server]) -> String {
    match servers.len() {
        0 => "no exit server of the pair is running".into(),
        _ => "no other exit server passes its health check, so the address stays".into(),
    }
}

fn whole_seconds(d: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(d.as_secs()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Hysteresis = Hysteresis { failures: 3, after: Duration::from_secs(2) };
    const REPLACE_AFTER: Option<Duration> = Some(Duration::from_secs(900));

    fn ok(id: &str) -> Server<'_> {
        Server { id, health: Health::default(), error: "", replace_after: REPLACE_AFTER }
    }

    fn failing(id: &str, failures: u32, secs: u64) -> Server<'_> {
        let health = Health { failures, failing_for: Duration::from_secs(secs) };
        Server { id, health, error: "connection refused", replace_after: REPLACE_AFTER }
    }

    /// When the address leaves a hung holder (its every check takes the whole timeout and
    /// fails) for a passing standby, counted from the last check the holder passed, in the
    /// worst case: each pass waits the whole interval after the one before.
    fn hung_holder_moves_after(interval: Duration, timeout: Duration, h: &Hysteresis) -> Duration {
        let (mut now, mut first) = (Duration::ZERO, None);
        for failures in 1.. {
            now += interval + timeout;
            let failing_for = now - *first.get_or_insert(now);
            let hung = Server { health: Health { failures, failing_for }, error: "timed out", ..ok("a") };
            if let FailoverStep::Move { .. } = failover_step(&[hung, ok("b")], Some("a"), h) {
                return now;
            }
        }
        unreachable!("a hysteresis is reached")
    }

    #[test]
    fn a_hung_holder_loses_the_address_within_8_s_at_the_defaults() {
        let d = crate::config::TunnelArgs::default();
        let h = Hysteresis { failures: d.failover_failures, after: d.failover_after };
        let interval = d.failover_probe_interval;
        let moved = hung_holder_moves_after(interval, probe_timeout(interval), &h);
        // The move itself (one provider call) and the clients' reconnect fit in the rest of 10 s.
        assert!(moved <= Duration::from_secs(8), "a hung holder loses the address only after {moved:?}");
    }

    #[test]
    fn a_pair_check_may_take_its_interval_within_bounds() {
        assert_eq!(probe_timeout(Duration::from_secs(1)), Duration::from_secs(1));
        assert_eq!(probe_timeout(Duration::from_millis(1500)), Duration::from_millis(1500));
        assert_eq!(probe_timeout(Duration::from_millis(100)), MIN_PROBE_TIMEOUT, "a fast interval, a usable check");
        assert_eq!(probe_timeout(Duration::from_secs(10)), PROBE_TIMEOUT, "a slow interval, the single server's");
    }

    #[test]
    fn a_passing_holder_keeps_the_address() {
        assert_eq!(failover_step(&[ok("a"), ok("b")], Some("a"), &H), FailoverStep::Keep { degraded: None });
        let standby_down = [ok("a"), failing("b", 50, 60)];
        assert_eq!(failover_step(&standby_down, Some("a"), &H), FailoverStep::Keep { degraded: None });
    }

    #[test]
    fn a_blip_moves_nothing_neither_few_failures_nor_a_short_streak() {
        for holder in [failing("a", 2, 60), failing("a", 10, 1), failing("a", 1, 0)] {
            let step = failover_step(&[holder.clone(), ok("b")], Some("a"), &H);
            assert_eq!(step, FailoverStep::Keep { degraded: None }, "{holder:?}");
        }
    }

    #[test]
    fn a_holder_failing_past_the_hysteresis_gives_the_address_to_a_passing_standby() {
        let step = failover_step(&[failing("a", 3, 2), ok("b")], Some("a"), &H);
        let FailoverStep::Move { from, to, reason } = step else { panic!("{step:?}") };
        assert_eq!((from.as_str(), to.as_str()), ("a", "b"));
        assert!(reason.contains("failed 3 health checks in a row over 2s: connection refused"), "{reason}");
        let step = failover_step(&[ok("a"), failing("b", 4, 5)], Some("b"), &H);
        assert!(matches!(step, FailoverStep::Move { ref to, .. } if to == "a"), "slot order does not matter: {step:?}");
    }

    #[test]
    fn never_to_a_standby_whose_own_check_fails() {
        for standby in [failing("b", 1, 0), failing("b", 30, 60)] {
            let step = failover_step(&[failing("a", 5, 10), standby], Some("a"), &H);
            let FailoverStep::Keep { degraded: Some(why) } = step else { panic!("{step:?}") };
            assert!(why.contains("exit server a failed 5") && why.contains("address stays"), "{why}");
        }
        let alone = failover_step(&[failing("a", 5, 10)], Some("a"), &H);
        assert!(matches!(alone, FailoverStep::Keep { degraded: Some(_) }), "no standby running: {alone:?}");
    }

    #[test]
    fn a_holder_that_is_not_running_loses_the_address_at_once_to_a_passing_server() {
        let step = failover_step(&[ok("b")], Some("a"), &H);
        assert_eq!(
            step,
            FailoverStep::Move { from: "a".into(), to: "b".into(), reason: "exit server a is not running".into() }
        );
        let step = failover_step(&[failing("b", 1, 0)], Some("a"), &H);
        assert!(matches!(step, FailoverStep::Keep { degraded: Some(_) }), "{step:?}");
        let none = failover_step(&[], Some("a"), &H);
        assert_eq!(none, FailoverStep::Keep { degraded: Some("no exit server of the pair is running".into()) });
    }

    #[test]
    fn an_unassigned_address_goes_to_the_first_passing_server() {
        assert_eq!(failover_step(&[ok("a"), ok("b")], None, &H), FailoverStep::Assign { to: "a".into() });
        assert_eq!(failover_step(&[failing("a", 1, 0), ok("b")], None, &H), FailoverStep::Assign { to: "b".into() });
        let step = failover_step(&[failing("a", 1, 0), failing("b", 1, 0)], None, &H);
        assert!(matches!(step, FailoverStep::Keep { degraded: Some(_) }), "{step:?}");
    }

    #[test]
    fn a_recovered_former_holder_does_not_take_the_address_back() {
        // After a move b holds it; a passes again: nothing moves while b passes or blips.
        assert_eq!(failover_step(&[ok("a"), ok("b")], Some("b"), &H), FailoverStep::Keep { degraded: None });
        assert_eq!(failover_step(&[ok("a"), failing("b", 2, 1)], Some("b"), &H), FailoverStep::Keep { degraded: None });
    }

    #[test]
    fn when_both_fail_the_server_without_the_address_is_replaced_once_due() {
        let step = failover_step(&[failing("a", 900, 900), failing("b", 900, 900)], Some("a"), &H);
        let FailoverStep::ReplaceStandby { id, reason } = step else { panic!("{step:?}") };
        assert_eq!(id, "b");
        assert!(reason.contains("standby exit server b") && reason.contains("exit server a failed 900"), "{reason}");
        // The holder is gone and the other fails: it is replaced too.
        let gone = failover_step(&[failing("b", 900, 900)], Some("a"), &H);
        assert!(matches!(gone, FailoverStep::ReplaceStandby { ref id, .. } if id == "b"), "{gone:?}");
        // Not yet due, or its slot's replacements spent: the address stays, degraded.
        let young = failover_step(&[failing("a", 900, 900), failing("b", 30, 60)], Some("a"), &H);
        assert!(matches!(young, FailoverStep::Keep { degraded: Some(_) }), "{young:?}");
        let spent = Server { replace_after: None, ..failing("b", 9000, 9000) };
        let step = failover_step(&[failing("a", 900, 900), spent], Some("a"), &H);
        assert!(matches!(step, FailoverStep::Keep { degraded: Some(_) }), "{step:?}");
    }

    #[test]
    fn a_standby_failing_long_enough_is_replaced_while_the_holder_serves() {
        let step = failover_step(&[ok("a"), failing("b", 900, 900)], Some("a"), &H);
        let FailoverStep::ReplaceStandby { id, reason } = step else { panic!("{step:?}") };
        assert_eq!(id, "b");
        assert!(reason.contains("standby exit server b") && reason.contains("15m"), "{reason}");
        let blip = failover_step(&[failing("a", 1, 0), failing("b", 900, 900)], Some("a"), &H);
        assert!(matches!(blip, FailoverStep::ReplaceStandby { .. }), "a holder within its blip still serves");
        let later = Server { replace_after: Some(Duration::from_secs(1800)), ..failing("b", 900, 900) };
        assert_eq!(failover_step(&[ok("a"), later], Some("a"), &H), FailoverStep::Keep { degraded: None });
        let spent = Server { replace_after: None, ..failing("b", 9000, 9000) };
        assert_eq!(failover_step(&[ok("a"), spent], Some("a"), &H), FailoverStep::Keep { degraded: None });
    }

    #[test]
    fn clients_roll_one_at_a_time_the_holders_last_after_a_handover() {
        use Client::*;
        let (zero, patience) = ([Duration::ZERO; 2], Duration::from_secs(60));
        let all = |c| [Some(c), Some(c)];
        assert_eq!(roll(all(Current), Some(0), [true; 2], zero, patience), Roll::default());
        // Both stale: the standby (b) first; the holder waits.
        assert_eq!(roll(all(Stale), Some(0), [true; 2], zero, patience), Roll { handover_to: None, apply: vec![1] });
        // b rolled and restarting (not passing yet): the holder still waits.
        let waiting = roll([Some(Stale), Some(Current)], Some(0), [true, false], zero, patience);
        assert_eq!(waiting, Roll::default());
        // b's check passes but its roll is not done: the old Pod may be the one answering.
        let rolling = roll([Some(Stale), Some(Rolling)], Some(0), [true; 2], zero, patience);
        assert_eq!(rolling, Roll::default());
        // b passes: the address goes to b; a's client rolls at the next pass, without the address.
        let handover = roll([Some(Stale), Some(Current)], Some(0), [true; 2], zero, patience);
        assert_eq!(handover, Roll { handover_to: Some(1), apply: vec![] });
        let after = roll([Some(Stale), Some(Current)], Some(1), [true; 2], zero, patience);
        assert_eq!(after, Roll { handover_to: None, apply: vec![0] });
    }

    #[test]
    fn a_new_client_that_never_rolls_out_or_passes_halts_the_roll_and_the_holder_keeps_serving() {
        use Client::*;
        let (patience, long) = (Duration::from_secs(60), [Duration::ZERO, Duration::from_secs(3600)]);
        // b's new client never becomes available (an image that cannot be pulled), or runs and
        // never passes: rolling a too would take both down.
        for b in [Rolling, Current] {
            let halted = roll([Some(Stale), Some(b)], Some(0), [true, false], long, patience);
            assert_eq!(halted, Roll::default(), "{b:?}");
        }
        assert_eq!(roll([Some(Stale), None], Some(0), [true, false], long, patience), Roll::default(), "no b at all");
        // The holder itself has failed for the patience: it serves nothing a roll could interrupt.
        let down = roll([Some(Stale), Some(Rolling)], Some(0), [false; 2], [patience, patience], patience);
        assert_eq!(down, Roll { handover_to: None, apply: vec![0] });
        let blip =
            roll([Some(Stale), Some(Rolling)], Some(0), [false; 2], [Duration::from_secs(2), patience], patience);
        assert_eq!(blip, Roll::default(), "a blip of the holder is no reason");
    }

    #[test]
    fn missing_clients_are_made_at_once_and_without_a_holder_everything_applies() {
        use Client::*;
        let (zero, patience) = ([Duration::ZERO; 2], Duration::from_secs(60));
        let r = roll([Some(Missing), Some(Missing)], None, [false; 2], zero, patience);
        assert_eq!(r, Roll { handover_to: None, apply: vec![0, 1] });
        let r = roll([Some(Missing), Some(Current)], Some(0), [false, true], zero, patience);
        assert_eq!(r.apply, [0], "the holder's client is gone anyway");
        let r = roll([Some(Stale), Some(Stale)], None, [true; 2], zero, patience);
        assert_eq!(r.apply, [0, 1], "no address to protect yet");
        assert_eq!(roll([None, Some(Stale)], Some(1), [false, true], zero, patience), Roll::default());
    }

    #[test]
    fn with_both_addresses_published_clients_still_roll_one_at_a_time_without_a_handover() {
        use Client::*;
        let (zero, patience) = ([Duration::ZERO; 2], Duration::from_secs(60));
        let both = roll_both([Some(Stale), Some(Stale)], [true; 2], zero, patience);
        assert_eq!(both, Roll { handover_to: None, apply: vec![1] });
        assert_eq!(roll_both([Some(Stale), Some(Current)], [true, false], zero, patience), Roll::default());
        let next = roll_both([Some(Stale), Some(Current)], [true; 2], zero, patience);
        assert_eq!(next, Roll { handover_to: None, apply: vec![0] }, "b carries while a rolls; nothing moves");
        let made = roll_both([Some(Missing), Some(Stale)], [false, true], zero, patience);
        assert_eq!(made.apply, [0], "b waits for a's new client to pass");
        assert_eq!(roll_both([Some(Current); 2], [true; 2], zero, patience), Roll::default());
    }

    #[test]
    fn zero_failures_in_the_settings_still_needs_one_failed_check() {
        let h = Hysteresis { failures: 0, after: Duration::ZERO };
        assert_eq!(failover_step(&[ok("a"), ok("b")], Some("a"), &h), FailoverStep::Keep { degraded: None });
        assert!(matches!(failover_step(&[failing("a", 1, 0), ok("b")], Some("a"), &h), FailoverStep::Move { .. }));
    }
}
