//! The Service controller: a LoadBalancer Service that skyport serves gets an owned Tunnel named
//! `<service>-tunnel`; one it no longer serves loses it.
//!
//! Which Services are served:
//! - `spec.type: LoadBalancer`, and
//! - `spec.loadBalancerClass: skyport.dev/tunnel`, or no class when skyport runs with
//!   `--default-load-balancer`, and
//! - not annotated `skyport.dev/tunnel: "false"`; with `--annotated-only`, annotated `"true"`.
//!
//! The Tunnel carries a controller reference to the Service, so deleting the Service garbage
//! collects the Tunnel (whose finalizer deletes the exit server), and a deleted Tunnel is made
//! again at once: `kubectl delete tunnel` means "give me a fresh exit server".
//! Annotations `skyport.dev/provider`, `skyport.dev/region`, `skyport.dev/size`,
//! `skyport.dev/address`, `skyport.dev/address-deletion-policy` and
//! `skyport.dev/high-availability` on the Service fill the Tunnel's spec when it is created; its `loadBalancerSourceRanges` become the Tunnel's
//! `spec.sourceRanges` and its `skyport.dev/proxy-protocol` annotation the Tunnel's
//! `spec.proxyProtocol`, both following every change.
//!
//! Stages: [`desired`] (which Services, which Tunnel), [`plan`] (the step), [`act`] (the
//! write); it observes only the Tunnel cache it shares with the Tunnel controller, has no status
//! and nothing to clean up (garbage collection removes the Tunnel).

pub mod act;
pub mod desired;
pub mod plan;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::Api;
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use tracing::debug;

use crate::config::TunnelArgs;
use crate::controllers::context::namespace_of;
use crate::controllers::{Backoff, api_beside, error_policy, object_key, reconcile_with, scoped_api, store_synced};
use crate::crd::tunnel::Tunnel;
use crate::error::Result;

pub use desired::{
    ANNOTATION, ANNOTATION_ADDRESS, ANNOTATION_ADDRESS_DELETION, ANNOTATION_PROVIDER, ANNOTATION_REGION,
    ANNOTATION_SIZE, LOAD_BALANCER_CLASS, served, tunnel_for, tunnel_name,
};

/// The Service controller's context: the shared one, with [`State`].
pub type Context = crate::controllers::Context<State>;

/// What only the Service controller holds.
pub struct State {
    pub settings: TunnelArgs,
    pub tunnels: Store<Tunnel>,
    /// The Services in scope, kept by the controller's own watch.
    pub services: Store<Service>,
}

impl State {
    /// Whether every cache a reconcile waits for has listed once: the Services and, before any
    /// write, the Tunnels. Asked at shutdown ([`crate::controllers::shutdown`]).
    pub fn caches_synced(&self) -> bool {
        use crate::controllers::has_synced;
        has_synced(&self.services) && has_synced(&self.tunnels)
    }
}

/// Builds the controller, acting only when `acting` permits; it shares the Tunnel controller's
/// Tunnel cache.
pub fn controller(
    client: Client,
    settings: TunnelArgs,
    tunnels: Store<Tunnel>,
    namespace: Option<String>,
    acting: crate::controllers::Acting,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> (Arc<Context>, impl std::future::Future<Output = ()> + Send) {
    let services = scoped_api::<Service>(&client, namespace.as_deref());
    let tunnel_api = scoped_api::<Tunnel>(&client, namespace.as_deref());
    let backoff = Backoff::new(settings.service_backoff_min, settings.service_backoff_max);
    let concurrency = settings.service_concurrency;
    let controller = Controller::new(services, watcher::Config::default());
    let state = State { settings, tunnels, services: controller.store() };
    let ctx = Arc::new(Context::new(client, backoff, state).with_acting(acting));
    let run = controller
        .owns(tunnel_api, watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(concurrency))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(crate::log_result!(service));
    (ctx, run)
}

pub async fn reconcile(service: Arc<Service>, ctx: Arc<Context>) -> Result<Action> {
    reconcile_with(service, ctx, reconcile_inner).await
}

async fn reconcile_inner(service: Arc<Service>, ctx: Arc<Context>) -> Result<Action> {
    let api: Api<Tunnel> = api_beside(&ctx.client, &*service)?;
    let name = tunnel_name(&service);
    store_synced(&ctx.tunnels).await;
    let existing = ctx.tunnels.get(&ObjectRef::new(&name).within(&namespace_of(&*service)?));
    let action = match plan::step(&service, existing.as_deref(), &ctx.settings) {
        plan::Step::Create => {
            act::create(&service, &api, &ctx).await?;
            Action::await_change()
        }
        plan::Step::SetSourceRanges(ranges) => {
            act::set_source_ranges(&service, &name, &ranges, &api, &ctx).await?;
            Action::await_change()
        }
        plan::Step::SetProxyProtocol(version) => {
            act::set_proxy_protocol(&service, &name, version, &api, &ctx).await?;
            Action::await_change()
        }
        plan::Step::InvalidAnnotation(why) => {
            act::invalid_annotation(&service, &name, &why, &ctx).await;
            Action::await_change()
        }
        plan::Step::Delete { why } => {
            act::delete(&service, &name, why, &api, &ctx).await?;
            Action::await_change()
        }
        plan::Step::Retry(after) => Action::requeue(after),
        plan::Step::Leave { why } => {
            debug!(tunnel = %name, why, "nothing to do");
            Action::await_change()
        }
    };
    ctx.backoff.reset(&object_key(&*service));
    Ok(action)
}
