//! The reconcile spine of a live Tunnel: named phases, in order, over one [`Pass`].
//!
//! 1. [`Pass::desired`]: the Service exists and is one skyport serves, its ports, the
//!    allow-lists, the provider; all before any cloud call;
//! 2. [`Pass::credentials`]: the Secret's keys (created once; an earlier Tunnel's replaced);
//! 3. [`Pass::host`] ([`host`]): the exit server found, created, replaced or reconfigured until
//!    it runs with the Service's ports;
//! 4. [`Pass::address`]: with a reserved address, that address on the running host;
//! 5. [`Pass::client`]: the client config and Deployment;
//! 6. [`Pass::traffic`]: the end-to-end probe decides Ready and the Service's ingress, or a
//!    replacement.
//!
//! Phases 3 to 6 are those of [`Policy::Single`]. After the credentials, a highly available
//! Tunnel (`spec.highAvailability`) leaves for its policy's own: [`Pass::pair`] (`pair.rs`) for
//! `ActiveStandby`, two exit servers and two clients with the reserved address moved between
//! them; `Pass::both` (`pair/both.rs`) for `BothAddresses`, both servers' own addresses published.
//!
//! Each phase decides with `plan`, writes with `act` and records what it reached through
//! [`Pass::record`], the one place that writes a Tunnel's status (deletion and failure reports
//! included). A phase that must wait returns `None` or a [`Blocked`].

mod console;
mod host;
mod pair;
mod reservation;

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use providers::HostProvider;
use providers::exit::userdata::{ExitServer, render_client_toml};

use super::observe::SecretState;
use super::placement::Placement;
use super::plan::failover::PROBE_TIMEOUT;
use super::plan::policy::Policy;
use super::plan::replace::Unhealthy;
use super::plan::{self, Blocked, TrafficStep};
use super::status::{self, Writer, describe};
use super::{Context, act, desired, observe, ranges};
use crate::controllers::jittered;
use crate::controllers::status::ObjectStatus;
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::tunnel::{Tunnel, TunnelPhase, TunnelPort, TunnelStatus};
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// How often a booting exit server is looked at again.
pub const BOOT_POLL: Duration = Duration::from_secs(3);
/// How often a running exit server whose tunnel is not through yet is probed again.
const HEALTH_POLL: Duration = Duration::from_secs(5);

/// One reconcile of one Tunnel: what it was handed and the status it is writing.
pub struct Pass<'a> {
    pub tunnel: &'a Tunnel,
    pub ctx: &'a Context,
    /// The Tunnel's Service, as the cache shows it.
    pub service: Option<Arc<Service>>,
    status: Writer<'a>,
}

/// What a live Tunnel must be, decided before the first cloud call.
pub struct Desired {
    service: Arc<Service>,
    /// Whether this Tunnel writes the Service's ingress ([`desired::controls_service_status`]).
    publishes: bool,
    provider: Arc<dyn HostProvider>,
    /// Where the client Deployment and credentials Secret live.
    at: Placement,
    uid: String,
    ports: Vec<TunnelPort>,
}

impl Desired {
    fn publishes(&self) -> Option<&Service> {
        self.publishes.then_some(&*self.service)
    }
}

/// The credentials phase's result: the keys, and the exit server they make.
pub struct Keys {
    credentials: desired::Credentials,
    /// The client config the Secret holds, if any.
    stored_client: Option<String>,
    /// A highly available Tunnel's client configs the Secret holds, by key.
    stored_pair: std::collections::BTreeMap<String, String>,
    /// [`plan::credentials_digest`] of `credentials`.
    digest: String,
    /// The ports the running host may be trusted to have ([`plan::configured_ports`]).
    configured: Vec<TunnelPort>,
    server: ExitServer,
    /// `spec.sourceRanges`, canonical ([`ranges::restrict`]).
    source_ranges: Vec<String>,
}

/// The running exit server, once the host phase is through.
pub struct Running {
    ip: String,
    id: Option<String>,
    /// The reserved address as the host phase found it (`None` without one).
    address: Option<providers::Address>,
}

/// Why the phases stopped: waiting for a change ([`Blocked`]) or an error.
pub enum Failure {
    Blocked(Blocked),
    Error(Error),
}

impl<E: Into<Error>> From<E> for Failure {
    fn from(e: E) -> Self {
        Failure::Error(e.into())
    }
}

