//! The skyport binary: flags in, controllers running.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::Context as _;
use clap::Parser;
use futures::FutureExt;
use kube::runtime::reflector::Store;
use skyport::config::{Cli, Command, RunArgs, TunnelRole};
use skyport::controllers::shutdown::run_until_stopped;
use skyport::http::{self, Phase};
use skyport::leader::{self, Lease};
use skyport::metrics::{CloudSnapshot, Metrics, ReadyCounts, TunnelSnapshot};
use skyport::{controllers, crd, telemetry};
use tracing::{error, info, warn};

// jemalloc rather than musl's allocator in the static image: see Cargo.toml.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // kube and the AWS client both use rustls; pin one process-wide crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cli = Cli::parse();
    match cli.command {
        Command::Crds { dir: None, write_all: false } => {
            print!("{}", crd::to_yaml(&crd::all())?);
            Ok(())
        }
        Command::Crds { dir, write_all } => {
            // Every copy of the generated YAML; tests/crds.rs checks each against the types.
            const COPIES: [&str; 3] = ["crds", "deploy/crds", "deploy/helm/skyport/crds"];
            let dirs: Vec<std::path::PathBuf> = if write_all {
                COPIES.iter().map(std::path::PathBuf::from).collect()
            } else {
                dir.into_iter().collect()
            };
            for dir in dirs {
                for c in crd::all() {
                    let path = dir.join(crd::file_name(&c));
                    std::fs::write(&path, crd::to_yaml(std::slice::from_ref(&c))?)
                        .with_context(|| format!("writing {}", path.display()))?;
                }
            }
            Ok(())
        }
        Command::Run(args) => run(*args).await,
        Command::Tunnel { role } => {
            telemetry::init(telemetry::LogFormat::Text);
            match role {
                TunnelRole::Server { config, push_port, forward_file } => {
                    skyport::tunnel::run(skyport::tunnel::Role::Server, config, push_port, forward_file).await
                }
                TunnelRole::Client { config } => {
                    skyport::tunnel::run(skyport::tunnel::Role::Client, config, 0, None).await
                }
                TunnelRole::Firewall { config, output, push_port } => {
                    skyport::tunnel::firewall(&config, &output, push_port).await
                }
                TunnelRole::Addresses { config, state } => skyport::tunnel::addresses(&config, &state),
            }
        }
    }
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    telemetry::init(args.log_format);
    let config = kube::Config::infer()
        .await
        .context("no Kubernetes configuration found (KUBECONFIG, ~/.kube/config or in-cluster)")?;
    let client = kube::Client::try_from(config.clone()).context("building the Kubernetes client")?;

    // Before anything is written (the Lease included): the admission policies must cover us.
    skyport::admission::verify(&client, &args.probe_namespace(&client), args.allow_without_admission_policies).await?;

    let state = http::State::new(Metrics::default());
    let (listener, address) =
        http::bind(args.listen_address).await.with_context(|| format!("cannot listen on {}", args.listen_address))?;
    info!(%address, "serving /healthz, /readyz and /metrics");
    tokio::spawn(http::serve(listener, state.clone()));

    let shutdown = shutdown_signal().boxed().shared();
    tokio::spawn({
        let (shutdown, state) = (shutdown.clone(), state.clone());
        async move {
            shutdown.await;
            state.set_phase(Phase::ShuttingDown);
        }
    });

    let lease = match args.leader.enabled {
        true => Some(prepare_lease(&args, &client, &config).await?),
        false => None,
    };
    // A standby builds every controller now, so its watches list and keep their caches while it
    // waits; the gate holds every reconcile and sweep until it holds the Lease.
    // With sharding the gate is open but permits only the shards this replica holds.
    let (gate, acting) = match args.leader.sharding {
        true => controllers::Gate::sharded(),
        false => controllers::Gate::shut(),
    };
    match lease {
        Some(_) => state.set_phase(Phase::Standby),
        None => state.set_phase(Phase::Syncing),
    }

    let sqs = Arc::new(providers::SqsProvider::from_env(&args.aws.sqs_settings()).await);
    info!(
        namespace = args.namespace.as_deref().unwrap_or("<all>"),
        region = sqs.region().as_deref().unwrap_or("<unset>"),
        resync = ?args.queue.resync,
        "starting skyport"
    );
    let (client_for_tunnels, client_for_leases) = (client.clone(), client.clone());
    let cluster_id = skyport::clouds::cluster_id(&client, &args.tunnel).await?;
    let ownership_key = match &args.queue.ownership_key_file {
        Some(path) => skyport::config::OwnershipKey::load(path)?,
        None => None,
    };
    if ownership_key.is_none() {
        info!(
            "no ownership key: Queue ownership proofs are kept in memory only, so a restart reads every queue's tags"
        );
    }
    let queue_settings =
        skyport::config::QueueArgs { cluster_id: cluster_id.clone(), ownership_key, ..args.queue.clone() };
    let (ctx, queues) = controllers::queue::controller(
        client,
        sqs.clone(),
        args.aws.sqs_settings(),
        queue_settings,
        args.namespace.clone(),
        acting.clone(),
        shutdown.clone(),
    );
    let queues = run_until_stopped("queue", queues, shutdown.clone(), {
        let ctx = ctx.clone();
        move || ctx.caches_synced()
    });
    add_queue_metrics(&state, &ctx, sqs, &acting);
    let (tunnels, tunnels_synced, with_tunnels) =
        start_tunnels(&args, client_for_tunnels, cluster_id, &state, acting, shutdown.clone()).await?;
    let synced = Arc::new(AtomicBool::new(false));
    tokio::spawn({
        let (ctx, state, flag) = (ctx.clone(), state.clone(), synced.clone());
        async move {
            let synced = controllers::store_synced(&ctx.queues).await
                && controllers::store_synced(&ctx.configmaps).await
                && tunnels_synced.await;
            if synced {
                state.metrics.caches_synced.set(1);
                flag.store(true, Ordering::SeqCst);
                match state.phase() {
                    Phase::Syncing => {
                        state.set_phase(Phase::Running);
                        info!("caches synced; ready");
                    }
                    Phase::Standby => info!("caches synced; standing by for the leader lease"),
                    _ => {}
                }
            }
        }
    });
    let controllers = tokio::spawn(async move {
        tokio::join!(queues, tunnels);
    });
    if args.leader.sharding {
        let existing = skyport::shards::existing(&ctx, with_tunnels);
        let lease_client = lease_client(&args, &config)?;
        let group = skyport::shards::Group {
            namespace: lease_namespace(&args, &client_for_leases),
            name: args.leader.lease_name.clone(),
            duration: args.leader.lease_duration,
            identity: leader::identity(),
        };
        let metrics = state.metrics.shards.clone();
        let mut shards = skyport::shards::Shards::new(lease_client, group, gate, existing, metrics);
        if let Err(reason) = shards.run(shutdown.clone(), controllers.map(|_| ())).await {
            // Exit at once: another replica may take the shard as soon as its Lease expires.
            error!(%reason, "lost a shard lease; exiting");
            std::process::exit(1);
        }
        shards.release_all().await;
        info!("stopped");
        return Ok(());
    }
    let Some(lease) = lease else {
        act(&gate, &state, &synced);
        let _ = controllers.await;
        state.metrics.leader.set(0);
        info!("stopped");
        return Ok(());
    };
    tokio::select! {
        _ = lease.acquire() => {}
        _ = shutdown.clone() => {
            // Parked reconciles end without acting; the watches end with the shutdown.
            gate.stop();
            lease.release().await;
            let _ = controllers.await;
            info!("stopped before becoming leader");
            return Ok(());
        }
    }
    act(&gate, &state, &synced);
    tokio::select! {
        _ = controllers => {}
        reason = lease.hold() => {
            // Exit at once: a replacement leader may already be reconciling.
            error!(%reason, "lost the leader lease; exiting");
            std::process::exit(1);
        }
    }
    lease.release().await;
    state.metrics.leader.set(0);
    info!("stopped");
    Ok(())
}

