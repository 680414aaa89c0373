//! The phases of [`Policy::Single`]'s one slot, after the credentials:
//!
//! 1. its fill: [`Pass::host`] steps the exit server with [`host_step`] until it runs with the
//!    Service's ports, and [`Pass::address`] puts a reserved address on it ([`address_step`]);
//! 2. the host's cloud firewall brought to the source ranges, and the client config and
//!    Deployment ([`Pass::client`]) pointed at the slot's address;
//! 3. the slot checked end to end as a pair's slots are ([`Pass::check_slots`]);
//! 4. the policy's step after the check ([`traffic_step`]): Ready with the address on the
//!    Service, still coming up, or failing, where the failing server is judged as a pair's is
//!    ([`Slot::failing`], [`console::judge`]) and replaced only if a new one can help;
//! 5. status from what was done: `hostId`/`hostIp` and `replacements` are the slot's record.
//!
//! [`host_step`]: super::super::plan::host_step
//! [`address_step`]: super::super::plan::address::address_step

use kube::runtime::controller::Action;
use providers::Host;
use providers::exit::userdata::render_client_toml;

use super::super::plan::policy::Policy;
use super::super::plan::replace::Unhealthy;
use super::super::plan::single::{TrafficStep, health_poll, traffic_step, withdraws};
use super::super::status;
use super::super::{act, desired, ranges};
use super::slot::Slot;
use super::{BOOT_POLL, Desired, Failure, HEALTH_POLL, Keys, Pass, console};
use crate::controllers::jittered;
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::tunnel::{TunnelPhase, TunnelStatus};
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// The running exit server, once the host phase is through.
pub struct Running {
    /// Its own public address.
    pub(super) ip: String,
    pub(super) host: Host,
    /// The reserved address as the host phase found it (`None` without one).
    pub(super) address: Option<providers::Address>,
}

