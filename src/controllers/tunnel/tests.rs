//! The Tunnel reconcile against in-process fakes of the Kubernetes API and a host provider:
//! finalizer, Secret, exit server, client, Service ingress, status, Events, cleanup, and their
//! failure branches.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::runtime::controller::Action;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use providers::{Host, HostError, HostProvider, HostState};
use serde_json::json;

use super::*;
use crate::controllers::testing::probe::FakeProbe;
use crate::controllers::testing::provider::{FakeProvider, NAME};
use crate::controllers::testing::{FakeApi, ready_store};
use crate::crd::condition::ConditionStatus;

pub(super) const TUNNEL: &str = "/apis/skyport.dev/v1alpha1/namespaces/ns/tunnels/web-tunnel";
pub(super) const SERVICE: &str = "/api/v1/namespaces/ns/services/web";

pub(super) struct Harness {
    pub(super) ctx: Arc<Context>,
    pub(super) api: FakeApi,
    pub(super) provider: Arc<FakeProvider>,
    /// Answers by default: the tests of other stages see a tunnel that carries traffic.
    pub(super) probe: Arc<FakeProbe>,
    pub(super) services: Writer<Service>,
    pub(super) tunnels: Writer<Tunnel>,
    pub(super) pools: Writer<crate::crd::pool::ExitServerPool>,
}

fn harness_with(providers: Providers, provider: Arc<FakeProvider>) -> Harness {
    harness_on(FakeApi::start(), providers, provider)
}

fn harness_on((client, api): (kube::Client, FakeApi), providers: Providers, provider: Arc<FakeProvider>) -> Harness {
    harness_set(client, api, (providers, provider), TunnelArgs::default())
}

/// [`harness`] with other settings.
pub(super) fn harness_settings(settings: TunnelArgs) -> Harness {
    let provider = Arc::new(FakeProvider::default());
    let providers = Providers::new(Some(NAME.into()), vec![provider.clone() as Arc<dyn HostProvider>]);
    let (client, api) = FakeApi::start();
    harness_set(client, api, (providers, provider), settings)
}

fn harness_set(
    client: kube::Client,
    api: FakeApi,
    (providers, provider): (Providers, Arc<FakeProvider>),
    settings: TunnelArgs,
) -> Harness {
    let (tunnels, tunnel_writer) = ready_store();
    let (services, service_writer) = ready_store();
    let probe = Arc::new(FakeProbe::answering(true));
    let (pools, pool_writer) = ready_store();
    let state = State {
        creations: super::hourly::HourlyBudget::new(settings.max_hosts_per_hour),
        providers,
        settings,
        cluster_id: "cluster-1".into(),
        namespace: Some("ns".into()),
        tunnels,
        services,
        pools,
        wakes: futures::channel::mpsc::unbounded().0,
        orphans_deleted: Default::default(),
        orphan_addresses_released: Default::default(),
        sweeps: Default::default(),
        health: Default::default(),
        failovers: Default::default(),
        unserved: Default::default(),
        pair_views: Default::default(),
        halted_rolls: Default::default(),
        probe: probe.clone(),
    };
    let backoff = Backoff::new(Duration::from_secs(1), Duration::from_secs(60));
    Harness {
        ctx: Arc::new(Context::new(client, backoff, state)),
        api,
        provider,
        probe,
        services: service_writer,
        tunnels: tunnel_writer,
        pools: pool_writer,
    }
}

pub(super) fn harness() -> Harness {
    let provider = Arc::new(FakeProvider::default());
    let providers = Providers::new(Some(NAME.into()), vec![provider.clone() as Arc<dyn HostProvider>]);
    harness_with(providers, provider)
}

pub(super) fn service() -> Service {
    serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web", "namespace": "ns", "uid": "svc-uid"},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel", "clusterIP": "10.0.0.7", "ports": [{"port": 80, "protocol": "TCP"}]},
    }))
    .unwrap()
}

impl Harness {
    /// Puts the Service into the fake API and the cache.
    pub(super) fn add_service(&mut self) -> Service {
        let svc: Service =
            serde_json::from_value(self.api.put(SERVICE, serde_json::to_value(service()).unwrap())).unwrap();
        self.services.apply_watcher_event(&watcher::Event::Apply(svc.clone()));
        svc
    }

    /// The cache gets the Service as the fake API has it now, as the watch brings it.
    pub(super) fn sync_service(&mut self) {
        let svc: Service = serde_json::from_value(self.api.get(SERVICE).expect("Service stored")).unwrap();
        self.services.apply_watcher_event(&watcher::Event::Apply(svc));
    }

