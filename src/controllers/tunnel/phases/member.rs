//! The phases of a Service on an ExitServerPool's shared server (`spec.pool` with a
//! `serviceRef`), after the credentials. It buys nothing itself:
//!
//! 1. the pool allows its namespace, checked before anything is made;
//! 2. the pool's shared server: its Tunnel ([`carrier`](super::carrier)) is made with the first
//!    member, in skyport's own namespace, controlled by the pool;
//! 3. what that server does for this member, as the server's status records it: its ports and
//!    health port, or why not;
//! 4. its own client, with its own token ([`member_token`]), dialing the shared server's own
//!    address; a client per server when the pool is a pair, as a pair's own clients are;
//! 5. checked end to end on its own health port, through its own clients alone, at each address
//!    it would publish ([`Route`]);
//! 6. those addresses that passed, with its own ports, on its Service, and status.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::ObjectRef;
use providers::exit::userdata::render_client_toml;

use super::super::observe::{self, SecretState};
use super::super::placement::{KEY_CLIENT, Placement, SLOTS, fit_label};
use super::super::plan::Blocked;
use super::super::{act, desired, status};
use super::{BOOT_POLL, Desired, Failure, HEALTH_POLL, Keys, Pass};
use crate::controllers::jittered;
use crate::controllers::pool::desired::{MemberClient, member_client, member_token};
use crate::controllers::status::ObjectStatus;
use crate::crd::condition::{Condition, ConditionStatus};
use crate::crd::pool::{ExitServerPool, PoolAddressing};
use crate::crd::tunnel::{HighAvailabilityMode, PoolMember, Tunnel, TunnelPhase};
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// The name of `pool`'s shared-server Tunnel.
pub fn carrier_name(pool: &str) -> String {
    fit_label(&format!("pool-{pool}"))
}

/// Has every member of the shared server `carrier` look at it again when a pass moved it to other
/// addresses (a new server, a failover, a member's own address reserved or released): a member
/// publishes only where its check passes, and must not keep showing an address its server left.
pub fn wake_members_if_moved(
    carrier: &Tunnel,
    after: &crate::crd::tunnel::TunnelStatus,
    ctx: &crate::controllers::tunnel::Context,
) {
    let before = carrier.status.clone().unwrap_or_default();
    let addresses = |s: &crate::crd::tunnel::TunnelStatus| {
        let servers = s
            .high_availability
            .as_ref()
            .map(|h| (h.active.clone(), h.servers.iter().map(|v| v.host_ip.clone()).collect::<Vec<_>>()));
        (s.host_ip.clone(), s.address_ip.clone(), servers, s.member_addresses.clone())
    };
    if addresses(&before) == addresses(after) {
        return;
    }
    wake(ctx, &with_uids(ctx, after.pool_members.iter().map(|m| m.uid.as_str())));
}

/// The Tunnels in the cache whose UID is one of `uids` (a shared server's members).
pub fn with_uids<'a>(
    ctx: &crate::controllers::tunnel::Context,
    uids: impl IntoIterator<Item = &'a str>,
) -> Vec<Arc<Tunnel>> {
    let uids: std::collections::BTreeSet<&str> = uids.into_iter().collect();
    ctx.tunnels.state().into_iter().filter(|t| t.metadata.uid.as_deref().is_some_and(|u| uids.contains(u))).collect()
}

/// Has each of `tunnels` reconciled again now.
pub fn wake(ctx: &crate::controllers::tunnel::Context, tunnels: &[Arc<Tunnel>]) {
    for tunnel in tunnels {
        let _ = ctx.wakes.unbounded_send(ObjectRef::from_obj(&**tunnel));
    }
}

/// The Services of the shared server's members (as its `status` records them) whose ingress
/// skyport writes: before the server goes, its address comes off them.
pub fn published_members(
    status: &crate::crd::tunnel::TunnelStatus,
    ctx: &crate::controllers::tunnel::Context,
) -> Vec<Arc<k8s_openapi::api::core::v1::Service>> {
    let members = with_uids(ctx, status.pool_members.iter().map(|m| m.uid.as_str()));
    let service_of = |member: Arc<Tunnel>| {
        let service = ctx.services.get(&ObjectRef::new(member.spec.service_name()?).within(&member.namespace()?))?;
        desired::controls_service_status(&member, &service).then_some(service)
    };
    members.into_iter().filter_map(service_of).collect()
}

/// Has the shared server of the pool `member` names look at its members now: the member joined,
/// changed its ports, or is leaving.
pub fn wake_carrier(member: &Tunnel, ctx: &crate::controllers::tunnel::Context) {
    let (Some(pool), Some(ns)) = (member.spec.pool.as_ref(), ctx.settings.pools_namespace()) else { return };
    if member.spec.service_ref.is_some() {
        let _ = ctx.wakes.unbounded_send(ObjectRef::new(&carrier_name(&pool.name)).within(&ns));
    }
}

