//! The desired stage of an ExitServerPool's shared server ([`TunnelSpec::carries_pool`]): a Tunnel
//! in skyport's own namespace, controlled by its pool, whose ports are its members'. Every later
//! stage is the spine's: the server is filled, checked through the carrier's own client (which
//! carries the health check alone), replaced and budgeted as any Tunnel's.
//!
//! [`TunnelSpec::carries_pool`]: crate::crd::tunnel::TunnelSpec::carries_pool

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;

use super::{Carried, Desired, Failure, Pass};
use crate::controllers::pool::admit::{self, Admission, Rules};
use crate::controllers::tunnel::placement::Placement;
use crate::controllers::tunnel::plan::Blocked;
use crate::controllers::tunnel::{Context, act, desired};
use crate::crd::pool::{ExitServerPool, PoolAddressing};
use crate::crd::tunnel::{HighAvailabilityMode, Tunnel, TunnelPhase, TunnelPort};
use crate::error::Error;
use crate::reasons::Reason;

/// Why a `PerService` pool is not a `BothAddresses` pair: each member would need an address per
/// server, which skyport does not reserve.
const BOTH_ADDRESSES: &str = "addressing PerService moves every member's address to the active server of an ActiveStandby pair; highAvailability mode BothAddresses is not available with it: use mode ActiveStandby, or addressing Shared";

impl Pass<'_> {
    /// The pool, its members and the ports each gets, checked before any cloud call.
    pub(super) fn carrier_desired(&self, pool_name: &str) -> Result<Desired, Failure> {
        let (tunnel, ctx) = (self.tunnel, self.ctx);
        let ns = crate::controllers::context::namespace_of(tunnel)?;
        let uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
        let blocked = |phase, reason, message| Failure::Blocked(Blocked(phase, reason, message));
        let misplaced = |why: &str| {
            let message = format!(
                "{why}: a Tunnel without spec.serviceRef runs an ExitServerPool's shared server, which only skyport makes; name the Service to expose in spec.serviceRef"
            );
            blocked(TunnelPhase::Failed, Reason::NotAPoolServer, message)
        };
        if ctx.settings.pools_namespace().as_deref() != Some(ns.as_str()) {
            return Err(misplaced("not in skyport's own namespace"));
        }
        let Some(pool) = ctx.pools.get(&ObjectRef::new(pool_name)) else {
            let message = format!("ExitServerPool {pool_name} does not exist");
            return Err(blocked(TunnelPhase::Pending, Reason::PoolNotFound, message));
        };
        if !act::serves(tunnel, &pool, Some(ns.as_str())) {
            return Err(misplaced("not controlled by its ExitServerPool"));
        }
        let members = admissions(ctx, &pool, &self.status().pool_members);
        let member_ranges = ranges(ctx, &members);
        let ports = carried_ports(&members);
        let provider = self.own_provider().map_err(Failure::Blocked)?;
        let at = Placement::of(tunnel, ctx.settings.client_namespace.as_deref())?;
        // Published by the members themselves; before a server of this one goes, it unpublishes.
        let members_shown = super::published_members(self.status(), ctx);
        let member_binds = match pool.spec.addressing {
            PoolAddressing::Shared => None,
            PoolAddressing::PerService => {
                let unavailable = |why| blocked(TunnelPhase::Failed, Reason::PoolAddressingUnavailable, why);
                let paired = tunnel.spec.high_availability.as_ref().map(|h| h.mode);
                if paired == Some(HighAvailabilityMode::BothAddresses) {
                    // Admission refuses it too (the pool's CEL rules); a pool made before them is told here.
                    return Err(unavailable(BOTH_ADDRESSES.into()));
                }
                let pool_addresses = provider.capabilities().pool_addresses;
                pool_addresses.per_service(provider.name(), paired.is_some()).map_err(unavailable)?;
                Some(BTreeMap::new())
            }
        };
        let pool = Carried { members, ranges: member_ranges, shown: members_shown, binds: member_binds };
        Ok(Desired { service: None, publishes: false, provider, at, uid, ports, pool })
    }
}

