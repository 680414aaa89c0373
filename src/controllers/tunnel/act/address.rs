//! Writes at the provider for the reserved address: reserved, assigned to each running exit
//! server, or (where it comes only at creation) the exit server replaced until it holds it.
//! Each reservation is recorded in status at once, so a crash never reserves a second one.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::events::EventType;
use providers::hosts::{TAG_CLUSTER, TAG_DELETION_POLICY, owner_tags};
use providers::{Address, AddressRequest, HostProvider};
use tracing::{info, warn};

use super::super::plan::address::{self as plan, AddressStep};
use super::super::status::{Writer, not_ready};
use super::super::{Context, desired};
use crate::crd::tunnel::{Tunnel, TunnelPhase};
use crate::error::{Error, Result};

/// Where the address stands after [`converge`].
pub enum AddressReached {
    /// On the running exit server: `ip` is the Tunnel's address.
    Ready { ip: String },
    /// The exit server was deleted to get the address at creation: look again soon.
    HostReplaced,
}

/// The tags of the Tunnel's reserved address (and, on providers whose addresses carry their
/// host's tags, of its hosts): the owner's, the cluster's and the deletion policy.
pub fn tags(tunnel: &Tunnel, cluster_id: &str) -> Result<std::collections::BTreeMap<String, String>> {
    let ns = tunnel.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let mut tags = owner_tags(&uid, &ns, &tunnel.name_any());
    tags.insert(TAG_CLUSTER.to_string(), cluster_id.to_string());
    tags.insert(TAG_DELETION_POLICY.to_string(), format!("{:?}", tunnel.spec.address_deletion_policy()));
    Ok(tags)
}

/// Before the exit server is stepped, for a Tunnel with a reserved address: finds it, takes a
/// released one off the Service, releases duplicates, and reserves the address where the
/// provider needs it first. Returns the address (`None` without one, or not yet reserved).
pub async fn prepare(
    tunnel: &Tunnel,
    provider: &Arc<dyn HostProvider>,
    uid: &str,
    publishes: Option<&k8s_openapi::api::core::v1::Service>,
    ctx: &Context,
    status: &mut Writer<'_>,
) -> Result<Option<Address>> {
    if !tunnel.spec.reserves_address() {
        return Ok(None);
    }
    let found = super::super::observe::find_address(provider.as_ref(), status.current(), uid).await?;
    for extra in &found.extras {
        warn!(address = %extra.id, "releasing a second reserved address carrying this Tunnel's UID");
        provider.release_address(&extra.id).await?;
    }
    let recorded = status.current().address_id.clone();
    if plan::lost(recorded.as_deref(), found.address.as_ref()) {
        if let Some(service) = publishes {
            super::unpublish_before_delete(service, ctx).await?;
        }
        let old = status.current().address_ip.clone().unwrap_or_default();
        let note = format!("reserved address {old} was released outside skyport; reserving another (a new address)");
        ctx.publish(tunnel, EventType::Warning, "AddressLost", note).await;
        status
            .write(|s| {
                s.address_id = None;
                s.address_ip = None;
            })
            .await?;
    }
    match found.address {
        Some(address) => Ok(Some(address)),
        None if plan::reserve_first(provider.address_binding(), None) => {
            reserve(tunnel, provider.as_ref(), None, ctx, status).await.map(Some)
        }
        None => Ok(None),
    }
}

/// Steps the address toward the running exit server `(host_id, host_ip)`; without a reserved
/// address the Tunnel's address is the host's own.
pub async fn converge(
    tunnel: &Tunnel,
    provider: &Arc<dyn HostProvider>,
    mut address: Option<Address>,
    (host_id, host_ip): (&str, String),
    publishes: Option<&k8s_openapi::api::core::v1::Service>,
    ctx: &Context,
    status: &mut Writer<'_>,
) -> Result<AddressReached> {
    if !tunnel.spec.reserves_address() {
        return Ok(AddressReached::Ready { ip: host_ip });
    }
    // Read before the host was created or replaced: where a new host takes the address at
    // creation, only a fresh read shows it there.
    if let Some(stale) = address.as_ref().filter(|a| a.host_id.as_deref() != Some(host_id)) {
        address = provider.get_address(&stale.id).await?;
    }
    for _ in 0..3 {
        match plan::address_step(provider.address_binding(), address.as_ref(), host_id) {
            AddressStep::Ready { ip } => return Ok(AddressReached::Ready { ip }),
            AddressStep::Reserve { onto } => {
                address = Some(reserve(tunnel, provider.as_ref(), onto, ctx, status).await?);
            }
            AddressStep::Assign { id, host_id } => {
                provider.assign_address(&id, &host_id).await?;
                info!(address = %id, host = %host_id, "assigned the reserved address");
                let ip = address.as_ref().map(|a| a.ip.clone()).unwrap_or_default();
                let note = format!("assigned reserved address {ip} to exit server {host_id}");
                ctx.publish(tunnel, EventType::Normal, "AddressAssigned", note).await;
                address = address.map(|a| Address { host_id: Some(host_id), ..a });
            }
            AddressStep::ReplaceHost { id, why } => {
                warn!(host = %id, why, "replacing the exit server to give it the reserved address");
                ctx.publish(tunnel, EventType::Normal, "Replacing", format!("{why}; replacing it")).await;
                super::host::delete_unpublished(provider.as_ref(), &id, publishes, ctx).await?;
                status
                    .write(|s| {
                        s.phase = Some(TunnelPhase::Provisioning);
                        s.host_id = None;
                        s.host_ip = None;
                        s.conditions = not_ready("Replacing", &why);
                    })
                    .await?;
                return Ok(AddressReached::HostReplaced);
            }
        }
    }
    Err(Error::Host(providers::HostError::Unavailable {
        provider: provider.name(),
        message: "the reserved address did not reach the exit server".into(),
    }))
}

/// Reserves the Tunnel's address (onto host `onto` if set) and records it in status at once.
async fn reserve(
    tunnel: &Tunnel,
    provider: &dyn HostProvider,
    onto: Option<String>,
    ctx: &Context,
    status: &mut Writer<'_>,
) -> Result<Address> {
    let ns = tunnel.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let request = AddressRequest {
        name: desired::host_name(&ns, &tunnel.name_any()),
        region: tunnel.spec.region.clone(),
        tags: tags(tunnel, &ctx.cluster_id)?,
        host_id: onto,
    };
    let address = provider.reserve_address(&request).await?;
    info!(address = %address.id, ip = %address.ip, provider = provider.name(), "reserved an address");
    let provider_name = provider.name().to_string();
    status
        .write(|s| {
            s.provider = Some(provider_name);
            s.address_id = Some(address.id.clone());
            s.address_ip = Some(address.ip.clone());
        })
        .await?;
    let note = format!("reserved address {} ({}) at {}", address.ip, address.id, provider.name());
    ctx.publish(tunnel, EventType::Normal, "AddressReserved", note).await;
    Ok(address)
}
