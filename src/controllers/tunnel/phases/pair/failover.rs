//! A pass's failover step acted on ([`failover_step`] decides it): the reserved address put on
//! a server or moved off a failing holder (with Events, the metric and status recorded at once),
//! or a standby that keeps failing replaced.
//!
//! [`failover_step`]: super::super::super::plan::failover::failover_step

use providers::Address;

use super::super::super::act;
use super::super::super::plan::failover::{FailoverStep, Hysteresis, Server};
use super::super::{Desired, Pass};
use super::Slot;
use crate::crd::tunnel::{Failover, HighAvailabilityStatus};
use crate::error::Result;
use crate::reasons::Reason;

/// What the failover step left for status.
pub(super) struct Moved {
    /// Why no server could take the address over, when none could.
    pub(super) degraded: Option<String>,
    pub(super) failovers: Option<u32>,
    pub(super) last_failover: Option<Failover>,
}

impl Pass<'_> {
    /// The checked servers as [`failover_step`] reads them.
    ///
    /// [`failover_step`]: super::super::super::plan::failover::failover_step
    pub(super) fn servers<'s>(&self, slots: &'s [Slot]) -> Vec<Server<'s>> {
        let (replace_after, max) = (self.ctx.settings.replace_after, self.ctx.settings.max_replacements);
        slots
            .iter()
            .filter_map(|s| {
                let (health, error) = s.check.as_ref()?;
                Some(Server { id: s.id()?, health: *health, error, replace_after: s.replace_after(replace_after, max) })
            })
            .collect()
    }

    pub(super) fn hysteresis(&self) -> Hysteresis {
        Hysteresis { failures: self.ctx.settings.failover_failures, after: self.ctx.settings.failover_after }
    }

    /// Acts on `step`. A move is recorded in status at once: a later step of this pass may fail
    /// (creating a server).
    pub(super) async fn apply_failover(
        &mut self,
        want: &Desired,
        (address, slots): (&mut Option<Address>, &mut [Slot]),
        step: FailoverStep,
        recorded: &HighAvailabilityStatus,
        beside: bool,
    ) -> Result<Moved> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let mut moved =
            Moved { degraded: None, failovers: recorded.failovers, last_failover: recorded.last_failover.clone() };
        match step {
            FailoverStep::Keep { degraded } => moved.degraded = degraded,
            FailoverStep::Assign { to } => *address = Some(self.put_address(want, address.take(), &to).await?),
            FailoverStep::Move { from, to, reason } => {
                *address = Some(self.put_address(want, address.take(), &to).await?);
                let note = format!("moved the reserved address from exit server {from} to {to}: {reason}");
                ctx.publish(tunnel, Reason::Failover, note.clone()).await;
                if let Some(service) = &want.service {
                    ctx.publish_on(&kube::Resource::object_ref(&**service, &()), Reason::Failover, note).await;
                }
                let name = tunnel.metadata.name.as_deref().unwrap_or_default();
                ctx.failovers.add((tunnel.metadata.namespace.as_deref().unwrap_or_default(), name), 1.0);
                moved.failovers = Some(moved.failovers.unwrap_or(0) + 1);
                let time = k8s_openapi::jiff::Timestamp::now().to_string();
                moved.last_failover = Some(Failover { time, from, to: to.clone(), reason });
                let record = (Some(to), moved.failovers, moved.last_failover.clone());
                self.record(|s| {
                    let ha = s.high_availability.get_or_insert_default();
                    (ha.active, ha.failovers, ha.last_failover) = record;
                })
                .await?;
            }
            // Due for replacement ([`Server::replace_after`]), if a new server can help.
            FailoverStep::ReplaceStandby { id, .. } => {
                if let Some(slot) = slots.iter_mut().find(|s| s.id() == Some(id.as_str())) {
                    self.replace_failing(want, slot, beside).await?;
                }
            }
        }
        Ok(moved)
    }

    /// Puts the reserved address on running host `to`, reserving it there where the provider
    /// reserves only onto a host (DigitalOcean).
    pub(super) async fn put_address(&mut self, want: &Desired, address: Option<Address>, to: &str) -> Result<Address> {
        match address {
            Some(a) => {
                act::address::assign(self.tunnel, want.provider.as_ref(), &a, to, self.ctx).await?;
                Ok(Address { host_id: Some(to.to_string()), ..a })
            }
            None => self.reserve(want, Some(to.to_string())).await,
        }
    }
}
