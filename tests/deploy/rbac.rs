//! Least privilege: the ClusterRole grants exactly the calls the controllers make, a namespaced
//! install only a Role in the watched namespace, and the admission policy narrows the
//! ServiceAccount's writes to skyport's own objects.

use std::process::Command;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role};
use serde_json::Value;

use crate::harness::{documents, find, helm, helm_template, read, require_env, root, run};

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
        "skyport.dev/queues:get",               // is the Queue an SQS owner tag names still there
        "skyport.dev/queues:list",              // Queue watch (reflector)
        "skyport.dev/queues:watch",             // Queue watch
        "skyport.dev/queues:patch",             // finalizer add/remove
        "skyport.dev/queues/status:patch",      // status
        "skyport.dev/awsaccounts:list",         // AwsAccount watch (a Queue's accountRef)
        "skyport.dev/awsaccounts:watch",        //
        "/configmaps:list",                     // owned ConfigMaps watch (by label)
        "/configmaps:watch",                    //
        "/configmaps:get",                      // a same-named ConfigMap skyport does not own
        "/configmaps:create",                   // a new ConfigMap (fails if the name is taken)
        "/configmaps:patch",                    // server-side apply
        "/configmaps:delete",                   // an export removed from a Queue's spec
        "events.k8s.io/events:create",          // Recorder
        "events.k8s.io/events:patch",           // Recorder (repeated events become a series)
        "skyport.dev/tunnels:list",             // Tunnel watch (reflector)
        "skyport.dev/tunnels:watch",            //
        "skyport.dev/tunnels:patch",            // finalizer add/remove
        "skyport.dev/tunnels:create",           // Service controller: a LoadBalancer Service's Tunnel
        "skyport.dev/tunnels:delete",           // Service controller: the Service opted out
        "skyport.dev/tunnels/status:patch",     // status
        "/services:list",                       // Service watch (both controllers)
        "/services:watch",                      //
        "/services/status:patch",               // status.loadBalancer.ingress
        "/secrets:get",                         // a Tunnel's credentials, a Queue's Secret exports
        "/secrets:create",                      // generated once; a new Secret export
        "/secrets:patch",                       // client config, Queue exports (server-side apply)
        "/secrets:delete",                      // a Secret export removed from a Queue's spec
        "apps/deployments:get",                 // compare before applying
        "apps/deployments:list",                // client Deployments watch (by label)
        "apps/deployments:watch",               //
        "apps/deployments:create",              // server-side apply of a new Deployment
        "apps/deployments:patch",               // server-side apply
        "/namespaces[kube-system]:get",         // cluster id for queue and host tags
        "skyport.dev/awsaccounts:patch",        // the in-use finalizer
        "skyport.dev/awsaccounts/status:patch", // the derived external id
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
