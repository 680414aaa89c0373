//! Least privilege: the ClusterRole grants exactly the calls the controllers make, a namespaced
//! install only a Role in the watched namespace, and the admission policy narrows the
//! ServiceAccount's writes to skyport's own objects.

use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use serde_json::Value;

use super::harness::{documents, find, helm, helm_template, read, require_env, root, run};

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
        "skyport.dev/queues:get",                   // an owner tag's Queue; a Queue before its create
        "skyport.dev/queues:list",                  // Queue watch (reflector)
        "skyport.dev/queues:watch",                 // Queue watch
        "skyport.dev/queues:patch",                 // finalizer add/remove
        "skyport.dev/queues/status:patch",          // status
        "skyport.dev/awsaccounts:get",              // read again when the finalizer patch meets a newer copy
        "skyport.dev/awsaccounts:list",             // AwsAccount watch (a Queue's accountRef)
        "skyport.dev/awsaccounts:watch",            //
        "/configmaps:list",                         // owned ConfigMaps watch (by label)
        "/configmaps:watch",                        //
        "/configmaps:get",                          // a same-named ConfigMap skyport does not own
        "/configmaps:create",                       // a new ConfigMap (fails if the name is taken)
        "/configmaps:patch",                        // server-side apply
        "/configmaps:delete",                       // an export removed from a Queue's spec
        "events.k8s.io/events:create",              // Recorder
        "events.k8s.io/events:update",              // a repeat replaces the first Event, with its series
        "skyport.dev/tunnels:list",                 // Tunnel watch (reflector)
        "skyport.dev/tunnels:watch",                //
        "skyport.dev/tunnels:patch",                // finalizer add/remove
        "skyport.dev/tunnels:create",               // Service controller: a LoadBalancer Service's Tunnel
        "skyport.dev/tunnels:delete",               // Service controller: the Service opted out
        "skyport.dev/tunnels/status:patch",         // status
        "/services:list",                           // Service watch (both controllers)
        "/services:watch",                          //
        "/services/status:patch",                   // status.loadBalancer.ingress
        "/secrets:create",                          // a new Secret export
        "/secrets:update",                          // a Secret export rewritten whole, by its UID
        "/secrets:delete",                          // a Secret export removed from a Queue's spec
        "/namespaces[kube-system]:get",             // cluster id for queue and host tags
        "skyport.dev/awsaccounts:patch",            // the in-use finalizer
        "skyport.dev/awsaccounts/status:patch",     // the derived external id
        "skyport.dev/exitserverpools:list",         // pools: who may use them, where they run
        "skyport.dev/exitserverpools:watch",        //
        "skyport.dev/exitserverpools/status:patch", // written by the pool's own shared server
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
    // Tunnel clients and their credentials: in their own namespace only (a patch is a read, so
    // not in the operator's, which holds its own Secrets), no Deployment anywhere else.
    let clients: Role = serde_json::from_value(find(&docs, "Role", "skyport-tunnel-clients").clone()).unwrap();
    assert_eq!(clients.metadata.namespace.as_deref(), Some("skyport-tunnels"));
    let flag = "--tunnel-client-namespace=skyport-tunnels";
    assert!(read("deploy/deployment.yaml").contains(flag), "the operator runs its clients there: {flag}");
    let roles = docs.iter().filter(|d| d["kind"] == "Role" || d["kind"] == "RoleBinding");
    let secrets_in_operator_ns = roles.filter(|d| d["metadata"]["namespace"] == "skyport-system");
    let secrets_in_operator_ns = secrets_in_operator_ns.filter(|d| d["rules"].to_string().contains("secrets"));
    assert_eq!(secrets_in_operator_ns.count(), 0, "no Secret verb in the operator's own namespace");
    let mut expected = vec![
        "apps/deployments:get",    // compare before applying
        "apps/deployments:list",   // client Deployments watch (by label), orphan sweep
        "apps/deployments:watch",  //
        "apps/deployments:create", // server-side apply of a new Deployment
        "apps/deployments:patch",  // server-side apply
        "apps/deployments:delete", // with its Tunnel (no owner reference across namespaces)
        "/secrets:create",         // credentials generated once
        "/secrets:patch",          // client config; reading its own back
        "/secrets:delete",         // with its Tunnel; an earlier Tunnel's keys
    ];
    expected.sort();
    assert_eq!(rules(clients.rules), expected);
    let binding = find(&docs, "RoleBinding", "skyport-tunnel-clients");
    assert_eq!(binding["subjects"][0]["name"], "skyport");
}

/// The ClusterRole's rules without the cluster-scoped ones (kube-system's UID, ExitServerPools,
/// which a namespaced install does not serve): what it grants in the watched namespace.
fn namespaced_rules() -> Vec<String> {
    let docs = documents(&read("deploy/rbac.yaml"));
    let cluster: ClusterRole = serde_json::from_value(find(&docs, "ClusterRole", "skyport").clone()).unwrap();
    let cluster_scoped = |r: &String| r.starts_with("/namespaces") || r.starts_with("skyport.dev/exitserverpools");
    rules(cluster.rules).into_iter().filter(|r| !cluster_scoped(r)).collect()
}

