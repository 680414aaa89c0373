//! The install manifests in `deploy/`: the kustomize base and the Helm chart render the same
//! objects, the real API server accepts both (server-side dry run), the CRD copies match
//! `crds/`, and the Deployment is hardened and passes flags the binary accepts.
//!
//! The tests that need `kubectl`, `helm` or the API server are ignored by default; tests/run.sh
//! runs them (it builds helm with tests/env/build-helm.sh and exports SKYPORT_HELM).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clap::Parser;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &str) -> String {
    std::fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// Every document of a YAML stream, without empty ones.
fn documents(yaml: &str) -> Vec<Value> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).unwrap_or_else(|e| panic!("invalid YAML: {e}\n{yaml}"));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the manifests"))
}

/// Runs `program args` with `stdin`; panics with its output unless it succeeds.
fn run(program: &str, args: &[&str], stdin: Option<&str>) -> String {
    let mut child = Command::new(program)
        .args(args)
        .current_dir(root())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {program}: {e} (is the test environment's PATH set?)"));
    let mut input = child.stdin.take().expect("stdin");
    if let Some(text) = stdin {
        input.write_all(text.as_bytes()).expect("write stdin");
    }
    drop(input);
    let out = child.wait_with_output().expect("wait");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{program} {args:?} failed ({}):\n{stdout}\n{stderr}", out.status);
    stdout.into_owned()
}

fn require_env() {
    assert!(
        std::env::var_os("KUBECONFIG").is_some(),
        "KUBECONFIG is not set: start the test environment with `eval \"$(tests/env.sh up)\"` (or run tests/run.sh)"
    );
}

/// helm built from its Go module: SKYPORT_HELM (tests/run.sh), else tests/env/build-helm.sh.
fn helm() -> String {
    if let Some(path) = std::env::var_os("SKYPORT_HELM") {
        return path.to_string_lossy().into_owned();
    }
    run("tests/env/build-helm.sh", &[], None).trim().to_string()
}

fn kustomize() -> String {
    run("kubectl", &["kustomize", "deploy/"], None)
}

fn helm_template(extra: &[&str]) -> String {
    let mut args =
        vec!["template", "skyport", "deploy/helm/skyport", "--namespace", "skyport-system", "--include-crds"];
    args.extend_from_slice(extra);
    run(&helm(), &args, None)
}

/// The install namespace must exist for a server-side dry run of the objects inside it (the
/// dry run does not create the Namespace). Applying it is what an install does first anyway.
/// Once per process: two tests applying it at the same moment both find it missing, and the
/// second create fails with AlreadyExists (it did in CI).
fn ensure_install_namespace() {
    static APPLIED: std::sync::Once = std::sync::Once::new();
    APPLIED.call_once(|| {
        run("kubectl", &["apply", "-f", "deploy/namespace.yaml"], None);
    });
}

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
fn deploy_crds_are_copies_of_the_generated_crds() {
    let canonical: BTreeMap<String, String> = std::fs::read_dir(root().join("crds"))
        .expect("crds/")
        .map(|e| e.expect("entry").path())
        .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()))
        .collect();
    for dir in ["deploy/crds", "deploy/helm/skyport/crds"] {
        let copies: BTreeMap<String, String> = std::fs::read_dir(root().join(dir))
            .unwrap_or_else(|e| panic!("{dir}: {e}"))
            .map(|e| e.expect("entry").path())
            .map(|p| (p.file_name().unwrap().to_string_lossy().into_owned(), std::fs::read_to_string(&p).unwrap()))
            .collect();
        assert!(copies == canonical, "{dir}/ differs from crds/: refresh it with `cp crds/*.yaml {dir}/`");
    }
}

#[test]
fn kustomization_lists_every_manifest_in_deploy() {
    let kustomization: Value = serde_saphyr::from_str(&read("deploy/kustomization.yaml")).unwrap();
    let listed: Vec<&str> =
        kustomization["resources"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
    for entry in std::fs::read_dir(root().join("deploy")).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().into_owned();
        if name.ends_with(".yaml") && name != "kustomization.yaml" {
            assert!(listed.contains(&name.as_str()), "deploy/{name} is not in deploy/kustomization.yaml");
        }
    }
    for crd in std::fs::read_dir(root().join("crds")).unwrap() {
        let name = format!("crds/{}", crd.unwrap().file_name().to_string_lossy());
        assert!(listed.contains(&name.as_str()), "{name} is not in deploy/kustomization.yaml");
    }
}

