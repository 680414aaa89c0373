//! The orphan sweep: exit servers and reserved addresses tagged by this cluster's skyport whose
//! Tunnel no longer exists are deleted and released (a `Retain` address is kept), and so are
//! tunnel clients left in the clients' namespace. Normally the finalizer deletes every host; the sweep catches what a removed
//! finalizer, a deleted namespace with a force-removed finalizer or a bug left behind.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use providers::hosts::{TAG_CLUSTER, TAG_DELETION_POLICY, TAG_TUNNEL_NAMESPACE, TAG_TUNNEL_UID};
use providers::{Address, Host, HostProvider};
use tracing::{Instrument, info, info_span, warn};

use super::Context;
use super::act;
use super::placement::{LABEL_TUNNEL_NAMESPACE, LABEL_TUNNEL_UID, label_test};
use super::plan::address::taken_over;
use crate::controllers::MANAGED_BY;
use crate::controllers::owned::{self, Guarded};

/// Runs a sweep every `--orphan-sweep-interval` (the first one after one interval, when the
/// Tunnel cache is complete and this replica acts) until `shutdown`. An interval of 0 disables it.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()>) {
    let interval = ctx.settings.orphan_sweep_interval;
    if interval.is_zero() {
        info!("orphan sweep disabled");
        return;
    }
    let work = async {
        loop {
            tokio::time::sleep(crate::controllers::jittered(interval)).await;
            if !crate::controllers::store_synced(&ctx.tunnels).await {
                return;
            }
            // A standby sweeps nothing: it waits for the Lease, then sweeps what the cache holds.
            if !ctx.acting.until_permits_shard(crate::controllers::acting::TUNNELS_SHARD).await {
                return;
            }
            sweep_once(&ctx).instrument(info_span!("orphan_sweep")).await;
        }
    };
    tokio::select! {
        _ = work => {}
        _ = shutdown => {}
    }
}

/// One pass over every configured provider; returns how many hosts it deleted.
pub async fn sweep_once(ctx: &Context) -> usize {
    let mut deleted = 0;
    for provider in ctx.providers.all() {
        // Addresses first: a DigitalOcean reserved IP is found through its droplet's tags, which
        // go with the droplet.
        release_orphaned_addresses(provider.as_ref(), ctx).await;
        let live = async { ctx.tunnels.state().iter().filter_map(|t| t.uid()).collect::<HashSet<String>>() };
        let orphans = match find_orphans(provider.as_ref(), live, &ctx.cluster_id, ctx.namespace.as_deref()).await {
            Ok(orphans) => orphans,
            Err(e) => {
                warn!(provider = provider.name(), error = %e, "orphan sweep could not list hosts");
                continue;
            }
        };
        for host in &orphans {
            deleted += delete(provider.as_ref(), host, ctx).await;
        }
        delete_orphaned_placements(provider.as_ref(), ctx).await;
    }
    delete_orphaned_clients(ctx).await;
    ctx.sweeps.fetch_add(1, Ordering::Relaxed);
    deleted
}

/// Deletes the client Deployments (and their Secrets) in the clients' namespace whose Tunnel
/// is gone: across namespaces no owner reference lets the garbage collector do it. Listed
/// before the live Tunnels are read, as in [`find_orphans`].
async fn delete_orphaned_clients(ctx: &Context) {
    let Some(namespace) = ctx.settings.client_namespace.as_deref().filter(|ns| !ns.is_empty()) else { return };
    let api: Api<Deployment> = Api::namespaced(ctx.client.clone(), namespace);
    let selector = format!("{}={},{LABEL_TUNNEL_UID}", MANAGED_BY.0, MANAGED_BY.1);
    let listed = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(listed) => listed.items,
        Err(e) => {
            warn!(error = %e, "orphan sweep could not list tunnel clients");
            return;
        }
    };
    let live: HashSet<String> = ctx.tunnels.state().iter().filter_map(|t| t.uid()).collect();
    for client in listed {
        let labels = client.labels();
        let (Some(uid), tunnel_ns) = (labels.get(LABEL_TUNNEL_UID), labels.get(LABEL_TUNNEL_NAMESPACE)) else {
            continue;
        };
        let watched = ctx.namespace.as_deref().is_none_or(|ns| tunnel_ns.map(String::as_str) == Some(ns));
        if live.contains(uid) || !watched {
            continue;
        }
        let name = client.name_any();
        let secret = format!("{}-credentials", name.strip_suffix("-client").unwrap_or(&name));
        match delete_client_of(&api, &client, &secret, uid, ctx).await {
            Ok(()) => info!(client = %name, tunnel_uid = %uid, "deleted orphaned tunnel client"),
            Err(e) => warn!(client = %name, error = %e, "could not delete orphaned tunnel client"),
        }
    }
}

