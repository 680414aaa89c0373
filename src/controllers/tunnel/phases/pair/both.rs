//! A highly available Tunnel in mode `BothAddresses`: two exit servers, each on its own address,
//! both in the Service's ingress while their end-to-end checks pass. For providers that cannot
//! move an address between running servers (and for anyone who prefers two addresses to one
//! that moves): nothing is reserved or moved; a server whose check fails leaves the ingress at
//! once, and is replaced once it has failed for `--tunnel-replace-after` while the other passes
//! (if a new server can help: [`Pass::replace_failing`]). [`both::steps`] and [`both::publish`]
//! decide; this file acts on them and records the outcome.

use kube::runtime::controller::Action;
use providers::HostState;

use super::super::super::placement::SLOTS;
use super::super::super::plan::both::{self, Step};
use super::super::super::plan::policy::Policy;
use super::super::super::status::{describe, not_ready};
use super::super::super::{act, desired, observe};
use super::super::{Desired, Failure, Keys, Pass};
use super::{PairRecord, Slot};
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::tunnel::{HighAvailabilityStatus, ServerStatus, Tunnel};
use crate::reasons::Reason;

impl Pass<'_> {
    pub(in super::super) async fn both(&mut self, want: &Desired, keys: &Keys) -> Result<Action, Failure> {
        let recorded = self.status().high_availability.clone().unwrap_or_default();
        let mut slots = self.fill_both(want, keys, &recorded).await?;
        let ports_current = self.reconfigure_pair(want, keys, &mut slots).await?;
        self.check_slots(keys, &mut slots, Policy::BothAddresses, |s| s.check_ip(false)).await;
        self.after_both_checks(want, &mut slots).await?;
        let clients = self.pair_clients(want, keys, &slots, &mut None, true).await?;
        let (published, ready) = self.publish_both(want, &slots, &clients.restarted, &recorded).await?;
        let published: Vec<&Slot> = published.iter().map(|i| &slots[*i]).collect();
        let condition = match ready {
            true => both_ready(self.tunnel, want, &published, clients.waiting),
            false => {
                let why = slots.iter().filter_map(|s| s.check.as_ref().map(|(_, e)| e.clone())).find(|e| !e.is_empty());
                let why = why.unwrap_or_else(|| "waiting for an exit server of the pair to carry traffic".into());
                not_ready(Reason::WaitingForTunnel, &why).remove(0)
            }
        };
        let host = published.first().map(|s| (s.id().map(str::to_string), s.own_ip.clone())).unwrap_or_default();
        let servers: Vec<ServerStatus> = slots.iter().map(Slot::status).collect();
        let spread = Some(super::spread(want.provider.spread_in(self.tunnel.spec.region.as_deref()), &slots));
        let ha = HighAvailabilityStatus { active: None, servers, limitation: None, spread, ..recorded };
        self.record_pair(want, keys, PairRecord { host, ports_current, ha, ready, condition }).await
    }

    /// Each slot's server as found, or created now where the slot is empty, on its own address.
    async fn fill_both(
        &mut self,
        want: &Desired,
        keys: &Keys,
        recorded: &HighAvailabilityStatus,
    ) -> Result<Vec<Slot>, Failure> {
        let (ctx, provider) = (self.ctx, want.provider.clone());
        let found = observe::find_pair(provider.as_ref(), self.status(), &want.uid).await?;
        for extra in &found.extras {
            self.withdraw_own(want, extra.public_ipv4.as_deref()).await?;
        }
        act::host::delete_extras(provider.as_ref(), &found.extras, &[], ctx).await?;
        let mut slots = Vec::new();
        for (slot, host) in SLOTS.into_iter().zip(found.hosts) {
            let host = match host {
                Some(host) => host,
                None => self.create_slot(want, keys, (slot, None)).await?,
            };
            let kept = recorded.servers.iter().find(|s| s.slot == slot && s.host_id.as_deref() == Some(&host.id));
            let own_ip = kept
                .and_then(|s| s.host_ip.clone())
                .or_else(|| host.public_ipv4.clone().filter(|_| host.state == HostState::Running));
            slots.push(Slot::new(slot, Some(host), own_ip, &recorded.servers));
        }
        Ok(slots)
    }

    /// A stopped server goes at once; a failing one while the other carries the traffic, once it
    /// is due and a new server can help ([`both::steps`]). Its slot is filled next pass, on a new
    /// address.
    async fn after_both_checks(&mut self, want: &Desired, slots: &mut [Slot]) -> Result<(), Failure> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, want.provider.clone());
        let (replace_after, max) = (ctx.settings.replace_after, ctx.settings.max_replacements);
        let steps = both::steps([0, 1].map(|i| slots[i].checked(replace_after, max)));
        for (slot, step) in slots.iter_mut().zip(steps) {
            match step {
                Step::Keep => {}
                Step::Gone(why) => {
                    let id = slot.id().unwrap_or_default().to_string();
                    self.withdraw_own(want, slot.own_ip.as_deref()).await?;
                    act::host::replace_lost(tunnel, provider.as_ref(), (&id, &why), &[], ctx).await?;
                    ctx.health.forget(&id);
                    slot.host = None;
                }
                Step::ReplaceFailing => _ = self.replace_failing(want, slot, false).await?,
                Step::Spent => self.spent(slot),
            }
        }
        Ok(())
    }

    /// Carries on the Service the servers [`both::publish`] picks, with an Event for each address
    /// that leaves it, and counts unserved time. Which slots are carried, and whether any is.
    async fn publish_both(
        &self,
        want: &Desired,
        slots: &[Slot],
        restarted: &[usize],
        recorded: &HighAvailabilityStatus,
    ) -> Result<(Vec<usize>, bool), Failure> {
        let (tunnel, ctx, settings) = (self.tunnel, self.ctx, &self.ctx.settings);
        let checked = [0, 1].map(|i| slots[i].checked(settings.replace_after, settings.max_replacements));
        let carried = both::publish(checked, restarted, &recorded.servers, settings.withdraw_after);
        for gone in &carried.withdrawn {
            let note = format!("exit server {} ({}) left the Service's addresses: {}", gone.host_id, gone.ip, gone.why);
            ctx.publish(tunnel, Reason::AddressWithdrawn, note).await;
        }
        let ready = carried.ready;
        let was_active = self.status().observed_generation.is_some() || ready;
        let at = (
            tunnel.metadata.namespace.as_deref().unwrap_or_default(),
            tunnel.metadata.name.as_deref().unwrap_or_default(),
        );
        ctx.unserved.record(&want.uid, at, was_active.then_some(ready));
        if let Some(service) = want.publishes() {
            let ips: Vec<&str> = carried.slots.iter().filter_map(|i| slots[*i].own_ip.as_deref()).collect();
            if ready {
                act::set_ingress(service, Some(desired::ingress_all(&ips, &want.ports)), ctx).await?;
            } else if carried.withdraw {
                act::set_ingress(service, None, ctx).await?;
            }
        }
        Ok((carried.slots, ready))
    }
}

/// The Ready condition of a pair whose `published` servers carry the Service's addresses;
/// `waiting` says what a client roll waits for, if anything.
fn both_ready(tunnel: &Tunnel, want: &Desired, published: &[&Slot], waiting: Option<String>) -> Condition {
    let list: Vec<String> = published
        .iter()
        .map(|s| format!("{} on exit server {}", s.own_ip.as_deref().unwrap_or_default(), s.id().unwrap_or_default()))
        .collect();
    let message = format!(
        "{} forward {} to Service {}, each having passed its health check{}{}",
        list.join(" and "),
        describe(&want.ports),
        tunnel.spec.service_name().unwrap_or_default(),
        if published.len() < 2 { "; the other exit server is not serving" } else { "" },
        waiting.map(|w| format!("; client roll: {w}")).unwrap_or_default(),
    );
    Condition::new("Ready", ConditionStatus::True, Reason::Active.as_str(), message)
}
