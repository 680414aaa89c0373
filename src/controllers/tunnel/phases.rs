//! The reconcile spine of a live Tunnel: named phases, in order, over one [`Pass`].
//!
//! 1. [`Pass::desired`]: the Service exists and is one skyport serves, its ports, the
//!    allow-lists, the provider; all before any cloud call;
//! 2. [`Pass::credentials`]: the Secret's keys (created once; an earlier Tunnel's replaced);
//! 3. the phases of the Tunnel's [`Policy`] over its slots ([`slot::Slot`]), each the same
//!    stages: fill each slot (its server found, created, replaced or reconfigured until it runs
//!    with the Service's ports), check every slot end to end ([`Pass::check_slots`], one health
//!    tracker), take the policy's step after the checks (a pure plan), write the clients,
//!    publish, and record status from what was done:
//!    - [`Pass::single`] (`single.rs`, with `host.rs`) for [`Policy::Single`]'s one slot;
//!    - [`Pass::pair`] (`pair.rs`) for `ActiveStandby`: two slots, the reserved address moved
//!      between them by [`failover_step`](super::plan::failover::failover_step);
//!    - `Pass::both` (`pair/both.rs`) for `BothAddresses`: both servers' own addresses
//!      published, [`both::steps`](super::plan::both::steps) after the checks.
//!
//! A failing slot's server is judged the same way under every policy ([`console::judge`]), and
//! every creation draws on its slot's daily budget ([`Pass::charge_host`]). Each phase decides
//! with `plan`, writes with `act` and records what it reached through [`Pass::record`], the one
//! place that writes a Tunnel's status (deletion and failure reports included). A phase that
//! must wait returns `None` or a [`Blocked`].

mod carrier;
mod checks;
mod console;
mod host;
mod member;
mod member_address;

pub use member::{published_members, wake_carrier};
mod pair;
mod reservation;
mod single;
mod slot;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use providers::HostProvider;
use providers::exit::userdata::ExitServer;

use super::observe::SecretState;
use super::placement::Placement;
use super::plan::policy::Policy;
use super::plan::{self, Blocked};
use super::status::{self, Writer, describe};
use super::{Context, act, desired, observe, ranges};
use crate::controllers::pool;
use crate::controllers::pool::admit::Admission;
use crate::controllers::status::ObjectStatus;
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
    /// The Service it exposes; none on a pool's shared server.
    service: Option<Arc<Service>>,
    /// Whether this Tunnel writes the Service's ingress ([`desired::controls_service_status`]).
    publishes: bool,
    provider: Arc<dyn HostProvider>,
    /// Where the client Deployment and credentials Secret live.
    at: Placement,
    uid: String,
    /// The ports the exit server exposes: the Service's, or on a pool's shared server every
    /// member's.
    ports: Vec<TunnelPort>,
    /// On a pool's shared server, what it does for its members; empty otherwise.
    pool: Carried,
}

/// What a pool's shared server does for its members.
#[derive(Default)]
pub struct Carried {
    /// What it does for each member (by UID).
    members: BTreeMap<String, Admission>,
    /// Each member's source ranges (canonical, by UID).
    ranges: BTreeMap<String, Vec<String>>,
    /// The members' Services that show its address ([`published_members`]).
    shown: Vec<Arc<Service>>,
    /// Under `addressing: PerService`, each carried member's own address (by UID), filled by
    /// [`Pass::member_addresses`]; `None` on a `Shared` pool.
    binds: Option<BTreeMap<String, std::net::Ipv4Addr>>,
}