impl Pass<'_> {
    /// The phases after the credentials, for the one server of [`Policy::Single`].
    pub(super) async fn single(&mut self, want: &Desired, keys: &Keys) -> Result<Action, Failure> {
        let Some(running) = self.host(want, keys).await? else { return Ok(Action::requeue(BOOT_POLL)) };
        let Some(ip) = self.address(want, &running).await? else { return Ok(Action::requeue(BOOT_POLL)) };
        let enforced = self.source_ranges(want, keys, Some(&running.host.id)).await?;
        let client_available = self.client(want, keys, &ip).await?;
        let mut slot = Slot::single(running.host, ip, self.status().replacements);
        // At the Tunnel's address: a reserved one is where the client dials (local: the only
        // address its ports are bound at).
        self.check_slots(keys, std::slice::from_mut(&mut slot), Policy::Single, |s| s.own_ip.as_deref()).await;
        Ok(self.traffic(want, keys, slot, (enforced, client_available)).await?)
    }

    /// The client config in the Secret and the client Deployment, pointed at `ip`. Returns
    /// whether the Deployment has an available replica.
    async fn client(&mut self, want: &Desired, keys: &Keys, ip: &str) -> Result<bool, Failure> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let cluster_ip = self.cluster_ip(want)?;
        let ports = (ctx.settings.control_port, ctx.settings.health_port);
        let client = desired::client(want.forwarded(), &keys.credentials, ip, ports, &cluster_ip);
        let client_toml = render_client_toml(&client).map_err(|e| Error::Internal(format!("client config: {e}")))?;
        if keys.stored_client.as_deref() != Some(client_toml.as_str()) {
            act::write_client_config(tunnel, &want.at, &client_toml, ctx).await?;
        }
        let checksum = desired::checksum(&client_toml);
        Ok(act::ensure_deployment(tunnel, &want.at, &ctx.settings.client_image, &checksum, ctx).await?)
    }

    /// Ready means traffic can flow: only a tunnel that passed the end-to-end check gets the
    /// address published; any other state takes it off the Service first. Past the boot
    /// timeout, the side at fault decides whether the host is replaced ([`console::judge`]).
    async fn traffic(
        &mut self,
        want: &Desired,
        keys: &Keys,
        mut slot: Slot,
        (enforced, client_available): (bool, bool),
    ) -> Result<Action> {
        let (tunnel, ctx, settings) = (self.tunnel, self.ctx, &self.ctx.settings);
        let Some((health, error)) = slot.check.clone() else { return Ok(Action::requeue(BOOT_POLL)) };
        let step = traffic_step((health, &error), settings.boot_timeout, settings.replace_after);
        if let Some(service) = want.publishes()
            && withdraws(&step, health.failing_for, settings.withdraw_after)
        {
            act::set_ingress(service, None, ctx).await?;
        }
        let (host_id, ip) = (slot.id().map(str::to_string), slot.own_ip.clone().unwrap_or_default());
        let provider_name = want.provider.name().to_string();
        let record = |s: &mut TunnelStatus| {
            s.provider = Some(provider_name.clone());
            s.host_id = host_id.clone();
            s.host_ip = Some(ip.clone());
            s.ports = want.ports.clone();
            // Reached means the host runs with these credentials (created or reconfigured with them).
            s.credentials_digest = Some(keys.digest.clone());
        };
        match step {
            TrafficStep::Ready => {}
            TrafficStep::Waiting { message } => {
                self.record(|s| {
                    record(s);
                    s.phase = Some(TunnelPhase::Provisioning);
                    s.conditions = status::not_ready(Reason::WaitingForTunnel, &message);
                })
                .await?;
                return Ok(Action::requeue(jittered(health_poll(health.failing_for, HEALTH_POLL))));
            }
            TrafficStep::NotEstablished { .. } | TrafficStep::Replace { .. } => {
                let Some(failing) = slot.failing(&ip) else { return Ok(Action::requeue(BOOT_POLL)) };
                let provider = want.provider.as_ref();
                match console::judge(failing, client_available, &slot.client_at(&want.at), provider, ctx).await {
                    (_, Unhealthy::Report { reason, message }) => {
                        self.record(record).await?;
                        self.report(TunnelPhase::Provisioning, reason, &message).await?;
                        return Ok(Action::requeue(jittered(HEALTH_POLL)));
                    }
                    (cause, Unhealthy::Replace { why, count, next_after }) => {
                        let host = (host_id.as_deref(), cause.reason(), why.as_str());
                        act::host::replace_unhealthy(
                            tunnel,
                            (want.service.as_deref(), &want.showing()),
                            provider,
                            host,
                            ctx,
                        )
                        .await?;
                        ctx.health.forget(host_id.as_deref().unwrap_or_default());
                        (slot.host, slot.replaced) = (None, count);
                        let message = format!("{why}; provisioning a new exit server");
                        self.record(|s| {
                            s.phase = Some(TunnelPhase::Provisioning);
                            s.host_id = None;
                            s.host_ip = None;
                            s.replacements = slot.replacements();
                            s.next_replacement_after = Some(next_after.to_string());
                            s.conditions = status::not_ready(Reason::Replacing, &message);
                        })
                        .await?;
                        return Ok(Action::requeue(BOOT_POLL));
                    }
                }
            }
        }
        if let Some(service) = want.publishes() {
            act::set_ingress(service, Some(desired::ingress(&ip, &want.ports)), ctx).await?;
        }
        let generation = tunnel.metadata.generation;
        let message = format!(
            "exit server {ip} {}; the tunnel passed its health check{}",
            want.carries(),
            ranges::note(enforced, &keys.source_ranges, want.provider.as_ref()),
        );
        self.record(|s| {
            record(s);
            // Working again: a later failure gets the whole run of replacements (each one still
            // drawn from the slot's daily budget).
            s.replacements = slot.replacements();
            s.next_replacement_after = None;
            s.phase = Some(TunnelPhase::Active);
            s.observed_generation = generation;
            s.conditions = vec![Condition::new("Ready", ConditionStatus::True, Reason::Active.as_str(), message)];
        })
        .await?;
        Ok(Action::requeue(jittered(ctx.settings.resync)))
    }
}
