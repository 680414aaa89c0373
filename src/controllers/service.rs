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
//! Annotations `skyport.dev/provider`, `skyport.dev/region` and `skyport.dev/size` on the Service
//! fill the Tunnel's spec when it is created.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerConfig, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::config::TunnelArgs;
use crate::controllers::ApiWrites;
use crate::crd::tunnel::Tunnel;
use crate::error::{Error, Result};
use crate::metrics::ReconcileMetrics;

/// The loadBalancerClass skyport implements.
pub const LOAD_BALANCER_CLASS: &str = "skyport.dev/tunnel";
/// Opt-out (`"false"`) / opt-in (`"true"`, required with `--annotated-only`) annotation.
pub const ANNOTATION: &str = "skyport.dev/tunnel";
pub const ANNOTATION_PROVIDER: &str = "skyport.dev/provider";
pub const ANNOTATION_REGION: &str = "skyport.dev/region";
pub const ANNOTATION_SIZE: &str = "skyport.dev/size";

/// Shared state of the Service controller.
pub struct Context {
    pub client: Client,
    pub settings: TunnelArgs,
    recorder: Recorder,
    pub tunnels: Store<Tunnel>,
    pub api_writes: ApiWrites,
    pub metrics: Arc<ReconcileMetrics>,
}

/// Builds the controller; it shares the Tunnel controller's Tunnel cache.
pub fn controller(
    client: Client,
    settings: TunnelArgs,
    tunnels: Store<Tunnel>,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) -> (Arc<Context>, impl std::future::Future<Output = ()> + Send) {
    let (services, tunnel_api): (Api<Service>, Api<Tunnel>) = match namespace.as_deref() {
        Some(ns) => (Api::namespaced(client.clone(), ns), Api::namespaced(client.clone(), ns)),
        None => (Api::all(client.clone()), Api::all(client.clone())),
    };
    let reporter = Reporter { controller: "skyport".into(), instance: std::env::var("POD_NAME").ok() };
    let ctx = Arc::new(Context {
        recorder: Recorder::new(client.clone(), reporter),
        client,
        settings,
        tunnels,
        api_writes: ApiWrites::default(),
        metrics: Arc::default(),
    });
    let run = Controller::new(services, watcher::Config::default())
        .owns(tunnel_api, watcher::Config::default())
        .with_config(ControllerConfig::default().concurrency(4))
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx.clone())
        .for_each(|result| {
            match result {
                Ok((obj, _)) => debug!(service = %obj, "reconciled"),
                Err(kube::runtime::controller::Error::ReconcilerFailed(e, obj)) => {
                    warn!(service = %obj, error = %e, "reconcile failed")
                }
                Err(e) => debug!(error = %e, "controller event"),
            }
            futures::future::ready(())
        });
    (ctx, run)
}

/// Whether skyport serves `service`, with the reason when it does not (for logs).
pub fn served(service: &Service, settings: &TunnelArgs) -> Result<(), &'static str> {
    let spec = service.spec.as_ref().ok_or("no spec")?;
    if spec.type_.as_deref() != Some("LoadBalancer") {
        return Err("not of type LoadBalancer");
    }
    let annotation = service.annotations().get(ANNOTATION).map(String::as_str);
    if annotation == Some("false") {
        return Err("annotated skyport.dev/tunnel: \"false\"");
    }
    if settings.annotated_only && annotation != Some("true") {
        return Err("not annotated skyport.dev/tunnel: \"true\" (skyport runs with --annotated-only)");
    }
    match spec.load_balancer_class.as_deref() {
        Some(LOAD_BALANCER_CLASS) => Ok(()),
        Some(_) => Err("another loadBalancerClass"),
        None if settings.default_load_balancer => Ok(()),
        None => Err("no loadBalancerClass and skyport is not the default load balancer"),
    }
}

/// The Tunnel skyport makes for a Service.
pub fn tunnel_name(service: &Service) -> String {
    format!("{}-tunnel", service.name_any())
}

/// The Tunnel for `service`: owned by it, spec from its annotations.
pub fn tunnel_for(service: &Service) -> Result<Tunnel> {
    let owner = service.controller_owner_ref(&()).ok_or(Error::MissingObjectKey("uid"))?;
    let annotation = |k: &str| service.annotations().get(k).cloned();
    let value = json!({
        "apiVersion": "skyport.dev/v1alpha1",
        "kind": "Tunnel",
        "metadata": {
            "name": tunnel_name(service),
            "labels": {"app.kubernetes.io/managed-by": "skyport"},
            "ownerReferences": [owner],
        },
        "spec": {
            "serviceRef": {"name": service.name_any()},
            "provider": annotation(ANNOTATION_PROVIDER),
            "region": annotation(ANNOTATION_REGION),
            "size": annotation(ANNOTATION_SIZE),
        },
    });
    let mut tunnel: Tunnel = serde_json::from_value(value).map_err(|e| Error::InvalidSpec(e.to_string()))?;
    tunnel.spec.provider = tunnel.spec.provider.filter(|s| !s.is_empty());
    tunnel.spec.region = tunnel.spec.region.filter(|s| !s.is_empty());
    tunnel.spec.size = tunnel.spec.size.filter(|s| !s.is_empty());
    Ok(tunnel)
}

fn owned_by(tunnel: &Tunnel, service: &Service) -> bool {
    let uid = service.meta().uid.as_deref();
    tunnel.owner_references().iter().any(|r| r.controller == Some(true) && Some(r.uid.as_str()) == uid)
}

pub async fn reconcile(service: Arc<Service>, ctx: Arc<Context>) -> Result<Action> {
    let metrics = ctx.metrics.clone();
    crate::controllers::instrumented("Service", &*service.clone(), &metrics, reconcile_inner(service, ctx)).await
}