impl Desired {
    /// Where the members' services listen on the shared server.
    fn binds(&self) -> pool::desired::Binds<'_> {
        self.pool.binds.as_ref().map_or(pool::desired::Binds::Shared, pool::desired::Binds::PerService)
    }

    fn publishes(&self) -> Option<&Service> {
        self.service.as_deref().filter(|_| self.publishes)
    }

    /// Every Service whose status may show this Tunnel's exit server: its own where it publishes,
    /// on a pool's shared server its members'. Each loses the address before a server goes.
    fn showing(&self) -> Vec<&Service> {
        self.publishes().into_iter().chain(self.pool.shown.iter().map(|s| &**s)).collect()
    }

    /// What the exit server does, for the Ready condition: `forwards 80/TCP to Service web`, or
    /// on a pool's shared server `carries 2 Services (80/TCP, 443/TCP)`.
    fn carries(&self) -> String {
        match &self.service {
            Some(service) => format!("forwards {} to Service {}", describe(&self.ports), service.name_any()),
            None => {
                let carried = self.pool.members.values().filter(|a| !a.ports().is_empty()).count();
                format!("carries {carried} Services of its pool ({})", describe(&self.ports))
            }
        }
    }

    /// The ports the Tunnel's own client forwards: none on a pool's shared server, whose
    /// members' clients carry their own.
    fn forwarded(&self) -> &[TunnelPort] {
        if self.service.is_some() { &self.ports } else { &[] }
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
        let service = (tunnel.spec.service_name().zip(tunnel.namespace()))
            .and_then(|(name, ns)| ctx.services.get(&ObjectRef::new(name).within(&ns)));
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
        let result = match self.phases().await {
            Ok(action) => Ok(action),
            Err(Failure::Blocked(Blocked(phase, reason, message))) => {
                self.report(phase, reason, &message).await?;
                Ok(Action::await_change())
            }
            Err(Failure::Error(e)) => Err(e),
        };
        // A pool's shared server says what it reached on its pool too.
        if self.tunnel.spec.carries_pool() {
            if let Err(e) = act::publish_pool(self.tunnel, self.status(), self.ctx).await {
                tracing::warn!(error = %e, "writing the pool's status failed; written again next pass");
            }
            member::wake_members_if_moved(self.tunnel, self.status(), self.ctx);
        }
        result
    }

    async fn phases(&mut self) -> Result<Action, Failure> {
        let mut desired = self.desired()?;
        let mut proven = Vec::new();
        if desired.service.is_none() {
            self.cap_member_addresses(&mut desired).await?;
            let allowed = |a: &Admission| !matches!(a, Admission::Refused(pool::admit::Refusal::NamespaceNotAllowed));
            if !desired.pool.members.values().any(allowed) {
                act::retire_carrier(self.tunnel, self.ctx).await?;
                return Ok(Action::await_change());
            }
            // Members read what they get here, before the server is even up; those whose entry
            // changed look again now.
            let members = pool::admit::recorded(&desired.pool.members);
            let changed = member::with_uids(
                self.ctx,
                members.iter().filter(|m| !self.status().pool_members.contains(m)).map(|m| m.uid.as_str()),
            );
            self.record(|s| s.pool_members = members).await?;
            member::wake(self.ctx, &changed);
            if desired.pool.binds.is_some() {
                let (binds, listed) = self.member_addresses(&desired).await?;
                (desired.pool.binds, proven) = (Some(binds), listed);
            }
        }
        let keys = self.credentials(&desired).await?;
        if let Some(pool) = self.tunnel.spec.pool.as_ref().filter(|_| desired.service.is_some()) {
            return self.member(&desired, &keys, &pool.name).await;
        }
        let action = match Policy::of(&self.tunnel.spec) {
            Policy::Single => self.single(&desired, &keys).await,
            Policy::ActiveStandby => self.pair(&desired, &keys).await,
            Policy::BothAddresses => self.both(&desired, &keys).await,
        }?;
        if desired.pool.binds.is_some() {
            let moved = self.assign_member_addresses(&desired, &proven).await?;
            self.release_departed(&desired, &keys, &proven).await?;
            // Where a member binds the private IPv4 its address reaches the server at, the
            // configuration that binds it is the next pass's.
            if moved && desired.provider.capabilities().pool_addresses.translated() {
                return Ok(Action::requeue(BOOT_POLL));
            }
        }
        Ok(action)
    }

    /// The Service, its ports and the provider, checked before any cloud call.
    fn desired(&self) -> Result<Desired, Failure> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let ns = crate::controllers::context::namespace_of(tunnel)?;
        let uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
        let blocked = |phase, reason, message| Failure::Blocked(Blocked(phase, reason, message));
        let Some(svc_name) = tunnel.spec.service_name() else {
            let pool = tunnel.spec.pool.as_ref().map(|p| p.name.as_str()).unwrap_or_default();
            return self.carrier_desired(pool);
        };
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
        let provider = match tunnel.spec.pool.as_ref().and_then(|p| ctx.pools.get(&ObjectRef::new(&p.name))) {
            // A member buys nothing: the provider and its allow-lists are its shared server's.
            Some(pool) => plan::provider_named(pool.spec.provider.clone(), &ctx.providers),
            None => self.own_provider(),
        }
        .map_err(Failure::Blocked)?;
        let publishes = desired::controls_service_status(tunnel, &service);
        let at = Placement::of(tunnel, ctx.settings.client_namespace.as_deref())?;
        Ok(Desired { service: Some(service), publishes, provider, at, uid, ports, pool: Carried::default() })
    }

    /// The provider of a Tunnel that buys its own exit server, held to the operator's size and
    /// region allow-lists before any cloud call. An exit server made before the lists were
    /// narrowed keeps serving (a policy change must not cut traffic); only new ones are held to them.
    fn own_provider(&self) -> Result<Arc<dyn HostProvider>, Blocked> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        if self.status().host_id.is_none() {
            plan::allowed(tunnel, &ctx.settings.allowed_sizes, &ctx.settings.allowed_regions)?;
        }
        plan::provider_for(tunnel, self.status(), &ctx.providers)
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
        let server = desired::exit_server(want.forwarded(), &credentials, settings.control_port, settings.health_port);
        let (mut server, source_ranges) =
            ranges::restrict(server, &self.tunnel.spec.source_ranges).map_err(Failure::Blocked)?;
        server.services.extend(pool::desired::member_services(
            &credentials,
            &want.pool.members,
            &want.pool.ranges,
            want.binds(),
        ));
        // New keys (the Secret was re-created, now or in a reconcile that failed after) mean the
        // running server must get the new configuration: status remembers the host's keys' digest,
        // which on a pool's shared server covers its members too.
        let credentials_digest = plan::credentials_digest(&credentials);
        let digest =
            pool::desired::server_digest(&credentials_digest, &want.pool.members, &want.pool.ranges, want.binds());
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

    /// The Service's cluster IP, where the tunnel client forwards (nothing on a pool's shared
    /// server: its client forwards no port).
    fn cluster_ip(&self, want: &Desired) -> Result<String, Failure> {
        let Some(service) = &want.service else { return Ok(String::new()) };
        let cluster_ip = service.spec.as_ref().and_then(|s| s.cluster_ip.clone()).filter(|ip| ip != "None");
        cluster_ip.ok_or_else(|| {
            let svc_name = self.tunnel.spec.service_name().unwrap_or_default();
            Failure::Blocked(Blocked(
                TunnelPhase::Failed,
                Reason::InvalidService,
                format!("Service {svc_name} has no cluster IP (headless); the tunnel client forwards to it"),
            ))
        })
    }
}
