//! What Helm users expect of the chart beyond the objects it renders: a values schema that
//! refuses typos and wrong types, a PodDisruptionBudget and spreading over nodes, and opt-in
//! monitoring objects (ServiceMonitor, PodMonitor, PrometheusRule, Grafana dashboard).

use std::collections::BTreeSet;
use std::process::Command;

use serde_json::Value;

use super::harness::*;

/// `helm template` with `extra`: Ok(output) or Err(stderr), for values that must be refused.
fn template(extra: &[&str]) -> Result<String, String> {
    let mut args = vec!["template", "skyport", "deploy/helm/skyport", "--namespace", "skyport-system"];
    args.extend_from_slice(extra);
    let out = Command::new(helm()).args(&args).current_dir(root()).output().expect("run helm");
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn the_values_schema_refuses_typos_and_wrong_types() {
    require_env();
    template(&[]).expect("the default values pass their own schema");
    let refused = [
        (&["--set", "replicaCount=two"][..], "replicaCount"),
        (&["--set", "tunnel.provder=ec2"][..], "provder"),
        (&["--set", "logFormat=yaml"][..], "logFormat"),
        (&["--set", "queue.resync=soon"][..], "resync"),
        (&["--set", "tunnel.provider=azure"][..], "provider"),
        (&["--set", "podDisruptionBudget.enabled=maybe"][..], "enabled"),
    ];
    for (args, field) in refused {
        let error = template(args).expect_err(&format!("{args:?} must be refused"));
        assert!(error.contains("schema") && error.contains(field), "{args:?}: {error}");
    }
}

/// Every key of values.yaml, as dotted paths (free-form maps count as one key).
fn value_paths(value: &serde_json::Value, schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    let Some(map) = value.as_object() else { return };
    for (key, v) in map {
        let path = format!("{prefix}{key}");
        let s = &schema["properties"][key];
        assert!(s.is_object(), "values.yaml has {path}, values.schema.json does not");
        assert!(s["description"].as_str().is_some_and(|d| !d.is_empty()), "{path} has no description in the schema");
        out.insert(path.clone());
        if s.get("properties").is_some() {
            value_paths(v, s, &format!("{path}."), out);
        }
    }
    if let Some(props) = schema["properties"].as_object() {
        for key in props.keys() {
            assert!(map.contains_key(key), "values.schema.json has {prefix}{key}, values.yaml does not");
        }
    }
}

#[test]
fn every_value_is_described_in_the_schema_and_nothing_else_is() {
    let values: Value = serde_saphyr::from_str(&read("deploy/helm/skyport/values.yaml")).expect("values.yaml");
    let schema: Value = serde_json::from_str(&read("deploy/helm/skyport/values.schema.json")).expect("schema");
    assert_eq!(schema["additionalProperties"], false, "unknown top-level values must be refused");
    let mut paths = BTreeSet::new();
    value_paths(&values, &schema, "", &mut paths);
    assert!(paths.contains("tunnel.withdrawAfter") && paths.len() > 80, "{paths:?}");
}

#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn the_operator_has_a_disruption_budget_and_spreads_over_nodes() {
    require_env();
    let docs = documents(&helm_template(&[]));
    let pdb = find(&docs, "PodDisruptionBudget", "skyport");
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    assert_eq!(pdb["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"], "skyport");
    let spread = &find(&docs, "Deployment", "skyport")["spec"]["template"]["spec"]["topologySpreadConstraints"][0];
    assert_eq!(spread["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(spread["whenUnsatisfiable"], "ScheduleAnyway", "spreading must never block scheduling");
    let off =
        documents(&helm_template(&["--set", "podDisruptionBudget.enabled=false", "--set", "spreadOverNodes=false"]));
    assert!(!off.iter().any(|d| d["kind"] == "PodDisruptionBudget"));
    assert!(find(&off, "Deployment", "skyport")["spec"]["template"]["spec"].get("topologySpreadConstraints").is_none());
}

/// The chart with every monitoring object switched on.
pub fn monitoring_objects() -> Vec<Value> {
    let on = [
        "metrics.serviceMonitor.enabled=true",
        "metrics.podMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
    ];
    let args: Vec<&str> = on.iter().flat_map(|s| ["--set", *s]).collect();
    documents(&helm_template(&args))
}

/// The PromQL expressions of the dashboard and of the alerting rules.
pub fn monitoring_expressions(docs: &[Value]) -> Vec<String> {
    let dashboard = find(docs, "ConfigMap", "skyport-dashboard")["data"]["skyport.json"].as_str().expect("dashboard");
    let dashboard: Value = serde_json::from_str(dashboard).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut exprs: Vec<String> = panels
        .iter()
        .flat_map(|p| p["targets"].as_array().cloned().unwrap_or_default())
        .filter_map(|t| t["expr"].as_str().map(str::to_string))
        .collect();
    let rules = &find(docs, "PrometheusRule", "skyport")["spec"]["groups"][0]["rules"];
    exprs.extend(rules.as_array().expect("rules").iter().filter_map(|r| r["expr"].as_str().map(str::to_string)));
    exprs
}

#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn monitoring_objects_are_opt_in_and_select_the_operator() {
    require_env();
    let default = documents(&helm_template(&[]));
    for kind in ["ServiceMonitor", "PodMonitor", "PrometheusRule"] {
        assert!(!default.iter().any(|d| d["kind"] == kind), "{kind} is opt-in");
    }
    let docs = monitoring_objects();
    for kind in ["ServiceMonitor", "PodMonitor"] {
        let monitor = find(&docs, kind, "skyport");
        assert_eq!(monitor["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"], "skyport", "{kind}");
    }
    let service = find(&docs, "Service", "skyport-metrics");
    let port = &find(&docs, "ServiceMonitor", "skyport")["spec"]["endpoints"][0]["port"];
    assert_eq!(&service["spec"]["ports"][0]["name"], port, "the ServiceMonitor names the Service's port");
    let alerts: Vec<&str> = find(&docs, "PrometheusRule", "skyport")["spec"]["groups"][0]["rules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["alert"].as_str())
        .collect();
    assert!(alerts.contains(&"SkyportNoLeader") && alerts.contains(&"SkyportReconcileErrors"), "{alerts:?}");
    assert!(monitoring_expressions(&docs).len() >= 15);
}

/// The tunnel clients' namespace is its own: the chart creates it (restricted), binds the
/// clients' Role there and nowhere else, and refuses the release's own namespace, where a patch
/// of Secrets would read the operator's.
#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn tunnel_clients_get_a_namespace_of_their_own_never_the_releases() {
    require_env();
    let docs = documents(&template(&[]).expect("default values"));
    let namespace = find(&docs, "Namespace", "skyport-tunnels");
    assert_eq!(namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"], "restricted");
    let role = find(&docs, "Role", "skyport-tunnel-clients");
    assert_eq!(role["metadata"]["namespace"], "skyport-tunnels");
    let secret_roles = docs.iter().filter(|d| d["kind"] == "Role" && d["rules"].to_string().contains("secrets"));
    let namespaces: Vec<&Value> = secret_roles.map(|d| &d["metadata"]["namespace"]).collect();
    assert_eq!(namespaces, [&Value::from("skyport-tunnels")], "Secrets are granted in the clients' namespace only");

    let elsewhere =
        documents(&template(&["--set", "tunnel.clientNamespace=edge,tunnel.createClientNamespace=false"]).unwrap());
    assert!(!elsewhere.iter().any(|d| d["kind"] == "Namespace"), "no Namespace when the platform team makes it");
    assert_eq!(find(&elsewhere, "Role", "skyport-tunnel-clients")["metadata"]["namespace"], "edge");
    let policy = find(&elsewhere, "ValidatingAdmissionPolicy", "skyport-writes-only-its-own-objects").to_string();
    assert!(policy.contains("'edge'"), "the policy admits clients in the namespace given: {policy}");
    let deployment = find(&elsewhere, "Deployment", "skyport").to_string();
    assert!(deployment.contains("--tunnel-client-namespace=edge"), "{deployment}");

    let error = template(&["--set", "tunnel.clientNamespace=skyport-system"]).expect_err("the release's namespace");
    assert!(error.contains("tunnel.clientNamespace must differ"), "{error}");
    for shared in ["default", "kube-system"] {
        let error = template(&["--set", &format!("tunnel.clientNamespace={shared}")]).expect_err(shared);
        assert!(error.contains("a namespace of its own"), "{shared}: {error}");
    }
}