    /// The Tunnel skyport makes for the Service, stored in the fake API.
    pub(super) fn put_tunnel(&self, tunnel: &Tunnel) -> Arc<Tunnel> {
        Arc::new(serde_json::from_value(self.api.put(TUNNEL, serde_json::to_value(tunnel).unwrap())).unwrap())
    }

    pub(super) fn new_tunnel(&self) -> Arc<Tunnel> {
        let mut t = crate::controllers::service::tunnel_for(&service()).unwrap();
        t.metadata.namespace = Some("ns".into());
        t.metadata.uid = Some("tunnel-uid".into());
        t.metadata.generation = Some(1);
        self.put_tunnel(&t)
    }

    pub(super) fn current(&self) -> Tunnel {
        serde_json::from_value(self.api.get(TUNNEL).expect("tunnel stored")).unwrap()
    }

    pub(super) async fn reconcile(&self, tunnel: Arc<Tunnel>) -> Result<Action> {
        reconcile(tunnel, self.ctx.clone()).await
    }
}

pub(super) fn ready(t: &Tunnel) -> (ConditionStatus, String) {
    let c = crate::controllers::status::ready_condition(t).expect("Ready condition");
    (c.status, c.reason.to_string())
}

#[tokio::test]
async fn a_new_tunnel_gets_finalizer_secret_host_client_ingress_and_active_status() {
    let mut h = harness();
    h.add_service();
    let action = h.reconcile(h.new_tunnel()).await.unwrap();
    assert!(action != Action::await_change(), "an Active Tunnel is resynced");
    let t = h.current();
    assert_eq!(t.metadata.finalizers, Some(vec![FINALIZER.to_string()]));
    assert_eq!(ready(&t), (ConditionStatus::True, "Active".into()));
    let status = t.status.clone().unwrap();
    let host = h.provider.hosts().pop().expect("one host created");
    assert_eq!(status.host_id.as_deref(), Some(host.id.as_str()));
    assert_eq!(status.provider.as_deref(), Some(NAME));
    assert_eq!(host.tags.get(providers::hosts::TAG_TUNNEL_UID).map(String::as_str), Some("tunnel-uid"));
    assert_eq!(host.tags.get(providers::hosts::TAG_CLUSTER).map(String::as_str), Some("cluster-1"));
    let secret = h.api.get("/api/v1/namespaces/ns/secrets/web-tunnel-credentials").expect("Secret");
    assert!(secret["data"][desired::KEY_TOKEN].is_string());
    assert!(secret["stringData"][placement::KEY_CLIENT].as_str().unwrap().contains("10.0.0.7:80"));
    assert!(h.api.get("/apis/apps/v1/namespaces/ns/deployments/web-tunnel-client").is_some());
    let svc = h.api.get(SERVICE).unwrap();
    assert_eq!(svc["status"]["loadBalancer"]["ingress"][0]["ip"], json!(host.public_ipv4.unwrap()));
    assert_eq!(h.api.event_reasons(), ["Provisioning"]);
    assert_eq!(h.ctx.api_writes.get() as usize, h.api.writes().len());
}

#[tokio::test]
async fn a_booting_host_is_recorded_at_once_and_polled() {
    let mut h = harness();
    h.add_service();
    h.provider.create_as(HostState::Provisioning);
    let action = h.reconcile(h.new_tunnel()).await.unwrap();
    assert_eq!(action, Action::requeue(BOOT_POLL));
    let t = h.current();
    let status = t.status.clone().unwrap();
    assert_eq!(status.phase, Some(TunnelPhase::Provisioning));
    assert_eq!(status.host_id.as_deref(), Some("h-1"), "recorded before waiting");
    // The next reconcile, with the cache still behind, finds the recorded host: no second one.
    h.reconcile(h.put_tunnel(&Tunnel { status: None, ..t })).await.unwrap();
    assert_eq!(h.provider.hosts().len(), 1);
}

#[tokio::test]
async fn a_missing_service_blocks_with_a_warning_once() {
    let h = harness();
    let t = h.new_tunnel();
    assert_eq!(h.reconcile(t).await.unwrap(), Action::await_change());
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "ServiceNotFound".into()));
    assert_eq!(t.status.as_ref().unwrap().phase, Some(TunnelPhase::Pending));
    h.reconcile(Arc::new(t)).await.unwrap();
    assert_eq!(h.api.event_reasons(), ["ServiceNotFound"]);
    assert!(h.provider.calls().is_empty());
}

