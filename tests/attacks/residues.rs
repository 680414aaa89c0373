//! What a stolen token of skyport may still do to objects it does not own, on purpose: the one
//! place that names it. Everything else every attack tries must be refused, leak nothing and
//! change nothing. An entry applies only where the manifests grant what it names (a residue
//! never widens a grant), and an entry no grant matches any more fails the test, so that this
//! list stays exact.

use super::grants::{self, Grant};
use super::victims::Victim;

/// Resources the role reads on purpose, with why: an object of one of these that the grants let
/// it `get`, `list` or `watch` is readable, so its values seen in an answer (to a read, or to a
/// patch that copies them into an error) are no leak. Writes to them are attacked all the same.
pub const READABLE: &[(&str, &str, &str)] = &[
    // Telling a ConfigMap skyport owns from a tenant's of the same name needs `get`, and the
    // Queue exports are watched cluster-wide. ConfigMaps are not for secrets (Secrets are).
    ("", "configmaps", "a ConfigMap is told from skyport's own by reading it; not for secrets"),
    // The users' requests: every Queue, Tunnel and AwsAccount is what skyport reconciles.
    ("skyport.dev", "queues", "skyport reconciles every Queue"),
    ("skyport.dev", "tunnels", "skyport reconciles every Tunnel"),
    ("skyport.dev", "awsaccounts", "skyport resolves Queues' accountRefs; an AwsAccount names a role, no secret"),
    (
        "skyport.dev",
        "exitserverpools",
        "skyport serves the pools' Services; a pool names where its server runs, no secret",
    ),
    // LoadBalancer Services are watched to serve those of skyport's class.
    ("", "services", "the Service controller watches Services to find its class"),
    // The tunnel clients, found by label in their namespace (the Role there).
    ("apps", "deployments", "tunnel clients in their namespace; a Deployment holds no secret"),
    // Several active replicas (`sharding.enabled`) list the Leases of the operator's namespace
    // to count live replicas and find free shards; only skyport's Leases belong there.
    ("coordination.k8s.io", "leases", "sharded replicas list their namespace's Leases; a Lease holds no secret"),
    // Only kube-system, by name: its UID is the cluster id tagged on every cloud resource.
    ("", "namespaces", "kube-system by name: its UID is the cluster id"),
];

/// Resources on which a granted `patch` is a read, not yet removed: the API server answers a
/// JSON patch that copies a value into the name with that value, before any admission policy
/// runs. Only where the grant is (a Role names its namespace).
pub const READ_BY_PATCH: &[(&str, &str, &str)] = &[
    // The tunnel clients' credentials are read back with `test`-op patches in the tunnel
    // clients' namespace (Role skyport-tunnel-clients), so every Secret there is readable; that
    // namespace holds only Tunnels' credentials, skyport's own (docs/security.md: keep nothing
    // else there). The operator's own Secrets are in its namespace, out of reach.
    ("", "secrets", "tunnel credentials read back through patch in the tunnel clients' namespace"),
];

/// Status subresources skyport writes for every object of the kind: a write there is admitted by
/// design (the controllers' output). What such a write must still not do is change anything but
/// status, which the attacks check as for any other write.
pub const STATUS_WRITTEN: &[(&str, &str, &str)] = &[
    ("skyport.dev", "queues/status", "a Queue's status is the Queue controller's output"),
    ("skyport.dev", "tunnels/status", "a Tunnel's status is the Tunnel controller's output"),
    ("skyport.dev", "awsaccounts/status", "an AwsAccount's status (external id) is skyport's output"),
    ("skyport.dev", "exitserverpools/status", "a pool's status is its shared server's output"),
];

/// Whether `victim` is readable under `grants` by a residue.
pub fn readable(grants: &[Grant], victim: &Victim) -> bool {
    let kind = victim.kind;
    let allowed =
        |verb: &str| grants::allows(grants, verb, kind.group, kind.resource, victim.namespace.as_deref(), &victim.name);
    let listed = |list: &[(&str, &str, &str)]| list.iter().any(|(g, r, _)| *g == kind.group && *r == kind.resource);
    (listed(READABLE) && grants::READS.iter().any(|verb| allowed(verb))) || (listed(READ_BY_PATCH) && allowed("patch"))
}

/// Whether a status write to `victim` being admitted is a residue (it must still change nothing
/// else, which is checked).
pub fn status_written(grants: &[Grant], victim: &Victim) -> bool {
    let resource = format!("{}/status", victim.kind.resource);
    STATUS_WRITTEN.iter().any(|(group, r, _)| *group == victim.kind.group && *r == resource)
        && grants::allows(grants, "patch", victim.kind.group, &resource, victim.namespace.as_deref(), &victim.name)
}

/// Residue entries no grant matches: stale, to be removed.
pub fn stale(grants: &[Grant]) -> Vec<String> {
    let granted = |group: &str, resource: &str| grants.iter().any(|g| g.group == group && g.resource == resource);
    let patched = |group: &str, resource: &str| {
        grants.iter().any(|g| g.group == group && g.resource == resource && g.verb == "patch")
    };
    let stale = |(group, resource, why): &(&str, &str, &str)| {
        format!("residue {group}/{resource} ({why}) is granted by no rule: remove it")
    };
    let mut out: Vec<String> =
        READABLE.iter().chain(STATUS_WRITTEN).filter(|(g, r, _)| !granted(g, r)).map(stale).collect();
    out.extend(READ_BY_PATCH.iter().filter(|(g, r, _)| !patched(g, r)).map(stale));
    out
}
