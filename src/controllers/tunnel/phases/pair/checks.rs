//! A pass's writes to and reads of the pair's running servers before its failover step: the
//! Service's ports pushed where a server lacks them, and every running server checked end to end.

use tracing::warn;

use super::super::super::act;
use super::super::super::plan::failover::probe_timeout;
use super::super::{Desired, Keys, Pass};
use super::Slot;
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
            match act::host::reconfigure(self.tunnel, want.provider.as_ref(), push, None, self.ctx).await {
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

    /// Checks every running host end to end ([`Slot::check_ip`]), both at once, each within
    /// [`probe_timeout`]: a hung server fails its check at the next interval, not after the single
    /// server's 3 s.
    pub(super) async fn check_pair(&self, keys: &Keys, slots: &mut [Slot], beside: bool) {
        let (ctx, token) = (self.ctx, keys.credentials.token.as_str());
        let timeout = probe_timeout(ctx.settings.failover_probe_interval);
        let checks = slots.iter().map(|s| async move {
            match (s.check_ip(beside), s.id()) {
                (Some(ip), Some(id)) => {
                    let result = ctx.probe.check(ip, ctx.settings.health_port, token, timeout).await;
                    let error = result.as_ref().err().cloned().unwrap_or_default();
                    Some((ctx.health.record(id, result.is_ok()), error))
                }
                _ => None,
            }
        });
        let results = futures::future::join_all(checks).await;
        for (slot, check) in slots.iter_mut().zip(results) {
            slot.check = check;
        }
    }
}