#[tokio::test]
async fn an_unconfigured_provider_fails_the_tunnel() {
    let mut h = harness_with(Providers::default(), Arc::new(FakeProvider::default()));
    h.add_service();
    assert_eq!(h.reconcile(h.new_tunnel()).await.unwrap(), Action::await_change());
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "ProviderNotConfigured".into()));
    assert_eq!(t.status.unwrap().phase, Some(TunnelPhase::Failed));
}

#[tokio::test]
async fn a_provider_failure_is_reported_on_tunnel_and_service_and_honours_retry_after() {
    let mut h = harness();
    h.add_service();
    let retry_after = Duration::from_secs(600);
    h.provider.fail_next("create", HostError::RateLimited { provider: NAME, retry_after: Some(retry_after) });
    let t = h.new_tunnel();
    let err = h.reconcile(t.clone()).await.unwrap_err();
    assert_eq!(err.reason(), "ProviderRateLimited");
    assert_eq!(ready(&h.current()), (ConditionStatus::False, "ProviderRateLimited".into()));
    let events: Vec<_> = h.api.writes().into_iter().filter(|c| c.path.contains("/events")).collect();
    let regarding: Vec<_> = events.iter().map(|e| e.body["regarding"]["kind"].as_str().unwrap().to_string()).collect();
    assert_eq!(regarding, ["Tunnel", "Service"]);
    let delay = error_policy(t, &err, h.ctx.clone());
    assert_eq!(delay, Action::requeue(retry_after), "the provider's Retry-After beats a shorter backoff");
}

#[tokio::test]
async fn a_stopped_host_is_replaced() {
    let mut h = harness();
    h.add_service();
    h.reconcile(h.new_tunnel()).await.unwrap();
    let mut stopped = h.provider.hosts().pop().unwrap();
    stopped.state = HostState::Stopped;
    h.provider.insert(stopped.clone());
    h.reconcile(Arc::new(h.current())).await.unwrap();
    let hosts = h.provider.hosts();
    assert_eq!(hosts.len(), 1);
    assert_ne!(hosts[0].id, stopped.id);
    assert_eq!(h.current().status.unwrap().host_id, Some(hosts[0].id.clone()));
    assert_eq!(h.api.event_reasons(), ["Provisioning", "ExitServerLost", "Provisioning"]);
}

#[tokio::test]
async fn a_second_host_with_the_tunnels_uid_is_deleted() {
    let mut h = harness();
    h.add_service();
    let tags = providers::owner_tags("tunnel-uid", "ns", "web-tunnel");
    for id in ["a", "b"] {
        h.provider.insert(Host {
            id: id.into(),
            name: "n".into(),
            public_ipv4: Some("203.0.113.50".into()),
            state: HostState::Running,
            tags: tags.clone(),
            placement: None,
        });
    }
    h.reconcile(h.new_tunnel()).await.unwrap();
    let ids: Vec<_> = h.provider.hosts().into_iter().map(|h| h.id).collect();
    assert_eq!(ids, ["a"]);
    assert_eq!(h.current().status.unwrap().host_id.as_deref(), Some("a"));
}

/// Reconciles the Tunnel to Active, then marks it deleted.
async fn active_then_deleted(h: &mut Harness) -> Arc<Tunnel> {
    h.add_service();
    h.reconcile(h.new_tunnel()).await.unwrap();
    let mut t = h.current();
    t.metadata.deletion_timestamp =
        Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(k8s_openapi::jiff::Timestamp::now()));
    h.put_tunnel(&t)
}

#[tokio::test]
async fn deleting_a_tunnel_deletes_its_host_clears_the_ingress_and_releases_the_finalizer() {
    let mut h = harness();
    let t = active_then_deleted(&mut h).await;
    let svc: Service = serde_json::from_value(h.api.get(SERVICE).unwrap()).unwrap();
    h.services.apply_watcher_event(&watcher::Event::Apply(svc));
    assert_eq!(h.reconcile(t).await.unwrap(), Action::await_change());
    assert!(h.provider.hosts().is_empty());
    assert_eq!(h.api.event_reasons(), ["Provisioning", "Deleted"]);
    assert_eq!(h.api.get(SERVICE).unwrap()["status"]["loadBalancer"]["ingress"], json!([]));
    let t = h.current();
    assert_eq!(t.metadata.finalizers, Some(vec![]));
    assert_eq!(t.status.unwrap().phase, Some(TunnelPhase::Deleting));
    assert!(h.ctx.written.is_empty(), "nothing remembered of a deleted Tunnel");
}

