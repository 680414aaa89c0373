//! Writes at the provider: the exit server created, replaced or reconfigured until it runs with
//! the Service's ports. Each step that changes the host is recorded in status and an Event.

use std::sync::Arc;

use kube::ResourceExt;
use kube::runtime::events::EventType;
use providers::hosts::{TAG_CLUSTER, owner_tags};
use providers::userdata::{ExitServer, render_cloud_config};
use providers::{Host, HostProvider, HostRequest};
use tracing::{info, warn};

use super::super::plan::{self, HostStep};
use super::super::status::{Writer, describe, not_ready};
use super::super::{Context, desired};
use crate::crd::tunnel::{Tunnel, TunnelPhase, TunnelPort};
use crate::error::{Error, Result};

/// Where the exit server stands after [`converge`].
pub enum Reached {
    /// Running with the Service's ports at `ip`.
    Ready { ip: String, id: Option<String> },
    /// Booting (or being deleted): look again soon.
    Waiting,
}

/// What the exit server must be.
pub struct Want<'a> {
    pub provider: &'a Arc<dyn HostProvider>,
    pub server: &'a ExitServer,
    pub ports: &'a [TunnelPort],
    /// The ports the running server was last configured with (empty: unknown, reconfigure).
    pub configured: Vec<TunnelPort>,
    /// The Service whose address this Tunnel publishes (`None`: another Tunnel controls it).
    pub publishes: Option<&'a k8s_openapi::api::core::v1::Service>,
    /// [`plan::credentials_digest`] of the credentials in `server`.
    pub digest: &'a str,
    /// The Tunnel's reserved address, whose holder a new host may have to wait for.
    pub address: Option<&'a str>,
}

/// Takes the address off the Service while no host serves it.
async fn unpublish(want: &Want<'_>, ctx: &Context) -> Result<()> {
    match want.publishes {
        Some(service) => super::set_ingress(service, None, ctx).await,
        None => Ok(()),
    }
}

/// Deletes host `id` after taking its address off the Service (see
/// [`super::unpublish_before_delete`]), and forgets its health clock.
pub(super) async fn delete_unpublished(
    provider: &dyn HostProvider,
    id: &str,
    publishes: Option<&k8s_openapi::api::core::v1::Service>,
    ctx: &Context,
) -> Result<()> {
    if let Some(service) = publishes {
        super::unpublish_before_delete(service, ctx).await?;
    }
    provider.delete(id).await?;
    ctx.failing.forget(id);
    Ok(())
}

/// Deletes hosts beyond the first carrying this Tunnel's UID (see `observe::Found`). The Service
/// may name one of them (it was the first before), so its address goes first; the kept host's is
/// published again once its tunnel passes the health check.
pub async fn delete_extras(
    provider: &dyn HostProvider,
    extras: &[Host],
    publishes: Option<&k8s_openapi::api::core::v1::Service>,
    ctx: &Context,
) -> Result<()> {
    for extra in extras {
        warn!(host = %extra.id, "deleting a second exit server carrying this Tunnel's UID");
        delete_unpublished(provider, &extra.id, publishes, ctx).await?;
    }
    Ok(())
}

/// Steps the exit server found (`host`) toward `want`: create, replace, reconfigure, until it is
/// ready or must be waited for.
pub async fn converge(
    tunnel: &Tunnel,
    mut host: Option<Host>,
    mut want: Want<'_>,
    ctx: &Context,
    status: &mut Writer<'_>,
) -> Result<Reached> {
    let provider = want.provider;
    let ports = want.ports;
    let mut steps = 0;
    loop {
        steps += 1;
        if steps > 4 {
            // A provider handing back hosts that are stopped at once: do not spin.
            return Err(Error::Host(providers::HostError::Unavailable {
                provider: provider.name(),
                message: "the exit server did not reach a usable state".into(),
            }));
        }
        match plan::host_step(host.as_ref(), &want.configured, ports) {
            HostStep::Ready { ip } => return Ok(Reached::Ready { ip, id: host.as_ref().map(|h| h.id.clone()) }),
            HostStep::Wait { why } => {
                unpublish(&want, ctx).await?;
                let id = host.as_ref().map(|h| h.id.clone());
                status
                    .write(|s| {
                        s.phase = Some(TunnelPhase::Provisioning);
                        s.provider = Some(provider.name().to_string());
                        s.host_id = id;
                        s.conditions = not_ready("Provisioning", &why);
                    })
                    .await?;
                return Ok(Reached::Waiting);
            }
            HostStep::Create => {
                unpublish(&want, ctx).await?;
                if let Some(why) = address_held(provider.as_ref(), want.address).await? {
                    status
                        .write(|s| {
                            s.phase = Some(TunnelPhase::Provisioning);
                            s.host_id = None;
                            s.conditions = not_ready("Provisioning", &why);
                        })
                        .await?;
                    return Ok(Reached::Waiting);
                }
                let created = create(tunnel, provider.as_ref(), want.server, want.address, ctx).await?;
                // Recorded before anything else can fail: a restart finds this host, not a new one.
                status
                    .write(|s| {
                        s.phase = Some(TunnelPhase::Provisioning);
                        s.provider = Some(provider.name().to_string());
                        s.host_id = Some(created.id.clone());
                        s.host_ip = created.public_ipv4.clone();
                        s.ports = ports.to_vec();
                        s.credentials_digest = Some(want.digest.to_string());
                        s.conditions = not_ready("Provisioning", &format!("created exit server {}", created.id));
                    })
                    .await?;
                let note = format!("created exit server {} at {}", created.id, provider.name());
                ctx.publish(tunnel, EventType::Normal, "Provisioning", note).await;
                want.configured = ports.to_vec();
                host = Some(created);
            }
            HostStep::Replace { id, why } => {
                warn!(host = %id, why, "replacing exit server");
                let note = format!("{why}; provisioning a new one");
                ctx.publish(tunnel, EventType::Warning, "ExitServerLost", note).await;
                delete_unpublished(provider.as_ref(), &id, want.publishes, ctx).await?;
                host = None;
            }
            HostStep::Reconfigure { id, ip: _ } => {
                if provider.reconfigure(&id, want.server).await? {
                    info!(host = %id, ?ports, "reconfigured exit server");
                    let note = format!("exit server {id} now exposes {}", describe(ports));
                    ctx.publish(tunnel, EventType::Normal, "PortsChanged", note).await;
                    status
                        .write(|s| {
                            s.ports = ports.to_vec();
                            s.credentials_digest = Some(want.digest.to_string());
                        })
                        .await?;
                    want.configured = ports.to_vec();
                } else {
                    let why = format!(
                        "the Service's ports changed to {} and exit server {id} at {} does not take the new \
                         configuration (no config push reached it, or it holds other credentials)",
                        describe(ports),
                        provider.name()
                    );
                    ctx.publish(tunnel, EventType::Normal, "Replacing", format!("{why}; replacing it")).await;
                    delete_unpublished(provider.as_ref(), &id, want.publishes, ctx).await?;
                    host = None;
                }
            }
        }
    }
}

