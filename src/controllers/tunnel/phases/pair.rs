//! The spine of a highly available Tunnel (`spec.highAvailability`): two exit servers, one per
//! slot ([`SLOTS`]), each with its own client Deployment, and the reserved address on the one
//! whose tunnel works.
//!
//! Each pass: the provider must move addresses between running hosts; the address and the
//! servers are observed (or taken from the last read while the pair is quiet); [`fill`] plans
//! each slot (keep, replace, create, or wait), which is acted on; every running server takes the
//! Service's ports and is checked end to end; [`failover_step`] decides where the address goes
//! (a stopped holder loses it at once, a failing one after the hysteresis, never to a server
//! whose own check fails), which is acted on; stopped hosts are replaced after that and the slot
//! that lost the holder is filled; the clients are written and rolled one at a time ([`roll`]);
//! the Service and status record the outcome. A pass is due every
//! `--tunnel-failover-probe-interval`.
//!
//! [`roll`]: super::super::plan::failover::roll

use std::time::Duration;

use kube::runtime::controller::Action;
use providers::{Address, AddressBinding, Host, HostState};

use super::super::placement::SLOTS;
use super::super::plan::Blocked;
use super::super::plan::failover::{FailoverStep, failover_step};
use super::super::plan::fill::{After, Fill, FillPlan, Found, fill};
use super::super::plan::policy::Policy;
use super::super::status::not_ready;
use super::super::{act, desired, observe};
use super::{Desired, Failure, Keys, Pass};
use crate::controllers::jittered;
use crate::crd::condition::Condition;
use crate::crd::tunnel::{HighAvailabilityStatus, ServerStatus, TunnelPhase};
use crate::error::Result;
use crate::reasons::Reason;

mod both;
mod clients;
mod failover;
mod ready;
mod standby;

use super::slot::Slot;
use ready::{checked_at, ready_condition, spread};

/// What a pass writes into status, after its writes to the cloud and the cluster.
struct PairRecord {
    /// `status.hostId` and `status.hostIp`.
    host: (Option<String>, Option<String>),
    /// Whether every host took the Service's ports (then they and the credentials are recorded).
    ports_current: bool,
    ha: HighAvailabilityStatus,
    ready: bool,
    condition: Condition,
}