impl Pass<'_> {
    /// The phases after the credentials, for a Service on `pool`'s shared server. One the pool
    /// does not carry (any more) has its address withdrawn: it no longer leads to the Service.
    pub(super) async fn member(&mut self, want: &Desired, keys: &Keys, pool: &str) -> Result<Action, Failure> {
        match self.member_phases(want, keys, pool).await {
            Err(Failure::Blocked(blocked)) => Err(self.withdrawn(want, blocked).await),
            other => other,
        }
    }

    /// `blocked` reported, after [`Pass::off_the_pool`].
    async fn withdrawn(&mut self, want: &Desired, blocked: Blocked) -> Failure {
        match self.off_the_pool(want).await {
            Ok(()) => Failure::Blocked(blocked),
            Err(e) => e,
        }
    }

    /// The Service's address and the Tunnel's recorded server cleared: the address no longer
    /// leads to the Service, as a Tunnel's own address leaves its Service when its check fails.
    async fn off_the_pool(&mut self, want: &Desired) -> Result<(), Failure> {
        self.unpublish(want).await?;
        self.record(|s| {
            s.host_ip = None;
            s.ports = Vec::new();
        })
        .await?;
        Ok(())
    }

    async fn member_phases(&mut self, want: &Desired, keys: &Keys, pool: &str) -> Result<Action, Failure> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let found = self.pool_allowing(pool)?;
        let Some(carrier) = self.carrier(&found).await? else {
            // Being made, or going: whatever address the Service shows leads nowhere now.
            self.off_the_pool(want).await?;
            return Ok(Action::requeue(BOOT_POLL));
        };
        let uid = want.uid.as_str();
        let entry = carrier.status.as_ref().and_then(|s| s.pool_members.iter().find(|m| m.uid == uid).cloned());
        if entry.as_ref().is_none_or(|e| e.ports != want.ports && e.refused.is_none()) {
            wake_carrier(tunnel, ctx);
        }
        let waiting = entry.as_ref().and_then(|e| e.refused.clone()).map(|why| format!("; the edit waits: {why}"));
        let Some((ports, health_port)) = carried(entry, pool).map_err(Failure::Blocked)? else {
            let message = format!("waiting for the shared exit server of ExitServerPool {pool} to take the Service");
            self.off_the_pool(want).await?;
            self.report(TunnelPhase::Provisioning, Reason::Provisioning, &message).await?;
            return Ok(Action::requeue(BOOT_POLL));
        };
        let own = match found.spec.addressing {
            PoolAddressing::Shared => None,
            PoolAddressing::PerService => match own_address(&carrier, uid) {
                Some(ip) => Some(ip),
                None => {
                    let message = format!(
                        "waiting for the shared exit server of ExitServerPool {pool} to reserve the Service's own address"
                    );
                    self.off_the_pool(want).await?;
                    self.report(TunnelPhase::Provisioning, Reason::Provisioning, &message).await?;
                    return Ok(Action::requeue(BOOT_POLL));
                }
            },
        };
        let Some(route) = route(&carrier, own) else {
            let message =
                format!("the shared exit server of ExitServerPool {pool} is not running yet{}", why_not(&carrier));
            self.off_the_pool(want).await?;
            self.report(TunnelPhase::Provisioning, Reason::Provisioning, &message).await?;
            return Ok(Action::requeue(BOOT_POLL));
        };
        let token = self.clients_on((want, keys), &carrier, (&ports, health_port), &route.dials).await?;
        let (passing, failing) = check(ctx, &route.published, health_port, &token).await;
        if passing.is_empty() {
            let mut message =
                format!("the tunnel through the shared exit server does not answer: {}", failing.join("; "));
            // One failed check may be a moment's (the shared server taking another member's
            // change); the address goes when the next check fails too, and the side at fault is
            // looked for then.
            if self.status().not_ready_reason() == Some(Reason::WaitingForTunnel.as_str()) {
                self.off_the_pool(want).await?;
                let clients: Vec<Placement> = route.dials.iter().map(|(slot, _)| placed(&want.at, *slot)).collect();
                let servers: Vec<&str> = route.dials.iter().map(|(_, ip)| ip.as_str()).collect();
                let why = super::console::judge_member(&clients, &servers, ctx).await?;
                message = format!("{message}; {why}");
            }
            self.report(TunnelPhase::Provisioning, Reason::WaitingForTunnel, &message).await?;
            return Ok(Action::requeue(jittered(HEALTH_POLL)));
        }
        if let Some(service) = want.publishes() {
            let passing: Vec<&str> = passing.iter().map(String::as_str).collect();
            act::set_ingress(service, Some(desired::ingress_all(&passing, &ports)), ctx).await?;
        }
        let message = format!(
            "the shared exit server {} of ExitServerPool {pool} forwards {} to Service {}; the tunnel passed its health check{}",
            passing.join(", "),
            status::describe(&ports),
            tunnel.spec.service_name().unwrap_or_default(),
            waiting.unwrap_or_default(),
        );
        let generation = tunnel.metadata.generation;
        self.record(|s| {
            s.phase = Some(TunnelPhase::Active);
            s.host_ip = passing.into_iter().next();
            s.ports = ports;
            s.observed_generation = generation;
            s.conditions = vec![Condition::new("Ready", ConditionStatus::True, Reason::Active.as_str(), message)];
        })
        .await?;
        Ok(Action::requeue(jittered(ctx.settings.resync)))
    }

    /// The pool, once it exists and allows the member's namespace; checked before anything is made.
    fn pool_allowing(&self, pool: &str) -> Result<Arc<ExitServerPool>, Failure> {
        let blocked = |phase, reason, message: String| Failure::Blocked(Blocked(phase, reason, message));
        let Some(found) = self.ctx.pools.get(&ObjectRef::new(pool)) else {
            let message = format!("ExitServerPool {pool} does not exist");
            return Err(blocked(TunnelPhase::Pending, Reason::PoolNotFound, message));
        };
        let ns = self.tunnel.namespace().unwrap_or_default();
        if !found.spec.allowed_namespaces.contains(&ns) {
            let message = format!("ExitServerPool {pool} does not allow namespace {ns} (its spec.allowedNamespaces)");
            return Err(blocked(TunnelPhase::Failed, Reason::PoolNotAllowed, message));
        }
        Ok(found)
    }

    /// The pool's shared-server Tunnel, made if there is none; `None` while it is being made or
    /// replaced.
    async fn carrier(&mut self, pool: &ExitServerPool) -> Result<Option<Arc<Tunnel>>, Failure> {
        let ctx = self.ctx;
        let Some(ns) = ctx.settings.pools_namespace() else {
            let message =
                "skyport knows no namespace of its own for pools' shared servers: set --tunnel-pool-namespace";
            return Err(Failure::Blocked(Blocked(TunnelPhase::Failed, Reason::NotAPoolServer, message.into())));
        };
        let name = carrier_name(&pool.name_any());
        match ctx.tunnels.get(&ObjectRef::new(&name).within(&ns)) {
            Some(carrier) if carrier.metadata.deletion_timestamp.is_none() => Ok(Some(carrier)),
            Some(_) => Ok(None),
            None => {
                act::create_carrier(pool, &ns, &name, ctx).await?;
                Ok(None)
            }
        }
    }

    /// The member's clients, one per server of the shared server (two for a pair, each dialing its
    /// server's own address, as a pair's own clients do), with its own token; its token.
    async fn clients_on(
        &mut self,
        (want, own): (&Desired, &Keys),
        carrier: &Tunnel,
        (ports, health_port): (&[crate::crd::tunnel::TunnelPort], u16),
        dials: &[(Option<&'static str>, String)],
    ) -> Result<String, Failure> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let at = Placement::of(carrier, ctx.settings.client_namespace.as_deref())?;
        let SecretState::Stored(keys) = observe::credentials(&ctx.client, carrier, &at).await? else {
            return Err(Error::Internal("the shared exit server's credentials are not stored yet".into()).into());
        };
        let token = member_token(&keys.credentials, &want.uid);
        let cluster_ip = self.cluster_ip(want)?;
        let mut configs = std::collections::BTreeMap::new();
        let mut deployments = Vec::new();
        for (slot, ip) in dials {
            let member = MemberClient {
                uid: &want.uid,
                ports,
                health_port,
                token: &token,
                server_public_key: &keys.credentials.keypair.public_key,
                remote_addr: format!("{ip}:{}", ctx.settings.control_port),
                cluster_ip: &cluster_ip,
            };
            let toml = render_client_toml(&member_client(&member))
                .map_err(|e| Error::Internal(format!("client config: {e}")))?;
            let placed = placed(&want.at, *slot);
            deployments.push((desired::checksum(&toml), placed.clone()));
            configs.insert(placed.client_key(), toml);
        }
        match configs.remove(KEY_CLIENT) {
            Some(toml) if own.stored_client.as_deref() != Some(toml.as_str()) => {
                act::write_client_config(tunnel, &want.at, &toml, ctx).await?;
            }
            None if configs != own.stored_pair => {
                act::write_pair_client_config(tunnel, &want.at, &configs, ctx).await?
            }
            _ => {}
        }
        for (checksum, placed) in deployments {
            act::ensure_deployment(tunnel, &placed, &ctx.settings.client_image, &checksum, ctx).await?;
        }
        Ok(token)
    }
}