fn assert_namespaced_install(docs: &[Value], watched: &str, role: &str, what: &str) {
    // The tenant roles (aggregated into view/edit/admin) grant skyport nothing.
    let aggregated =
        |d: &Value| d["metadata"]["labels"].as_object().is_some_and(|l| l.keys().any(|k| k.contains("/aggregate-to-")));
    let cluster_wide: Vec<String> = docs
        .iter()
        .filter(|d| (d["kind"] == "ClusterRole" && !aggregated(d)) || d["kind"] == "ClusterRoleBinding")
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

/// The admission policies narrow the ServiceAccount's writes: Secrets, ConfigMaps and
/// Deployments to those a skyport object controls, Services' status to skyport's class, Queues,
/// Tunnels and AwsAccounts to skyport's finalizers, Leases to its own. Each applies to skyport's ServiceAccount only, and denies.
#[test]
fn admission_policies_narrow_the_service_accounts_writes() {
    let docs = documents(&read("deploy/admission.yaml"));
    let resources = |policy: &Value| -> Vec<String> {
        let rules = policy["spec"]["matchConstraints"]["resourceRules"].as_array().unwrap();
        rules.iter().flat_map(|r| r["resources"].as_array().unwrap().iter().map(|v| v.to_string())).collect()
    };
    for (name, expected) in [
        ("skyport-writes-only-its-own-objects", vec!["secrets", "configmaps", "deployments"]),
        ("skyport-publishes-only-its-own-load-balancers", vec!["services/status"]),
        ("skyport-never-writes-specs", vec!["queues", "tunnels", "awsaccounts", "tunnels"]),
        ("skyport-writes-only-its-own-events", vec!["events"]),
        ("skyport-writes-only-its-own-leases", vec!["leases"]),
    ] {
        let policy = find(&docs, "ValidatingAdmissionPolicy", name);
        let condition = policy["spec"]["matchConditions"][0]["expression"].as_str().unwrap();
        assert!(condition.contains("'system:serviceaccount:skyport-system:skyport'"), "{name}: {condition}");
        assert_eq!(policy["spec"]["failurePolicy"], "Fail", "{name}");
        let quoted: Vec<String> = expected.iter().map(|r| format!("\"{r}\"")).collect();
        assert_eq!(resources(policy), quoted, "{name}");
        let binding = find(&docs, "ValidatingAdmissionPolicyBinding", name);
        assert_eq!(binding["spec"]["policyName"], name);
        assert_eq!(binding["spec"]["validationActions"], serde_json::json!(["Deny"]), "{name}");
    }
    // Class-less Services are skyport's only when it is the default load balancer: the chart
    // follows tunnel.defaultLoadBalancer, the base says false like its Deployment's flag.
    let status = find(&docs, "ValidatingAdmissionPolicy", "skyport-publishes-only-its-own-load-balancers");
    assert_eq!(
        status["spec"]["variables"][0],
        serde_json::json!({"name": "defaultLoadBalancer", "expression": "false"})
    );
    let deployment = documents(&read("deploy/deployment.yaml"));
    let deployment = serde_json::to_string(find(&deployment, "Deployment", "skyport")).unwrap();
    assert!(deployment.contains("--default-load-balancer=false"), "{deployment}");
    // The Lease policy's group is the Deployment's --lease-name.
    let leases = find(&docs, "ValidatingAdmissionPolicy", "skyport-writes-only-its-own-leases");
    assert_eq!(leases["spec"]["variables"][0], serde_json::json!({"name": "group", "expression": "'skyport'"}));
    assert!(deployment.contains("--lease-name=skyport"), "{deployment}");
}

#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn the_charts_service_status_policy_follows_its_default_load_balancer_value() {
    require_env();
    let chart = documents(&helm_template(&["--set", "tunnel.defaultLoadBalancer=true"]));
    let status = find(&chart, "ValidatingAdmissionPolicy", "skyport-publishes-only-its-own-load-balancers");
    assert_eq!(status["spec"]["variables"][0]["expression"], "true");
}

#[test]
#[ignore = "needs the test environment: tests/env.sh up"]
fn namespaced_installs_grant_only_roles_in_the_watched_namespace() {
    require_env();
    let overlay = documents(&run("kubectl", &["kustomize", "examples/namespaced/"], None));
    assert_namespaced_install(&overlay, "apps", "skyport", "examples/namespaced (kustomize)");
    let chart = documents(&helm_template(&["--set", "watchNamespace=apps,tunnel.clusterId=apps-cluster"]));
    assert_namespaced_install(&chart, "apps", "skyport", "the Helm chart with watchNamespace");
    // Queues and Tunnels need a cluster id the operator can no longer read: the chart says so.
    let out = Command::new(helm())
        .args(["template", "skyport", "deploy/helm/skyport", "--set", "watchNamespace=apps"])
        .current_dir(root())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && stderr.contains("set tunnel.clusterId"), "{stderr}");
}
