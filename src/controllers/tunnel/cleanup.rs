//! Deleting a Tunnel: the Service's ingress is cleared, its reserved address released (or kept,
//! with `deletionPolicy: Retain`, or for the Service's next Tunnel while the Service still asks for
//! one), its exit servers and a client in the clients' namespace deleted, then the finalizer goes.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::controller::Action;
use providers::hosts::TAG_DELETION_POLICY;
use tracing::info;

use super::phases::Pass;
use super::placement::Placement;
use super::plan::address::keep_for_successor;
use super::plan::policy::Policy;
use super::plan::{Blocked, provider_for};
use super::status::not_ready;
use super::{Context, FINALIZER, act, desired};
use crate::controllers::{has_finalizer, object_key, remove_finalizer};
use crate::crd::tunnel::{AddressDeletionPolicy, Tunnel, TunnelPhase, TunnelStatus};
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// Deletes the exit server (the recorded one and any other carrying the Tunnel's UID), clears the
/// Service's ingress if this Tunnel set it, and releases the finalizer. A host already gone counts
/// as deleted; a provider that is not configured keeps the finalizer (deleting the Tunnel then
/// would leak the host), with the reason in status.
pub async fn cleanup(tunnel: &Tunnel, api: &Api<Tunnel>, ctx: &Context) -> Result<Action> {
    if !has_finalizer(tunnel, FINALIZER) {
        return Ok(Action::await_change());
    }
    // A pool member leaving frees its ports on the shared server at once.
    super::phases::wake_carrier(tunnel, ctx);
    let mut pass = Pass::new(tunnel, api, ctx);
    let uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let at = (tunnel.metadata.namespace.as_deref().unwrap_or_default(), tunnel.name_any());
    ctx.unserved.forget(&uid, (at.0, &at.1));
    ctx.failovers.remove((at.0, &at.1));
    ctx.pair_views.forget(&uid);
    let recorded_host = pass.status().host_id.clone();
    let reserving = pass.status().address_reservation.is_some();
    let provider = match provider_for(tunnel, pass.status(), &ctx.providers) {
        Ok(p) => Some(p),
        // Never created a host: nothing to delete.
        Err(_) if recorded_host.is_none() && pass.status().address_id.is_none() && !reserving => None,
        Err(Blocked(_, reason, message)) => {
            let message = format!("{message}; the exit server cannot be deleted, so the Tunnel is kept");
            pass.record(|s| {
                s.phase = Some(TunnelPhase::Deleting);
                s.conditions = not_ready(reason, &message);
            })
            .await?;
            return Ok(Action::requeue(Duration::from_secs(60)));
        }
    };
    pass.record(|s| {
        s.phase = Some(TunnelPhase::Deleting);
        s.conditions = not_ready(Reason::Deleting, "deleting the exit server");
    })
    .await?;
    // The address goes off the Service before the host goes: once released, the IP may be
    // someone else's, and must never be advertised as this Service's.
    if let Some(service) = &pass.service
        && desired::controls_service_status(tunnel, service)
    {
        act::unpublish_before_delete(service, ctx).await?;
    }
    // A pool's shared server: its members' Services show its address too.
    if tunnel.spec.carries_pool() {
        for service in super::phases::published_members(pass.status(), ctx) {
            act::unpublish_before_delete(&service, ctx).await?;
        }
    }
    // An address made by a reservation whose answer was lost is found before it is released.
    if let Some(provider) = &provider
        && reserving
    {
        pass.settle_reservation(provider.as_ref()).await?;
    }
    if let Some(provider) = &provider
        && (tunnel.spec.reserves_address() || pass.status().address_id.is_some())
    {
        let keep = keep_for_successor(
            service_asks(tunnel, pass.service.as_deref(), ctx),
            provider.capabilities().address_binding,
        );
        // The Service's annotation proves a handed-over address ([`observe::find_address`]).
        let service = pass.service.as_deref().filter(|s| desired::controls_service_status(tunnel, s));
        addresses(tunnel, provider.as_ref(), (&uid, keep), (ctx, service), pass.status()).await?;
    }
    if let Some(provider) = provider {
        // The id in status counts only if the host carries this Tunnel's tag: whoever may write
        // `tunnels/status` could name another Tunnel's exit server there.
        let mut ids = Vec::new();
        if let Some(id) = recorded_host
            && let Some(host) = provider.get(&id).await?
            && super::observe::tagged_for(&host.tags, &uid)
        {
            ids.push(host.id);
        }
        for host in provider.list_by_tag(providers::hosts::TAG_TUNNEL_UID, &uid).await? {
            if !ids.contains(&host.id) {
                ids.push(host.id);
            }
        }
        for id in &ids {
            provider.delete(id).await?;
            ctx.health.forget(id);
            info!(host = %id, provider = provider.name(), "deleted exit server");
        }
        if !ids.is_empty() {
            let note = format!("deleted exit server {}", ids.join(", "));
            ctx.publish(tunnel, Reason::Deleted, note).await;
        }
        // A PerService pool's member addresses, now that no server of it listens on them (found
        // by their tags, so one whose reservation answer was lost goes too).
        if tunnel.spec.carries_pool() && provider.capabilities().pool_addresses.several() {
            act::member_address::release_all(provider.as_ref(), &uid, ctx).await?;
        }
        // What kept a pair's servers apart (a spread placement group) goes after them; retried
        // while a server is still being deleted.
        if Policy::of(&tunnel.spec).spreads() {
            provider.delete_placement(&uid).await?;
        }
    }
    // The client has nothing left to connect to; in the clients' namespace nothing else
    // would delete it.
    act::delete_client(&Placement::of(tunnel, ctx.settings.client_namespace.as_deref())?, ctx).await?;
    // Conditional on the version our own status write produced, not the one we were handed.
    let mut current = tunnel.clone();
    current.metadata.resource_version = pass.resource_version();
    ctx.api_writes.inc();
    remove_finalizer(api, &current, FINALIZER).await?;
    let key = object_key(tunnel);
    ctx.backoff.reset(&key);
    ctx.written.forget(&key);
    Ok(Action::await_change())
}

