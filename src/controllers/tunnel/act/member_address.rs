//! Writes at the provider for the addresses a pool's shared server holds for its members under
//! `addressing: PerService`: each reserved tagged with the shared server's owner tags (so the orphan
//! sweep releases it once that Tunnel is gone) and the member's UID ([`TAG_POOL_MEMBER`]), found
//! again by those tags before another is reserved, so a lost answer never becomes a second address.

use kube::ResourceExt;
use providers::hosts::{TAG_CLUSTER, TAG_DELETION_POLICY, TAG_POOL_MEMBER, TAG_TUNNEL_UID};
use providers::{Address, AddressRequest, HostProvider};
use tracing::info;

use super::super::{Context, desired};
use crate::crd::tunnel::Tunnel;
use crate::error::{Error, Result};

/// Member `member`'s address on `carrier`'s server: the one of `listed` (the carrier's member
/// addresses, [`listed`]) tagged for it, else a new one. Movable where the provider assigns
/// member addresses to the server ([`providers::hosts::PoolAddresses::Assigned`]).
pub async fn reserve_for_member(
    carrier: &Tunnel,
    member: &str,
    listed: &[Address],
    provider: &dyn HostProvider,
    ctx: &Context,
) -> Result<Address> {
    let uid = carrier.uid().ok_or(Error::MissingObjectKey("uid"))?;
    if let Some(found) = listed.iter().find(|a| member_of(a, &uid, ctx) == Some(member)) {
        return Ok(found.clone());
    }
    let ns = carrier.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let mut tags = desired::tags(carrier, &ctx.cluster_id)?;
    tags.insert(TAG_DELETION_POLICY.into(), "Delete".into());
    tags.insert(TAG_POOL_MEMBER.into(), member.into());
    let request = AddressRequest {
        name: desired::host_name(&ns, &format!("{}-{}", carrier.name_any(), short(member))),
        region: carrier.spec.region.clone(),
        tags,
        host_id: None,
        movable: provider.capabilities().pool_addresses.assigned(),
    };
    let address = provider.reserve_address(&request).await?;
    info!(address = %address.id, ip = %address.ip, member, "reserved a pool member's own address");
    Ok(address)
}

/// Assigns member address `address` to the shared server's host `host_id` unless the provider
/// says it is there already (a new host after a replacement gets every one again). The host is
/// read first and must carry `carrier_uid`'s owner tag: `host_id` comes from status, which whoever
/// may write Tunnel status could point at another server. Whether it was assigned now.
pub async fn assign_to(
    address: &Address,
    (host_id, carrier_uid): (&str, &str),
    provider: &dyn HostProvider,
) -> Result<bool> {
    if address.host_id.as_deref() == Some(host_id) {
        return Ok(false);
    }
    let Some(host) = provider.get(host_id).await? else { return Ok(false) };
    if !super::super::observe::tagged_for(&host.tags, carrier_uid) {
        return Ok(false);
    }
    provider.assign_address(&address.id, host_id).await?;
    info!(address = %address.id, ip = %address.ip, host = host_id, "assigned a pool member's address to the shared server");
    Ok(true)
}

/// The member addresses of `carrier`'s server as the provider's tags prove them: one read, the
/// proof every bind, assignment and release of a recorded address needs (whoever may write
/// Tunnel status could name any address there).
pub async fn listed(carrier: &Tunnel, provider: &dyn HostProvider, ctx: &Context) -> Result<Vec<Address>> {
    of_carrier(provider, &carrier.uid().unwrap_or_default(), ctx).await
}

/// Whether the status entry (`member`, `id`, `ip`) is one of `listed`, tagged for that member.
pub fn proves(listed: &[Address], carrier: &Tunnel, (member, id, ip): (&str, &str, &str), ctx: &Context) -> bool {
    let uid = carrier.uid().unwrap_or_default();
    listed.iter().any(|a| a.id == id && a.ip == ip && member_of(a, &uid, ctx) == Some(member))
}

/// Releases every member address of the shared server `carrier_uid` (it is being deleted, its
/// servers are gone).
pub async fn release_all(provider: &dyn HostProvider, carrier_uid: &str, ctx: &Context) -> Result<()> {
    for address in of_carrier(provider, carrier_uid, ctx).await? {
        release(provider, &address.id).await?;
    }
    Ok(())
}

/// Releases one member address; one already gone is released.
pub async fn release(provider: &dyn HostProvider, id: &str) -> Result<()> {
    match provider.release_address(id).await {
        Ok(()) | Err(providers::HostError::NotFound { .. }) => {
            info!(address = %id, "released a pool member's address");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The member addresses tagged for the shared server `carrier_uid` in this cluster.
async fn of_carrier(provider: &dyn HostProvider, carrier_uid: &str, ctx: &Context) -> Result<Vec<Address>> {
    let listed = provider.list_addresses_by_tag(TAG_TUNNEL_UID, carrier_uid).await?;
    Ok(listed.into_iter().filter(|a| member_of(a, carrier_uid, ctx).is_some()).collect())
}

/// The member (its UID) an address is tagged for, if its tags say it is a member address of the
/// shared server `carrier_uid` in this cluster: the one proof of ownership every write here needs.
fn member_of<'a>(address: &'a Address, carrier_uid: &str, ctx: &Context) -> Option<&'a str> {
    let tag = |k: &str| address.tags.get(k).map(String::as_str);
    let ours = tag(TAG_TUNNEL_UID) == Some(carrier_uid) && tag(TAG_CLUSTER) == Some(ctx.cluster_id.as_str());
    tag(TAG_POOL_MEMBER).filter(|_| ours)
}

/// The first characters of a UID: enough to tell a pool's members apart in a provider's console.
fn short(uid: &str) -> &str {
    uid.get(..8).unwrap_or(uid)
}