/// Where the member's client for `slot` of its shared server runs (a single server's: `at`).
fn placed(at: &Placement, slot: Option<&'static str>) -> Placement {
    slot.map_or_else(|| at.clone(), |slot| at.for_slot(slot))
}

/// Where a member's clients dial and what its Service publishes, from its shared server's status.
struct Route {
    /// Each server's slot (none for a single server) and own address.
    dials: Vec<(Option<&'static str>, String)>,
    /// The addresses the member is checked through and, those passing, published on its Service:
    /// the shared address, or a `BothAddresses` pair's two own addresses.
    published: Vec<String>,
}

/// The address the shared server `carrier` reserved for member `uid` (`addressing: PerService`).
fn own_address(carrier: &Tunnel, uid: &str) -> Option<String> {
    let status = carrier.status.as_ref()?;
    status.member_addresses.iter().find(|a| a.uid == uid).map(|a| a.ip.clone())
}

/// The member's [`Route`] on `carrier`, published at `own` when it has an address of its own;
/// `None` while no server of it has an address.
fn route(carrier: &Tunnel, own: Option<String>) -> Option<Route> {
    let route = shared_route(carrier)?;
    match own {
        Some(ip) => Some(Route { published: vec![ip], ..route }),
        None => Some(route),
    }
}

fn shared_route(carrier: &Tunnel) -> Option<Route> {
    let status = carrier.status.clone().unwrap_or_default();
    let Some(pair) = carrier.spec.high_availability.as_ref() else {
        // The client dials the server's own address, as a Tunnel's own client does: a reserved
        // address need not carry the control port (the local provider's carries service ports).
        let own = status.host_ip.clone().or(status.address_ip.clone())?;
        let published = status.address_ip.unwrap_or_else(|| own.clone());
        return Some(Route { dials: vec![(None, own)], published: vec![published] });
    };
    let servers = status.high_availability.map(|h| h.servers).unwrap_or_default();
    let dials: Vec<(Option<&'static str>, String)> = servers
        .into_iter()
        .filter_map(|s| Some((Some(*SLOTS.iter().find(|&&slot| slot == s.slot)?), s.host_ip?)))
        .collect();
    let published: Vec<String> = match pair.mode {
        HighAvailabilityMode::BothAddresses => dials.iter().map(|(_, ip)| ip.clone()).collect(),
        HighAvailabilityMode::ActiveStandby => status.address_ip.into_iter().collect(),
    };
    (!dials.is_empty() && !published.is_empty()).then_some(Route { dials, published })
}

/// The member's health check through each of `addresses`: those passing, and why the others fail.
async fn check(
    ctx: &crate::controllers::tunnel::Context,
    addresses: &[String],
    health_port: u16,
    token: &str,
) -> (Vec<String>, Vec<String>) {
    let (mut passing, mut failing) = (Vec::new(), Vec::new());
    for ip in addresses {
        match ctx.probe.check(ip, health_port, token, std::time::Duration::from_secs(3)).await {
            Ok(()) => passing.push(ip.clone()),
            Err(why) => failing.push(format!("{ip}: {why}")),
        }
    }
    (passing, failing)
}

/// What the shared server's Ready condition says while it does not run: why its members wait.
fn why_not(carrier: &Tunnel) -> String {
    let ready = carrier.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    ready
        .filter(|c| c.status != ConditionStatus::True)
        .map(|c| format!(" ({}: {})", c.reason, c.message))
        .unwrap_or_default()
}

/// The member's ports and health port from its entry in the shared server's status; `None` while
/// it has none; refused with the server's reason when it is not carried at all.
fn carried(
    entry: Option<PoolMember>,
    pool: &str,
) -> Result<Option<(Vec<crate::crd::tunnel::TunnelPort>, u16)>, Blocked> {
    let Some(entry) = entry else { return Ok(None) };
    match (entry.health_port, entry.refused) {
        (Some(port), _) if !entry.ports.is_empty() => Ok(Some((entry.ports, port))),
        (_, Some(why)) => {
            let message = format!("ExitServerPool {pool}: {why}");
            Err(Blocked(TunnelPhase::Failed, Reason::PoolRefused, message))
        }
        _ => Ok(None),
    }
}

#[cfg(test)]
#[path = "member_tests.rs"]
mod tests;
