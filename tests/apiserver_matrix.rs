//! The CRDs, their CEL rules and the admission policies on the oldest and the newest kube-apiserver
//! the environment builds (recipes tests/env/kube-oldest and tests/env/kube-newest; the other
//! tests run on tests/env/kube's). Each version gets a control plane of its own
//! (apiserver_matrix/cluster.rs), then: every CRD in crds/ is accepted, Established and stored
//! with every field as written (a CEL function or a field the version lacks fails the test); the
//! ValidatingAdmissionPolicies of deploy/ are accepted and refuse what they are for; every admission
//! refusal of the bad input suite (tests/bad_input/refused.rs) is refused with its message; valid
//! Queues and Tunnels, edits included, are accepted by server-side apply; `kubectl explain` shows
//! the descriptions.
//!
//! tests/run.sh builds both apiservers (tests/env/build-apiserver.sh) and passes them as
//! SKYPORT_APISERVER_OLDEST and SKYPORT_APISERVER_NEWEST; without them the test builds them
//! itself (once, 20-30 min each on 2 busy cores). Run: `eval "$(tests/env.sh up)" && cargo test
//! --test integration apiserver_matrix:: -- --include-ignored`.

mod cluster;

use cluster::Cluster;
use serde_json::{Value, json};

use crate::bad_input::cases::Expect::Refused;
use crate::bad_input::cases::{case, fifo, q, t};

const NS: &str = "matrix";
const SERVER_SIDE: &[&str] = &["--server-side", "--field-manager=matrix"];
const ROLE: &str = "arn:aws:iam::123456789012:role/skyport";

fn account(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "skyport.dev/v1alpha1", "kind": "AwsAccount", "metadata": {"name": name}, "spec": spec})
}

#[test]
#[ignore = "needs the test environment (etcd, kubectl, the test PKI): tests/env.sh up"]
fn crds_and_cel_rules_hold_on_the_oldest_apiserver() {
    holds_on("kube-oldest", "SKYPORT_APISERVER_OLDEST");
}

#[test]
#[ignore = "needs the test environment (etcd, kubectl, the test PKI): tests/env.sh up"]
fn crds_and_cel_rules_hold_on_the_newest_apiserver() {
    holds_on("kube-newest", "SKYPORT_APISERVER_NEWEST");
}

fn holds_on(recipe: &str, var: &str) {
    let c = Cluster::start(std::path::Path::new(&apiserver(recipe, var)));
    let want = recipe_version(recipe);
    let version: Value = serde_json::from_str(&c.must(&["get", "--raw", "/version"])).expect("/version is JSON");
    assert_eq!(version["gitVersion"], want, "{var} is not the build of tests/env/{recipe}");

    for file in files("crds") {
        let name = apply_as_written(&c, &file);
        c.must(&["wait", "--for=condition=Established", "--timeout=60s", &format!("crd/{name}")]);
    }
    for file in ["deploy/admission.yaml", "deploy/queue-names.yaml"] {
        apply_as_written(&c, file);
    }
    c.must(&["create", "namespace", NS]);
    policies_enforced(&c);

    refusals(&c);
    valid_objects(&c);
    explained(&c);
}

