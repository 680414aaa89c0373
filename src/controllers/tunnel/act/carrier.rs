//! The one write a pool member makes beyond its own objects: its pool's shared-server Tunnel,
//! made with the pool's first member.

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::reflector::ObjectRef;
use serde_json::json;
use tracing::info;

use super::super::Context;
use crate::controllers::owned;
use crate::crd::pool::{ExitServerPool, ExitServerPoolStatus, PoolAddressing};
use crate::crd::tunnel::{
    HighAvailabilityMode, PoolMember, PoolRef, Tunnel, TunnelPhase, TunnelPort, TunnelSpec, TunnelStatus,
};
use crate::error::Result;

/// Creates `pool`'s shared-server Tunnel `ns/name`: controlled by the pool (so it goes with the
/// pool), labelled skyport's, its placement copied from the pool's spec. `Ok(false)`: it exists
/// already.
pub async fn create_carrier(pool: &ExitServerPool, ns: &str, name: &str, ctx: &Context) -> Result<bool> {
    let mut metadata = owned::meta(pool, name, [])?;
    metadata.namespace = Some(ns.to_string());
    let spec = TunnelSpec {
        service_ref: None,
        provider: pool.spec.provider.clone(),
        region: pool.spec.region.clone(),
        size: pool.spec.size.clone(),
        address: pool.spec.address.clone(),
        high_availability: pool.spec.high_availability.clone(),
        pool: Some(PoolRef { name: pool.name_any() }),
        ..TunnelSpec::default()
    };
    let carrier = Tunnel { metadata, spec, status: None };
    let created = owned::create(&Api::<Tunnel>::namespaced(ctx.client.clone(), ns), &carrier, &ctx.api_writes).await?;
    if created {
        info!(pool = %pool.name_any(), tunnel = %format!("{ns}/{name}"), "made the pool's shared exit server's Tunnel");
    }
    Ok(created)
}

