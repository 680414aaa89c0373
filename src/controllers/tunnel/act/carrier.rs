//! The one write a pool member makes beyond its own objects: its pool's shared-server Tunnel,
//! made with the pool's first member.

use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Preconditions};
use tracing::info;

use super::super::Context;
use crate::controllers::owned;
use crate::crd::pool::ExitServerPool;
use crate::crd::tunnel::{PoolRef, Tunnel, TunnelSpec};
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
