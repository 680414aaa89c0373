//! Writes: the credentials Secret, the client Deployment, the Service's load-balancer status;
//! [`host`]: the exit server; [`address`]: its reserved address. Each step is one write (and
//! its Event); which step, and what status records of it, is the spine's
//! ([`super::phases`]). Each is written only when it differs from what exists, so an Active
//! Tunnel costs no writes.

pub mod address;
mod carrier;
pub mod host;
pub mod member_address;

pub use carrier::{create_carrier, publish_pool, retire_carrier, serves};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::info;

use super::Context;
use providers::HostProvider;

use super::desired::{self, CHECKSUM_ANNOTATION, Credentials};
use super::placement::{Placement, SLOTS};
use crate::controllers::{FIELD_MANAGER, owned};
use crate::crd::tunnel::Tunnel;
use crate::error::{Error, Result};

/// Creates the Secret with fresh credentials. A Secret that appeared meanwhile (another run)
/// wins: its credentials are read back, so both runs agree.
pub async fn create_secret(tunnel: &Tunnel, at: &Placement, ctx: &Context) -> Result<Option<Credentials>> {
    let credentials = Credentials::generate();
    let secret = desired::secret(tunnel, at, &credentials)?;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &at.namespace);
    Ok(owned::create(&secrets, &secret, &ctx.api_writes).await?.then_some(credentials))
}

/// Deletes a credentials Secret an earlier Tunnel of the same name left (see
/// [`super::observe::SecretState::Stale`]); only that very object (uid precondition), so a
/// Secret made meanwhile survives. Already gone is success.
pub async fn delete_stale_secret(at: &Placement, secret_uid: Option<&str>, ctx: &Context) -> Result<()> {
    let name = &at.secret;
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &at.namespace);
    let params = DeleteParams {
        preconditions: Some(Preconditions { uid: secret_uid.map(str::to_string), resource_version: None }),
        ..Default::default()
    };
    ctx.api_writes.inc();
    match secrets.delete(name, &params).await {
        Ok(_) => {
            info!(secret = %name, "deleted the credentials of an earlier Tunnel of this name");
            Ok(())
        }
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Writes `client_toml` into the Secret ([`desired::client_config`]).
pub async fn write_client_config(tunnel: &Tunnel, at: &Placement, client_toml: &str, ctx: &Context) -> Result<()> {
    apply_secret(at, &desired::client_config(tunnel, at, client_toml)?, ctx).await
}

/// Writes a highly available Tunnel's client configs into the Secret, all in one apply
/// ([`desired::pair_client_config`]).
pub async fn write_pair_client_config(
    tunnel: &Tunnel,
    at: &Placement,
    configs: &std::collections::BTreeMap<String, String>,
    ctx: &Context,
) -> Result<()> {
    apply_secret(at, &desired::pair_client_config(tunnel, at, configs)?, ctx).await
}

/// Server-side apply of `patch` to the Tunnel's credentials Secret.
async fn apply_secret(at: &Placement, patch: &serde_json::Value, ctx: &Context) -> Result<()> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &at.namespace);
    ctx.api_writes.inc();
    secrets.patch(&at.secret, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(patch)).await?;
    Ok(())
}

/// Applies the client Deployment unless the existing one already runs `image` with `checksum`.
/// Returns whether it has an available replica (as the API server last reported).
pub async fn ensure_deployment(
    tunnel: &Tunnel,
    at: &Placement,
    image: &str,
    checksum: &str,
    ctx: &Context,
) -> Result<bool> {
    match deployed(at, image, checksum, ctx).await? {
        Deployed::Current { available, .. } => Ok(available),
        Deployed::Missing | Deployed::Stale => apply_deployment(tunnel, at, image, checksum, ctx).await,
    }
}

/// The client Deployment against what it should be.
pub enum Deployed {
    Missing,
    /// Not this Tunnel's, or another image or config.
    Stale,
    Current {
        /// It has an available replica (as the API server last reported).
        available: bool,
        /// The controller has rolled it out: every replica runs this template and is
        /// available, and no older Pod is left.
        rolled_out: bool,
    },
}

/// Whether the client Deployment exists, is this Tunnel's and runs `image` with `checksum`.
pub async fn deployed(at: &Placement, image: &str, checksum: &str, ctx: &Context) -> Result<Deployed> {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &at.namespace);
    let Some(current) = api.get_opt(&at.deployment).await? else { return Ok(Deployed::Missing) };
    let template = current.spec.as_ref().map(|s| &s.template);
    let sum = template
        .and_then(|t| t.metadata.as_ref())
        .and_then(|m| m.annotations.as_ref())
        .and_then(|a| a.get(CHECKSUM_ANNOTATION));
    let current_image =
        template.and_then(|t| t.spec.as_ref()).and_then(|s| s.containers.first()).and_then(|c| c.image.as_deref());
    match at.is_ours(&current.metadata) && sum.map(String::as_str) == Some(checksum) && current_image == Some(image) {
        true => Ok(Deployed::Current { available: available(&current), rolled_out: rolled_out(&current) }),
        false => Ok(Deployed::Stale),
    }
}

/// Whether the client Deployment at `at` has an available replica, whatever it runs.
pub async fn client_available(at: &Placement, ctx: &Context) -> Result<bool> {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &at.namespace);
    Ok(api.get_opt(&at.deployment).await?.is_some_and(|d| available(&d)))
}

/// Applies the client Deployment; whether it has an available replica.
pub async fn apply_deployment(
    tunnel: &Tunnel,
    at: &Placement,
    image: &str,
    checksum: &str,
    ctx: &Context,
) -> Result<bool> {
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), &at.namespace);
    ctx.api_writes.inc();
    let want = desired::deployment(tunnel, at, image, checksum)?;
    let applied = api.patch(&at.deployment, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&want)).await?;
    Ok(available(&applied))
}

