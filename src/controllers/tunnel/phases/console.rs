//! Why an exit server's tunnel does not come up, and whether a new one would help: the probes
//! and the VM's own word (its install report: served on the control port by a VM that refused
//! the binary, else read from the console where the provider keeps one,
//! [`HostProvider::console_output`]). One
//! diagnosis for a single exit server and for either server of a highly available pair.

use providers::HostProvider;
use providers::exit::userdata::InstallReport;
use tracing::warn;

use super::super::Context;
use super::super::placement::Placement;
use super::super::plan::replace::{self, Cause, Unhealthy};

/// A failing exit server to judge: its id and the address its control port is probed at, the
/// error and duration of its failing checks, and its replacements in a row so far.
pub(super) struct Failing<'a> {
    pub(super) host: (Option<&'a str>, &'a str),
    pub(super) error: &'a str,
    pub(super) failing_for: std::time::Duration,
    pub(super) replaced: u32,
}

/// Diagnoses `failing` (control port, client Deployment `at`'s availability, the install
/// report) and decides ([`replace::unhealthy`]) whether it is replaced.
pub(super) async fn judge(
    failing: Failing<'_>,
    client_available: bool,
    at: &Placement,
    provider: &dyn HostProvider,
    ctx: &Context,
) -> (Cause, Unhealthy) {
    let settings = &ctx.settings;
    let (id, ip) = failing.host;
    // A VM that refused the binary says so on its control port ([`observe::Probe::install_report`]);
    // else the console, where the provider keeps one, tells an unreachable VM's story.
    let served = ctx.probe.install_report(ip, settings.control_port).await;
    let cause = match served.as_deref().and_then(InstallReport::find) {
        Some(report) => Cause::ExitServerUnreachable.with_report(Some(report)),
        None => {
            let reachable = ctx.probe.reachable(ip, settings.control_port).await;
            with_report(Cause::diagnose(reachable, client_available), provider, id).await
        }
    };
    let limits = replace::Limits {
        boot_timeout: settings.boot_timeout,
        replace_after: settings.replace_after,
        max: settings.max_replacements,
    };
    let client = format!("{}/{}", at.namespace, at.deployment);
    let now = (k8s_openapi::jiff::Timestamp::now(), client.as_str());
    let decision = replace::unhealthy((&cause, failing.error), failing.failing_for, failing.replaced, &limits, now);
    (cause, decision)
}

/// Why a pool member's check fails, where that can be told apart: its own client Deployments
/// (`clients`) have no available replica, or no server of its shared server (`servers`) accepts
/// connections on its control port, or both run and its tunnel is not through. The shared server
/// itself is judged, and replaced, by its own Tunnel: this only names the side at fault.
pub(super) async fn judge_member(clients: &[Placement], servers: &[&str], ctx: &Context) -> crate::Result<String> {
    let mut unavailable = None;
    for at in clients {
        if !super::super::act::client_available(at, ctx).await? {
            unavailable = Some(format!("{}/{}", at.namespace, at.deployment));
            break;
        }
    }
    let mut reachable = false;
    for ip in servers {
        reachable = reachable || ctx.probe.reachable(ip, ctx.settings.control_port).await;
    }
    let cause = Cause::diagnose(reachable, unavailable.is_none());
    let client = unavailable.or_else(|| clients.first().map(|at| format!("{}/{}", at.namespace, at.deployment)));
    Ok(cause.explain(&client.unwrap_or_default()))
}

/// `cause`, told apart by the install report on host `id`'s console when the exit server is
/// unreachable. Only then is the console read (a cloud call); a console that cannot be read
/// leaves the cause as it is.
async fn with_report(cause: Cause, provider: &dyn HostProvider, id: Option<&str>) -> Cause {
    let (Cause::ExitServerUnreachable, Some(id)) = (&cause, id) else { return cause };
    match provider.console_output(id).await {
        Ok(console) => cause.with_report(console.as_deref().and_then(InstallReport::find)),
        Err(e) => {
            warn!(host = %id, error = %e, "cannot read the exit server's console; the cause stays as probed");
            cause
        }
    }
}