#[tokio::test]
async fn a_failed_host_delete_keeps_the_finalizer() {
    let mut h = harness();
    let t = active_then_deleted(&mut h).await;
    h.provider.fail_next("delete", HostError::Unavailable { provider: NAME, message: "503".into() });
    assert_eq!(h.reconcile(t).await.unwrap_err().reason(), "ProviderUnavailable");
    assert_eq!(h.current().metadata.finalizers, Some(vec![FINALIZER.to_string()]));
    assert_eq!(h.provider.hosts().len(), 1);
}

#[tokio::test]
async fn a_tunnel_whose_provider_is_gone_is_kept_with_the_reason() {
    let mut h = harness();
    let t = active_then_deleted(&mut h).await;
    // The same Tunnel under an operator that no longer has the provider.
    let other = harness_on((h.ctx.client.clone(), h.api.clone()), Providers::default(), h.provider.clone());
    assert_eq!(other.reconcile(t).await.unwrap(), Action::requeue(Duration::from_secs(60)));
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::False, "ProviderNotConfigured".into()));
    assert!(crate::controllers::status::ready_condition(&t).unwrap().message.contains("the Tunnel is kept"));
    assert_eq!(t.metadata.finalizers, Some(vec![FINALIZER.to_string()]));
    assert_eq!(h.provider.hosts().len(), 1, "the host is not leaked by dropping the finalizer");
}

