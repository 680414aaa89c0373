//! The spine of a highly available Tunnel (`spec.highAvailability`): two exit servers, one per
//! slot ([`SLOTS`]), each with its own client Deployment, and the reserved address on the one
//! whose tunnel works.
//!
//! Each pass: the provider must move addresses between running hosts; the address is found or
//! reserved; each slot's host is created, waited for or reconfigured; every running host is
//! checked end to end at its current address; [`failover_step`] decides where the address goes
//! (a stopped holder loses it at once, a failing one after the hysteresis, never to a server
//! whose own check fails); stopped hosts are replaced after that; the clients are written and
//! rolled one at a time ([`roll`]); status records both servers. A pass is due every
//! `--tunnel-failover-probe-interval`.

use std::time::Duration;

use kube::runtime::controller::Action;
use providers::{Address, AddressBinding, Host, HostState};
use tracing::warn;

use super::super::placement::SLOTS;
use super::super::plan::Blocked;
use super::super::plan::failover::{FailoverStep, Hysteresis, Server, failover_step, probe_timeout};
use super::super::status::not_ready;
use super::super::{act, desired, observe};
use super::{Desired, Failure, Keys, Pass};
use crate::controllers::jittered;
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::tunnel::{Failover, HighAvailabilityStatus, ServerStatus, TunnelPhase};
use crate::error::Result;
use crate::reasons::Reason;

mod both;
mod clients;
mod slot;
mod standby;