fn rules(rules: Option<Vec<PolicyRule>>) -> Vec<String> {
    let mut out = Vec::new();
    for r in rules.unwrap_or_default() {
        for group in r.api_groups.clone().unwrap_or_default() {
            for resource in r.resources.clone().unwrap_or_default() {
                let names = r.resource_names.clone().map(|n| format!("[{}]", n.join(","))).unwrap_or_default();
                for verb in &r.verbs {
                    out.push(format!("{group}/{resource}{names}:{verb}"));
                }
            }
        }
    }
    out.sort();
    out
}

/// Each grant, with the call that needs it. A new API call in a controller must be added to
/// deploy/rbac.yaml, the chart, and here; an unused grant is an error too.
#[test]
fn rbac_grants_exactly_the_calls_the_controllers_make() {
    let docs = documents(&read("deploy/rbac.yaml"));
    let cluster: ClusterRole = serde_json::from_value(find(&docs, "ClusterRole", "skyport").clone()).unwrap();
    let mut expected = vec![
        "skyport.dev/queues:get",           // is the Queue an SQS owner tag names still there
        "skyport.dev/queues:list",          // Queue watch (reflector)
        "skyport.dev/queues:watch",         // Queue watch
        "skyport.dev/queues:patch",         // finalizer add/remove
        "skyport.dev/queues/status:patch",  // status
        "skyport.dev/awsaccounts:list",     // AwsAccount watch (a Queue's accountRef)
        "skyport.dev/awsaccounts:watch",    //
        "/configmaps:list",                 // owned ConfigMaps watch (by label)
        "/configmaps:watch",                //
        "/configmaps:get",                  // a same-named ConfigMap skyport does not own
        "/configmaps:create",               // a new ConfigMap (fails if the name is taken)
        "/configmaps:patch",                // server-side apply
        "/configmaps:delete",               // an export removed from a Queue's spec
        "events.k8s.io/events:create",      // Recorder
        "events.k8s.io/events:patch",       // Recorder (repeated events become a series)
        "skyport.dev/tunnels:list",         // Tunnel watch (reflector)
        "skyport.dev/tunnels:watch",        //
        "skyport.dev/tunnels:patch",        // finalizer add/remove
        "skyport.dev/tunnels:create",       // Service controller: a LoadBalancer Service's Tunnel
        "skyport.dev/tunnels:delete",       // Service controller: the Service opted out
        "skyport.dev/tunnels/status:patch", // status
        "/services:list",                   // Service watch (both controllers)
        "/services:watch",                  //
        "/services/status:patch",           // status.loadBalancer.ingress
        "/secrets:get",                     // a Tunnel's credentials, a Queue's Secret exports
        "/secrets:create",                  // generated once; a new Secret export
        "/secrets:patch",                   // client config, Queue exports (server-side apply)
        "/secrets:delete",                  // a Secret export removed from a Queue's spec
        "apps/deployments:get",             // compare before applying
        "apps/deployments:list",            // client Deployments watch (by label)
        "apps/deployments:watch",           //
        "apps/deployments:create",          // server-side apply of a new Deployment
        "apps/deployments:patch",           // server-side apply
        "/namespaces[kube-system]:get",     // cluster id for host tags
    ];
    expected.sort();
    assert_eq!(rules(cluster.rules), expected);
    let lease: Role = serde_json::from_value(find(&docs, "Role", "skyport-leader-election").clone()).unwrap();
    assert_eq!(lease.metadata.namespace.as_deref(), Some("skyport-system"));
    let mut expected = vec![
        "coordination.k8s.io/leases:create",
        "coordination.k8s.io/leases[skyport]:get",
        "coordination.k8s.io/leases[skyport]:patch",
    ];
    expected.sort();
    assert_eq!(rules(lease.rules), expected);
}