impl<'a> Pass<'a> {
    pub fn new(tunnel: &'a Tunnel, api: &'a Api<Tunnel>, ctx: &'a Context) -> Self {
        let name = &tunnel.spec.service_ref.name;
        let service = tunnel.namespace().and_then(|ns| ctx.services.get(&ObjectRef::new(name).within(&ns)));
        Pass { tunnel, ctx, service, status: status::writer(tunnel, api, ctx) }
    }

    /// The status as last written (by this pass, or remembered from an earlier one).
    pub fn status(&self) -> &TunnelStatus {
        self.status.current()
    }

    /// The Tunnel's resourceVersion after the last status write.
    pub fn resource_version(&self) -> Option<String> {
        self.status.resource_version()
    }

    /// Applies `change` to the Tunnel's status and writes it if it differs: the one place that
    /// writes a Tunnel's status.
    pub async fn record(&mut self, change: impl FnOnce(&mut TunnelStatus)) -> Result<()> {
        self.status.write(change).await
    }

    /// Ready=False with `reason` in `phase`, with Warning Events when the reason is new
    /// ([`status::warn_if_new`]).
    pub async fn report(&mut self, phase: TunnelPhase, reason: Reason, message: &str) -> Result<()> {
        let current = self.status().not_ready_reason().map(str::to_string);
        status::warn_if_new(self.tunnel, self.service.as_deref(), self.ctx, current.as_deref(), reason, message).await;
        self.record(|s| {
            s.phase = Some(phase);
            s.conditions = status::not_ready(reason, message);
        })
        .await
    }

    /// Runs the phases; a [`Blocked`] one is reported and waits for a change.
    pub async fn run(mut self) -> Result<Action> {
        match self.phases().await {
            Ok(action) => Ok(action),
            Err(Failure::Blocked(Blocked(phase, reason, message))) => {
                self.report(phase, reason, &message).await?;
                Ok(Action::await_change())
            }
            Err(Failure::Error(e)) => Err(e),
        }
    }

    async fn phases(&mut self) -> Result<Action, Failure> {
        let desired = self.desired()?;
        let keys = self.credentials(&desired).await?;
        match Policy::of(&self.tunnel.spec) {
            Policy::Single => self.single(&desired, &keys).await,
            Policy::ActiveStandby => self.pair(&desired, &keys).await,
            Policy::BothAddresses => self.both(&desired, &keys).await,
        }
    }

    /// The phases after the credentials, for the one server of [`Policy::Single`].
    async fn single(&mut self, desired: &Desired, keys: &Keys) -> Result<Action, Failure> {
        let Some(running) = self.host(desired, keys).await? else { return Ok(Action::requeue(BOOT_POLL)) };
        let Some(ip) = self.address(desired, &running).await? else { return Ok(Action::requeue(BOOT_POLL)) };
        let enforced = self.source_ranges(desired, keys, running.id.as_deref()).await?;
        let client_available = self.client(desired, keys, &ip).await?;
        Ok(self.traffic(desired, keys, (ip, running.id, enforced), client_available).await?)
    }

