//! A server of a highly available Tunnel's pair that keeps failing while the other serves is
//! replaced the way a single exit server is ([`replace::unhealthy`]): only when a new VM can
//! cure the failure, each replacement of its slot waiting twice as long as the one before, and
//! at most `--tunnel-max-replacements` in a row. A standby whose client Pod cannot start (an
//! image that cannot be pulled) would otherwise buy a new VM every `--tunnel-replace-after`.

use super::super::super::act;
use super::super::super::plan::replace::Unhealthy;
use super::super::console;
use super::super::{Desired, Pass};
use super::Slot;
use crate::error::Result;

impl Pass<'_> {
    /// Replaces `slot`'s failing server if a new one can help, else records in the slot why it
    /// is kept (with a Warning Event once per `--tunnel-resync`). Whether it was replaced.
    pub(super) async fn replace_failing(&mut self, want: &Desired, slot: &mut Slot, beside: bool) -> Result<bool> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, want.provider.as_ref());
        let (Some(id), Some((health, error))) = (slot.id().map(str::to_string), slot.check.clone()) else {
            return Ok(false);
        };
        if let Some(kept) = ctx.health.kept(&id, ctx.settings.resync) {
            slot.kept = Some(kept);
            return Ok(false);
        }
        let Some(ip) = slot.check_ip(beside) else { return Ok(false) };
        let at = want.at.for_slot(slot.slot);
        let available = act::client_available(&at, ctx).await?;
        let failing = console::Failing {
            host: (Some(&id), ip),
            error: &error,
            failing_for: health.failing_for,
            replaced: slot.replaced,
        };
        match console::judge(failing, available, &at, provider, ctx).await.1 {
            Unhealthy::Report { reason, message } => {
                let note = format!("exit server {id} (slot {}) is kept: {message}", slot.slot);
                ctx.publish(tunnel, reason, note).await;
                ctx.health.keep(&id, message.clone());
                slot.kept = Some(message);
                Ok(false)
            }
            Unhealthy::Replace { why, count, .. } => {
                let why = format!("exit server {id} (slot {}): {why}", slot.slot);
                act::host::replace_lost(tunnel, provider, (&id, &why), None, ctx).await?;
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
                slot.slot, slot.replaced
            ));
        }
    }
}
