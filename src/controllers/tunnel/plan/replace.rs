//! Whether an exit server whose tunnel does not come up is replaced: only when a new one can
//! help, each replacement waiting twice as long as the one before, and never more than
//! `--tunnel-max-replacements` in a row. A failure that is not the exit server's (the client is
//! not running) or that no replacement has cured must not buy a new VM every
//! `--tunnel-replace-after`. Where the provider reads the VM's console, the install script's
//! own report ([`InstallReport`]) says whether an unreachable VM refused the binary (a new VM
//! would refuse it too, so none is bought) or did not start the server.

use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use providers::exit::userdata::InstallReport;

use crate::reasons::Reason;

/// Which side a failed health check is blamed on, diagnosed before any replacement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// The tunnel client Deployment has no available replica: a new exit server cannot help.
    ClientNotAvailable,
    /// The exit server does not answer on its control port at all.
    ExitServerUnreachable,
    /// The exit server answers, the client runs, and still the tunnel is not through.
    TunnelNotEstablished,
    /// Unreachable, and the VM reports it refused the exit-server binary (`download-failed`,
    /// `digest-mismatch`, `architecture <arch>`): a new VM would refuse it too.
    ArtifactRefused(String),
    /// Unreachable, and the VM reports the binary passed but the server did not start (the step
    /// that failed).
    NotStarted(String),
    /// Unreachable, though the VM reports the server started: something between the operator
    /// and the control port.
    StartedButUnreachable,
}

impl Cause {
    /// Reads the evidence: whether the exit server's control port accepts a connection, and
    /// whether the client Deployment has an available replica.
    pub fn diagnose(server_reachable: bool, client_available: bool) -> Self {
        match (server_reachable, client_available) {
            (false, _) => Cause::ExitServerUnreachable,
            (true, false) => Cause::ClientNotAvailable,
            (true, true) => Cause::TunnelNotEstablished,
        }
    }

    /// An unreachable exit server, told apart by the VM's own install report (from its console,
    /// where the provider reads one); any other cause stands as it is.
    pub fn with_report(self, report: Option<InstallReport>) -> Self {
        match (self, report) {
            (Cause::ExitServerUnreachable, Some(InstallReport::ArtifactRefused(what))) => Cause::ArtifactRefused(what),
            (Cause::ExitServerUnreachable, Some(InstallReport::NotStarted(step))) => Cause::NotStarted(step),
            (Cause::ExitServerUnreachable, Some(InstallReport::Started)) => Cause::StartedButUnreachable,
            (cause, _) => cause,
        }
    }

    /// The condition reason and Event reason.
    pub fn reason(&self) -> Reason {
        match self {
            Cause::ClientNotAvailable => Reason::ClientNotAvailable,
            Cause::ExitServerUnreachable | Cause::StartedButUnreachable => Reason::ExitServerUnreachable,
            Cause::TunnelNotEstablished => Reason::TunnelNotEstablished,
            Cause::ArtifactRefused(_) => Reason::ExitServerArtifactRefused,
            Cause::NotStarted(_) => Reason::ExitServerNotStarted,
        }
    }

    /// What the cause means and what to do, naming the client Deployment `client`.
    pub fn explain(&self, client: &str) -> String {
        match self {
            Cause::ClientNotAvailable => format!(
                "the tunnel client Deployment {client} has no available replica, so replacing the exit server cannot \
                 help; see the Deployment's pods (image pull, scheduling, crashes)"
            ),
            Cause::ExitServerUnreachable => {
                "the exit server does not accept connections on its control port (not booted, its install failed, \
                 or no route from the operator)"
                    .into()
            }
            Cause::TunnelNotEstablished => {
                "the exit server answers and the client runs, but the client is not connected (egress from the \
                 cluster to the control port, or the exit server refused it)"
                    .into()
            }
            Cause::ArtifactRefused(what) => format!(
                "the exit server's VM is up but refused the exit-server binary ({what}), and a new VM would refuse \
                 it too, so none is bought: --exit-server-url must serve this operator's own version for the VM's \
                 architecture (its SHA-256 is derived from the operator's executable), reachable from the VM; fix \
                 that, then delete the Tunnel (or its exit server) to try again"
            ),
            Cause::NotStarted(step) => format!(
                "the exit server's VM installed the checked binary but the server did not start (the {step} step \
                 failed; see the VM's console or its cloud-init log)"
            ),
            Cause::StartedButUnreachable => {
                "the exit server's VM reports the server started, yet its control port does not answer the \
                 operator: a firewall, security group or route between them"
                    .into()
            }
        }
    }
}

