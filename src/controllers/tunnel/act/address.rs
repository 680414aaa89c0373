//! Writes at the provider for the reserved address: reserved, assigned to a running exit server,
//! or (where it comes only at creation) the exit server replaced until it holds it, each with its
//! Event. The spine ([`super::super::phases`]) decides the step and records it in status.

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use providers::{Address, AddressRequest, HostProvider};
use tracing::{info, warn};

use super::super::plan::policy::Policy;
use super::super::{Context, desired};
use super::{delete_unpublished, unpublish_before_delete};
use crate::crd::tunnel::Tunnel;
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// Releases reserved addresses beyond the first carrying this Tunnel's UID.
pub async fn release_extras(provider: &dyn HostProvider, extras: &[Address]) -> Result<()> {
    for extra in extras {
        warn!(address = %extra.id, "releasing a second reserved address carrying this Tunnel's UID");
        provider.release_address(&extra.id).await?;
    }
    Ok(())
}

/// The recorded address `ip` was released outside skyport: off the Services that show it at once
/// (it may be someone else's now), with a Warning Event; another is reserved next.
pub async fn lost(tunnel: &Tunnel, ip: &str, shown: &[&Service], ctx: &Context) -> Result<()> {
    for service in shown {
        unpublish_before_delete(service, ctx).await?;
    }
    let note = format!("reserved address {ip} was released outside skyport; reserving another (a new address)");
    ctx.publish(tunnel, Reason::AddressLost, note).await;
    Ok(())
}

/// Reserves the Tunnel's address (onto host `onto` if set). The caller records it in status at
/// once, so a crash never reserves a second one.
pub async fn reserve(
    tunnel: &Tunnel,
    provider: &dyn HostProvider,
    onto: Option<String>,
    ctx: &Context,
) -> Result<Address> {
    let ns = tunnel.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let request = AddressRequest {
        name: desired::host_name(&ns, &tunnel.name_any()),
        region: tunnel.spec.region.clone(),
        tags: desired::tags(tunnel, &ctx.cluster_id)?,
        host_id: onto,
        movable: Policy::of(&tunnel.spec).moves_address(),
    };
    let address = provider.reserve_address(&request).await?;
    info!(address = %address.id, ip = %address.ip, provider = provider.name(), "reserved an address");
    let note = format!("reserved address {} ({}) at {}", address.ip, address.id, provider.name());
    ctx.publish(tunnel, Reason::AddressReserved, note).await;
    Ok(address)
}

/// Assigns `address` to the running exit server `host_id`.
pub async fn assign(
    tunnel: &Tunnel,
    provider: &dyn HostProvider,
    address: &Address,
    host_id: &str,
    ctx: &Context,
) -> Result<()> {
    provider.assign_address(&address.id, host_id).await?;
    info!(address = %address.id, host = %host_id, "assigned the reserved address");
    let note = format!("assigned reserved address {} to exit server {host_id}", address.ip);
    ctx.publish(tunnel, Reason::AddressAssigned, note).await;
    Ok(())
}

/// Deletes exit server `id`, which can get the reserved address only at creation.
pub async fn replace_host(
    tunnel: &Tunnel,
    provider: &dyn HostProvider,
    (id, why): (&str, &str),
    shown: &[&Service],
    ctx: &Context,
) -> Result<()> {
    warn!(host = %id, why, "replacing the exit server to give it the reserved address");
    ctx.publish(tunnel, Reason::Replacing, format!("{why}; replacing it")).await;
    delete_unpublished(provider, id, shown, ctx).await
}
