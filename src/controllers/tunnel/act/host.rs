//! Writes at the provider: the exit server created, replaced or reconfigured, each with its
//! Event. The spine ([`super::super::phases`]) decides the step and records it in status.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;

use providers::exit::userdata::{ExitServer, render_cloud_config_on};
use providers::hosts::TAG_TUNNEL_SLOT;
use providers::{Address, Host, HostProvider, HostRequest};
use tracing::{info, warn};

use super::super::placement::SLOTS;
use super::super::status::describe;
use super::super::{Context, desired};
use super::delete_unpublished;
use crate::crd::tunnel::{Tunnel, TunnelPort};
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// Deletes hosts beyond the first carrying this Tunnel's UID (see `observe::Found`). The Service
/// may name one of them (it was the first before), so its address goes first; the kept host's is
/// published again once its tunnel passes the health check.
pub async fn delete_extras(
    provider: &dyn HostProvider,
    extras: &[Host],
    shown: &[&Service],
    ctx: &Context,
) -> Result<()> {
    for extra in extras {
        warn!(host = %extra.id, "deleting a second exit server carrying this Tunnel's UID");
        delete_unpublished(provider, &extra.id, shown, ctx).await?;
    }
    Ok(())
}

/// Deletes an exit server that can no longer carry traffic (stopped, archived), with a Warning
/// Event: a new one is created next.
pub async fn replace_lost(
    tunnel: &Tunnel,
    provider: &dyn HostProvider,
    (id, why): (&str, &str),
    shown: &[&Service],
    ctx: &Context,
) -> Result<()> {
    warn!(host = %id, why, "replacing exit server");
    ctx.publish(tunnel, Reason::ExitServerLost, format!("{why}; provisioning a new one")).await;
    delete_unpublished(provider, id, shown, ctx).await
}

/// Pushes the Service's new `ports` to the running exit server `id`. `Ok(true)`: it runs with
/// them now. `Ok(false)`: it cannot take the push, so it was deleted (a new one comes next).
pub async fn reconfigure(
    tunnel: &Tunnel,
    provider: &dyn HostProvider,
    (id, server, ports): (&str, &ExitServer, &[TunnelPort]),
    shown: &[&Service],
    ctx: &Context,
) -> Result<bool> {
    if provider.reconfigure(id, server).await? {
        info!(host = %id, ?ports, "reconfigured exit server");
        let note = format!("exit server {id} now exposes {}", describe(ports));
        ctx.publish(tunnel, Reason::PortsChanged, note).await;
        return Ok(true);
    }
    let why = format!(
        "the Service's ports changed to {} and exit server {id} at {} does not take the new \
         configuration (no config push reached it, or it holds other credentials)",
        describe(ports),
        provider.name()
    );
    ctx.publish(tunnel, Reason::Replacing, format!("{why}; replacing it")).await;
    delete_unpublished(provider, id, shown, ctx).await?;
    Ok(false)
}

/// Deletes an exit server whose tunnel never came up (or stopped working) for too long, with a
/// Warning Event (`reason`: the side at fault) on the Tunnel and its Service, after taking its
/// address off the Services that show it (`shown`).
pub async fn replace_unhealthy(
    tunnel: &Tunnel,
    (service, shown): (Option<&Service>, &[&Service]),
    provider: &dyn HostProvider,
    (id, reason, why): (Option<&str>, Reason, &str),
    ctx: &Context,
) -> Result<()> {
    let note = format!("{why}; replacing the exit server");
    warn!(host = ?id, why, "replacing an exit server whose tunnel is down");
    ctx.publish(tunnel, reason, note.clone()).await;
    if let Some(service) = service {
        ctx.publish_on(&kube::Resource::object_ref(service, &()), reason, note).await;
    }
    if let Some(id) = id {
        delete_unpublished(provider, id, shown, ctx).await?;
    }
    Ok(())
}

/// Creates the exit server, tagged with the Tunnel's UID and this cluster's id
/// ([`desired::tags`]). A reserved address bound to a region takes the host there when the Tunnel
/// names no region; the region is immutable, so one named already holds both. A pair's host
/// (`slot`) is made to take the moved address as the provider's capabilities say
/// ([`providers::MovedAddress::setup`]).
pub async fn create(
    tunnel: &Tunnel,
    provider: &dyn HostProvider,
    server: &ExitServer,
    (address, slot): (Option<&Address>, Option<&str>),
    ctx: &Context,
) -> Result<Host> {
    let ns = tunnel.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let artifacts = ctx.settings.exit_server_artifacts().map_err(|e| Error::Internal(e.to_string()))?;
    crate::tunnel::verify::before_create(provider, &artifacts, &ctx.settings).await?;
    // Only a pair that moves its reserved address (not one publishing both servers' own).
    let moved_ip = address.filter(|_| slot.is_some()).map(|a| a.ip.as_str());
    let moved = provider.capabilities().moved_address.setup(moved_ip).map_err(Error::Internal)?;
    // Where the cloud's firewall enforces the ranges (EC2), the host's own admits anyone (but
    // on a pool member's own address: see `for_cloud_firewall`).
    let on_host =
        if provider.capabilities().host_enforces_source_ranges { server.clone() } else { server.for_cloud_firewall() };
    let user_data = render_cloud_config_on(&on_host, &artifacts, &moved.on_interface)
        .map_err(|e| Error::Internal(format!("user data: {e}")))?;
    let region = match (&tunnel.spec.region, address) {
        (Some(region), _) => Some(region.clone()),
        (None, Some(a)) => provider.address_region(&a.id).await?,
        (None, None) => None,
    };
    let mut tags = desired::tags(tunnel, &ctx.cluster_id)?;
    let mut name = desired::host_name(&ns, &tunnel.name_any());
    if let Some(slot) = slot {
        tags.insert(TAG_TUNNEL_SLOT.to_string(), slot.to_string());
        name = format!("{}-{slot}", name.trim_end_matches('-'));
    }
    tags.extend(moved.tags);
    // A single server comes up with the reserved address where the provider binds it at creation
    // (a pair's servers keep their own, the address moves between them).
    let address = address.filter(|_| slot.is_none()).map(|a| a.id.clone());
    let (size, server) = (tunnel.spec.size.clone(), server.clone());
    // A pair's slots go to different failure domains where the provider has them.
    let failure_domain = slot.and_then(|s| SLOTS.iter().position(|known| *known == s));
    let request = HostRequest { name, region, size, user_data, server, tags, address, failure_domain };
    let created = provider.create(&request).await?;
    info!(host = %created.id, provider = provider.name(), "created exit server");
    Ok(created)
}

/// Whether `host` can answer on the reserved address `ip` ([`create`] made it to, where the
/// provider needs that: [`providers::MovedAddress::carried_by`]).
pub fn carries(provider: &dyn HostProvider, host: &Host, ip: Option<&str>) -> bool {
    provider.capabilities().moved_address.carried_by(host, ip)
}