#[tokio::test]
async fn the_sweep_deletes_only_this_clusters_hosts_whose_tunnel_is_gone() {
    let mut h = harness();
    h.add_service();
    h.reconcile(h.new_tunnel()).await.unwrap();
    let live = h.current();
    h.tunnels.apply_watcher_event(&watcher::Event::Apply(live));
    let host = |id: &str, uid: &str, cluster: &str| {
        let mut tags = providers::owner_tags(uid, "ns", "old");
        tags.insert(providers::hosts::TAG_CLUSTER.into(), cluster.into());
        Host { id: id.into(), name: id.into(), public_ipv4: None, state: HostState::Running, tags, placement: None }
    };
    h.provider.insert(host("orphan", "gone-uid", "cluster-1"));
    h.provider.insert(host("foreign", "gone-uid", "cluster-2"));
    h.provider.fail_next("delete", HostError::Unavailable { provider: NAME, message: "503".into() });
    assert_eq!(sweep::sweep_once(&h.ctx).await, 0, "a failed delete is counted as none");
    assert_eq!(sweep::sweep_once(&h.ctx).await, 1);
    let mut left: Vec<_> = h.provider.hosts().into_iter().map(|h| h.id).collect();
    left.sort();
    assert_eq!(left, ["foreign", "h-1"]);
    assert_eq!(h.ctx.orphans_deleted.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test]
async fn the_client_config_is_applied_with_the_secrets_labels_and_owner() {
    let mut h = harness();
    h.add_service();
    h.reconcile(h.new_tunnel()).await.unwrap();
    let apply = h
        .api
        .writes()
        .into_iter()
        .find(|c| c.path.contains("/secrets/web-tunnel-credentials") && c.body["stringData"].is_object())
        .expect("the client config apply");
    // The apply creates the Secret when it was deleted meanwhile: it must be a whole, owned,
    // labelled Secret then, which the admission policy lets skyport write.
    let meta = &apply.body["metadata"];
    assert_eq!(meta["labels"]["app.kubernetes.io/managed-by"], json!("skyport"));
    assert_eq!(meta["ownerReferences"][0]["uid"], json!("tunnel-uid"));
}

/// The Secret is deleted and re-created with new keys, and the reconcile that did it
/// fails before the host got them. The next reconcile must still hand the host the new keys (it
/// found the Secret existing, so only status can tell it the host has others).
#[tokio::test]
async fn new_credentials_reach_the_host_even_when_the_reconcile_that_made_them_failed() {
    const SECRET: &str = "/api/v1/namespaces/ns/secrets/web-tunnel-credentials";
    let mut h = harness();
    h.add_service();
    h.reconcile(h.new_tunnel()).await.unwrap();
    let old = h.current().status.unwrap().credentials_digest.expect("the host's credentials digest");
    h.api.remove(SECRET);
    h.provider.fail_next("reconfigure", HostError::Unavailable { provider: NAME, message: "503".into() });
    assert_eq!(h.reconcile(Arc::new(h.current())).await.unwrap_err().reason(), "ProviderUnavailable");
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(h.api.get(SECRET).unwrap()).unwrap();
    let read = |key: &str| String::from_utf8(secret.data.as_ref().unwrap()[key].0.clone()).unwrap();
    let (private, token) = (read(desired::KEY_PRIVATE), read(desired::KEY_TOKEN));
    assert_ne!(h.provider.key_of("h-1"), Some(private.clone()), "the failed reconcile did not reach the host");

    h.reconcile(Arc::new(h.current())).await.unwrap();
    assert_eq!(h.provider.key_of("h-1"), Some(private.clone()), "the host runs with the Secret's keys");
    let t = h.current();
    assert_eq!(ready(&t), (ConditionStatus::True, "Active".into()));
    let digest = t.status.as_ref().unwrap().credentials_digest.clone().unwrap();
    assert_ne!(digest, old);
    let shown = serde_json::to_string(&t).unwrap();
    assert!(!shown.contains(&token) && !shown.contains(&private), "only a digest in status");
}

/// `kubectl delete tunnel` then a new Tunnel of the same name, before the garbage collector
/// removed the old one's Secret: the new Tunnel must not inherit the deleted one's keys.
#[tokio::test]
async fn a_new_tunnel_never_runs_on_the_keys_of_a_deleted_one_of_the_same_name() {
    const SECRET: &str = "/api/v1/namespaces/ns/secrets/web-tunnel-credentials";
    let mut h = harness();
    h.add_service();
    let old = desired::Credentials::generate();
    let mut earlier = h.new_tunnel().as_ref().clone();
    earlier.metadata.uid = Some("deleted-tunnel-uid".into());
    let leftover = desired::secret(&earlier, &placement::Placement::of(&earlier, None).unwrap(), &old).unwrap();
    h.api.put(SECRET, serde_json::to_value(&leftover).unwrap());

    h.reconcile(h.new_tunnel()).await.unwrap();
    let secret: k8s_openapi::api::core::v1::Secret = serde_json::from_value(h.api.get(SECRET).unwrap()).unwrap();
    let owner = &secret.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!(owner.uid, "tunnel-uid", "a Secret of this Tunnel's own");
    let private = String::from_utf8(secret.data.as_ref().unwrap()[desired::KEY_PRIVATE].0.clone()).unwrap();
    assert_ne!(private, old.keypair.private_key, "fresh keys");
    assert_eq!(h.provider.key_of("h-1"), Some(private), "the exit server runs with them");
    let deleted = h.api.calls().into_iter().find(|c| c.method == hyper::Method::DELETE && c.path == SECRET);
    assert!(deleted.is_some(), "the leftover Secret is deleted");
    assert_eq!(ready(&h.current()), (ConditionStatus::True, "Active".into()));
}

/// A Secret of that name that skyport did not make (no label, no owner) is neither read, deleted
/// nor replaced: the Tunnel says so.
#[tokio::test]
async fn a_credentials_secret_skyport_did_not_label_is_never_deleted() {
    use k8s_openapi::api::core::v1::Secret;
    const SECRET: &str = "/api/v1/namespaces/ns/secrets/web-tunnel-credentials";
    let foreign = json!({"metadata": {"name": "web-tunnel-credentials"}, "data": {"token": "c2VjcmV0"}});
    let mut h = harness();
    h.add_service();
    let stored = h.api.put(SECRET, foreign.clone());
    h.reconcile(h.new_tunnel()).await.unwrap();
    let t = h.current();
    let ready = crate::controllers::status::ready_condition(&t).expect("Ready condition");
    assert!(ready.message.contains("is not this Tunnel's"), "{ready:?}");
    assert_eq!(h.api.get(SECRET), Some(stored), "left as it was");
    let touched: Vec<_> = h.api.calls().into_iter().filter(|c| c.path == SECRET).collect();
    assert!(
        touched.iter().all(|c| c.method == hyper::Method::PATCH && c.status == 422),
        "only a refused test: {touched:?}"
    );
    let foreign: Secret = serde_json::from_value(foreign).unwrap();
    assert!(!observe::stale(&foreign, "tunnel-uid"));
    let mut earlier = h.new_tunnel().as_ref().clone();
    earlier.metadata.uid = Some("deleted-tunnel-uid".into());
    let mut ours = desired::secret(
        &earlier,
        &placement::Placement::of(&earlier, None).unwrap(),
        &desired::Credentials::generate(),
    )
    .unwrap();
    assert!(observe::stale(&ours, "tunnel-uid"));
    assert!(!observe::stale(&ours, "deleted-tunnel-uid"), "its own Tunnel's Secret is not stale");
    ours.metadata.labels = None;
    assert!(!observe::stale(&ours, "tunnel-uid"), "without skyport's label it is not ours to delete");
}