impl Pass<'_> {
    /// The phases after the credentials, for the pair of
    /// [`Policy::ActiveStandby`](super::super::plan::policy::Policy).
    pub(super) async fn pair(&mut self, want: &Desired, keys: &Keys) -> Result<Action, Failure> {
        self.may_move(want).await?;
        let caps = want.provider.capabilities();
        let (mut address, found, fresh) = self.observe_pair(want).await?;
        let recorded = self.status().high_availability.clone().unwrap_or_default();
        let plan = fill(&Found {
            hosts: [0, 1].map(|i| found.hosts[i].as_ref()),
            reserved_ip: address.as_ref().map(|a| a.ip.as_str()),
            reserved_on: address.as_ref().and_then(|a| a.host_id.as_deref()),
            recorded_active: recorded.active.as_deref(),
            moved_address: caps.moved_address,
            reserves_with_host: caps.address_binding == AddressBinding::WithHost,
        });
        let mut slots = self.fill_slots(want, keys, (&plan, found.hosts), address.as_ref(), &recorded).await?;
        let ports_current = self.reconfigure_pair(want, keys, &mut slots).await?;
        // Where each server is checked ([`Slot::check_ip`]).
        let beside = caps.moves_to_secondary_ip();
        self.check_slots(keys, &mut slots, Policy::ActiveStandby, |s| s.check_ip(beside)).await;
        let step = failover_step(&self.servers(&slots), plan.holder.as_deref(), &self.hysteresis());
        let steady = step == FailoverStep::Keep { degraded: None } && slots.iter().all(Slot::passing) && ports_current;
        let moved = self.apply_failover(want, (&mut address, &mut slots), step, &recorded, beside).await?;
        self.after_failover(want, keys, &mut slots, (&plan, address.as_ref())).await?;
        let clients = self.pair_clients(want, keys, &slots, &mut address, false).await?;

        let active = address.as_ref().and_then(|a| a.host_id.clone());
        match (steady && active == plan.holder, fresh) {
            (true, true) => {
                let hosts = [slots[0].host.clone(), slots[1].host.clone()];
                self.ctx.pair_views.keep(&want.uid, address.clone(), observe::FoundPair { hosts, extras: Vec::new() });
            }
            (true, false) => {}
            (false, _) => self.ctx.pair_views.forget(&want.uid),
        }
        let ready = self.publish_pair(want, address.as_ref(), &slots, active.as_deref()).await?;
        let condition = match (&address, ready) {
            (Some(a), true) => {
                let active_slot = slots.iter().find(|s| s.id().is_some() && s.id() == active.as_deref());
                let checked = checked_at(active_slot.and_then(|s| s.check_ip(beside)), &a.ip);
                let waiting = clients.waiting.map(|w| format!("; client roll: {w}")).unwrap_or_default();
                let at = (self.tunnel.spec.service_name().unwrap_or_default(), want.ports.as_slice());
                ready_condition(at, (a, active.as_deref()), &slots, (checked, waiting))
            }
            _ => {
                let why =
                    moved.degraded.unwrap_or_else(|| "waiting for an exit server of the pair to carry traffic".into());
                not_ready(Reason::WaitingForTunnel, &why).remove(0)
            }
        };
        let host_ip = address.as_ref().filter(|_| active.is_some()).map(|a| a.ip.clone());
        let ha = HighAvailabilityStatus {
            active: active.clone(),
            servers: slots.iter().map(Slot::status).collect(),
            failovers: moved.failovers,
            last_failover: moved.last_failover,
            limitation: None,
            spread: Some(spread(want.provider.spread_in(self.tunnel.spec.region.as_deref()), &slots)),
        };
        self.record_pair(want, keys, PairRecord { host: (active, host_ip), ports_current, ha, ready, condition }).await
    }

    /// The provider must move addresses between running hosts; else the Tunnel is blocked, and
    /// status says why.
    async fn may_move(&mut self, want: &Desired) -> Result<(), Failure> {
        let provider = want.provider.as_ref();
        let Err(why) = provider.capabilities().may_move_addresses(provider.name()) else { return Ok(()) };
        let limitation = why.clone();
        self.record(|s| s.high_availability.get_or_insert_default().limitation = Some(limitation)).await?;
        let message = format!(
            "{why}; highAvailability is not available at {}, so no exit server was created: create a Tunnel without it, at another provider, or with highAvailability.mode: BothAddresses (both servers' own addresses on the Service)",
            provider.name()
        );
        Err(Failure::Blocked(Blocked(TunnelPhase::Failed, Reason::HighAvailabilityUnavailable, message)))
    }

    /// The reserved address and the pair's servers, and whether they were read now. A quiet
    /// pair's last read stands until its resync ([`observe::PairViews`]): a server that stops
    /// fails its check, and the pass after that reads the provider again.
    async fn observe_pair(&mut self, want: &Desired) -> Result<(Option<Address>, observe::FoundPair, bool)> {
        let (ctx, provider) = (self.ctx, want.provider.as_ref());
        let cached = ctx.pair_views.recent(&want.uid, ctx.settings.resync);
        if let Some((address, found)) = cached.filter(|_| !provider.capabilities().reads_are_free) {
            return Ok((address, found, false));
        }
        let address = self.prepare_address(want).await?;
        let found = observe::find_pair(provider, self.status(), &want.uid).await?;
        act::host::delete_extras(provider, &found.extras, &[], ctx).await?;
        Ok((address, found, true))
    }

    /// Each slot as [`fill`] planned it: its server kept, or replaced, or created now; or empty.
    async fn fill_slots(
        &mut self,
        want: &Desired,
        keys: &Keys,
        (plan, hosts): (&FillPlan, [Option<Host>; 2]),
        address: Option<&Address>,
        recorded: &HighAvailabilityStatus,
    ) -> Result<Vec<Slot>> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, want.provider.clone());
        let reserved_ip = address.map(|a| a.ip.as_str());
        let mut slots = Vec::new();
        for ((slot, host), step) in SLOTS.into_iter().zip(hosts).zip(&plan.slots) {
            let host = match (step, host) {
                (Fill::Keep, Some(host)) => host,
                (Fill::Replace(why), Some(host)) => {
                    act::host::replace_lost(tunnel, provider.as_ref(), (&host.id, why), &[], ctx).await?;
                    ctx.health.forget(&host.id);
                    self.create_slot(want, keys, (slot, address)).await?
                }
                (Fill::Create, _) => self.create_slot(want, keys, (slot, address)).await?,
                _ => {
                    slots.push(Slot::new(slot, None, None, &recorded.servers));
                    continue;
                }
            };
            let kept = recorded.servers.iter().find(|s| s.slot == slot && s.host_id.as_deref() == Some(&host.id));
            let own_ip = kept.and_then(|s| s.host_ip.clone()).or_else(|| first_own_ip(&host, reserved_ip));
            slots.push(Slot::new(slot, Some(host), own_ip, &recorded.servers));
        }
        Ok(slots)
    }

    /// After the failover step, as [`FillPlan::after_failover_steps`] plans it: a failing server
    /// whose slot spent its replacements says why it is kept; stopped hosts go (the address is off
    /// them now; their slots are filled next pass); the slot that lost the holder is filled.
    async fn after_failover(
        &mut self,
        want: &Desired,
        keys: &Keys,
        slots: &mut [Slot],
        (plan, address): (&FillPlan, Option<&Address>),
    ) -> Result<()> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, want.provider.clone());
        let standing = [0, 1].map(|i| slots.get(i).map(Slot::standing).unwrap_or_default());
        let steps = plan.after_failover_steps(standing, ctx.settings.max_replacements);
        let reserved_ip = address.map(|a| a.ip.as_str());
        for (slot, step) in slots.iter_mut().zip(steps) {
            match step {
                After::Keep => {}
                After::Spent => self.spent(slot),
                After::Gone(why) => {
                    let id = slot.id().unwrap_or_default().to_string();
                    act::host::replace_lost(tunnel, provider.as_ref(), (&id, &why), &[], ctx).await?;
                    ctx.health.forget(&id);
                    slot.host = None;
                }
                After::Create => {
                    let Some(name) = slot.slot else { continue };
                    let host = self.create_slot(want, keys, (name, address)).await?;
                    slot.own_ip = first_own_ip(&host, reserved_ip);
                    slot.host = Some(host);
                }
            }
        }
        Ok(())
    }

    /// Puts the address on the Service while the holder passes, takes it off once the holder
    /// failed for `--tunnel-withdraw-after`, and counts unserved time. Whether the pair is Ready.
    async fn publish_pair(
        &self,
        want: &Desired,
        address: Option<&Address>,
        slots: &[Slot],
        active: Option<&str>,
    ) -> Result<bool> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let active_slot = slots.iter().find(|s| s.id().is_some() && s.id() == active);
        let active_check = active_slot.and_then(|s| s.check.as_ref());
        let ready = active_check.is_some_and(|(h, _)| h.passing());
        let was_active = self.status().observed_generation.is_some() || ready;
        let at = (
            tunnel.metadata.namespace.as_deref().unwrap_or_default(),
            tunnel.metadata.name.as_deref().unwrap_or_default(),
        );
        ctx.unserved.record(&want.uid, at, was_active.then_some(ready));
        let withdraw = !ready && active_check.is_none_or(|(h, _)| h.failing_for >= ctx.settings.withdraw_after);
        if let Some(service) = want.publishes() {
            match (address, ready) {
                (Some(a), true) => act::set_ingress(service, Some(desired::ingress(&a.ip, &want.ports)), ctx).await?,
                _ if withdraw => act::set_ingress(service, None, ctx).await?,
                _ => {}
            }
        }
        Ok(ready)
    }

    /// Writes a pass's outcome into status; the next pass is due at the probe interval.
    async fn record_pair(&mut self, want: &Desired, keys: &Keys, r: PairRecord) -> Result<Action, Failure> {
        let (provider_name, digest, ports) =
            (want.provider.name().to_string(), keys.digest.clone(), want.ports.clone());
        let generation = self.tunnel.metadata.generation;
        self.record(|s| {
            s.provider = Some(provider_name);
            (s.host_id, s.host_ip) = r.host;
            if r.ports_current {
                s.ports = ports;
                s.credentials_digest = Some(digest);
            }
            s.high_availability = Some(r.ha);
            s.phase = Some(if r.ready { TunnelPhase::Active } else { TunnelPhase::Provisioning });
            if r.ready {
                s.observed_generation = generation;
            }
            s.conditions = vec![r.condition];
        })
        .await?;
        let interval = self.ctx.settings.failover_probe_interval.max(Duration::from_millis(100));
        Ok(Action::requeue(jittered(interval)))
    }

    /// Creates slot `slot`'s exit server (where reserved address `address` can reach it) and
    /// records it at once.
    async fn create_slot(
        &mut self,
        want: &Desired,
        keys: &Keys,
        (slot, address): (&'static str, Option<&Address>),
    ) -> Result<Host> {
        let provider = want.provider.as_ref();
        self.charge_host(Some(slot)).await?;
        let created = act::host::create(self.tunnel, provider, &keys.server, (address, Some(slot)), self.ctx).await?;
        let (id, name) = (created.id.clone(), provider.name().to_string());
        self.record(|s| {
            s.provider = Some(name);
            let ha = s.high_availability.get_or_insert_default();
            // The slot's replacements in a row go on until one of its servers passes.
            let replacements = ha.servers.iter().find(|server| server.slot == slot).and_then(|s| s.replacements);
            ha.servers.retain(|server| server.slot != slot);
            let host_id = Some(id);
            ha.servers.push(ServerStatus { slot: slot.to_string(), host_id, replacements, ..Default::default() });
            ha.servers.sort_by(|a, b| a.slot.cmp(&b.slot));
        })
        .await?;
        let note = format!("created exit server {} (slot {slot}) at {}", created.id, provider.name());
        self.ctx.publish(self.tunnel, Reason::Provisioning, note).await;
        Ok(created)
    }
}

/// A host's own address as first seen: a host seen first while it holds the reserved address
/// (status lost) does not show its own; its client waits until it is replaced.
fn first_own_ip(host: &Host, reserved: Option<&str>) -> Option<String> {
    host.public_ipv4.clone().filter(|ip| host.state == HostState::Running && Some(ip.as_str()) != reserved)
}