/// The kube-apiserver of `recipe`: `var` (tests/run.sh), else built (a no-op when cached).
fn apiserver(recipe: &str, var: &str) -> String {
    if let Some(path) = std::env::var_os(var) {
        return path.to_string_lossy().into_owned();
    }
    let out = std::process::Command::new("tests/env/build-apiserver.sh")
        .arg(format!("tests/env/{recipe}"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("run tests/env/build-apiserver.sh");
    assert!(out.status.success(), "tests/env/build-apiserver.sh tests/env/{recipe} failed");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The k8s.io/kubernetes version the recipe pins.
fn recipe_version(recipe: &str) -> String {
    let gomod = std::fs::read_to_string(format!("tests/env/{recipe}/go.mod")).expect("read the recipe");
    let at = gomod.find("k8s.io/kubernetes v").expect("the recipe pins k8s.io/kubernetes") + "k8s.io/kubernetes ".len();
    gomod[at..].split_whitespace().next().expect("a version").to_string()
}

fn files(dir: &str) -> Vec<String> {
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .expect("read the directory")
        .map(|e| e.expect("an entry").path().display().to_string())
        .filter(|p| p.ends_with(".yaml"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no YAML in {dir}");
    files
}

/// Applies `file`, then checks that the server stored every field of every object in it as
/// written: the apiserver drops what its version does not know instead of refusing it.
/// Returns the (last) object's name.
fn apply_as_written(c: &Cluster, file: &str) -> String {
    c.kubectl(&["apply", "-f", file]).unwrap_or_else(|e| panic!("this apiserver refuses {file}: {e}"));
    // One JSON document per object.
    let written = c.must(&["create", "--dry-run=client", "-o", "json", "-f", file]);
    let objects: Vec<Value> =
        serde_json::Deserializer::from_str(&written).into_iter().collect::<Result<_, _>>().expect("JSON");
    let mut name = String::new();
    for object in objects {
        let kind = object["kind"].as_str().expect("a kind").to_lowercase();
        name = object["metadata"]["name"].as_str().expect("a name").to_string();
        let stored: Value =
            serde_json::from_str(&c.must(&["get", &kind, &name, "-o", "json"])).expect("the stored object");
        let mut lost = vec![];
        missing(&object["spec"], &stored["spec"], "spec", &mut lost);
        assert!(lost.is_empty(), "{file}: {kind}/{name} was stored without {lost:?}");
    }
    name
}

/// The paths of `want` that `got` lacks or holds otherwise (`got` may hold more: defaults).
fn missing(want: &Value, got: &Value, path: &str, lost: &mut Vec<String>) {
    match (want, got) {
        (Value::Object(w), Value::Object(g)) => {
            for (k, v) in w {
                missing(v, g.get(k).unwrap_or(&Value::Null), &format!("{path}.{k}"), lost);
            }
        }
        (Value::Array(w), Value::Array(g)) if w.len() == g.len() => {
            for (i, (w, g)) in w.iter().zip(g).enumerate() {
                missing(w, g, &format!("{path}[{i}]"), lost);
            }
        }
        _ if want == got => {}
        _ => lost.push(path.to_string()),
    }
}

/// The policies of deploy/admission.yaml judge skyport's ServiceAccount only: as that account
/// (with every RBAC permission, so that only admission can refuse), two writes skyport never
/// makes are refused with their policy's message, and no expression failed to compile (a
/// compilation error refuses too, with another message); as the admin the same write passes.
fn policies_enforced(c: &Cluster) {
    c.must(&[
        "create",
        "clusterrolebinding",
        "matrix-skyport",
        "--clusterrole=cluster-admin",
        "--serviceaccount=skyport-system:skyport",
    ]);
    let configmap = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "loose"}});
    let tunnel = t("unowned", json!({"serviceRef": {"name": "web"}}));
    let cases = [
        (&configmap, "skyport writes only configmaps controlled by its own Queue"),
        (&tunnel, "skyport creates a Tunnel only for the Service that controls it"),
    ];
    for (object, want) in cases {
        match apply(c, object, &["--as=system:serviceaccount:skyport-system:skyport"]) {
            Err(e) if e.contains(want) && !e.contains("compil") => {}
            other => panic!("skyport's write of {object} was not refused with {want:?} alone: {other:?}"),
        }
    }
    apply(c, &configmap, &[]).expect("the admin's ConfigMap is not the policies' concern");
}

fn apply(c: &Cluster, object: &Value, extra: &[&str]) -> Result<String, String> {
    let mut args = vec!["apply", "-n", NS, "-f", "-"];
    args.extend(extra);
    c.kubectl_in(&args, Some(&object.to_string()))
}

/// Every admission refusal of the bad input suite, plus the queue-name policy's.
fn refusals(c: &Cluster) {
    let mut cases = crate::bad_input::refused::cases();
    cases.extend([
        case(
            "queueName of another namespace's form",
            q("other-ns", json!({"queueName": "shop_orders"})),
            Refused(&["has the form <namespace>_<name> reserved for the Queues of that namespace"]),
        ),
        // isCIDR: CEL's network library, which not every apiserver has.
        case(
            "sourceRanges not a CIDR",
            t("cidr", json!({"serviceRef": {"name": "web"}, "sourceRanges": ["10.0.0.0/33"]})),
            Refused(&["sourceRanges must be CIDRs"]),
        ),
        case(
            "AwsAccount with an externalId",
            account("ext", json!({"roleArn": ROLE, "region": "eu-west-1", "externalId": "x"})),
            Refused(&["externalId is derived by skyport"]),
        ),
        case(
            "AwsAccount roleArn not a role",
            account("arn", json!({"roleArn": "arn:aws:iam::123456789012:user/x", "region": "eu-west-1"})),
            Refused(&["spec.roleArn", "should match"]),
        ),
    ]);
    let mut wrong = vec![];
    for case in &cases {
        let Refused(want) = case.expect else { continue };
        for before in &case.before {
            if let Err(e) = apply(c, before, &[]) {
                wrong.push(format!("{}: the original object was refused: {e}", case.what));
            }
        }
        match apply(c, &case.apply, &[]) {
            Ok(_) => wrong.push(format!("{}: accepted", case.what)),
            Err(e) if want.iter().all(|w| e.contains(w)) => {}
            Err(e) => wrong.push(format!("{}: refused without {want:?}: {e}", case.what)),
        }
    }
    assert!(wrong.is_empty(), "{} of {} refusals differ:\n{}", wrong.len(), cases.len(), wrong.join("\n"));
}

/// Valid objects at the edges of the rules, created and then edited by server-side apply (an edit
/// runs the transition rules against the stored object).
fn valid_objects(c: &Cluster) {
    let tags: serde_json::Map<String, Value> = (0..44).map(|i| (format!("k{i}"), json!("v"))).collect();
    let objects = [
        q(
            "bounds",
            json!({"visibilityTimeoutSeconds": 43200, "messageRetentionSeconds": 1209600,
            "delaySeconds": 900, "tags": tags, "deadLetter": {"queueRef": {"name": "dlq"}, "maxReceiveCount": 1000}}),
        ),
        fifo(
            "ordered",
            json!({"queueName": "matrix_ordered.fifo", "contentBasedDeduplication": true,
            "deduplicationScope": "messageGroup", "fifoThroughputLimit": "perMessageGroupId"}),
        ),
        t("web", json!({"serviceRef": {"name": "web"}, "address": {"mode": "Reserved"}, "highAvailability": {}})),
        account("prod", json!({"roleArn": ROLE, "region": "eu-west-1", "allowedNamespaces": ["shop"]})),
    ];
    for object in &objects {
        apply(c, object, SERVER_SIDE).unwrap_or_else(|e| panic!("valid {object} refused: {e}"));
    }
    let edits = [
        q(
            "bounds",
            json!({"visibilityTimeoutSeconds": 0, "messageRetentionSeconds": 60, "delaySeconds": 0,
            "tags": {"team": "shop"}, "deadLetter": {"queueRef": {"name": "dlq"}, "maxReceiveCount": 1}}),
        ),
        fifo("ordered", json!({"queueName": "matrix_ordered.fifo", "deduplicationScope": "queue"})),
        t(
            "web",
            json!({"serviceRef": {"name": "web"}, "address": {"mode": "Reserved"}, "highAvailability": {}, "sourceRanges": ["10.0.0.0/8", "2001:db8::/32"]}),
        ),
    ];
    for object in &edits {
        apply(c, object, SERVER_SIDE).unwrap_or_else(|e| panic!("valid edit {object} refused: {e}"));
    }
    let stored = c.must(&["get", "queue", "bounds", "-n", NS, "-o", "jsonpath={.spec.visibilityTimeoutSeconds}"]);
    assert_eq!(stored, "0", "the edit was not stored");
}

/// `kubectl explain queue.spec` shows the spec's description and each field's, as in the CRD.
fn explained(c: &Cluster) {
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let out = words(&c.must(&["explain", "queue.spec"]));
    let crd: Value = serde_json::from_str(&c.must(&["get", "crd", "queues.skyport.dev", "-o", "json"])).expect("JSON");
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut described = vec![spec["description"].as_str().expect("spec has a description")];
    for field in spec["properties"].as_object().expect("spec's fields").values() {
        described.push(field["description"].as_str().expect("every field has a description"));
    }
    for d in described {
        assert!(out.contains(&words(d)), "kubectl explain queue.spec lacks {d:?}:\n{out}");
    }
}

#[test]
fn missing_names_what_the_server_dropped_or_changed_but_not_what_it_added() {
    let written = json!({"a": {"b": 1, "c": [{"d": "x"}], "e": true}});
    let stored = json!({"a": {"b": 1, "c": [{"d": "y", "added": 1}], "defaulted": 2}});
    let mut lost = vec![];
    missing(&written, &stored, "spec", &mut lost);
    assert_eq!(lost, ["spec.a.c[0].d", "spec.a.e"]);
}