async fn reconcile_inner(service: Arc<Service>, ctx: Arc<Context>) -> Result<Action> {
    let ns = service.namespace().ok_or(Error::MissingObjectKey("namespace"))?;
    let api: Api<Tunnel> = Api::namespaced(ctx.client.clone(), &ns);
    let name = tunnel_name(&service);
    crate::controllers::store_synced(&ctx.tunnels).await;
    let existing = ctx.tunnels.get(&ObjectRef::new(&name).within(&ns));
    let serve = service.meta().deletion_timestamp.is_none() && served(&service, &ctx.settings).is_ok();
    match (serve, existing) {
        (true, None) => {
            let tunnel = tunnel_for(&service)?;
            ctx.api_writes.inc();
            match api.create(&PostParams::default(), &tunnel).await {
                Ok(_) => {
                    info!(tunnel = %name, "created Tunnel for LoadBalancer Service");
                    publish(&ctx, &service, EventType::Normal, "TunnelCreated", format!("created Tunnel {name}")).await;
                }
                // Created meanwhile (the cache lags our own writes): fine.
                Err(kube::Error::Api(e)) if e.code == 409 => {}
                Err(e) => return Err(e.into()),
            }
            Ok(Action::await_change())
        }
        (true, Some(tunnel)) if !owned_by(&tunnel, &service) => {
            // A Tunnel of that name that this Service does not own: made by hand, or left by an
            // earlier Service of the same name whose garbage collection is still pending.
            if tunnel.meta().deletion_timestamp.is_none()
                && !tunnel.owner_references().iter().any(|r| r.kind == "Service")
            {
                debug!(tunnel = %name, "Tunnel exists and is not owned by this Service; leaving it");
                return Ok(Action::await_change());
            }
            Ok(Action::requeue(Duration::from_secs(2)))
        }
        (true, Some(tunnel)) if tunnel.meta().deletion_timestamp.is_some() => {
            // Being deleted (kubectl delete tunnel): a fresh one follows once it is gone; the
            // owned-object watch wakes this Service then.
            Ok(Action::await_change())
        }
        (true, Some(_)) => Ok(Action::await_change()),
        (false, Some(tunnel)) if owned_by(&tunnel, &service) && tunnel.meta().deletion_timestamp.is_none() => {
            let why = served(&service, &ctx.settings).err().unwrap_or("being deleted");
            info!(tunnel = %name, why, "Service no longer served; deleting its Tunnel");
            ctx.api_writes.inc();
            match api.delete(&name, &DeleteParams::foreground()).await {
                Ok(_) => {}
                Err(kube::Error::Api(e)) if e.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
            if service.meta().deletion_timestamp.is_none() {
                publish(&ctx, &service, EventType::Normal, "TunnelDeleted", format!("deleted Tunnel {name}: {why}"))
                    .await;
            }
            Ok(Action::await_change())
        }
        (false, _) => Ok(Action::await_change()),
    }
}

async fn publish(ctx: &Context, service: &Service, type_: EventType, reason: &str, note: String) {
    ctx.api_writes.inc();
    let event =
        Event { type_, reason: reason.to_string(), note: Some(note), action: "Reconcile".into(), secondary: None };
    if let Err(e) = ctx.recorder.publish(&event, &service.object_ref(&())).await {
        warn!(error = %e, "could not publish event");
    }
}

pub fn error_policy(service: Arc<Service>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(namespace = %service.namespace().unwrap_or_default(), name = %service.name_any(), error = %error, "reconcile failed");
    Action::requeue(Duration::from_secs(5))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(type_: &str, class: Option<&str>, annotation: Option<&str>) -> Service {
        let mut annotations = serde_json::Map::new();
        if let Some(a) = annotation {
            annotations.insert(ANNOTATION.into(), a.into());
        }
        annotations.insert(ANNOTATION_PROVIDER.into(), "local".into());
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "a", "uid": "u1", "annotations": annotations},
            "spec": {"type": type_, "loadBalancerClass": class, "ports": [{"port": 80}]},
        }))
        .unwrap()
    }

    fn settings(default_lb: bool, annotated_only: bool) -> TunnelArgs {
        TunnelArgs { default_load_balancer: default_lb, annotated_only, ..Default::default() }
    }

    #[test]
    fn class_default_and_annotations_decide_which_services_are_served() {
        let class = Some(LOAD_BALANCER_CLASS);
        assert!(served(&service("LoadBalancer", class, None), &settings(false, false)).is_ok());
        assert!(served(&service("ClusterIP", class, None), &settings(true, false)).is_err());
        assert!(served(&service("LoadBalancer", None, None), &settings(false, false)).is_err());
        assert!(served(&service("LoadBalancer", None, None), &settings(true, false)).is_ok());
        assert!(served(&service("LoadBalancer", Some("other.io/lb"), None), &settings(true, false)).is_err());
        assert!(served(&service("LoadBalancer", class, Some("false")), &settings(false, false)).is_err());
        assert!(served(&service("LoadBalancer", class, None), &settings(false, true)).is_err());
        assert!(served(&service("LoadBalancer", class, Some("true")), &settings(false, true)).is_ok());
        assert!(served(&service("LoadBalancer", None, Some("true")), &settings(false, true)).is_err());
    }

    #[test]
    fn the_tunnel_is_owned_by_the_service_and_takes_its_annotations() {
        let svc = service("LoadBalancer", Some(LOAD_BALANCER_CLASS), None);
        let t = tunnel_for(&svc).unwrap();
        assert_eq!(t.name_any(), "web-tunnel");
        assert_eq!(t.spec.service_ref.name, "web");
        assert_eq!(t.spec.provider.as_deref(), Some("local"));
        assert_eq!(t.spec.region, None);
        assert!(owned_by(&t, &svc));
    }
}