async fn delete_client_of(
    api: &Api<Deployment>,
    client: &Deployment,
    secret: &str,
    uid: &str,
    ctx: &Context,
) -> crate::error::Result<()> {
    act::delete_precisely(api, &client.name_any(), client.metadata.uid.clone(), ctx).await?;
    let namespace = client.namespace().unwrap_or_default();
    let tests = [label_test(MANAGED_BY.0, MANAGED_BY.1), label_test(LABEL_TUNNEL_UID, uid)];
    if let Guarded::Ours(found) = owned::json_patch::<Secret>(&ctx.client, &namespace, secret, &tests).await? {
        let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &namespace);
        act::delete_precisely(&secrets, secret, found.metadata.uid, ctx).await?;
    }
    Ok(())
}

/// The provider's hosts of this cluster whose Tunnel is not in `live`. The hosts are listed
/// first and the live Tunnels read after: the reconcile that creates a host read its Tunnel from
/// the same cache, so every host listed has its Tunnel there by the time `live` is read. In the
/// other order, a Tunnel and its host created between the two reads would have its new host
/// deleted as an orphan.
pub async fn find_orphans(
    provider: &dyn HostProvider,
    live: impl std::future::Future<Output = HashSet<String>>,
    cluster_id: &str,
    namespace: Option<&str>,
) -> Result<Vec<Host>, providers::HostError> {
    let hosts = provider.list_by_tag(TAG_CLUSTER, cluster_id).await?;
    let live = live.await;
    Ok(hosts.into_iter().filter(|h| is_orphan(h, &live, cluster_id, namespace)).collect())
}

/// A host is an orphan when it carries this cluster's tag, lies in the watched namespace (when
/// only one is watched) and names a Tunnel UID that no Tunnel has.
pub fn is_orphan(host: &Host, live: &HashSet<String>, cluster_id: &str, namespace: Option<&str>) -> bool {
    orphan_tags(&host.tags, live, cluster_id, namespace)
}

/// The same for a reserved address, unless it is tagged `Retain`: its Tunnel asked to keep it.
pub fn is_orphan_address(address: &Address, live: &HashSet<String>, cluster_id: &str, namespace: Option<&str>) -> bool {
    let retained = address.tags.get(TAG_DELETION_POLICY).is_some_and(|p| p == "Retain");
    !retained && orphan_tags(&address.tags, live, cluster_id, namespace)
}

fn orphan_tags(
    tags: &BTreeMap<String, String>,
    live: &HashSet<String>,
    cluster_id: &str,
    namespace: Option<&str>,
) -> bool {
    let tag = |k: &str| tags.get(k).map(String::as_str);
    tag(TAG_CLUSTER) == Some(cluster_id)
        && namespace.is_none_or(|ns| tag(TAG_TUNNEL_NAMESPACE) == Some(ns))
        && tag(TAG_TUNNEL_UID).is_some_and(|uid| !live.contains(uid))
}

/// Deletes what kept the pair of a Tunnel that is gone apart (Hetzner's spread placement
/// groups), listed by this cluster's tag as hosts are ([`find_orphans`]), so one whose Tunnel went
/// without its finalizer is found even once its servers are gone. Refused while a server is still
/// being deleted: the next sweep lists it again.
async fn delete_orphaned_placements(provider: &dyn HostProvider, ctx: &Context) {
    let listed = match provider.list_placements_by_tag(TAG_CLUSTER, &ctx.cluster_id).await {
        Ok(listed) => listed,
        Err(e) => {
            warn!(provider = provider.name(), error = %e, "orphan sweep could not list placements");
            return;
        }
    };
    let live: HashSet<String> = ctx.tunnels.state().iter().filter_map(|t| t.uid()).collect();
    let namespace = ctx.namespace.as_deref();
    let orphaned = listed.iter().filter(|tags| orphan_tags(tags, &live, &ctx.cluster_id, namespace));
    let uids: std::collections::BTreeSet<&str> =
        orphaned.filter_map(|tags| tags.get(TAG_TUNNEL_UID)).map(String::as_str).collect();
    for uid in uids {
        match provider.delete_placement(uid).await {
            Ok(()) => info!(provider = provider.name(), tunnel_uid = %uid, "deleted an orphaned pair's placement"),
            Err(e) => {
                info!(provider = provider.name(), tunnel_uid = %uid, error = %e, "left an orphaned pair's placement for a later sweep")
            }
        }
    }
}