/// The ClusterRole's rules without the one cluster-scoped read (kube-system's UID): what a
/// namespaced install grants in the watched namespace.
fn namespaced_rules() -> Vec<String> {
    let docs = documents(&read("deploy/rbac.yaml"));
    let cluster: ClusterRole = serde_json::from_value(find(&docs, "ClusterRole", "skyport").clone()).unwrap();
    rules(cluster.rules).into_iter().filter(|r| !r.starts_with("/namespaces")).collect()
}

fn assert_namespaced_install(docs: &[Value], watched: &str, role: &str, what: &str) {
    let cluster_wide: Vec<String> = docs
        .iter()
        .filter(|d| d["kind"] == "ClusterRole" || d["kind"] == "ClusterRoleBinding")
        .map(|d| d["metadata"]["name"].to_string())
        .collect();
    assert!(cluster_wide.is_empty(), "{what} with one watched namespace still grants cluster-wide: {cluster_wide:?}");
    let granted: Role = serde_json::from_value(find(docs, "Role", role).clone()).unwrap();
    assert_eq!(granted.metadata.namespace.as_deref(), Some(watched), "{what}: the Role lives in the watched namespace");
    assert_eq!(rules(granted.rules), namespaced_rules(), "{what}: the controllers' rules, nothing more");
    let binding = find(docs, "RoleBinding", role);
    assert_eq!(binding["metadata"]["namespace"], watched, "{what}");
    assert_eq!(binding["roleRef"]["kind"], "Role", "{what}");
    let deployment: Deployment = serde_json::from_value(find(docs, "Deployment", role).clone()).unwrap();
    let args = deployment.spec.unwrap().template.spec.unwrap().containers[0].args.clone().unwrap();
    assert!(args.contains(&format!("--namespace={watched}")), "{what}: the operator watches {watched}: {args:?}");
}

/// The admission policy narrows the ServiceAccount's writes to the objects skyport labels.
#[test]
fn admission_policy_limits_the_service_accounts_writes_to_labelled_objects() {
    let docs = documents(&read("deploy/admission.yaml"));
    let policy = find(&docs, "ValidatingAdmissionPolicy", "skyport-writes-only-its-own-objects");
    let condition = policy["spec"]["matchConditions"][0]["expression"].as_str().unwrap();
    assert!(condition.contains("'system:serviceaccount:skyport-system:skyport'"), "{condition}");
    let resources: Vec<&str> = policy["spec"]["matchConstraints"]["resourceRules"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["resources"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()))
        .collect();
    assert_eq!(resources, ["secrets", "configmaps", "deployments"]);
    let binding = find(&docs, "ValidatingAdmissionPolicyBinding", "skyport-writes-only-its-own-objects");
    assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]));
}

#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn namespaced_installs_grant_only_roles_in_the_watched_namespace() {
    require_env();
    let overlay = documents(&run("kubectl", &["kustomize", "examples/namespaced/"], None));
    assert_namespaced_install(&overlay, "apps", "skyport", "examples/namespaced (kustomize)");
    let chart = documents(&helm_template(&["--set", "watchNamespace=apps"]));
    assert_namespaced_install(&chart, "apps", "skyport", "the Helm chart with watchNamespace");
    // Tunnels need a cluster id the operator can no longer read: the chart says so.
    let out = Command::new(helm())
        .args(["template", "skyport", "deploy/helm/skyport", "--set", "watchNamespace=apps,tunnel.provider=hetzner"])
        .current_dir(root())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("set tunnel.clusterId"), "{stderr}");
}