    /// The Service, its ports and the provider, checked before any cloud call.
    fn desired(&self) -> Result<Desired, Failure> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let ns = crate::controllers::context::namespace_of(tunnel)?;
        let uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
        let svc_name = &tunnel.spec.service_ref.name;
        let blocked = |phase, reason, message| Failure::Blocked(Blocked(phase, reason, message));
        let Some(service) = self.service.clone() else {
            let message = format!("Service {ns}/{svc_name} does not exist; the Tunnel waits for it");
            return Err(blocked(TunnelPhase::Pending, Reason::ServiceNotFound, message));
        };
        // A hand-written Tunnel gets no more than a Service would: skyport publishes only the
        // Services it serves (a ClusterIP Service, or one that opted out, stays private).
        if let Err(why) = crate::controllers::service::desired::served(&service, &ctx.settings) {
            let message =
                format!("Service {svc_name} is not one skyport serves ({why}); a Tunnel only publishes such Services");
            return Err(blocked(TunnelPhase::Failed, Reason::ServiceNotServed, message));
        }
        let ports = desired::service_ports(&service, ctx.settings.control_port, ctx.settings.health_port)
            .and_then(|ports| desired::proxied(ports, tunnel.spec.proxy_protocol))
            .map_err(|p| blocked(TunnelPhase::Failed, Reason::InvalidService, format!("Service {svc_name}: {p}")))?;
        // Checked before any cloud call; an exit server made before the lists were narrowed keeps
        // serving (a policy change must not cut traffic), only new ones are held to them.
        if self.status().host_id.is_none() {
            plan::allowed(tunnel, &ctx.settings.allowed_sizes, &ctx.settings.allowed_regions)
                .map_err(Failure::Blocked)?;
        }
        let provider = plan::provider_for(tunnel, self.status(), &ctx.providers).map_err(Failure::Blocked)?;
        let publishes = desired::controls_service_status(tunnel, &service);
        let at = Placement::of(tunnel, ctx.settings.client_namespace.as_deref())?;
        Ok(Desired { service, publishes, provider, at, uid, ports })
    }

    /// The credentials Secret: read, or created once (an earlier Tunnel's stale one deleted first).
    async fn credentials(&mut self, want: &Desired) -> Result<Keys, Failure> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let secret = observe::credentials(&ctx.client, tunnel, &want.at).await?;
        if let SecretState::Stale { secret_uid } = &secret {
            act::delete_stale_secret(&want.at, secret_uid.as_deref(), ctx).await?;
        }
        let (credentials, (stored_client, stored_pair), fresh) = match secret {
            SecretState::Stored(stored) => (stored.credentials, (stored.client_toml, stored.pair_clients), false),
            SecretState::Missing | SecretState::Stale { .. } => {
                match act::create_secret(tunnel, &want.at, ctx).await? {
                    Some(created) => (created, (None, Default::default()), true),
                    // Another run made it meanwhile: use what it stored.
                    None => match observe::credentials(&ctx.client, tunnel, &want.at).await? {
                        SecretState::Stored(stored) => {
                            (stored.credentials, (stored.client_toml, stored.pair_clients), false)
                        }
                        _ => {
                            let message = "the credentials Secret vanished right after it was created";
                            return Err(Error::Internal(message.into()).into());
                        }
                    },
                }
            }
        };
        let settings = &ctx.settings;
        let server = desired::exit_server(&want.ports, &credentials, settings.control_port, settings.health_port);
        let (server, source_ranges) =
            ranges::restrict(server, &self.tunnel.spec.source_ranges).map_err(Failure::Blocked)?;
        // New keys (the Secret was re-created, now or in a reconcile that failed after) mean the
        // running server must get the new configuration: status remembers the host's keys' digest.
        let digest = plan::credentials_digest(&credentials);
        let configured = plan::configured_ports(self.status(), fresh, &digest);
        Ok(Keys { credentials, stored_client, stored_pair, digest, configured, server, source_ranges })
    }

    /// The running host's cloud firewall brought to `spec.sourceRanges` where the provider has
    /// one; whether they are enforced.
    async fn source_ranges(&mut self, want: &Desired, keys: &Keys, host_id: Option<&str>) -> Result<bool> {
        let recorded = self.status().source_ranges.clone();
        let on = (&keys.server, keys.source_ranges.as_slice());
        let (enforced, record) =
            ranges::converge(self.tunnel, &want.provider, host_id, on, recorded.as_deref(), self.ctx).await?;
        if let Some(now) = record {
            self.record(|s| s.source_ranges = now).await?;
        }
        Ok(enforced)
    }

    /// The Service's cluster IP, where the tunnel client forwards.
    fn cluster_ip(&self, want: &Desired) -> Result<String, Failure> {
        let cluster_ip = want.service.spec.as_ref().and_then(|s| s.cluster_ip.clone()).filter(|ip| ip != "None");
        cluster_ip.ok_or_else(|| {
            let svc_name = &self.tunnel.spec.service_ref.name;
            Failure::Blocked(Blocked(
                TunnelPhase::Failed,
                Reason::InvalidService,
                format!("Service {svc_name} has no cluster IP (headless); the tunnel client forwards to it"),
            ))
        })
    }

    /// The client config in the Secret and the client Deployment, pointed at `ip`. Returns
    /// whether the Deployment has an available replica.
    async fn client(&mut self, want: &Desired, keys: &Keys, ip: &str) -> Result<bool, Failure> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let cluster_ip = self.cluster_ip(want)?;
        let ports = (ctx.settings.control_port, ctx.settings.health_port);
        let client = desired::client(&want.ports, &keys.credentials, ip, ports, &cluster_ip);
        let client_toml = render_client_toml(&client).map_err(|e| Error::Internal(format!("client config: {e}")))?;
        if keys.stored_client.as_deref() != Some(client_toml.as_str()) {
            act::write_client_config(tunnel, &want.at, &client_toml, ctx).await?;
        }
        let checksum = desired::checksum(&client_toml);
        Ok(act::ensure_deployment(tunnel, &want.at, &ctx.settings.client_image, &checksum, ctx).await?)
    }

    /// Ready means traffic can flow: only a tunnel that passed the end-to-end check gets the
    /// address published; any other state takes it off the Service first. Past the boot
    /// timeout, the side at fault decides whether the host is replaced ([`replace::unhealthy`]).
    async fn traffic(
        &mut self,
        want: &Desired,
        keys: &Keys,
        (ip, host_id, enforced): (String, Option<String>, bool),
        client_available: bool,
    ) -> Result<Action> {
        let (tunnel, ctx, settings) = (self.tunnel, self.ctx, &self.ctx.settings);
        let probed = ctx.probe.check(&ip, settings.health_port, &keys.credentials.token, PROBE_TIMEOUT).await;
        let error = probed.as_ref().err().cloned().unwrap_or_default();
        let clock = host_id.clone().unwrap_or_else(|| ip.clone());
        let failing_for = ctx.health.record(&clock, probed.is_ok()).failing_for;
        let step = plan::traffic_step(probed, failing_for, settings.boot_timeout, settings.replace_after);
        if want.publishes && plan::withdraws(&step, failing_for, settings.withdraw_after) {
            act::set_ingress(&want.service, None, ctx).await?;
        }
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
                return Ok(Action::requeue(jittered(plan::health_poll(failing_for, HEALTH_POLL))));
            }
            TrafficStep::NotEstablished { .. } | TrafficStep::Replace { .. } => {
                let replaced = self.status().replacements.unwrap_or(0);
                let failing =
                    console::Failing { host: (host_id.as_deref(), &ip), error: &error, failing_for, replaced };
                let provider = want.provider.as_ref();
                match console::judge(failing, client_available, &want.at, provider, ctx).await {
                    (_, Unhealthy::Report { reason, message }) => {
                        self.record(record).await?;
                        self.report(TunnelPhase::Provisioning, reason, &message).await?;
                        return Ok(Action::requeue(jittered(HEALTH_POLL)));
                    }
                    (cause, Unhealthy::Replace { why, count, next_after }) => {
                        let host = (host_id.as_deref(), cause.reason(), why.as_str());
                        act::host::replace_unhealthy(tunnel, &want.service, want.publishes, provider, host, ctx)
                            .await?;
                        ctx.health.forget(&clock);
                        let message = format!("{why}; provisioning a new exit server");
                        self.record(|s| {
                            s.phase = Some(TunnelPhase::Provisioning);
                            s.host_id = None;
                            s.host_ip = None;
                            s.replacements = Some(count);
                            s.next_replacement_after = Some(next_after.to_string());
                            s.conditions = status::not_ready(Reason::Replacing, &message);
                        })
                        .await?;
                        return Ok(Action::requeue(BOOT_POLL));
                    }
                }
            }
        }
        if want.publishes {
            act::set_ingress(&want.service, Some(desired::ingress(&ip, &want.ports)), ctx).await?;
        }
        let generation = tunnel.metadata.generation;
        let message = format!(
            "exit server {ip} forwards {} to Service {}; the tunnel passed its health check{}",
            describe(&want.ports),
            tunnel.spec.service_ref.name,
            ranges::note(enforced, &keys.source_ranges, want.provider.as_ref()),
        );
        self.record(|s| {
            record(s);
            // Working again: a later failure gets the whole replacement budget.
            s.replacements = None;
            s.next_replacement_after = None;
            s.phase = Some(TunnelPhase::Active);
            s.observed_generation = generation;
            s.conditions = vec![Condition::new("Ready", ConditionStatus::True, Reason::Active.as_str(), message)];
        })
        .await?;
        Ok(Action::requeue(jittered(ctx.settings.resync)))
    }
}
