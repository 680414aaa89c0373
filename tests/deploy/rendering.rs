//! The two renderings, the kustomize base and the Helm chart: the same objects from the chart's
//! defaults, every optional branch of the chart, and all of it accepted by a server-side dry run.

use std::collections::BTreeMap;

use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::Role;
use serde_json::Value;

use super::harness::{documents, ensure_install_namespace, find, helm, helm_template, kustomize, require_env, run};

/// Removes what only Helm adds (its bookkeeping labels), then keys objects by kind/namespace/name.
fn normalized(docs: Vec<Value>) -> BTreeMap<String, Value> {
    fn strip(labels: Option<&mut Value>) {
        if let Some(map) = labels.and_then(Value::as_object_mut) {
            map.remove("helm.sh/chart");
            map.remove("app.kubernetes.io/managed-by");
        }
    }
    /// `1000.0` and `1000` are the same number (kustomize rewrites the CRD's floats, Helm does not).
    fn integral_numbers(v: &mut Value) {
        match v {
            Value::Number(n) => {
                if let Some(f) = n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e15 && !n.is_i64()) {
                    *v = Value::from(f as i64);
                }
            }
            Value::Array(items) => items.iter_mut().for_each(integral_numbers),
            Value::Object(map) => map.values_mut().for_each(integral_numbers),
            _ => {}
        }
    }
    docs.into_iter()
        .map(|mut d| {
            integral_numbers(&mut d);
            strip(d.pointer_mut("/metadata/labels"));
            strip(d.pointer_mut("/spec/template/metadata/labels"));
            let key = format!(
                "{}/{}/{}",
                d["kind"].as_str().unwrap_or_default(),
                d["metadata"]["namespace"].as_str().unwrap_or_default(),
                d["metadata"]["name"].as_str().unwrap_or_default()
            );
            (key, d)
        })
        .collect()
}

#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn kustomize_base_is_accepted_by_a_server_side_dry_run() {
    require_env();
    ensure_install_namespace();
    let out = run("kubectl", &["apply", "--dry-run=server", "-k", "deploy/"], None);
    for object in [
        "namespace/skyport-system",
        "namespace/skyport-tunnels",
        "role.rbac.authorization.k8s.io/skyport-tunnel-clients",
        "customresourcedefinition.apiextensions.k8s.io/queues.skyport.dev",
        "serviceaccount/skyport",
        "clusterrole.rbac.authorization.k8s.io/skyport",
        "clusterrolebinding.rbac.authorization.k8s.io/skyport",
        "role.rbac.authorization.k8s.io/skyport-leader-election",
        "rolebinding.rbac.authorization.k8s.io/skyport-leader-election",
        "lease.coordination.k8s.io/skyport",
        "validatingadmissionpolicy.admissionregistration.k8s.io/skyport-writes-only-its-own-objects",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/skyport-writes-only-its-own-objects",
        "validatingadmissionpolicy.admissionregistration.k8s.io/skyport-queue-names",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/skyport-queue-names",
        "validatingadmissionpolicy.admissionregistration.k8s.io/skyport-publishes-only-its-own-load-balancers",
        "validatingadmissionpolicy.admissionregistration.k8s.io/skyport-never-writes-specs",
        "validatingadmissionpolicy.admissionregistration.k8s.io/skyport-writes-only-its-own-events",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/skyport-writes-only-its-own-events",
        "validatingadmissionpolicy.admissionregistration.k8s.io/skyport-writes-only-its-own-leases",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/skyport-writes-only-its-own-leases",
        "deployment.apps/skyport",
        "service/skyport-metrics",
    ] {
        assert!(out.contains(object), "{object} missing from the dry run:\n{out}");
    }
}

#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn helm_chart_with_default_values_renders_the_kustomize_objects() {
    require_env();
    run(&helm(), &["lint", "--strict", "deploy/helm/skyport"], None);
    let mut from_kustomize = normalized(documents(&kustomize()));
    let from_helm = normalized(documents(&helm_template(&[])));
    // Helm does not create its release namespace (`--create-namespace` does).
    assert!(from_kustomize.remove("Namespace//skyport-system").is_some());
    // The chart makes the ownership key with a random value; kustomize cannot (deploy/README.md).
    let mut from_helm = from_helm;
    assert!(from_helm.remove("Secret/skyport-system/skyport-ownership-key").is_some());
    let (k, h): (Vec<&String>, Vec<&String>) = (from_kustomize.keys().collect(), from_helm.keys().collect());
    assert_eq!(k, h, "the two renderings hold different objects");
    for (key, object) in &from_kustomize {
        assert!(
            &from_helm[key] == object,
            "{key} differs:\nkustomize: {}\nhelm: {}",
            serde_json::to_string_pretty(object).unwrap(),
            serde_json::to_string_pretty(&from_helm[key]).unwrap()
        );
    }
}

/// The Secrets the chart's Deployment loads with `envFrom`.
fn deployment_env_from(docs: &[Value]) -> Vec<String> {
    let deployment: Deployment = serde_json::from_value(find(docs, "Deployment", "skyport").clone()).unwrap();
    let container = deployment.spec.unwrap().template.spec.unwrap().containers[0].clone();
    container.env_from.unwrap_or_default().into_iter().filter_map(|e| e.secret_ref.map(|s| s.name)).collect()
}

