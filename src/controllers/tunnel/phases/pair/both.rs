//! A highly available Tunnel in mode `BothAddresses`: two exit servers, each on its own address,
//! both in the Service's ingress while their end-to-end checks pass. For providers that cannot
//! move an address between running servers (and for anyone who prefers two addresses to one
//! that moves): nothing is reserved or moved; a server whose check fails leaves the ingress at
//! once, and is replaced once it has failed for `--tunnel-replace-after` while the other passes
//! (if a new server can help: [`Pass::replace_failing`]).

use kube::runtime::controller::Action;
use providers::HostState;

use super::super::super::placement::SLOTS;
use super::super::super::status::not_ready;
use super::super::super::{act, desired, observe};
use super::super::{Desired, Failure, Keys, Pass};
use super::{PairRecord, Slot};
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::tunnel::{HighAvailabilityStatus, ServerStatus};
use crate::reasons::Reason;

impl Pass<'_> {
    pub(super) async fn both(&mut self, want: &Desired, keys: &Keys) -> Result<Action, Failure> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, want.provider.clone());
        let found = observe::find_pair(provider.as_ref(), self.status(), &want.uid).await?;
        act::host::delete_extras(provider.as_ref(), &found.extras, None, ctx).await?;
        let recorded = self.status().high_availability.clone().unwrap_or_default();
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
        let ports_current = self.reconfigure_pair(want, keys, &mut slots).await?;
        self.check_pair(keys, &mut slots, false).await;

        // A stopped server goes at once; a failing one while the other carries the traffic, once
        // it is due ([`Slot::replace_after`]) and a new server can help (both failing points at
        // the clients, not the servers, as with a single exit server). Its slot is filled next
        // pass, on a new address.
        let (replace_after, max) = (ctx.settings.replace_after, ctx.settings.max_replacements);
        let other_passes = [slots[1].passing(), slots[0].passing()];
        for (i, slot) in slots.iter_mut().enumerate() {
            let Some(id) = slot.id().map(str::to_string) else { continue };
            if slot.host.as_ref().is_some_and(|h| h.state == HostState::Stopped) {
                let why = format!("exit server {id} (slot {}) is no longer running", slot.slot);
                act::host::replace_lost(tunnel, provider.as_ref(), (&id, &why), None, ctx).await?;
                ctx.health.forget(&id);
                slot.host = None;
                continue;
            }
            let due = slot.replace_after(replace_after, max).zip(slot.check.as_ref());
            match due.is_some_and(|(after, (h, _))| !h.passing() && h.failing_for >= after) {
                true if other_passes[i] => _ = self.replace_failing(want, slot, false).await?,
                _ if other_passes[i] => self.spent(slot),
                _ => {}
            }
        }

        let clients = self.pair_clients(want, keys, &slots, &mut None, true).await?;
        let restarted = &clients.restarted;
        // A server whose client is being restarted leaves the ingress first, like a failing one.
        let published: Vec<&Slot> =
            slots.iter().enumerate().filter(|(i, s)| s.passing() && !restarted.contains(i)).map(|(_, s)| s).collect();
        // An Event for each address that leaves the Service, with the reason.
        for was in recorded.servers.iter().filter(|r| r.healthy) {
            if published.iter().any(|p| p.id().is_some() && p.id() == was.host_id.as_deref()) {
                continue;
            }
            let now = slots.iter().enumerate().find(|(_, s)| s.id().is_some() && s.id() == was.host_id.as_deref());
            let why = match now {
                Some((_, s)) if s.check.as_ref().is_some_and(|(_, e)| !e.is_empty()) => {
                    s.check.as_ref().map(|(_, e)| e.clone()).unwrap_or_default()
                }
                Some((i, _)) if restarted.contains(&i) => "its client is being restarted".into(),
                _ => "it is no longer running".into(),
            };
            let note = format!(
                "exit server {} ({}) left the Service's addresses: {why}",
                was.host_id.as_deref().unwrap_or_default(),
                was.host_ip.as_deref().unwrap_or_default(),
            );
            ctx.publish(tunnel, Reason::AddressWithdrawn, note).await;
        }
        let ready = !published.is_empty();
        let was_active = self.status().observed_generation.is_some() || ready;
        let at = (
            tunnel.metadata.namespace.as_deref().unwrap_or_default(),
            tunnel.metadata.name.as_deref().unwrap_or_default(),
        );
        ctx.unserved.record(&want.uid, at, was_active.then_some(ready));
        let failing_for = slots.iter().filter_map(|s| s.check.as_ref()).map(|(h, _)| h.failing_for).min();
        let withdraw = !ready && failing_for.is_none_or(|f| f >= ctx.settings.withdraw_after);
        if let Some(service) = want.publishes() {
            let ips: Vec<&str> = published.iter().filter_map(|s| s.own_ip.as_deref()).collect();
            if ready {
                act::set_ingress(service, Some(desired::ingress_all(&ips, &want.ports)), ctx).await?;
            } else if withdraw {
                act::set_ingress(service, None, ctx).await?;
            }
        }

        let servers: Vec<ServerStatus> = slots.iter().map(Slot::status).collect();
        let condition = if ready {
            let list: Vec<String> = published
                .iter()
                .map(|s| {
                    format!("{} on exit server {}", s.own_ip.as_deref().unwrap_or_default(), s.id().unwrap_or_default())
                })
                .collect();
            Condition::new(
                "Ready",
                ConditionStatus::True,
                Reason::Active.as_str(),
                format!(
                    "{} forward {} to Service {}, each having passed its health check{}{}",
                    list.join(" and "),
                    super::super::super::status::describe(&want.ports),
                    tunnel.spec.service_ref.name,
                    if published.len() < 2 { "; the other exit server is not serving" } else { "" },
                    clients.waiting.map(|w| format!("; client roll: {w}")).unwrap_or_default(),
                ),
            )
        } else {
            let why = slots.iter().filter_map(|s| s.check.as_ref().map(|(_, e)| e.clone())).find(|e| !e.is_empty());
            let why = why.unwrap_or_else(|| "waiting for an exit server of the pair to carry traffic".into());
            not_ready(Reason::WaitingForTunnel, &why).remove(0)
        };
        let host = published.first().map(|s| (s.id().map(str::to_string), s.own_ip.clone())).unwrap_or_default();
        let spread = Some(super::spread(provider.spread_in(tunnel.spec.region.as_deref()), &slots));
        let ha = HighAvailabilityStatus { active: None, servers, limitation: None, spread, ..recorded };
        self.record_pair(want, keys, PairRecord { host, ports_current, ha, ready, condition }).await
    }
}
