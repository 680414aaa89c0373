//! The VM's own word on an exit server the operator cannot reach: its install report, read
//! from the console where the provider keeps one ([`HostProvider::console_output`]).

use providers::HostProvider;
use providers::exit::userdata::InstallReport;
use tracing::warn;

use super::super::plan::replace::Cause;

/// `cause`, told apart by the install report on host `id`'s console when the exit server is
/// unreachable. Only then is the console read (a cloud call); a console that cannot be read
/// leaves the cause as it is.
pub(super) async fn with_report(cause: Cause, provider: &dyn HostProvider, id: Option<&str>) -> Cause {
    let (Cause::ExitServerUnreachable, Some(id)) = (&cause, id) else { return cause };
    match provider.console_output(id).await {
        Ok(console) => cause.with_report(console.as_deref().and_then(InstallReport::find)),
        Err(e) => {
            warn!(host = %id, error = %e, "cannot read the exit server's console; the cause stays as probed");
            cause
        }
    }
}