/// This replica may act: the gate opens, and it is Running at once if its caches synced while
/// it waited (else Syncing until they have).
fn act(gate: &controllers::Gate, state: &http::State, synced: &AtomicBool) {
    state.metrics.leader.set(1);
    gate.open();
    if state.phase() == Phase::ShuttingDown {
        return;
    }
    state.set_phase(Phase::Syncing);
    // Read after Syncing is set: the task that sees the caches sync reads the phase after setting
    // the flag, so one of the two moves to Running.
    if synced.load(Ordering::SeqCst) {
        state.set_phase(Phase::Running);
        info!("caches synced before the Lease was acquired; ready");
    }
}

/// The leader Lease (made if missing), renewed through a client whose requests time out in time
/// to retry a renewal before the Lease may expire.
async fn prepare_lease(args: &RunArgs, client: &kube::Client, config: &kube::Config) -> anyhow::Result<Lease> {
    let namespace = lease_namespace(args, client);
    let lease_client = lease_client(args, config)?;
    Lease::new(lease_client, &namespace, &args.leader.lease_name, args.leader.lease_duration, leader::identity())
        .await
        .with_context(|| format!("preparing the leader Lease {namespace}/{}", args.leader.lease_name))
}

/// Where the Leases live: --lease-namespace, else the Pod's namespace, else the kubeconfig's.
fn lease_namespace(args: &RunArgs, client: &kube::Client) -> String {
    args.leader
        .lease_namespace
        .clone()
        .or_else(|| std::env::var("POD_NAMESPACE").ok().filter(|s| !s.is_empty()))
        .unwrap_or_else(|| client.default_namespace().to_string())
}

