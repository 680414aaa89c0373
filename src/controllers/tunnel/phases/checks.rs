//! A pass's writes to and reads of a Tunnel's running servers before the step its policy takes
//! after the checks: the Service's ports pushed where a pair's server lacks them, and every
//! slot's running server checked end to end, whatever the policy.

use tracing::warn;

use super::super::act;
use super::super::plan::policy::Policy;
use super::slot::Slot;
use super::{Desired, Keys, Pass};
use crate::error::Result;

impl Pass<'_> {
    /// Pushes the Service's ports to running hosts that lack them; a host that cannot take the
    /// push was deleted. Whether every host now has them.
    pub(super) async fn reconfigure_pair(&mut self, want: &Desired, keys: &Keys, slots: &mut [Slot]) -> Result<bool> {
        if keys.configured == want.ports {
            return Ok(true);
        }
        let mut all = true;
        for slot in slots.iter_mut() {
            let Some(id) = slot.running_ip().and(slot.id()).map(str::to_string) else { continue };
            let push = (id.as_str(), &keys.server, want.ports.as_slice());
            match act::host::reconfigure(self.tunnel, want.provider.as_ref(), push, &[], self.ctx).await {
                Ok(true) => {}
                Ok(false) => {
                    slot.host = None;
                    all = false;
                }
                // A push that fails for now must not end the pass before the checks and the
                // failover, which do not depend on it: the ports are recorded only once every
                // server took them, so the next pass (one probe interval on) pushes again.
                Err(e) if !e.is_permanent() => {
                    warn!(host = %id, error = %e, "pushing the Service's ports failed; pushing again next pass");
                    all = false;
                }
                Err(e) => return Err(e),
            }
        }
        Ok(all)
    }

    /// Checks every slot's running server end to end at the address `at` gives, all at once, each
    /// within its policy's [`Policy::probe_timeout`] (a hung server of a pair fails its check at
    /// the next interval, not after the single server's 3 s), and records each streak in the one
    /// health tracker.
    pub(super) async fn check_slots(
        &self,
        keys: &Keys,
        slots: &mut [Slot],
        policy: Policy,
        at: impl Fn(&Slot) -> Option<&str>,
    ) {
        let (ctx, token) = (self.ctx, keys.credentials.token.as_str());
        let timeout = policy.probe_timeout(ctx.settings.failover_probe_interval);
        let targets: Vec<Option<(&str, &str)>> = slots.iter().map(|s| Some((at(s)?, s.id()?))).collect();
        let checks = targets.into_iter().map(|target| async move {
            let (ip, id) = target?;
            let result = ctx.probe.check(ip, ctx.settings.health_port, token, timeout).await;
            let error = result.as_ref().err().cloned().unwrap_or_default();
            Some((ctx.health.record(id, result.is_ok()), error))
        });
        let results = futures::future::join_all(checks).await;
        for (slot, check) in slots.iter_mut().zip(results) {
            slot.check = check;
        }
    }
}