#[test]
fn deployment_is_hardened_probed_and_passes_flags_the_binary_accepts() {
    let deployment: Deployment = serde_saphyr::from_str(&read("deploy/deployment.yaml")).unwrap();
    let pod = deployment.spec.unwrap().template.spec.unwrap();
    assert_eq!(pod.service_account_name.as_deref(), Some("skyport"));
    let pod_security = pod.security_context.unwrap();
    assert_eq!(pod_security.run_as_non_root, Some(true));
    assert_eq!(pod_security.seccomp_profile.unwrap().type_, "RuntimeDefault");
    let container = &pod.containers[0];
    let security = container.security_context.clone().unwrap();
    assert_eq!(security.allow_privilege_escalation, Some(false));
    assert_eq!(security.read_only_root_filesystem, Some(true));
    assert_eq!(security.capabilities.unwrap().drop, Some(vec!["ALL".to_string()]));
    let probe_path = |p: &Option<k8s_openapi::api::core::v1::Probe>| p.clone().unwrap().http_get.unwrap().path.unwrap();
    assert_eq!(probe_path(&container.liveness_probe), "/healthz");
    assert_eq!(probe_path(&container.readiness_probe), "/readyz");
    let env: Vec<(String, String)> = container
        .env
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.value_from.and_then(|v| v.field_ref).map(|f| f.field_path).unwrap_or_default()))
        .collect();
    assert!(env.contains(&("POD_NAME".into(), "metadata.name".into())), "{env:?}");
    assert!(env.contains(&("POD_NAMESPACE".into(), "metadata.namespace".into())), "{env:?}");
    let secrets: Vec<(String, Option<bool>)> = container
        .env_from
        .clone()
        .unwrap()
        .into_iter()
        .map(|e| e.secret_ref.map(|s| (s.name, s.optional)).unwrap_or_default())
        .collect();
    assert_eq!(
        secrets,
        [("skyport-aws".to_string(), Some(true)), ("skyport-providers".to_string(), Some(true))],
        "optional credentials Secrets: AWS, exit-server providers"
    );
    assert!(container.resources.clone().unwrap().requests.is_some());

    let args = container.args.clone().unwrap();
    let cli = skyport::config::Cli::try_parse_from(std::iter::once("skyport".to_string()).chain(args.clone()))
        .unwrap_or_else(|e| panic!("deploy/deployment.yaml passes flags skyport rejects: {e}"));
    let skyport::config::Command::Run(run) = cli.command else { panic!("not `skyport run`: {args:?}") };
    assert!(run.leader.enabled, "replicas > 1 must be safe");
    assert_eq!(run.leader.lease_name, "skyport", "must match the Role's resourceNames");
    assert_eq!(run.listen_address.port(), 8080, "must match the container port");
    assert_eq!(run.tunnel.provider, None, "no cloud is chosen for the user: --provider is set in an overlay");
    assert!(!run.tunnel.default_load_balancer && !run.tunnel.annotated_only);
    assert_eq!(run.tunnel.cluster_id, None, "default: the kube-system namespace's UID (RBAC allows that get)");
}

#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn kustomize_base_is_accepted_by_a_server_side_dry_run() {
    require_env();
    ensure_install_namespace();
    let out = run("kubectl", &["apply", "--dry-run=server", "-k", "deploy/"], None);
    for object in [
        "namespace/skyport-system",
        "customresourcedefinition.apiextensions.k8s.io/queues.skyport.dev",
        "serviceaccount/skyport",
        "clusterrole.rbac.authorization.k8s.io/skyport",
        "clusterrolebinding.rbac.authorization.k8s.io/skyport",
        "role.rbac.authorization.k8s.io/skyport-leader-election",
        "rolebinding.rbac.authorization.k8s.io/skyport-leader-election",
        "validatingadmissionpolicy.admissionregistration.k8s.io/skyport-writes-only-its-own-objects",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/skyport-writes-only-its-own-objects",
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
        "tunnel.ec2RegionImages.eu-west-1=ami-0aaaaaaaaaaaaaaaa",
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
    assert!(!docs.iter().any(|d| d["kind"] == "Role" || d["kind"] == "ClusterRole" || d["kind"] == "Service"));
    run("kubectl", &["apply", "--dry-run=server", "-f", "-"], Some(&minimal));
}

#[test]
fn dockerfile_builds_a_static_binary_into_a_non_root_image() {
    let dockerfile = read("Dockerfile");
    assert!(dockerfile.matches("FROM ").count() >= 2, "multi-stage");
    assert!(dockerfile.contains("USER 65532:65532"), "non-root, matching runAsUser in the manifests");
    assert!(Path::new(&root().join(".dockerignore")).exists(), "keep target/ out of the build context");
}
