//! The exposition of every family.

use super::*;

#[test]
fn exposition_has_every_family_with_controller_and_provider_labels() {
    let metrics = Metrics::default();
    let queue = Arc::new(ReconcileMetrics::default());
    queue.record(Duration::from_millis(30), None);
    queue.record(Duration::from_millis(3), Some("SqsUnavailable"));
    metrics.add_controller("queue", queue.clone(), || ReadyCounts { ready: 2, not_ready: 1, unknown: 0 }, || 7);
    let counters = providers::CallCounters::default();
    counters.record_outcome("CreateQueue", providers::limiter::SUCCESS);
    counters.record_outcome("GetQueueAttributes", "unavailable");
    let snap = CloudSnapshot::of(&counters);
    metrics.add_cloud("sqs", move || snap.clone());
    metrics.leader.set(1);
    metrics.add_orphans(|| 3);
    metrics.add_orphan_addresses(|| 2);
    let shop_pair = || [(("shop".to_string(), "pair".to_string()), 4.0)].into_iter().collect();
    metrics.add_failovers(shop_pair);
    metrics.add_unserved(|| [(("shop".to_string(), "pair".to_string()), 1.5)].into_iter().collect());

    let text = metrics.encode();
    for line in [
        r#"skyport_reconciles_total{controller="queue"} 2"#,
        r#"skyport_reconcile_errors_total{controller="queue",reason="SqsUnavailable"} 1"#,
        r#"skyport_reconcile_duration_seconds_count{controller="queue"} 2"#,
        r#"skyport_reconcile_duration_seconds_bucket{le="0.005",controller="queue"} 1"#,
        r#"skyport_objects{controller="queue",ready="True"} 2"#,
        r#"skyport_objects{controller="queue",ready="False"} 1"#,
        r#"skyport_objects{controller="queue",ready="Unknown"} 0"#,
        r#"skyport_kube_api_writes_total{controller="queue"} 7"#,
        r#"skyport_cloud_api_calls_total{provider="sqs",operation="CreateQueue",outcome="success"} 1"#,
        r#"skyport_cloud_api_calls_total{provider="sqs",operation="GetQueueAttributes",outcome="unavailable"} 1"#,
        r#"skyport_rate_limiter_waits_total{provider="sqs"} 0"#,
        r#"skyport_rate_limiter_wait_seconds_total{provider="sqs"} 0.0"#,
        "skyport_leader 1",
        "skyport_orphan_hosts_deleted_total 3",
        "skyport_orphan_addresses_released_total 2",
        r#"skyport_tunnel_failovers_total{namespace="shop",name="pair"} 4"#,
        r#"skyport_tunnel_unserved_seconds_total{namespace="shop",name="pair"} 1.5"#,
        r#"skyport_build_info{version="#,
        "# TYPE skyport_reconcile_duration_seconds histogram",
        "# EOF",
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert_eq!(queue.errors()["SqsUnavailable"], 1);
}

#[test]
fn before_any_controller_is_added_the_families_have_no_controller_series() {
    let text = Metrics::default().encode();
    assert!(text.contains("skyport_leader 0"), "{text}");
    assert!(text.contains("skyport_caches_synced 0"), "{text}");
    assert!(text.contains("# TYPE skyport_reconciles counter"), "{text}");
    assert!(!text.contains("skyport_reconciles_total{"), "{text}");
}

fn tunnel(name: &str, status: serde_json::Value) -> crate::crd::tunnel::Tunnel {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "skyport.dev/v1alpha1", "kind": "Tunnel",
        "metadata": {"name": name, "namespace": "shop"},
        "spec": {"serviceRef": {"name": name}},
        "status": status,
    }))
    .expect("a Tunnel")
}

#[test]
fn exit_servers_are_counted_by_provider_and_failovers_by_tunnel() {
    let server = |slot: &str, id: Option<&str>| serde_json::json!({"slot": slot, "hostId": id, "healthy": true});
    let tunnels = [
        tunnel("web", serde_json::json!({"provider": "hetzner", "hostId": "h-1", "conditions": []})),
        tunnel("booting", serde_json::json!({"provider": "hetzner", "conditions": []})),
        tunnel(
            "pair",
            serde_json::json!({"provider": "aws", "hostId": "i-1", "conditions": [], "highAvailability": {
            "active": "i-1", "servers": [server("a", Some("i-1")), server("b", Some("i-2"))], "failovers": 2}}),
        ),
        tunnel(
            "half",
            serde_json::json!({"provider": "aws", "conditions": [], "highAvailability": {
            "servers": [server("a", Some("i-3")), server("b", None)]}}),
        ),
    ];
    let snapshot = TunnelSnapshot::of(&tunnels);
    assert_eq!(snapshot.exit_servers, BTreeMap::from([("aws".into(), 3), ("hetzner".into(), 1)]));
    let failovers = BTreeMap::from([(("shop".into(), "half".into()), 0), (("shop".into(), "pair".into()), 2)]);
    assert_eq!(snapshot.failovers, failovers);
}

#[test]
fn exit_servers_failovers_and_account_calls_are_exposed() {
    let metrics = Metrics::default();
    let snapshot = TunnelSnapshot::of(&[tunnel(
        "pair",
        serde_json::json!({"provider": "aws", "conditions": [], "highAvailability": {
            "servers": [{"slot": "a", "hostId": "i-1", "healthy": true}], "failovers": 3}}),
    )]);
    metrics.add_tunnels(move || snapshot.clone());
    let counters = providers::CallCounters::default();
    counters.record_outcome("SendMessage", providers::limiter::SUCCESS);
    counters.record_outcome("GetQueueAttributes", "throttled");
    counters.record_outcome("CreateQueue", "throttled");
    let snap = CloudSnapshot::of(&counters);
    metrics.add_sqs_accounts(move || vec![(("111122223333".into(), "eu-west-1".into()), snap.clone())]);
    let text = metrics.encode();
    for line in [
        "# TYPE skyport_exit_servers gauge",
        r#"skyport_exit_servers{provider="aws"} 1"#,
        r#"skyport_tunnel_status_failovers_total{namespace="shop",name="pair"} 3"#,
        r#"skyport_sqs_account_calls_total{aws_account="111122223333",region="eu-west-1",operation="SendMessage",outcome="success"} 1"#,
        r#"skyport_sqs_account_throttles_total{aws_account="111122223333",region="eu-west-1"} 2"#,
        r#"skyport_sqs_account_rate_limiter_waits_total{aws_account="111122223333",region="eu-west-1"} 0"#,
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}

#[test]
fn drift_periods_are_exposed_per_account_and_region() {
    let metrics = Metrics::default();
    let pace = |account: &str, queues, attributes, tags| DriftPace {
        aws_account: account.into(),
        region: "eu-west-1".into(),
        queues,
        attributes: Duration::from_secs(attributes),
        tags: Duration::from_secs(tags),
    };
    let paces = vec![pace("default", 10, 60, 600), pace("111122223333", 10_000, 416, 833)];
    metrics.add_drift_paces(move || paces.clone());
    let text = metrics.encode();
    for line in [
        "# TYPE skyport_queue_drift_period_seconds gauge",
        r#"skyport_queue_drift_period_seconds{aws_account="default",region="eu-west-1",check="attributes"} 60.0"#,
        r#"skyport_queue_drift_period_seconds{aws_account="111122223333",region="eu-west-1",check="tags"} 833.0"#,
        r#"skyport_sqs_account_queues{aws_account="111122223333",region="eu-west-1"} 10000"#,
    ] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
}