/// A client for Leases whose requests time out in time to retry a renewal before expiry.
fn lease_client(args: &RunArgs, config: &kube::Config) -> anyhow::Result<kube::Client> {
    let mut lease_config = config.clone();
    let timeout = leader::request_timeout(args.leader.lease_duration);
    lease_config.connect_timeout = Some(timeout);
    lease_config.read_timeout = Some(timeout);
    lease_config.write_timeout = Some(timeout);
    kube::Client::try_from(lease_config).context("building the Lease client")
}

/// The Queue controller's series: SQS calls (own identity and per AwsAccount), drift pacing.
fn add_queue_metrics(
    state: &http::State,
    ctx: &Arc<controllers::queue::Context>,
    sqs: Arc<providers::SqsProvider>,
    acting: &controllers::Acting,
) {
    add_controller(state, "queue", ctx, Some(ctx.queues.clone()), acting);
    state.metrics.add_cloud("sqs", move || CloudSnapshot::of(&providers::QueueBackend::limiter(&*sqs).counters));
    let accounts = ctx.clone();
    state.metrics.add_sqs_accounts(move || {
        accounts
            .accounts
            .budgets()
            .into_iter()
            .map(|(key, limiter)| (key, CloudSnapshot::of(&limiter.counters)))
            .collect()
    });
    let paced = ctx.clone();
    state.metrics.add_drift_paces(move || {
        let paces = paced.paces().into_iter();
        paces
            .map(|((aws_account, region), pace)| skyport::metrics::DriftPace {
                aws_account,
                region,
                queues: pace.queues as u64,
                attributes: pace.resync,
                tags: pace.tag_resync,
            })
            .collect()
    });
}

