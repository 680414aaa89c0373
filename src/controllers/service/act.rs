//! Writes: creating and deleting the Service's Tunnel, with an Event on the Service.

use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use tracing::{info, warn};

use super::Context;
use super::desired::tunnel_for;
use crate::controllers::owned;
use crate::crd::tunnel::{ProxyProtocol, Tunnel};
use crate::error::{Error, Result};
use crate::reasons::Reason;

/// Creates the Tunnel for `service`. One created meanwhile (the cache lags our own writes) is fine.
/// An annotation skyport cannot read is the Service owner's to fix: a Warning Event on the
/// Service says which, and nothing is retried until the Service changes.
pub async fn create(service: &Service, api: &Api<Tunnel>, ctx: &Context) -> Result<()> {
    let tunnel = match tunnel_for(service) {
        Ok(tunnel) => tunnel,
        Err(Error::InvalidSpec(why)) => {
            warn!(why, "cannot make a Tunnel from the Service's annotations");
            let note = format!("{why}; no Tunnel is made until the annotation is fixed");
            ctx.publish(service, Reason::InvalidAnnotation, note).await;
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let name = tunnel.name_any();
    if owned::create(api, &tunnel, &ctx.api_writes).await? {
        info!(tunnel = %name, "created Tunnel for LoadBalancer Service");
        ctx.publish(service, Reason::TunnelCreated, format!("created Tunnel {name}")).await;
    }
    Ok(())
}

/// Sets the Tunnel's `spec.sourceRanges` to the Service's (a merge patch of that field only).
pub async fn set_source_ranges(
    service: &Service,
    name: &str,
    ranges: &[String],
    api: &Api<Tunnel>,
    ctx: &Context,
) -> Result<()> {
    info!(tunnel = %name, ?ranges, "the Service's source ranges changed");
    let patch = serde_json::json!({"spec": {"sourceRanges": ranges}});
    ctx.api_writes.inc();
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        // Gone meanwhile: it is made again, with these ranges.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(kube::Error::Api(e)) if e.code == 422 => {
            let note = format!("Tunnel {name} refused the source ranges {ranges:?}: {}", e.message);
            ctx.publish(service, Reason::InvalidSourceRanges, note).await;
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    let note = format!("Tunnel {name} admits the Service's ports from {}", describe_ranges(ranges));
    ctx.publish(service, Reason::SourceRangesChanged, note).await;
    Ok(())
}

/// Sets the Tunnel's `spec.proxyProtocol` to the annotation's (a merge patch of that field only;
/// `null` removes it).
pub async fn set_proxy_protocol(
    service: &Service,
    name: &str,
    version: Option<ProxyProtocol>,
    api: &Api<Tunnel>,
    ctx: &Context,
) -> Result<()> {
    info!(tunnel = %name, ?version, "the Service's PROXY protocol annotation changed");
    let patch = serde_json::json!({"spec": {"proxyProtocol": version}});
    ctx.api_writes.inc();
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        // Gone meanwhile: it is made again, with this value.
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
        Err(e) => return Err(e.into()),
    }
    let now = version.map_or("no PROXY protocol header".to_string(), |v| {
        format!("PROXY protocol {}", providers::ProxyProtocol::from(v).as_str())
    });
    ctx.publish(service, Reason::ProxyProtocolChanged, format!("Tunnel {name} now asks for {now}")).await;
    Ok(())
}

/// Says on the Service that an annotation of a Service with a Tunnel cannot be read; the Tunnel
/// keeps its spec.
pub async fn invalid_annotation(service: &Service, name: &str, why: &str, ctx: &Context) {
    warn!(tunnel = %name, why, "cannot read the Service's annotations");
    let note = format!("{why}; the Tunnel {name} keeps its spec until the annotation is fixed");
    ctx.publish(service, Reason::InvalidAnnotation, note).await;
}

/// `anywhere` for no ranges, else the list.
pub fn describe_ranges(ranges: &[String]) -> String {
    if ranges.is_empty() { "anywhere".into() } else { ranges.join(", ") }
}

/// Deletes the Tunnel `name` (its finalizer deletes the exit server). An Event tells why,
/// unless the Service itself is going.
pub async fn delete(service: &Service, name: &str, why: &str, api: &Api<Tunnel>, ctx: &Context) -> Result<()> {
    info!(tunnel = %name, why, "Service no longer served; deleting its Tunnel");
    ctx.api_writes.inc();
    match api.delete(name, &DeleteParams::foreground()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => return Err(e.into()),
    }
    if service.meta().deletion_timestamp.is_none() {
        let note = format!("deleted Tunnel {name}: {why}");
        ctx.publish(service, Reason::TunnelDeleted, note).await;
    }
    Ok(())
}