impl Pass<'_> {
    /// Under `addressing: PerService`, refuses the members past the addresses of their own one
    /// server of the carrier's size holds ([`providers::HostProvider::member_addresses_limit`]:
    /// EC2's private IPv4s per interface), before anything records what members get, and takes
    /// their ports off the server's: a Service past the limit is told so, is exposed nowhere, and
    /// never fails the pass that serves the others.
    pub(super) async fn cap_member_addresses(&self, want: &mut Desired) -> Result<(), Failure> {
        if want.pool.binds.is_none() {
            return Ok(());
        }
        let spec = &self.tunnel.spec;
        let limit = want.provider.member_addresses_limit(spec.region.as_deref(), spec.size.as_deref()).await;
        let Some(limit) = limit.map_err(Error::from)? else { return Ok(()) };
        let holding = self.status().member_addresses.iter().map(|a| a.uid.clone()).collect();
        let members = super::member::with_uids(self.ctx, want.pool.members.keys().map(String::as_str));
        let created = members.iter().filter_map(|m| {
            let created = m.metadata.creation_timestamp.as_ref().map(|t| t.0.to_string());
            Some((m.metadata.uid.clone()?, created.unwrap_or_default()))
        });
        admit::cap_addresses(&mut want.pool.members, limit, &holding, &created.collect());
        want.ports = carried_ports(&want.pool.members);
        Ok(())
    }
}

/// The ports the shared server exposes: each carried member's, once.
fn carried_ports(members: &BTreeMap<String, Admission>) -> Vec<TunnelPort> {
    let mut ports: Vec<TunnelPort> = members.values().flat_map(|a| a.ports().iter().cloned()).collect();
    ports.sort();
    ports.dedup();
    ports
}

/// What the shared server does for each live member of `pool`. A member whose Service is missing
/// or cannot be tunnelled claims nothing: it reports that itself.
fn admissions(
    ctx: &Context,
    pool: &ExitServerPool,
    recorded: &[crate::crd::tunnel::PoolMember],
) -> BTreeMap<String, Admission> {
    let name = pool.name_any();
    let members = ctx.tunnels.state().into_iter().filter(|t| {
        !t.spec.carries_pool()
            && t.metadata.deletion_timestamp.is_none()
            && t.spec.pool.as_ref().is_some_and(|p| p.name == name)
    });
    let claims: Vec<admit::Claim> = members.filter_map(|m| admit::claim_of(&m, wants(ctx, &m)?, recorded)).collect();
    let rules = Rules {
        allowed_namespaces: pool.spec.allowed_namespaces.iter().cloned().collect(),
        health_ports: pool.spec.health_ports.range(),
        per_service: pool.spec.addressing == PoolAddressing::PerService,
    };
    admit::admit(&rules, &claims)
}

/// Each carried member's source ranges (its `spec.sourceRanges`, canonical; the API server
/// checked they are CIDRs), by UID.
fn ranges(ctx: &Context, members: &BTreeMap<String, Admission>) -> BTreeMap<String, Vec<String>> {
    let of = |member: Arc<Tunnel>| {
        let mut ranges: Vec<String> =
            member.spec.source_ranges.iter().filter_map(|r| providers::cidr::canonical(r).ok()).collect();
        ranges.sort();
        ranges.dedup();
        Some((member.metadata.uid.clone()?, ranges))
    };
    super::member::with_uids(ctx, members.keys().map(String::as_str)).into_iter().filter_map(of).collect()
}

/// The ports a member's Service asks for, as its own Tunnel would expose them.
fn wants(ctx: &Context, member: &Arc<Tunnel>) -> Option<Vec<TunnelPort>> {
    let service = ctx.services.get(&ObjectRef::new(member.spec.service_name()?).within(&member.namespace()?))?;
    crate::controllers::service::desired::served(&service, &ctx.settings).ok()?;
    let ports = desired::service_ports(&service, ctx.settings.control_port, ctx.settings.health_port).ok()?;
    desired::proxied(ports, member.spec.proxy_protocol).ok()
}
