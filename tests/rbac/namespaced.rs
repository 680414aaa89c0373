//! A namespaced install (`watchNamespace`): the controllers work with its one Role.

use super::*;

/// With `watchNamespace`, the chart grants only a Role in that namespace: both controllers work
/// with exactly it, and nothing outside the namespace is readable, not even one Secret.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn controllers_work_with_only_the_namespaced_role_of_a_watch_namespace_install() {
    use k8s_openapi::api::core::v1::Service;
    use skyport::crd::{Tunnel, TunnelPhase};

    let admin = client().await;
    let ns = TestNs::new("rbac-ns").await;
    const RELEASE_NS: &str = "skyport-ns-system";
    const RELEASE_CLIENT_NS: &str = "skyport-ns-tunnels";
    let _ = Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": RELEASE_NS}})).unwrap())
        .await;
    let rendered = helm_render(&[
        "--namespace",
        RELEASE_NS,
        "--set",
        &format!("watchNamespace={},tunnel.clusterId=rbac-ns-test,tunnel.clientNamespace={RELEASE_CLIENT_NS}", ns.name),
    ]);
    assert!(!rendered.contains("kind: ClusterRoleBinding"), "nothing cluster-wide with watchNamespace:\n{rendered}");
    kubectl_apply(&rendered);
    let sa = token_client(&admin, RELEASE_NS, "skyport-ns").await;
    install::until_the_policy_applies(&sa, &ns.name).await;

    // The Queue controller: create → Ready, ConfigMap, Event; delete → gone.
    let (ctx, stop, task) = queue_controller_as(sa.clone(), &ns).await;
    let queues: Api<Queue> = ns.api();
    queues.create(&PostParams::default(), &queue("orders", json!({}))).await.unwrap();
    wait_ready(&queues, "orders", ConditionStatus::True, "Available", TIMEOUT).await;
    eventually("ConfigMap orders-sqs", TIMEOUT, || async { ns.api::<ConfigMap>().get("orders-sqs").await.ok() }).await;
    queues.delete("orders", &DeleteParams::default()).await.unwrap();
    wait_gone(&queues, "orders", TIMEOUT).await;
    assert_no_failures(&ctx.metrics, "Queue reconciles failed with the Role");
    let _ = stop.send(());
    let _ = tokio::time::timeout(Duration::from_secs(20), task).await;
    escalations::escalations_are_refused(&admin, &sa, &ns.name, (RELEASE_NS, "skyport-ns"), RELEASE_CLIENT_NS).await;
    users_objects::users_objects_are_skyports_only_by_its_finalizer(&admin, &sa, &ns.name, RELEASE_CLIENT_NS).await;

    // The Tunnel and Service controllers, with the cluster id from the chart's value.
    let mut settings = tunnels::fast_tunnel_settings();
    settings.cluster_id = Some("rbac-ns-test".into());
    settings.client_namespace = Some(RELEASE_CLIENT_NS.into());
    let op = tunnels::TunnelOperator::start_as(sa.clone(), &ns, settings).await;
    let (_, client, _) = Placement::names(&ns.name, "web-tunnel", Some(RELEASE_CLIENT_NS));
    let svc: Service = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"type": "LoadBalancer", "loadBalancerClass": "skyport.dev/tunnel", "ports": [{"port": 8080}]},
    }))
    .unwrap();
    ns.api::<Service>().create(&PostParams::default(), &svc).await.unwrap();
    // Active needs the tunnel client running (the kubelet's part here), in the release's
    // tunnel clients' namespace.
    let _client = common::kubelet::ClientRunner::start(
        admin.clone(),
        RELEASE_CLIENT_NS,
        &client,
        common::kubelet::Backends::default(),
    );
    let tunnels_api: Api<Tunnel> = ns.api();
    eventually("Tunnel Active with the Role", ACTIVE_TIMEOUT, || async {
        let t = tunnels_api.get("web-tunnel").await.ok()?;
        (t.status?.phase == Some(TunnelPhase::Active)).then_some(())
    })
    .await;
    assert_no_failures(&op.ctx.metrics, "Tunnel reconciles failed with the Role");
    assert_no_failures(&op.services.metrics, "Service reconciles failed");

    // Nothing outside the watched namespace, reads included.
    let elsewhere = TestNs::new("rbac-ns-other").await;
    let secret: Secret =
        serde_json::from_value(json!({"metadata": {"name": "unrelated"}, "stringData": {"k": "v"}})).unwrap();
    elsewhere.api::<Secret>().create(&PostParams::default(), &secret).await.unwrap();
    forbidden(
        Api::<Secret>::namespaced(sa.clone(), &elsewhere.name).get("unrelated").await,
        "read a Secret in another namespace",
    );
    forbidden(Api::<Queue>::all(sa.clone()).list(&ListParams::default()).await, "list Queues cluster-wide");
    forbidden(Api::<Secret>::namespaced(sa.clone(), &ns.name).list(&ListParams::default()).await, "list Secrets");
    forbidden(Api::<Namespace>::all(sa.clone()).get("kube-system").await, "read kube-system (no ClusterRole)");
    forbidden(
        Api::<ConfigMap>::namespaced(sa.clone(), &elsewhere.name)
            .create(
                &PostParams::default(),
                &serde_json::from_value(
                    json!({"metadata": {"name": "x", "labels": {"app.kubernetes.io/managed-by": "skyport"}}}),
                )
                .unwrap(),
            )
            .await,
        "create a ConfigMap in another namespace",
    );
    unrelated_writes_are_refused(&admin, &sa, &ns.name).await;
    elsewhere.cleanup().await;
    tunnels::finish_tunnels(op, ns).await;
}