/// Releases this cluster's reserved addresses whose Tunnel is gone, by the same list-then-read
/// order as hosts ([`find_orphans`]). A provider without reserved addresses is skipped quietly.
async fn release_orphaned_addresses(provider: &dyn HostProvider, ctx: &Context) {
    let listed = match provider.list_addresses_by_tag(TAG_CLUSTER, &ctx.cluster_id).await {
        Ok(listed) => listed,
        Err(providers::HostError::Invalid { .. }) => return,
        Err(e) => {
            warn!(provider = provider.name(), error = %e, "orphan sweep could not list reserved addresses");
            return;
        }
    };
    let tunnels = ctx.tunnels.state();
    let live: HashSet<String> = tunnels.iter().filter_map(|t| t.uid()).collect();
    // Kept by a deleted Tunnel for its Service's next one, which took it over or is about to.
    let recorded: HashSet<String> = tunnels.iter().filter_map(|t| t.status.as_ref()?.address_id.clone()).collect();
    let awaiting: HashSet<(String, String)> = tunnels
        .iter()
        .filter(|t| t.spec.reserves_address() && t.status.as_ref().is_none_or(|s| s.address_id.is_none()))
        .map(|t| (t.namespace().unwrap_or_default(), t.name_any()))
        .collect();
    let namespace = ctx.namespace.as_deref();
    let orphan =
        |a: &&Address| is_orphan_address(a, &live, &ctx.cluster_id, namespace) && !taken_over(a, &recorded, &awaiting);
    for address in listed.iter().filter(orphan) {
        let uid = address.tags.get(TAG_TUNNEL_UID).map(String::as_str).unwrap_or_default();
        match provider.release_address(&address.id).await {
            Ok(()) => {
                ctx.orphan_addresses_released.fetch_add(1, Ordering::Relaxed);
                info!(provider = provider.name(), address = %address.id, ip = %address.ip, tunnel_uid = uid, "released orphaned reserved address");
            }
            Err(e) => {
                warn!(provider = provider.name(), address = %address.id, error = %e, "could not release orphaned reserved address")
            }
        }
    }
}