/// Starts the Tunnel and Service controllers when a provider is configured; otherwise a future
/// that does nothing. Also returns a future saying whether their caches synced.
async fn start_tunnels(
    args: &RunArgs,
    client: kube::Client,
    cluster_id: String,
    state: &http::State,
    acting: controllers::Acting,
    shutdown: futures::future::Shared<futures::future::BoxFuture<'static, ()>>,
) -> anyhow::Result<(futures::future::BoxFuture<'static, ()>, futures::future::BoxFuture<'static, bool>, bool)> {
    let registry = skyport::clouds::configure(&args.tunnel, args.aws.region.as_deref()).await?;
    if registry.names().is_empty() {
        info!("no exit-server provider configured (--provider); Tunnel controllers not started");
        return Ok((futures::future::ready(()).boxed(), futures::future::ready(true).boxed(), false));
    }
    let t = &args.tunnel;
    controllers::tunnel::plan::check_health_settings(t.control_port, t.health_port, t.boot_timeout, t.replace_after)
        .map_err(anyhow::Error::msg)?;
    // Fail at start, not at the first Tunnel, when exit servers could not be checked.
    if registry.all().any(|p| p.capabilities().fetches_artifact) {
        let artifacts = args.tunnel.exit_server_artifacts().context("exit-server binary (--exit-server-url)")?;
        for a in &artifacts {
            info!(arch = %a.arch, url = %a.url, sha256 = %a.sha256, "exit servers download and check this binary");
        }
        // Said at start, before a Tunnel needs a host (which checks again, from the cache).
        if !t.skip_exit_server_check {
            let settings = t.clone();
            tokio::spawn(async move {
                if let Err(e) = skyport::tunnel::verify::check(&artifacts, &settings).await {
                    warn!(reason = %e.reason(), "{e}");
                }
            });
        }
    }
    let backoff = args.tunnel.backoff(&args.queue);
    for provider in registry.all() {
        let provider = provider.clone();
        state.metrics.add_cloud(provider.name(), move || CloudSnapshot::of(&provider.limiter().counters));
    }
    let (ctx, tunnels) = controllers::tunnel::controller(
        client.clone(),
        registry,
        Arc::new(controllers::tunnel::observe::NetworkProbe),
        args.tunnel.clone(),
        backoff,
        args.namespace.clone(),
        cluster_id,
        acting.clone(),
        shutdown.clone(),
    );
    let (svc_ctx, services) = controllers::service::controller(
        client,
        args.tunnel.clone(),
        ctx.tunnels.clone(),
        args.namespace.clone(),
        acting.clone(),
        shutdown.clone(),
    );
    let tunnels = run_until_stopped("tunnel", tunnels, shutdown.clone(), {
        let ctx = ctx.clone();
        move || ctx.caches_synced()
    });
    // Service reconciles parked on a Tunnel cache that never synced are dropped too: stopping the
    // Tunnel controller would let them go on with an empty Tunnel cache.
    let services = run_until_stopped("service", services, shutdown, {
        let ctx = svc_ctx.clone();
        move || ctx.caches_synced()
    });
    add_controller(state, "tunnel", &ctx, Some(ctx.tunnels.clone()), &acting);
    add_controller::<skyport::crd::Tunnel, _, _>(state, "service", &svc_ctx, None, &acting);
    let orphans = ctx.clone();
    state.metrics.add_orphans(move || orphans.orphans_deleted.load(std::sync::atomic::Ordering::Relaxed));
    let released = ctx.clone();
    state
        .metrics
        .add_orphan_addresses(move || released.orphan_addresses_released.load(std::sync::atomic::Ordering::Relaxed));
    let moved = ctx.clone();
    state.metrics.add_failovers(move || moved.failovers.by_tunnel());
    let unserved = ctx.clone();
    state.metrics.add_unserved(move || unserved.unserved.seconds.by_tunnel());
    let (cached, leading) = (ctx.tunnels.clone(), acting.clone());
    state.metrics.add_tunnels(move || match leading.permits_shard(controllers::acting::TUNNELS_SHARD) {
        true => TunnelSnapshot::of(cached.state().iter().map(|t| &**t)),
        false => TunnelSnapshot::default(),
    });
    let synced = {
        let (tunnels, services) = (ctx.tunnels.clone(), svc_ctx.services.clone());
        async move { controllers::store_synced(&tunnels).await && controllers::store_synced(&services).await }.boxed()
    };
    let run = async move {
        tokio::join!(tunnels, services);
    };
    Ok((run.boxed(), synced, true))
}

/// Registers a controller's reconcile metrics, its write counter and, for controllers with a
/// status, the Ready counts of the objects in its cache while this replica acts.
fn add_controller<K, S, M>(
    state: &http::State,
    name: &'static str,
    ctx: &Arc<controllers::Context<S, M>>,
    objects: Option<Store<K>>,
    acting: &controllers::Acting,
) where
    K: controllers::status::WithStatus
        + controllers::Sharded
        + kube::runtime::reflector::Lookup<DynamicType = ()>
        + Send
        + Sync
        + 'static,
    S: Send + Sync + 'static,
    M: Send + Sync + 'static,
{
    let (writes, leading) = (ctx.clone(), acting.clone());
    // Counted by the replica that acts on each object only: a standby's warm cache (or another
    // shard's replica's) holds the same objects, and dashboards sum over replicas.
    let count = move || match &objects {
        Some(store) => ReadyCounts::count(
            store
                .state()
                .iter()
                .filter(|o| leading.permits(&***o))
                .map(|o| controllers::status::ready_condition(&**o).map(|c| c.status)),
        ),
        None => ReadyCounts::default(),
    };
    state.metrics.add_controller(name, ctx.metrics.clone(), count, move || writes.api_writes.get());
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term => {},
    }
    info!("shutdown requested; finishing reconciles in flight");
}