#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn helm_chart_output_is_accepted_by_a_server_side_dry_run() {
    require_env();
    ensure_install_namespace();
    let defaults = helm_template(&[]);
    run("kubectl", &["apply", "--dry-run=server", "-f", "-"], Some(&defaults));
    // Every optional branch of the templates.
    let custom = helm_template(&[
        "--set",
        "replicaCount=2,watchNamespace=team-a,logLevel=debug,aws.region=eu-west-1,aws.sqsEndpointUrl=http://sqs.local:4566",
        "--set",
        "leaderElection.leaseName=custom,serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::1:role/x",
        "--set",
        "podAnnotations.a=b,podLabels.c=d,nodeSelector.e=f,priorityClassName=system-cluster-critical",
        "--set",
        "extraArgs[0]=--queue-resync=30s,extraEnv[0].name=X,extraEnv[0].value=y,metrics.service.annotations.g=h",
        "--set",
        "tunnel.provider=hetzner,tunnel.defaultLoadBalancer=true,tunnel.annotatedOnly=true,tunnel.clusterId=prod-1",
        "--set",
        "tunnel.ec2ImageId=ami-0123456789abcdef0,tunnel.orphanSweepInterval=0,tunnel.credentialsSecret=my-tokens",
        "--set",
        "tunnel.ec2RegionImages.eu-west-1=ami-0aaaaaaaaaaaaaaaa,tunnel.ec2SubnetIds={subnet-0123456789abcdef0,subnet-0fedcba9876543210}",
        "--set",
        "tunnel.skipExitServerCheck=true,tunnel.exitServerCheckTtl=10m",
        "--set",
        "queue.nameGrants[0]=payments=legacy-payments-*,queue.nameGrants[1]=payments=billing,aws.allowHttpAccountEndpoints=true",
        "--set",
        "rbac.allowWithoutAdmissionPolicies=true,rbac.tenantRoles=false",
    ]);
    // The watched namespace must exist for the Role inside it.
    run(
        "kubectl",
        &["apply", "-f", "-"],
        Some(r#"{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}"#),
    );
    let docs = documents(&custom);
    let deployment: Deployment = serde_json::from_value(find(&docs, "Deployment", "skyport").clone()).unwrap();
    let args = deployment.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
    assert!(args.contains(&"--namespace=team-a".to_string()) && args.contains(&"--lease-name=custom".to_string()));
    let cli = skyport::config::Cli::try_parse_from(std::iter::once("skyport".to_string()).chain(args.clone()))
        .unwrap_or_else(|e| panic!("the chart passes flags skyport rejects: {e}: {args:?}"));
    let skyport::config::Command::Run(run_args) = cli.command else { panic!("not `skyport run`: {args:?}") };
    let tunnel = &run_args.tunnel;
    assert_eq!(tunnel.provider.as_deref(), Some("hetzner"));
    assert!(tunnel.default_load_balancer && tunnel.annotated_only);
    assert_eq!(tunnel.cluster_id.as_deref(), Some("prod-1"));
    assert_eq!(tunnel.ec2_image_id.as_deref(), Some("ami-0123456789abcdef0"));
    assert_eq!(tunnel.ec2_region_images, [("eu-west-1".to_string(), "ami-0aaaaaaaaaaaaaaaa".to_string())]);
    assert!(tunnel.orphan_sweep_interval.is_zero());
    assert_eq!(tunnel.ec2_subnet_ids, ["subnet-0123456789abcdef0", "subnet-0fedcba9876543210"]);
    assert!(tunnel.skip_exit_server_check);
    assert_eq!(tunnel.exit_server_check_ttl, std::time::Duration::from_secs(600));
    let grants: Vec<(&str, &str)> =
        run_args.queue.name_grants.iter().map(|g| (g.namespace.as_str(), g.pattern.as_str())).collect();
    assert_eq!(grants, [("payments", "legacy-payments-*"), ("payments", "billing")]);
    assert!(run_args.aws.allow_http_account_endpoints);
    assert!(run_args.allow_without_admission_policies);
    assert!(!docs.iter().any(|d| d["kind"] == "ClusterRole"), "no tenant roles when switched off");
    let env_from = deployment_env_from(&docs);
    assert!(env_from.contains(&"my-tokens".to_string()), "{env_from:?}");
    let role: Role = serde_json::from_value(find(&docs, "Role", "skyport-leader-election").clone()).unwrap();
    assert_eq!(role.rules.unwrap()[1].resource_names, Some(vec!["custom".to_string()]));
    run("kubectl", &["apply", "--dry-run=server", "-f", "-"], Some(&custom));
    // Without leader election and RBAC.
    let minimal = helm_template(&[
        "--set",
        "leaderElection.enabled=false,rbac.create=false,metrics.service.enabled=false",
        "--set",
        "aws.credentialsSecret=,tunnel.credentialsSecret=",
    ]);
    let docs = documents(&minimal);
    assert_eq!(deployment_env_from(&docs), Vec::<String>::new());
    let deployment: Deployment = serde_json::from_value(find(&docs, "Deployment", "skyport").clone()).unwrap();
    let args = deployment.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
    assert!(
        !args.iter().any(|a| a.starts_with("--queue-name-grant") || a.starts_with("--allow-")),
        "grants, plain-http endpoints, no admission policies: only when asked for: {args:?}"
    );
    assert!(!docs.iter().any(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole" || d["kind"] == "Service"));
    run("kubectl", &["apply", "--dry-run=server", "-f", "-"], Some(&minimal));
}
