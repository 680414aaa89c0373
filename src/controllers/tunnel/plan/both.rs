//! A highly available Tunnel in mode `BothAddresses` after its checks (pure): what becomes of
//! each slot's server, which servers' own addresses the Service carries, and why an address it
//! carried leaves. From what the pass found and checked, so every branch is unit tested.

use std::time::Duration;

use super::super::placement::SLOTS;
use super::failover::Health;
use crate::crd::tunnel::ServerStatus;

/// One slot as the pass found and checked it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Checked<'a> {
    /// Its server, if one fills the slot.
    pub id: Option<&'a str>,
    /// Whether the provider reports that server stopped.
    pub stopped: bool,
    /// Its end-to-end check, when it runs: the streak and the last error.
    pub check: Option<(Health, &'a str)>,
    /// How long it may fail while the other serves before it is replaced; `None` once its slot's
    /// replacements are spent.
    pub replace_after: Option<Duration>,
}

impl Checked<'_> {
    /// A server fills the slot and its last check passed.
    pub fn passing(&self) -> bool {
        self.id.is_some() && self.check.is_some_and(|(h, _)| h.passing())
    }

    fn failing_for(&self) -> Option<Duration> {
        self.check.filter(|(h, _)| !h.passing()).map(|(h, _)| h.failing_for)
    }
}

/// What a pass does with one slot's server after the checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Empty, passing, failing for less than its wait, or failing while the other neither
    /// serves nor fails for longer.
    Keep,
    /// Its server stopped: deleted now, the slot filled next pass, on a new address.
    Gone(String),
    /// Failing past its wait while the other serves, or, both failing, the one failing longer
    /// (slot b on a tie, as the standby is in active/standby): replaced if a new server can help
    /// (the console and the client's state decide, [`super::replace::unhealthy`]).
    ReplaceFailing,
    /// The same, its slot's replacements spent: kept, and status says why.
    Spent,
}

/// Each slot's step, in slot order. With both running and failing, one is replaced at a time:
/// the other waits until its partner's successor runs, so the pair is never bought twice at once
/// for one fault, and a fault a new server cannot cure is found on the first.
pub fn steps(slots: [Checked; 2]) -> [Step; 2] {
    let other_passes = [slots[1].passing(), slots[0].passing()];
    let failing_running = |s: &Checked| s.id.is_some() && !s.stopped && s.failing_for().is_some();
    let both_failing = slots.iter().all(failing_running);
    let longest = if slots[0].failing_for() > slots[1].failing_for() { 0 } else { 1 };
    [0, 1].map(|i| {
        let slot = &slots[i];
        let Some(id) = slot.id else { return Step::Keep };
        if slot.stopped {
            return Step::Gone(format!("exit server {id} (slot {}) is no longer running", SLOTS[i]));
        }
        let candidate = other_passes[i] || (both_failing && i == longest);
        match (slot.failing_for(), slot.replace_after) {
            _ if !candidate => Step::Keep,
            (Some(failing), Some(after)) if failing >= after => Step::ReplaceFailing,
            (Some(_), None) => Step::Spent,
            _ => Step::Keep,
        }
    })
}

/// An address the Service carried that leaves it, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Withdrawn {
    pub host_id: String,
    pub ip: String,
    pub why: String,
}

/// What the Service carries after the clients were written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The slots whose own addresses the Service carries, in slot order.
    pub slots: Vec<usize>,
    /// The addresses that were carried (as recorded) and leave now.
    pub withdrawn: Vec<Withdrawn>,
    /// Whether any address is carried: the Tunnel is Ready.
    pub ready: bool,
    /// With none carried: whether the Service's ingress is cleared now (every check has failed
    /// for `--tunnel-withdraw-after`, or no server runs), else it keeps its last addresses.
    pub withdraw: bool,
}

