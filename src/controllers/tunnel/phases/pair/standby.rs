//! A server of a highly available Tunnel's pair that keeps failing while the other serves is
//! replaced the way a single exit server is ([`replace::unhealthy`]): only when a new VM can
//! cure the failure, each replacement of its slot waiting twice as long as the one before, and
//! at most `--tunnel-max-replacements` in a row. A standby whose client Pod cannot start (an
//! image that cannot be pulled) would otherwise buy a new VM every `--tunnel-replace-after`.
//!
//! [`replace::unhealthy`]: super::super::super::plan::replace::unhealthy

use super::super::super::act;
use super::super::super::plan::replace::Unhealthy;
use super::super::console;
use super::super::{Desired, Pass};
use super::Slot;
use crate::error::Result;

impl Pass<'_> {
    /// A server's own address `ip` off every Service that shows it, before the server goes: a
    /// `BothAddresses` pair's Services show each server's own address (an ActiveStandby pair's
    /// the reserved one, which does not go with a server: there, nothing is written).
    pub(super) async fn withdraw_own(&self, want: &Desired, ip: Option<&str>) -> Result<()> {
        let Some(ip) = ip else { return Ok(()) };
        for service in want.showing() {
            act::withdraw(service, ip, self.ctx).await?;
        }
        Ok(())
    }

    /// Replaces `slot`'s failing server if a new one can help, else records in the slot why it
    /// is kept (with a Warning Event once per `--tunnel-resync`). Whether it was replaced.
    pub(super) async fn replace_failing(&mut self, want: &Desired, slot: &mut Slot, beside: bool) -> Result<bool> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, want.provider.as_ref());
        let Some(id) = slot.id().map(str::to_string) else { return Ok(false) };
        if let Some(kept) = ctx.health.kept(&id, ctx.settings.resync) {
            slot.kept = Some(kept);
            return Ok(false);
        }
        let Some(failing) = slot.check_ip(beside).and_then(|ip| slot.failing(ip)) else { return Ok(false) };
        let at = slot.client_at(&want.at);
        let available = act::client_available(&at, ctx).await?;
        match console::judge(failing, available, &at, provider, ctx).await.1 {
            Unhealthy::Report { reason, message } => {
                let note = format!("{} is kept: {message}", slot.server());
                ctx.publish(tunnel, reason, note).await;
                ctx.health.keep(&id, message.clone());
                slot.kept = Some(message);
                Ok(false)
            }
            Unhealthy::Replace { why, count, .. } => {
                let why = format!("{}: {why}", slot.server());
                self.withdraw_own(want, slot.own_ip.as_deref()).await?;
                act::host::replace_lost(tunnel, provider, (&id, &why), &[], ctx).await?;
                ctx.health.forget(&id);
                slot.host = None;
                slot.replaced = count;
                Ok(true)
            }
        }
    }

    /// Records, for a failing server whose slot has spent its replacements
    /// ([`After::Spent`](super::super::super::plan::fill::After::Spent)), why it is kept, unless
    /// this pass already said why.
    pub(super) fn spent(&self, slot: &mut Slot) {
        let max = self.ctx.settings.max_replacements;
        if slot.kept.is_none() {
            slot.kept = Some(format!(
                "skyport stopped replacing the exit server of slot {} after {} replacement(s) (--tunnel-max-replacements {max}); fix the cause, then delete the server (or the Tunnel) to try again",
                slot.slot.unwrap_or_default(),
                slot.replaced
            ));
        }
    }
}
