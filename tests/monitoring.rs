//! The chart's dashboard and alerting rules query only metrics a running operator exports:
//! every metric name in their PromQL is looked up in the `/metrics` of a real `skyport run`
//! with both the Queue and the Tunnel controllers on.

use crate::common;
use crate::deploy::chart::{monitoring_expressions, monitoring_objects};
use crate::deploy::harness::require_env;
use crate::operate::http_get;

use std::collections::BTreeSet;
use std::process::Stdio;
use std::time::Duration;

use common::{TestNs, eventually};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Command;

/// A metric's family name: what OpenMetrics names in `# TYPE` (no `_total`, `_bucket`, ...).
fn family(name: &str) -> &str {
    ["_total", "_bucket", "_count", "_sum", "_created", "_info"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name)
}

/// Every `skyport_*` metric name an expression reads.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut rest = expr;
    while let Some(at) = rest.find("skyport_") {
        let tail = &rest[at..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        names.insert(tail[..end].to_string());
        rest = &tail[end..];
    }
    names
}

#[test]
fn metric_names_are_read_from_promql() {
    let names = metric_names(
        "histogram_quantile(0.99, sum by (le) (rate(skyport_reconcile_duration_seconds_bucket[5m]))) / skyport_leader",
    );
    assert_eq!(names, BTreeSet::from(["skyport_leader".into(), "skyport_reconcile_duration_seconds_bucket".into()]));
    assert_eq!(family("skyport_reconciles_total"), "skyport_reconciles");
    assert_eq!(family("skyport_build_info"), "skyport_build");
}

#[tokio::test]
#[ignore = "needs the test environment: tests/env.sh up"]
async fn the_dashboard_and_alerts_query_only_metrics_the_operator_exports() {
    require_env();
    let exprs = monitoring_expressions(&monitoring_objects());
    let ns = TestNs::new("monitoring").await;
    let state = tempfile_dir();
    let mut child = Command::new(env!("CARGO_BIN_EXE_skyport"))
        .args(["run", "--namespace", &ns.name, "--log-format", "json", "--listen-address", "127.0.0.1:0"])
        .args(["--provider", "local", "--cluster-id", "monitoring-test", "--local-state-dir"])
        .arg(&state)
        // As the test cluster's admin, whom no admission policy covers.
        .env("SKYPORT_ALLOW_WITHOUT_ADMISSION_POLICIES", "true")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("start skyport");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let address = tokio::time::timeout(Duration::from_secs(30), async {
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(log) = serde_json::from_str::<serde_json::Value>(&line) else { continue };
            if log["message"].as_str().is_some_and(|m| m.starts_with("serving /healthz")) {
                return log["address"].as_str().map(str::to_string);
            }
        }
        None
    })
    .await
    .ok()
    .flatten()
    .expect("the operator logs the address it serves /metrics on");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    eventually("the controllers running", Duration::from_secs(60), || async {
        (http_get(&address, "/readyz").await.2.trim() == "running").then_some(())
    })
    .await;
    let body = http_get(&address, "/metrics").await.2;
    let exported: BTreeSet<&str> =
        body.lines().filter_map(|l| l.strip_prefix("# TYPE ")).filter_map(|l| l.split(' ').next()).collect();
    let wanted: BTreeSet<String> = exprs.iter().flat_map(|e| metric_names(e)).collect();
    let missing: Vec<&String> = wanted.iter().filter(|n| !exported.contains(family(n))).collect();
    assert!(missing.is_empty(), "the dashboard or alerts read {missing:?}, which /metrics does not export:\n{body}");
    assert!(wanted.len() >= 10, "{wanted:?}");
    let own = r#"skyport_queue_drift_period_seconds{aws_account="default",region="#;
    assert!(body.contains(own), "the operator's own account's drift check period is exported:\n{body}");
    drop(child);
    ns.cleanup().await;
    let _ = std::fs::remove_dir_all(state);
}

fn tempfile_dir() -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("skyport-monitoring-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).expect("state dir");
    dir
}