use slot::{Slot, checked_at, spread, standby_note};

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
    /// The phases after the credentials, for a highly available Tunnel.
    pub(super) async fn pair(&mut self, want: &Desired, keys: &Keys) -> Result<Action, Failure> {
        let (tunnel, ctx, provider) = (self.tunnel, self.ctx, want.provider.clone());
        if tunnel.spec.both_addresses() {
            return self.both(want, keys).await;
        }
        if let Err(why) = provider.capabilities().may_move_addresses(provider.name()) {
            let limitation = why.clone();
            self.record(|s| s.high_availability.get_or_insert_default().limitation = Some(limitation)).await?;
            let message = format!(
                "{why}; highAvailability is not available at {}, so no exit server was created: create a Tunnel without it, at another provider, or with highAvailability.mode: BothAddresses (both servers' own addresses on the Service)",
                provider.name()
            );
            return Err(Failure::Blocked(Blocked(TunnelPhase::Failed, Reason::HighAvailabilityUnavailable, message)));
        }
        // A quiet pair's last read stands until its resync ([`observe::PairViews`]): a server that
        // stops fails its check, and the pass after that reads the provider again.
        let cached =
            ctx.pair_views.recent(&want.uid, ctx.settings.resync).filter(|_| !provider.capabilities().reads_are_free);
        let fresh = cached.is_none();
        let (mut address, found) = match cached {
            Some(view) => view,
            None => {
                let address = self.prepare_address(want).await?;
                let found = observe::find_pair(provider.as_ref(), self.status(), &want.uid).await?;
                act::host::delete_extras(provider.as_ref(), &found.extras, None, ctx).await?;
                (address, found)
            }
        };
        let recorded = self.status().high_availability.clone().unwrap_or_default();
        let reserved_ip = address.as_ref().map(|a| a.ip.clone());
        let found_ids: Vec<&str> = found.hosts.iter().flatten().map(|h| h.id.as_str()).collect();
        // The host holding the address: as the provider says, else the one recorded active if it
        // is gone (a cloud unassigns a deleted host's address: EC2, DigitalOcean), whose loss is
        // a failover like any other.
        let holder = address
            .as_ref()
            .and_then(|a| a.host_id.clone())
            .or_else(|| recorded.active.clone().filter(|id| !found_ids.contains(&id.as_str())));
        // A slot that lost the holder is filled once the address moved on: creating a server
        // takes seconds (and may fail), the move one call.
        let holder_gone = holder.as_deref().is_some_and(|id| !found_ids.contains(&id));
        let mut deferred = Vec::new();
        let mut slots = Vec::new();
        // Where a reserved address exists only once it is on a first host (DigitalOcean), the
        // second host waits for it, to be made in its region: the address cannot move between
        // regions, and a provider left to pick may pick two.
        let wait_for_address = address.is_none() && provider.capabilities().address_binding == AddressBinding::WithHost;
        for (slot, host) in SLOTS.into_iter().zip(found.hosts) {
            let host = match host {
                Some(host) if !act::host::carries(provider.as_ref(), &host, reserved_ip.as_deref()) => {
                    // Made with an earlier reserved address on its interface (this one was
                    // reserved again after a release outside skyport): it cannot answer on it.
                    let why = format!(
                        "exit server {} (slot {slot}) does not carry the reserved address {} on its interface",
                        host.id,
                        reserved_ip.as_deref().unwrap_or_default()
                    );
                    act::host::replace_lost(tunnel, provider.as_ref(), (&host.id, &why), None, ctx).await?;
                    ctx.health.forget(&host.id);
                    self.create_slot(want, keys, (slot, address.as_ref())).await?
                }
                Some(host) => host,
                None if wait_for_address && slot != SLOTS[0] => {
                    slots.push(Slot::new(slot, None, None, &recorded.servers));
                    continue;
                }
                None if holder_gone => {
                    deferred.push(slot);
                    slots.push(Slot::new(slot, None, None, &recorded.servers));
                    continue;
                }
                None => self.create_slot(want, keys, (slot, address.as_ref())).await?,
            };
            let kept = recorded.servers.iter().find(|s| s.slot == slot && s.host_id.as_deref() == Some(&host.id));
            let own_ip = kept.and_then(|s| s.host_ip.clone()).or_else(|| first_own_ip(&host, reserved_ip.as_deref()));
            slots.push(Slot::new(slot, Some(host), own_ip, &recorded.servers));
        }
        let ports_current = self.reconfigure_pair(want, keys, &mut slots).await?;
        // Where each server is checked ([`Slot::check_ip`]).
        let beside = provider.capabilities().moves_to_secondary_ip();
        self.check_pair(keys, &mut slots, beside).await;

        let hysteresis = Hysteresis { failures: ctx.settings.failover_failures, after: ctx.settings.failover_after };
        let (replace_after, max) = (ctx.settings.replace_after, ctx.settings.max_replacements);
        let servers: Vec<Server> = slots
            .iter()
            .filter_map(|s| {
                let (health, error) = s.check.as_ref()?;
                Some(Server { id: s.id()?, health: *health, error, replace_after: s.replace_after(replace_after, max) })
            })
            .collect();
        let step = failover_step(&servers, holder.as_deref(), &hysteresis);
        let steady = step == FailoverStep::Keep { degraded: None } && slots.iter().all(Slot::passing) && ports_current;
        let mut last_failover = recorded.last_failover.clone();
        let mut failovers = recorded.failovers;
        let mut degraded = None;
        match step {
            FailoverStep::Keep { degraded: why } => degraded = why,
            FailoverStep::Assign { to } => address = Some(self.put_address(want, address, &to).await?),
            FailoverStep::Move { from, to, reason } => {
                address = Some(self.put_address(want, address, &to).await?);
                let note = format!("moved the reserved address from exit server {from} to {to}: {reason}");
                ctx.publish(tunnel, Reason::Failover, note.clone()).await;
                ctx.publish_on(&kube::Resource::object_ref(&*want.service, &()), Reason::Failover, note).await;
                let name = tunnel.metadata.name.as_deref().unwrap_or_default();
                ctx.failovers.add((tunnel.metadata.namespace.as_deref().unwrap_or_default(), name), 1.0);
                failovers = Some(failovers.unwrap_or(0) + 1);
                let time = k8s_openapi::jiff::Timestamp::now().to_string();
                last_failover = Some(Failover { time, from, to: to.clone(), reason });
                // Recorded at once: a later step of this pass may fail (creating a server).
                let moved = (Some(to), failovers, last_failover.clone());
                self.record(|s| {
                    let ha = s.high_availability.get_or_insert_default();
                    (ha.active, ha.failovers, ha.last_failover) = moved;
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
        for slot in slots.iter_mut().filter(|s| s.id().is_some() && s.id() != holder.as_deref()) {
            self.spent(slot);
        }
        // Stopped hosts go once the address is off them; their slots are filled next pass.
        for slot in slots.iter_mut().filter(|s| s.host.as_ref().is_some_and(|h| h.state == HostState::Stopped)) {
            let id = slot.id().unwrap_or_default().to_string();
            let why = format!("exit server {id} (slot {}) is no longer running", slot.slot);
            act::host::replace_lost(tunnel, provider.as_ref(), (&id, &why), None, ctx).await?;
            ctx.health.forget(&id);
            slot.host = None;
        }
        for slot in slots.iter_mut().filter(|s| deferred.contains(&s.slot)) {
            let host = self.create_slot(want, keys, (slot.slot, address.as_ref())).await?;
            slot.own_ip = first_own_ip(&host, reserved_ip.as_deref());
            slot.host = Some(host);
        }

        let clients = self.pair_clients(want, keys, &slots, &mut address, false).await?;

        let active = address.as_ref().and_then(|a| a.host_id.clone());
        match (steady && active == holder, fresh) {
            (true, true) => {
                let hosts = [slots[0].host.clone(), slots[1].host.clone()];
                ctx.pair_views.keep(&want.uid, address.clone(), observe::FoundPair { hosts, extras: Vec::new() });
            }
            (true, false) => {}
            (false, _) => ctx.pair_views.forget(&want.uid),
        }
        let active_slot = slots.iter().find(|s| s.id().is_some() && s.id() == active.as_deref());
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
            match (&address, ready) {
                (Some(a), true) => act::set_ingress(service, Some(desired::ingress(&a.ip, &want.ports)), ctx).await?,
                _ if withdraw => act::set_ingress(service, None, ctx).await?,
                _ => {}
            }
        }
        let servers: Vec<ServerStatus> = slots.iter().map(Slot::status).collect();
        let condition = match (&address, ready) {
            (Some(a), true) => Condition::new(
                "Ready",
                ConditionStatus::True,
                Reason::Active.as_str(),
                format!(
                    "reserved address {} on exit server {} forwards {} to Service {}; its tunnel passed its health check at {}; standby: {}{}",
                    a.ip,
                    active.as_deref().unwrap_or_default(),
                    super::super::status::describe(&want.ports),
                    tunnel.spec.service_ref.name,
                    checked_at(active_slot.and_then(|s| s.check_ip(beside)), &a.ip),
                    standby_note(&slots, active.as_deref()),
                    clients.waiting.map(|w| format!("; client roll: {w}")).unwrap_or_default(),
                ),
            ),
            _ => {
                let why = degraded.unwrap_or_else(|| "waiting for an exit server of the pair to carry traffic".into());
                not_ready(Reason::WaitingForTunnel, &why).remove(0)
            }
        };
        let host_ip = address.as_ref().filter(|_| active.is_some()).map(|a| a.ip.clone());
        let spread = Some(spread(provider.capabilities().spread, &slots));
        let ha = HighAvailabilityStatus {
            active: active.clone(),
            servers,
            failovers,
            last_failover,
            limitation: None,
            spread,
        };
        self.record_pair(want, keys, PairRecord { host: (active, host_ip), ports_current, ha, ready, condition }).await
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

    /// Pushes the Service's ports to running hosts that lack them; a host that cannot take the
    /// push was deleted. Whether every host now has them.
    async fn reconfigure_pair(&mut self, want: &Desired, keys: &Keys, slots: &mut [Slot]) -> Result<bool> {
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
    async fn check_pair(&self, keys: &Keys, slots: &mut [Slot], beside: bool) {
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

    /// Puts the reserved address on running host `to`, reserving it there where the provider
    /// reserves only onto a host (DigitalOcean).
    async fn put_address(&mut self, want: &Desired, address: Option<Address>, to: &str) -> Result<Address> {
        match address {
            Some(a) => {
                act::address::assign(self.tunnel, want.provider.as_ref(), &a, to, self.ctx).await?;
                Ok(Address { host_id: Some(to.to_string()), ..a })
            }
            None => self.reserve(want, Some(to.to_string())).await,
        }
    }
}

/// A host's own address as first seen: a host seen first while it holds the reserved address
/// (status lost) does not show its own; its client waits until it is replaced.
fn first_own_ip(host: &Host, reserved: Option<&str>) -> Option<String> {
    host.public_ipv4.clone().filter(|ip| host.state == HostState::Running && Some(ip.as_str()) != reserved)
}