/// Whether the Service that controls `tunnel` still asks for a Tunnel: it exists, is served and
/// is not being deleted. The Service controller deletes a Tunnel only when that is no longer so;
/// otherwise it was deleted by hand (or with a stolen token), and a new one follows at once.
fn service_asks(tunnel: &Tunnel, service: Option<&Service>, ctx: &Context) -> bool {
    service.is_some_and(|s| {
        desired::controls_service_status(tunnel, s)
            && s.metadata.deletion_timestamp.is_none()
            && crate::controllers::service::desired::served(s, &ctx.settings).is_ok()
    })
}

/// Releases the Tunnel's reserved addresses (the recorded one and any carrying its UID), or with
/// `Retain`, or kept for the Service's next Tunnel (`keep`), only says where they are. Done before
/// the hosts go: a DigitalOcean reserved IP is found by its droplet's tags.
async fn addresses(
    tunnel: &Tunnel,
    provider: &dyn providers::HostProvider,
    (uid, keep): (&str, bool),
    (ctx, service): (&Context, Option<&Service>),
    status: &TunnelStatus,
) -> Result<()> {
    let at = (tunnel.namespace().unwrap_or_default(), tunnel.name_any());
    let named = service.and_then(crate::controllers::service::desired::named_address);
    let found =
        match super::observe::find_address(provider, status, uid, (&at.0, &at.1), (named, &ctx.cluster_id)).await {
            Ok(found) => found,
            // A provider without reserved addresses never reserved one: it must not keep the Tunnel.
            Err(Error::Host(providers::HostError::Invalid { .. })) if status.address_id.is_none() => {
                return Ok(());
            }
            Err(e) => return Err(e),
        };
    let all: Vec<_> = found.address.into_iter().chain(found.extras).collect();
    if all.is_empty() {
        return Ok(());
    }
    let names = all.iter().map(|a| format!("{} ({})", a.ip, a.id)).collect::<Vec<_>>().join(", ");
    // An address tagged Retain (this Tunnel's policy, or one handed over by name) is never
    // released by skyport: whoever named it manages it.
    let tagged_retain = all.iter().any(|a| a.tags.get(TAG_DELETION_POLICY).is_some_and(|p| p == "Retain"));
    if tunnel.spec.address_deletion_policy() == AddressDeletionPolicy::Retain || tagged_retain {
        info!(addresses = %names, provider = provider.name(), "keeping the reserved address (Retain)");
        let note = format!(
            "kept reserved address {names} at {} (deletionPolicy Retain); release it there when no longer needed",
            provider.name()
        );
        ctx.publish(tunnel, Reason::AddressRetained, note).await;
        return Ok(());
    }
    if keep {
        info!(addresses = %names, provider = provider.name(), "keeping the reserved address for the Service's next Tunnel");
        let note = format!(
            "kept reserved address {names} for the Service's next Tunnel: the Service still asks for one (delete the Service, or change its type or class, to release it)"
        );
        ctx.publish(tunnel, Reason::AddressKept, note).await;
        return Ok(());
    }
    for address in &all {
        provider.release_address(&address.id).await?;
        info!(address = %address.id, provider = provider.name(), "released the reserved address");
    }
    ctx.publish(tunnel, Reason::AddressReleased, format!("released reserved address {names}")).await;
    Ok(())
}