/// Which servers the Service carries: those passing whose client is not being restarted
/// (`restarted`, slot indices), since a restart cuts its tunnel as a failure would.
pub fn publish(
    slots: [Checked; 2],
    restarted: &[usize],
    recorded: &[ServerStatus],
    withdraw_after: Duration,
) -> Published {
    let carried: Vec<usize> = (0..2).filter(|i| slots[*i].passing() && !restarted.contains(i)).collect();
    let is_carried = |id: Option<&str>| carried.iter().any(|i| id.is_some() && slots[*i].id == id);
    let withdrawn = recorded
        .iter()
        .filter(|was| was.healthy && !is_carried(was.host_id.as_deref()))
        .map(|was| {
            let now = (0..2).find(|i| slots[*i].id.is_some() && slots[*i].id == was.host_id.as_deref());
            let why = match now {
                Some(i) if slots[i].check.is_some_and(|(_, e)| !e.is_empty()) => {
                    slots[i].check.map(|(_, e)| e.to_string()).unwrap_or_default()
                }
                Some(i) if restarted.contains(&i) => "its client is being restarted".into(),
                _ => "it is no longer running".into(),
            };
            let (host_id, ip) = (was.host_id.clone().unwrap_or_default(), was.host_ip.clone().unwrap_or_default());
            Withdrawn { host_id, ip, why }
        })
        .collect();
    let ready = !carried.is_empty();
    let failing_for = slots.iter().filter_map(|s| s.check.map(|(h, _)| h.failing_for)).min();
    let withdraw = !ready && failing_for.is_none_or(|f| f >= withdraw_after);
    Published { slots: carried, withdrawn, ready, withdraw }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn passing(id: &str) -> Checked<'_> {
        Checked { id: Some(id), check: Some((Health::default(), "")), replace_after: Some(MIN), ..Default::default() }
    }

    fn failing(id: &str, for_: Duration) -> Checked<'_> {
        let health = Health { failures: 3, failing_for: for_ };
        Checked {
            id: Some(id),
            check: Some((health, "connection refused")),
            replace_after: Some(MIN),
            ..Default::default()
        }
    }

    fn recorded(id: &str, ip: &str) -> ServerStatus {
        ServerStatus { host_id: Some(id.into()), host_ip: Some(ip.into()), healthy: true, ..Default::default() }
    }

    #[test]
    fn a_stopped_server_goes_at_once_whatever_the_other_does() {
        let stopped = Checked { stopped: true, ..failing("i-a", Duration::ZERO) };
        let [a, b] = steps([stopped, failing("i-b", 10 * MIN)]);
        let Step::Gone(why) = a else { panic!("{a:?}") };
        assert!(why.contains("i-a") && why.contains("slot a"), "{why}");
        assert_eq!(b, Step::Keep, "nobody else serves: the other is not replaced");
        assert_eq!(steps([Checked::default(), passing("i-b")]), [Step::Keep, Step::Keep], "an empty slot");
    }

    #[test]
    fn a_failing_server_is_replaced_past_its_wait_while_the_other_serves() {
        let b = passing("i-b");
        assert_eq!(steps([failing("i-a", MIN - Duration::from_secs(1)), b]), [Step::Keep, Step::Keep]);
        assert_eq!(steps([failing("i-a", MIN), b]), [Step::ReplaceFailing, Step::Keep]);
    }

    #[test]
    fn when_both_fail_the_one_failing_longer_is_replaced_once_due_and_the_other_waits_for_its_successor() {
        assert_eq!(steps([failing("i-a", 2 * MIN), failing("i-b", MIN)]), [Step::ReplaceFailing, Step::Keep]);
        assert_eq!(steps([failing("i-a", MIN), failing("i-b", MIN)]), [Step::Keep, Step::ReplaceFailing], "a tie: b");
        let young = steps([failing("i-a", MIN / 2), failing("i-b", MIN / 3)]);
        assert_eq!(young, [Step::Keep, Step::Keep], "not due yet");
        let spent = Checked { replace_after: None, ..failing("i-b", 2 * MIN) };
        assert_eq!(steps([failing("i-a", MIN), spent]), [Step::Keep, Step::Spent], "one at a time, even when spent");
        // The successor boots (no check yet): the other keeps failing and waits.
        let booting = Checked { id: Some("i-c"), ..Default::default() };
        assert_eq!(steps([failing("i-a", 10 * MIN), booting]), [Step::Keep, Step::Keep]);
        assert_eq!(
            steps([failing("i-a", 10 * MIN), Checked::default()]),
            [Step::Keep, Step::Keep],
            "or is not made yet"
        );
    }

    #[test]
    fn a_slot_whose_replacements_are_spent_keeps_its_failing_server_and_says_so() {
        let spent = Checked { replace_after: None, ..failing("i-a", 10 * MIN) };
        assert_eq!(steps([spent, passing("i-b")]), [Step::Spent, Step::Keep]);
        let passing_spent = Checked { replace_after: None, ..passing("i-a") };
        assert_eq!(steps([passing_spent, passing("i-b")]), [Step::Keep, Step::Keep], "nothing to say of a passing one");
    }

    #[test]
    fn the_service_carries_the_passing_servers_whose_clients_run_and_says_why_others_left() {
        let slots = [failing("i-a", Duration::from_secs(5)), passing("i-b")];
        let was = [recorded("i-a", "192.0.2.1"), recorded("i-b", "192.0.2.2"), recorded("i-gone", "192.0.2.3")];
        let p = publish(slots, &[], &was, MIN);
        assert_eq!((p.slots.clone(), p.ready, p.withdraw), (vec![1], true, false));
        let whys: Vec<(&str, &str)> = p.withdrawn.iter().map(|w| (w.ip.as_str(), w.why.as_str())).collect();
        assert_eq!(whys, [("192.0.2.1", "connection refused"), ("192.0.2.3", "it is no longer running")]);

        let p = publish([passing("i-a"), passing("i-b")], &[0], &was[..2], MIN);
        assert_eq!(p.slots, [1], "a client being restarted cuts its tunnel");
        assert_eq!(p.withdrawn[0].why, "its client is being restarted");
    }

    #[test]
    fn with_none_carried_the_ingress_goes_only_after_the_withdraw_time() {
        let soon = publish([failing("i-a", MIN / 2), failing("i-b", 2 * MIN)], &[], &[], MIN);
        assert_eq!((soon.ready, soon.withdraw), (false, false), "the most recent failure decides");
        let late = publish([failing("i-a", MIN), failing("i-b", 2 * MIN)], &[], &[], MIN);
        assert!(late.withdraw);
        let none_running = publish([Checked::default(), Checked::default()], &[], &[], MIN);
        assert!(none_running.withdraw, "no server runs");
    }
}