async fn delete(provider: &dyn HostProvider, host: &Host, ctx: &Context) -> usize {
    match provider.delete(&host.id).await {
        Ok(()) => {
            ctx.orphans_deleted.fetch_add(1, Ordering::Relaxed);
            info!(
                provider = provider.name(),
                host = %host.id,
                name = %host.name,
                tunnel_uid = host.tags.get(TAG_TUNNEL_UID).map(String::as_str).unwrap_or_default(),
                "deleted orphaned exit server"
            );
            1
        }
        Err(e) => {
            warn!(provider = provider.name(), host = %host.id, error = %e, "could not delete orphaned exit server");
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use providers::HostState;
    use providers::hosts::owner_tags;

    use super::*;

    fn host(uid: &str, ns: &str, cluster: Option<&str>) -> Host {
        let mut tags = owner_tags(uid, ns, "web-tunnel");
        if let Some(c) = cluster {
            tags.insert(TAG_CLUSTER.into(), c.into());
        }
        Host { id: "h".into(), name: "n".into(), public_ipv4: None, state: HostState::Running, tags, placement: None }
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_sweeps_nothing_until_it_holds_the_lease() {
        let settings =
            crate::config::TunnelArgs { orphan_sweep_interval: Duration::from_secs(10), ..Default::default() };
        let h = super::super::tests::harness_settings(settings);
        h.provider.insert(host("gone-uid", "ns", Some("cluster-1")));
        let (gate, acting) = crate::controllers::Gate::shut();
        let ctx = Arc::new(Arc::into_inner(h.ctx).expect("one owner").with_acting(acting));
        let sweeps = tokio::spawn(run(ctx.clone(), std::future::pending()));
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(ctx.sweeps.load(Ordering::Relaxed), 0, "a standby swept");
        assert_eq!(h.provider.hosts().len(), 1, "a standby deleted an orphan");
        gate.open();
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(ctx.sweeps.load(Ordering::Relaxed) >= 1, "the leader did not sweep");
        assert!(h.provider.hosts().is_empty(), "the leader left the orphan");
        sweeps.abort();
    }

    #[tokio::test]
    #[ignore = "runs real exit servers: SKYPORT_EXE names the skyport binary (tests/run.sh sets it)"]
    async fn a_tunnel_and_host_made_while_the_sweep_runs_are_not_swept() {
        use providers::local::{LocalProvider, LocalSettings};
        use providers::{ExitServer, HostRequest, NoiseKeypair, Protocol, TunnelService};

        let exe = std::env::var("SKYPORT_EXE").expect("SKYPORT_EXE: the skyport binary");
        let dir = std::env::temp_dir().join(format!("skyport-sweep-{:08x}", rand::random::<u32>()));
        let provider = LocalProvider::new(LocalSettings::new(&dir, exe)).unwrap();
        let uid = "5f0c7a52-8d3e-4a51-9c1e-2b7d0e6f4a91";
        let mut tags = owner_tags(uid, "team-a", "web-tunnel");
        tags.insert(TAG_CLUSTER.into(), "c1".into());
        let server = ExitServer {
            control_port: 2333,
            noise_private_key: NoiseKeypair::generate().private_key,
            services: vec![TunnelService {
                name: "s".into(),
                protocol: Protocol::Tcp,
                port: 18090,
                token: "t".into(),
                source_ranges: Vec::new(),
                proxy_protocol: None,
                bind: None,
            }],
        };
        let request = HostRequest {
            name: "skyport-team-a-web-tunnel".into(),
            region: None,
            size: None,
            user_data: String::new(),
            server,
            tags,
            address: None,
            failure_domain: None,
        };
        let tunnels = std::sync::Mutex::new(HashSet::new());
        // The Tunnel reaches the cache and its host is created just as the sweep reads the cache.
        let live = async {
            let seen = tunnels.lock().unwrap().clone();
            tunnels.lock().unwrap().insert(uid.to_string());
            provider.create(&request).await.expect("create");
            seen
        };
        let orphans = find_orphans(&provider, live, "c1", None).await.unwrap();
        for host in provider.list_by_tag(TAG_TUNNEL_UID, uid).await.unwrap() {
            provider.delete(&host.id).await.unwrap();
        }
        let _ = std::fs::remove_dir_all(&dir);
        assert!(orphans.is_empty(), "a live Tunnel's new host was taken for an orphan: {orphans:?}");
    }

    #[test]
    fn only_this_clusters_hosts_without_a_live_tunnel_are_orphans() {
        let live = HashSet::from(["live-uid".to_string()]);
        assert!(is_orphan(&host("gone-uid", "a", Some("c1")), &live, "c1", None));
        assert!(!is_orphan(&host("live-uid", "a", Some("c1")), &live, "c1", None));
        assert!(!is_orphan(&host("gone-uid", "a", Some("c2")), &live, "c1", None), "another cluster's host");
        assert!(!is_orphan(&host("gone-uid", "a", None), &live, "c1", None), "untagged: not provably ours");
        assert!(!is_orphan(&host("gone-uid", "b", Some("c1")), &live, "c1", Some("a")), "outside the namespace");
        assert!(is_orphan(&host("gone-uid", "a", Some("c1")), &live, "c1", Some("a")));
        let no_uid =
            Host { tags: BTreeMap::from([(TAG_CLUSTER.to_string(), "c1".to_string())]), ..host("x", "a", None) };
        assert!(!is_orphan(&no_uid, &live, "c1", None));
    }

    #[test]
    fn an_orphaned_address_is_released_unless_retained() {
        let live = HashSet::from(["live-uid".to_string()]);
        let address = |uid: &str, policy: Option<&str>| {
            let mut tags = host(uid, "a", Some("c1")).tags;
            if let Some(p) = policy {
                tags.insert(TAG_DELETION_POLICY.into(), p.into());
            }
            Address { private_ip: None, id: "a-1".into(), ip: "198.51.100.1".into(), host_id: None, tags }
        };
        assert!(is_orphan_address(&address("gone-uid", Some("Delete")), &live, "c1", None));
        assert!(is_orphan_address(&address("gone-uid", None), &live, "c1", None));
        assert!(!is_orphan_address(&address("gone-uid", Some("Retain")), &live, "c1", None), "kept on purpose");
        assert!(!is_orphan_address(&address("live-uid", Some("Delete")), &live, "c1", None));
        assert!(!is_orphan_address(&address("gone-uid", Some("Delete")), &live, "c2", None), "another cluster's");
    }
}
