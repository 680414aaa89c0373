//! The orphan sweep: exit servers tagged by this cluster's skyport whose Tunnel no longer exists
//! are deleted. Normally the finalizer deletes every host; the sweep catches what a removed
//! finalizer, a deleted namespace with a force-removed finalizer or a bug left behind.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use kube::ResourceExt;
use providers::hosts::{TAG_CLUSTER, TAG_TUNNEL_NAMESPACE, TAG_TUNNEL_UID};
use providers::{Host, HostProvider};
use tracing::{Instrument, info, info_span, warn};

use super::Context;

/// Runs a sweep every `--orphan-sweep-interval` (the first one after one interval, when the
/// Tunnel cache is complete) until `shutdown`. An interval of 0 disables it.
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
    }
    ctx.sweeps.fetch_add(1, Ordering::Relaxed);
    deleted
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
    let tag = |k: &str| host.tags.get(k).map(String::as_str);
    tag(TAG_CLUSTER) == Some(cluster_id)
        && namespace.is_none_or(|ns| tag(TAG_TUNNEL_NAMESPACE) == Some(ns))
        && tag(TAG_TUNNEL_UID).is_some_and(|uid| !live.contains(uid))
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
    use std::collections::BTreeMap;

    use providers::HostState;
    use providers::hosts::owner_tags;

    use super::*;

    fn host(uid: &str, ns: &str, cluster: Option<&str>) -> Host {
        let mut tags = owner_tags(uid, ns, "web-tunnel");
        if let Some(c) = cluster {
            tags.insert(TAG_CLUSTER.into(), c.into());
        }
        Host { id: "h".into(), name: "n".into(), public_ipv4: None, state: HostState::Running, tags }
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
            services: vec![TunnelService { name: "s".into(), protocol: Protocol::Tcp, port: 18090, token: "t".into() }],
        };
        let request = HostRequest {
            name: "skyport-team-a-web-tunnel".into(),
            region: None,
            size: None,
            user_data: String::new(),
            server,
            tags,
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
}