/// Deletes the shared-server Tunnel `carrier` once no member is left (by UID precondition, so a
/// new one made meanwhile stays); its finalizer then deletes the exit server.
pub async fn retire_carrier(carrier: &Tunnel, ctx: &Context) -> Result<()> {
    let ns = carrier.namespace().unwrap_or_default();
    let uid = carrier.metadata.uid.clone();
    let params =
        DeleteParams { preconditions: Some(Preconditions { uid, resource_version: None }), ..Default::default() };
    info!(tunnel = %format!("{ns}/{}", carrier.name_any()), "the pool has no member left: deleting its shared exit server");
    match Api::<Tunnel>::namespaced(ctx.client.clone(), &ns).delete(&carrier.name_any(), &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Whether `tunnel` is `pool`'s shared server: in skyport's namespace for them (`namespace`) and
/// controlled by this very pool (its UID).
pub fn serves(tunnel: &Tunnel, pool: &ExitServerPool, namespace: Option<&str>) -> bool {
    let Some(uid) = pool.metadata.uid.as_deref() else { return false };
    let controlled = tunnel
        .owner_references()
        .iter()
        .any(|r| r.kind == "ExitServerPool" && r.uid == uid && r.controller == Some(true));
    controlled && namespace.is_some() && tunnel.namespace().as_deref() == namespace
}

/// Where the Active shared server publishes its members: a `BothAddresses` pair's servers whose
/// check passes, each at its own address; else the reserved address, or the single server's own.
fn served_at(carrier: &Tunnel, status: &TunnelStatus) -> Vec<String> {
    let both = carrier.spec.high_availability.as_ref().is_some_and(|ha| ha.mode == HighAvailabilityMode::BothAddresses);
    if both {
        let servers = status.high_availability.iter().flat_map(|ha| &ha.servers);
        return servers.filter(|s| s.healthy).filter_map(|s| s.host_ip.clone()).collect();
    }
    status.address_ip.clone().or_else(|| status.host_ip.clone()).into_iter().collect()
}

/// Writes the pool's status from its shared server's `status` when it differs: the address once
/// the server is Active, how many members it carries and their ports (not whose), and the
/// server's Ready condition.
pub async fn publish_pool(carrier: &Tunnel, status: &TunnelStatus, ctx: &Context) -> Result<()> {
    let Some(name) = carrier.spec.pool.as_ref().map(|p| p.name.clone()) else { return Ok(()) };
    let Some(pool) = ctx.pools.get(&ObjectRef::new(&name)) else { return Ok(()) };
    // Only the pool's own shared server speaks for it: a Tunnel anyone else wrote naming the pool
    // (refused as NotAPoolServer) must not overwrite the pool's status.
    if !serves(carrier, &pool, ctx.settings.pools_namespace().as_deref()) {
        return Ok(());
    }
    let active = status.phase == Some(TunnelPhase::Active);
    let carried: Vec<&PoolMember> = status.pool_members.iter().filter(|m| !m.ports.is_empty()).collect();
    let mut ports: Vec<TunnelPort> = carried.iter().flat_map(|m| m.ports.iter().cloned()).collect();
    ports.sort();
    ports.dedup();
    // Members' own addresses stay off the pool's status: every allowed namespace reads it, and
    // would learn which addresses share its server.
    let shared = pool.spec.addressing == PoolAddressing::Shared;
    let addresses = if active && shared { served_at(carrier, status) } else { Vec::new() };
    let want = ExitServerPoolStatus {
        address: addresses.first().cloned(),
        addresses,
        members: Some(u32::try_from(carried.len()).unwrap_or(u32::MAX)),
        ports,
        conditions: status.conditions.clone(),
    };
    if pool.status.as_ref() == Some(&want) {
        return Ok(());
    }
    // Every field named, so a merge patch also clears what is gone.
    let patch = json!({"status": {
        "address": want.address, "addresses": want.addresses, "members": want.members, "ports": want.ports,
        "conditions": want.conditions,
    }});
    Api::<ExitServerPool>::all(ctx.client.clone())
        .patch_status(&name, &PatchParams::default(), &Patch::Merge(patch))
        .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::tunnel::{HighAvailability, HighAvailabilityStatus, ServerStatus};

    fn carrier(mode: Option<HighAvailabilityMode>) -> Tunnel {
        let spec = TunnelSpec { high_availability: mode.map(|mode| HighAvailability { mode }), ..Default::default() };
        Tunnel::new("pool-shared", spec)
    }

    #[test]
    fn a_pool_shows_every_address_its_members_are_published_at() {
        let single = TunnelStatus { host_ip: Some("192.0.2.1".into()), ..Default::default() };
        assert_eq!(served_at(&carrier(None), &single), ["192.0.2.1"]);
        let reserved = TunnelStatus { address_ip: Some("198.51.100.9".into()), ..single };
        assert_eq!(served_at(&carrier(Some(HighAvailabilityMode::ActiveStandby)), &reserved), ["198.51.100.9"]);

        let server = |slot: &str, ip: &str, healthy| ServerStatus {
            slot: slot.into(),
            host_ip: Some(ip.into()),
            healthy,
            ..Default::default()
        };
        let servers = vec![server("a", "192.0.2.1", true), server("b", "192.0.2.2", true)];
        let mut both = TunnelStatus {
            host_ip: Some("192.0.2.1".into()),
            high_availability: Some(HighAvailabilityStatus { servers, ..Default::default() }),
            ..Default::default()
        };
        let pair = carrier(Some(HighAvailabilityMode::BothAddresses));
        assert_eq!(served_at(&pair, &both), ["192.0.2.1", "192.0.2.2"]);
        // A server whose check fails carries no member: the pool does not show it.
        both.high_availability.as_mut().unwrap().servers[0].healthy = false;
        assert_eq!(served_at(&pair, &both), ["192.0.2.2"]);
    }
}
