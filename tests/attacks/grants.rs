//! The rules the shipped manifests grant skyport's ServiceAccount, read from the manifests
//! themselves (every Role and ClusterRole a binding in them gives the ServiceAccount), so that a
//! rule added there is attacked, or fails the test for want of an attack.

use serde_json::Value;

use super::victims;

/// One verb on one resource (`queues/status` for a subresource), cluster-wide (`namespace`
/// `None`) or in one namespace, for any name or only `names`.
#[derive(Debug, Clone, PartialEq)]
pub struct Grant {
    pub role: String,
    pub namespace: Option<String>,
    pub group: String,
    pub resource: String,
    pub verb: String,
    pub names: Vec<String>,
}

/// Every verb the attacks cover, each with its own attacks (see `attempts` and `patches`).
pub const VERBS: &[&str] = &["get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"];
pub const READS: &[&str] = &["get", "list", "watch"];

fn strings(v: &Value) -> Vec<String> {
    v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
}

/// Every grant to the ServiceAccount `(namespace, name)` in `docs` (the rendered manifests).
pub fn of(docs: &[Value], (sa_ns, sa): (&str, &str)) -> Vec<Grant> {
    let bound = |b: &Value| {
        b["subjects"].as_array().is_some_and(|subjects| {
            subjects.iter().any(|s| s["kind"] == "ServiceAccount" && s["name"] == sa && s["namespace"] == sa_ns)
        })
    };
    let mut grants = Vec::new();
    for binding in docs.iter().filter(|d| matches!(d["kind"].as_str(), Some("RoleBinding" | "ClusterRoleBinding"))) {
        if !bound(binding) {
            continue;
        }
        let scope = binding["metadata"]["namespace"].as_str().map(str::to_string);
        let (ref_kind, ref_name) = (&binding["roleRef"]["kind"], &binding["roleRef"]["name"]);
        let role = docs
            .iter()
            .find(|d| {
                &d["kind"] == ref_kind
                    && &d["metadata"]["name"] == ref_name
                    && (d["kind"] == "ClusterRole" || d["metadata"]["namespace"].as_str() == scope.as_deref())
            })
            .unwrap_or_else(|| {
                panic!("{} binds {ref_kind} {ref_name}, which is not in the manifests", binding["metadata"]["name"])
            });
        let role_name = format!("{} {}", ref_kind.as_str().unwrap(), ref_name.as_str().unwrap());
        assert!(role.get("aggregationRule").is_none(), "{role_name} aggregates rules the test cannot read");
        for rule in role["rules"].as_array().into_iter().flatten() {
            for url in strings(&rule["nonResourceURLs"]) {
                grants.push(Grant {
                    role: role_name.clone(),
                    namespace: None,
                    group: String::new(),
                    resource: format!("nonResourceURL {url}"),
                    verb: strings(&rule["verbs"]).join(","),
                    names: vec![],
                });
            }
            for group in strings(&rule["apiGroups"]) {
                for resource in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        grants.push(Grant {
                            role: role_name.clone(),
                            namespace: scope.clone(),
                            group: group.clone(),
                            resource: resource.clone(),
                            verb,
                            names: strings(&rule["resourceNames"]),
                        });
                    }
                }
            }
        }
    }
    grants
}

/// Grants no attack covers: a resource without a victim kind, a subresource other than a
/// kind's status, a verb without attacks, a wildcard, or a Role in a namespace where no victim
/// is planted (`planted`: the namespaces that have victims).
pub fn uncovered(grants: &[Grant], planted: &[&str]) -> Vec<String> {
    grants
        .iter()
        .filter_map(|g| {
            let (base, sub) = g.resource.split_once('/').map_or((g.resource.as_str(), None), |(b, s)| (b, Some(s)));
            let reason = match victims::find(&g.group, base) {
                None => Some("no victim of this resource"),
                Some(kind) if sub.is_some() && (sub != Some("status") || !kind.status) => {
                    Some("no attack on this subresource")
                }
                Some(_) if !VERBS.contains(&g.verb.as_str()) => Some("no attack for this verb"),
                Some(_) if g.namespace.as_deref().is_some_and(|ns| !planted.contains(&ns)) => {
                    Some("no victims planted in this Role's namespace")
                }
                Some(_) => None,
            };
            reason.map(|r| {
                format!("{} grants `{}` on {}/{} ({:?}): {r}", g.role, g.verb, g.group, g.resource, g.namespace)
            })
        })
        .collect()
}

/// Whether `grants` allow `verb` on `group/resource` named `name` in `namespace`.
pub fn allows(grants: &[Grant], verb: &str, group: &str, resource: &str, namespace: Option<&str>, name: &str) -> bool {
    grants.iter().any(|g| {
        g.verb == verb
            && g.group == group
            && g.resource == resource
            && (g.namespace.is_none() || g.namespace.as_deref() == namespace)
            && (g.names.is_empty() || g.names.iter().any(|n| n == name))
    })
}

/// The rules are read from the manifests, and a rule without attacks is caught (no test
/// environment needed: `deploy/rbac.yaml` as it is, and with one more rule).
#[test]
fn every_rule_of_deploy_rbac_is_attacked_and_a_new_one_is_not_until_it_has_attacks() {
    let yaml = crate::deploy::harness::read("deploy/rbac.yaml");
    let docs = crate::deploy::harness::documents(&yaml);
    let sa = ("skyport-system", "skyport");
    let grants = of(&docs, sa);
    assert!(grants.iter().any(|g| g.resource == "secrets"), "the Secret rules are read: {grants:?}");
    assert_eq!(uncovered(&grants, &["skyport-system", "skyport-tunnels"]), Vec::<String>::new());
    let mut more = docs.clone();
    let role = more.iter_mut().find(|d| d["kind"] == "ClusterRole").unwrap();
    let extra = serde_json::json!([
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": ["skyport.dev"], "resources": ["queues/finalizers"], "verbs": ["update"]},
        {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["escalate"]},
        {"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]},
    ]);
    role["rules"].as_array_mut().unwrap().extend(extra.as_array().unwrap().iter().cloned());
    assert_eq!(uncovered(&of(&more, sa), &["skyport-system", "skyport-tunnels"]).len(), 4);
    // A Role in a namespace where no victim is planted is not covered either.
    assert!(!uncovered(&grants, &["elsewhere"]).is_empty());
}