/// Why a new host must wait for the reserved address `id` ([`plan::address::may_create`]), read
/// fresh: the host that held it may have just been deleted.
async fn address_held(provider: &dyn HostProvider, id: Option<&str>) -> Result<Option<String>> {
    let Some(id) = id.filter(|_| provider.address_binding() == providers::AddressBinding::AtCreate) else {
        return Ok(None);
    };
    let address = provider.get_address(id).await?;
    Ok(plan::address::may_create(provider.address_binding(), address.as_ref()).err())
}

/// Deletes an exit server whose tunnel never came up (or stopped working) for too long, with a
/// Warning Event on the Tunnel and the Service, after taking its address off the Service when
/// this Tunnel `publishes` it.
pub async fn replace_unhealthy(
    tunnel: &Tunnel,
    service: &k8s_openapi::api::core::v1::Service,
    publishes: bool,
    provider: &dyn HostProvider,
    id: Option<&str>,
    why: &str,
    ctx: &Context,
) -> Result<()> {
    let note = format!("{why}; replacing the exit server");
    warn!(host = ?id, why, "replacing an exit server whose tunnel is down");
    ctx.publish(tunnel, EventType::Warning, "TunnelNotEstablished", note.clone()).await;
    ctx.publish_on(&kube::Resource::object_ref(service, &()), EventType::Warning, "TunnelNotEstablished", note).await;
    if let Some(id) = id {
        delete_unpublished(provider, id, publishes.then_some(service), ctx).await?;
    }
    Ok(())
}

/// Creates the exit server, tagged with the Tunnel's UID and this cluster's id.
/// A reserved address bound to a region (DigitalOcean) takes the host there when the Tunnel
/// names no region; the region is immutable, so one named already holds both.
async fn create(
    tunnel: &Tunnel,
    provider: &dyn HostProvider,
    server: &ExitServer,
    address: Option<&str>,
    ctx: &Context,
) -> Result<Host> {
    let ns = tunnel.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let uid = tunnel.uid().ok_or(Error::MissingObjectKey("uid"))?;
    let artifacts = ctx.settings.exit_server_artifacts().map_err(|e| Error::InvalidSpec(e.to_string()))?;
    crate::tunnel::verify::before_create(provider, &artifacts, &ctx.settings).await?;
    let user_data = render_cloud_config(server, &artifacts).map_err(|e| Error::InvalidSpec(e.to_string()))?;
    // A Tunnel with a reserved address tags its hosts like the address: a DigitalOcean reserved
    // IP carries no tags of its own, only its droplet's.
    let tags = if tunnel.spec.reserves_address() {
        super::address::tags(tunnel, &ctx.cluster_id)?
    } else {
        let mut tags = owner_tags(&uid, &ns, &tunnel.name_any());
        tags.insert(TAG_CLUSTER.to_string(), ctx.cluster_id.clone());
        tags
    };
    let region = match (&tunnel.spec.region, address) {
        (Some(region), _) => Some(region.clone()),
        (None, Some(id)) => provider.address_region(id).await?,
        (None, None) => None,
    };
    let request = HostRequest {
        name: desired::host_name(&ns, &tunnel.name_any()),
        region,
        size: tunnel.spec.size.clone(),
        user_data,
        server: server.clone(),
        tags,
    };
    let created = provider.create(&request).await?;
    info!(host = %created.id, provider = provider.name(), "created exit server");
    Ok(created)
}