/// What is done about a host whose tunnel is past its boot timeout.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Unhealthy {
    /// Keep the host and report Ready=False with `reason`.
    Report { reason: Reason, message: String },
    /// Replace the host: the `count`th replacement in a row; the next one comes no earlier than
    /// `next_after` (recorded for the user: the next host must fail twice as long).
    Replace { why: String, count: u32, next_after: Timestamp },
}

/// The operator's settings the decision depends on.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub boot_timeout: Duration,
    pub replace_after: Duration,
    /// `--tunnel-max-replacements`.
    pub max: u32,
}

/// The failing time replacement number `done + 1` waits for: `replace_after` × 2^done.
pub fn replace_wait(replace_after: Duration, done: u32) -> Duration {
    replace_after.saturating_mul(1u32 << done.min(16))
}

/// Decides for a host whose tunnel has failed the health check for `failing_for` with `error`
/// (past the boot timeout), blamed on `cause`, after `done` replacements in a row (recorded in
/// status: the Tunnel's for a single exit server, the slot's in a highly available pair).
pub fn unhealthy(
    (cause, error): (&Cause, &str),
    failing_for: Duration,
    done: u32,
    limits: &Limits,
    (now, client): (Timestamp, &str),
) -> Unhealthy {
    let (replace_after, max) = (limits.replace_after, limits.max);
    let waited = humantime::format_duration(Duration::from_secs(failing_for.as_secs()));
    let boot = humantime::format_duration(limits.boot_timeout);
    let base = format!(
        "the tunnel has not been established for {waited} (boot timeout {boot}): {error}; {}",
        cause.explain(client)
    );
    let report = |message: String| Unhealthy::Report { reason: cause.reason(), message };
    if matches!(cause, Cause::ClientNotAvailable | Cause::ArtifactRefused(_)) {
        return report(base);
    }
    if done >= max {
        return report(format!(
            "{base}; skyport stopped replacing the exit server after {done} replacement(s) (--tunnel-max-replacements \
             {max}); fix the cause, then delete the Tunnel (or its exit server) to try again"
        ));
    }
    // The failing clock of a host starts when it is first seen running (after the replacement
    // that made it, or after an operator restart), so this wait also keeps `next_after`.
    let wait = replace_wait(replace_after, done);
    if failing_for < wait {
        let due = humantime::format_duration(wait);
        return report(format!("{base}; the exit server is replaced after {due}"));
    }
    let next = SignedDuration::try_from(replace_wait(replace_after, done + 1)).unwrap_or(SignedDuration::MAX);
    Unhealthy::Replace {
        why: format!("{base}; replacement {} of at most {max}", done + 1),
        count: done + 1,
        next_after: now.checked_add(next).unwrap_or(Timestamp::MAX),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIN: Duration = Duration::from_secs(60);

    fn now() -> Timestamp {
        "2030-01-01T00:00:00Z".parse().unwrap()
    }

    fn decide(cause: Cause, failing_for: Duration, done: u32) -> Unhealthy {
        let limits = Limits { boot_timeout: MIN / 2, replace_after: MIN, max: 3 };
        unhealthy((&cause, "refused"), failing_for, done, &limits, (now(), "web-tunnel-client"))
    }

    #[test]
    fn the_side_at_fault_is_diagnosed_before_blaming_the_exit_server() {
        assert_eq!(Cause::diagnose(false, false), Cause::ExitServerUnreachable);
        assert_eq!(Cause::diagnose(false, true), Cause::ExitServerUnreachable);
        assert_eq!(Cause::diagnose(true, false), Cause::ClientNotAvailable);
        assert_eq!(Cause::diagnose(true, true), Cause::TunnelNotEstablished);
        let reasons =
            [Cause::ClientNotAvailable, Cause::ExitServerUnreachable, Cause::TunnelNotEstablished].map(|c| c.reason());
        assert_eq!(reasons, ["ClientNotAvailable", "ExitServerUnreachable", "TunnelNotEstablished"]);
    }

    #[test]
    fn a_client_that_is_not_available_never_costs_a_new_exit_server() {
        let Unhealthy::Report { reason, message } = decide(Cause::ClientNotAvailable, 100 * MIN, 0) else {
            panic!("replaced although the client is not running")
        };
        assert_eq!(reason, "ClientNotAvailable");
        assert!(message.contains("web-tunnel-client") && message.contains("cannot help"), "{message}");
    }

    #[test]
    fn replacements_back_off_exponentially_and_stop_at_the_maximum() {
        assert_eq!(replace_wait(MIN, 0), MIN);
        assert_eq!(replace_wait(MIN, 2), 4 * MIN);
        assert_eq!(replace_wait(MIN, u32::MAX), MIN * (1 << 16), "capped, never an overflow");
        // First: after replace_after; recorded with the next one's earliest time.
        assert!(matches!(
            decide(Cause::ExitServerUnreachable, MIN - Duration::from_secs(1), 0),
            Unhealthy::Report { reason: crate::reasons::Reason::ExitServerUnreachable, .. }
        ));
        let Unhealthy::Replace { count, next_after, why } = decide(Cause::TunnelNotEstablished, MIN, 0) else {
            panic!("not replaced after replace_after")
        };
        assert_eq!(count, 1);
        assert_eq!(next_after, "2030-01-01T00:02:00Z".parse::<Timestamp>().unwrap(), "twice the wait");
        assert!(why.contains("replacement 1 of at most 3"), "{why}");
        // Second: the new host must fail twice as long.
        let second = 1;
        let Unhealthy::Report { message, .. } = decide(Cause::TunnelNotEstablished, MIN, second) else {
            panic!("the second replacement came as early as the first")
        };
        assert!(message.contains("boot timeout 30s") && message.contains("replaced after 2m"), "{message}");
        assert!(matches!(decide(Cause::TunnelNotEstablished, 2 * MIN, second), Unhealthy::Replace { count: 2, .. }));
        // At the maximum: the cause stays, with what to do.
        let Unhealthy::Report { reason, message } = decide(Cause::ExitServerUnreachable, 1000 * MIN, 3) else {
            panic!("replaced beyond the maximum")
        };
        assert_eq!(reason, "ExitServerUnreachable");
        assert!(
            message.contains("after 3 replacement(s)") && message.contains("--tunnel-max-replacements 3"),
            "{message}"
        );
        let limits = Limits { boot_timeout: MIN, replace_after: MIN, max: 0 };
        let none = unhealthy((&Cause::TunnelNotEstablished, "x"), 1000 * MIN, 0, &limits, (now(), "c"));
        assert!(matches!(none, Unhealthy::Report { .. }), "0 never replaces");
    }

    #[test]
    fn the_vms_own_report_names_why_an_exit_server_is_unreachable() {
        let unreachable = || Cause::diagnose(false, true);
        let refused = unreachable().with_report(Some(InstallReport::ArtifactRefused("digest-mismatch".into())));
        assert_eq!(refused, Cause::ArtifactRefused("digest-mismatch".into()));
        assert_eq!(refused.reason(), "ExitServerArtifactRefused");
        let not_started = unreachable().with_report(Some(InstallReport::NotStarted("firewall".into())));
        assert_eq!(not_started.reason(), "ExitServerNotStarted");
        let started = unreachable().with_report(Some(InstallReport::Started));
        assert_eq!((started.reason().as_str(), started), ("ExitServerUnreachable", Cause::StartedButUnreachable));
        assert_eq!(unreachable().with_report(None), Cause::ExitServerUnreachable, "no console: the probe's cause");
        // A reachable server's cause is not the console's to change.
        let client = Cause::diagnose(true, false).with_report(Some(InstallReport::ArtifactRefused("x".into())));
        assert_eq!(client, Cause::ClientNotAvailable);
    }

    #[test]
    fn an_artifact_the_vm_refused_never_buys_another_vm() {
        let refused = Cause::ArtifactRefused("architecture riscv64".into());
        let Unhealthy::Report { reason, message } = decide(refused, 1000 * MIN, 0) else {
            panic!("replaced a VM that refused the artifact")
        };
        assert_eq!(reason, "ExitServerArtifactRefused");
        assert!(message.contains("architecture riscv64") && message.contains("--exit-server-url"), "{message}");
        // A server that did not start may start on another VM: replaced as any other failure.
        let not_started = Cause::NotStarted("service".into());
        let Unhealthy::Replace { why, .. } = decide(not_started, MIN, 0) else {
            panic!("a server that did not start is never replaced")
        };
        assert!(why.contains("the service step failed"), "{why}");
    }
}