/// Deletes the client Deployment and Secret of a Tunnel that is going, when they live in the
/// clients' namespace (beside the Tunnel the garbage collector does it). Only objects
/// [`Placement::is_ours`] says are this Tunnel's, by UID precondition; already gone is success.
pub async fn delete_client(at: &Placement, ctx: &Context) -> Result<()> {
    if at.beside {
        return Ok(());
    }
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &at.namespace);
    // A highly available Tunnel's clients are one per exit server of the pair.
    for name in [at.deployment.clone(), at.for_slot(SLOTS[0]).deployment, at.for_slot(SLOTS[1]).deployment] {
        if let Some(current) = deployments.get_opt(&name).await?
            && at.is_ours(&current.metadata)
        {
            delete_precisely(&deployments, &name, current.metadata.uid, ctx).await?;
        }
    }
    let tests = at.secret_tests(&<crate::crd::tunnel::Tunnel as Resource>::api_version(&()));
    if let owned::Guarded::Ours(secret) =
        owned::json_patch::<Secret>(&ctx.client, &at.namespace, &at.secret, &tests).await?
        && at.is_ours(&secret.metadata)
    {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &at.namespace);
        delete_precisely(&secrets, &at.secret, secret.metadata.uid, ctx).await?;
    }
    Ok(())
}

/// Deletes `name` only if it still has `uid`; gone is success.
pub async fn delete_precisely<K>(api: &Api<K>, name: &str, uid: Option<String>, ctx: &Context) -> Result<()>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    let params =
        DeleteParams { preconditions: Some(Preconditions { uid, resource_version: None }), ..Default::default() };
    ctx.api_writes.inc();
    match api.delete(name, &params).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => Ok(()),
        Err(e) => Err(e.into()),
    }
}

fn available(deployment: &Deployment) -> bool {
    deployment.status.as_ref().and_then(|s| s.available_replicas).unwrap_or(0) > 0
}

/// The Deployment controller has seen this generation, and its replicas are all of it and
/// available, none older left. Until then a `Recreate` roll may not have stopped the old Pod, and
/// a passing check may still be the old client's.
fn rolled_out(deployment: &Deployment) -> bool {
    let Some(status) = deployment.status.as_ref() else { return false };
    let want = deployment.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    status.observed_generation >= deployment.metadata.generation
        && status.updated_replicas == Some(want)
        && status.replicas == Some(want)
        && status.available_replicas.unwrap_or(0) >= want
}

/// Sets (or with `None` clears) the Service's `status.loadBalancer.ingress`, when it differs.
pub async fn set_ingress(service: &Service, ingress: Option<serde_json::Value>, ctx: &Context) -> Result<()> {
    let ns = service.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let want = ingress.unwrap_or_else(|| json!([]));
    let empty = want.as_array().is_some_and(Vec::is_empty);
    let has_any = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|lb| lb.ingress.as_ref())
        .is_some_and(|i| !i.is_empty());
    if desired::ingress_matches(service, &want) || (empty && !has_any) {
        return Ok(());
    }
    ctx.api_writes.inc();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    // A merge patch replaces the ingress list as a whole; only this field is ours.
    let patch = json!({"status": {"loadBalancer": {"ingress": want}}});
    api.patch_status(&service.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Clears the Service's ingress before a host is deleted, whatever the cache shows: the cache
/// often has not seen skyport's own last publish yet, and a released address must never stay
/// advertised. One write per host deletion; a Service already gone has nothing to clear.
pub async fn unpublish_before_delete(service: &Service, ctx: &Context) -> Result<()> {
    let ns = service.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    ctx.api_writes.inc();
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let patch = json!({"status": {"loadBalancer": {"ingress": []}}});
    match api.patch_status(&service.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map(|_| ()).map_err(Into::into),
    }
}

/// Takes `ip` alone off the Service's ingress before the host holding it goes, keeping the other
/// addresses (a pair's other server). Computed from the cache's copy and written with its
/// resourceVersion, so that a publish the copy has not seen is a conflict (retried, the host kept
/// meanwhile), never overwritten. Nothing is written where the copy does not show `ip`: the pass's
/// own publish takes it off then.
pub async fn withdraw(service: &Service, ip: &str, ctx: &Context) -> Result<()> {
    let ns = service.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let shown = service.status.as_ref().and_then(|s| s.load_balancer.as_ref()).and_then(|lb| lb.ingress.as_ref());
    let shown: Vec<_> = shown.into_iter().flatten().collect();
    let rest: Vec<_> = shown.iter().filter(|i| i.ip.as_deref() != Some(ip)).collect();
    if rest.len() == shown.len() {
        return Ok(());
    }
    ctx.api_writes.inc();
    let version = &service.metadata.resource_version;
    let patch = json!({"metadata": {"resourceVersion": version}, "status": {"loadBalancer": {"ingress": rest}}});
    let api: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    match api.patch_status(&service.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        other => other.map(|_| ()).map_err(Into::into),
    }
}

/// Deletes host `id` after taking its address off the Services that show it (see
/// [`unpublish_before_delete`]), and forgets its health clock.
pub async fn delete_unpublished(
    provider: &dyn HostProvider,
    id: &str,
    shown: &[&Service],
    ctx: &Context,
) -> Result<()> {
    for service in shown {
        unpublish_before_delete(service, ctx).await?;
    }
    provider.delete(id).await?;
    ctx.health.forget(id);
    Ok(())
}
